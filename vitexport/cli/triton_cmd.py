"""`vitexport triton [MODEL_DIR] -o REPO`: a Triton Inference Server model repository entry for one model file."""

from __future__ import annotations

from pathlib import Path

import click

from .groups import MODEL, QUIET, TARGET, OptionGroup, opt, use


def _options(precision, fmt, name, max_batch, instances, force, uint8_input):
    from ..deploy.triton import TritonOptions

    return TritonOptions(precision=precision, format=fmt, name=name, max_batch=max_batch, instances=instances,
                         force=force, uint8_input=uint8_input)


TRITON = OptionGroup(
    "opts",
    lambda: [
        opt("--precision", type=click.Choice(["fp32", "fp16", "int8"]), default="fp32", show_default=True,
            help="Which model file (made first when missing)."),
        opt("--format", "fmt", type=click.Choice(["onnx", "plan", "openvino"]), default="onnx", show_default=True,
            help="onnx: Triton's onnxruntime_onnx backend; plan: a TensorRT plan (tensorrt_plan), built first "
                 "when missing; openvino: the ONNX file on Triton's OpenVINO backend, on the CPU (for an INT8 graph "
                 "the fastest CPU row `bench` finds on most CPUs)."),
        opt("--name", default=None, help="Model name in the repository. Default: <variant>-<precision>[-plan]."),
        opt("--max-batch", type=click.IntRange(min=1), default=None,
            help="max_batch_size. Default: 32 for ONNX, the plan's profile maximum for a plan."),
        opt("--instances", type=click.IntRange(min=1), default=1, show_default=True,
            help="Model instances per device (instance_group count)."),
        opt("--force", is_flag=True, help="Replace REPO/NAME when it holds another model."),
        opt("--uint8-input", is_flag=True,
            help="ONNX and OpenVINO: the input is uint8 pixels (B, 3, H, W), resized and center-cropped; the mean/std "
                 "normalisation runs inside the graph, so clients need not know it."),
    ],
    _options,
)


@click.command("triton")
@click.option("--output", "-o", "repo", type=click.Path(path_type=Path), required=True,
              help="The Triton model repository (created when missing); the model goes to REPO/NAME.")
@use(TARGET, TRITON, MODEL, QUIET)
def triton_command(repo, target, opts, spec, log):
    """Write REPO/NAME/config.pbtxt, REPO/NAME/1/model.onnx (or model.plan) and labels.txt for Triton.

    Inputs, outputs, data types and dims are read from the model file; dynamic batching is on. MODEL_DIR is
    an exported model folder; without it, the folder of --model is used, exported first if absent.
    """
    from ..deploy.triton import write_triton
    from ..deploy.triton_usage import serve_instructions
    from ..ensure import open_model

    folder = open_model(target, spec, log=log)
    result = write_triton(folder, repo, opts, log=log)
    for entry in (result, result.decoder):
        if entry is not None:
            click.echo(f"Triton model: {entry.folder.path} ({entry.platform}, max_batch_size {entry.max_batch_size})")
    click.echo(serve_instructions(result, folder))
