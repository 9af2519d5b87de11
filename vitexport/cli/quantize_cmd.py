"""`vitexport quantize --fp16 | --int8 [--target cpu|tensorrt|all] | --fp8`: precision in the ONNX graph, checked vs
FP32."""

from __future__ import annotations

from pathlib import Path

import click

from ..precision.settings import GRAPH_KINDS, graph_kinds
from .groups import CALIB, MODEL, QUIET, TARGET, one_flag, use

@click.command("quantize")
@click.option("--fp16", is_flag=True, help="Mixed FP16, FP32 inputs/outputs.")
@click.option("--int8", is_flag=True, help="Symmetric INT8 Q/DQ from calibration.")
@click.option("--fp8", is_flag=True, help="FP8 (E4M3) Q/DQ from calibration, shaped for TensorRT on Hopper/Ada "
                                          "(ONNX Runtime's CPU provider runs it too, for its accuracy).")
@click.option("--target", "graph_target", type=click.Choice(list(GRAPH_KINDS["int8"])), default="cpu",
              show_default=True,
              help="The graph for CPU runtimes (FP16: LayerNorm and Softmax in FP32; INT8: FP32 between the INT8 "
                   "GEMMs), the one shaped for TensorRT (every other op in FP16), or both (INT8: from one "
                   "calibration).")
@click.option("--sensitivity", is_flag=True,
              help="INT8/FP8: measure what each GEMM group (per block qkv, proj, fc1, fc2; the patch embedding, ...) "
                   "costs alone quantized, on the held-out data; print them sorted by cost. Writes no model.")
@click.option("--json", "json_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="With --sensitivity: one record per group (ONNX node names, block, kind, figures) to this file.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="With --sensitivity: a bar plot of the groups' costs, PNG (needs matplotlib).")
@use(TARGET, MODEL, CALIB, QUIET)
def quantize_command(fp16, int8, fp8, graph_target, sensitivity, json_path, plot_path, target, spec, calib, log):
    """Write model.fp16.onnx, model.int8.onnx (or, with --target tensorrt, model.fp16.trt.onnx, model.int8.trt.onnx),
    or model.fp8.onnx beside an exported model, checked against FP32.

    MODEL_DIR is an exported model folder (or its model.onnx). Without it, the folder of --model
    (default: the default model) is used, exported first if absent.
    """
    precision = one_flag(fp16=fp16, int8=int8, fp8=fp8)
    if precision is None:
        raise click.UsageError("Choose --fp16, --int8 or --fp8.")
    if precision == "fp16" and calib.int8.smoothquant is not None:
        raise click.UsageError("--smoothquant is for --int8 and --fp8.")
    kinds = graph_kinds(precision, graph_target)
    if (json_path or plot_path) and not sensitivity:
        raise click.UsageError("--json and --plot write what --sensitivity measures; add --sensitivity.")
    if sensitivity:
        return _sensitivity(precision, kinds, target, spec, calib, json_path, plot_path, log)
    if target is not None:  # hashed for its check and parsed while the modules below are imported
        _prefetch_fp32(Path(target))
    from ..ensure import ensure_artifact

    for kind in kinds:
        artifact = ensure_artifact(target, kind, spec=spec, calib=calib, fresh=True, log=log)
        v = artifact.precision.verdict if artifact.precision else None
        if v is not None:
            click.echo(f"Parity vs FP32: {'passed' if v.passed else v.status} ({v.stats.n} held-out inputs, "
                       f"min cosine {v.stats.cos_min:.5f}"
                       + (f", top-1 {v.stats.acc_ref:.2%} -> {v.stats.acc:.2%}" if v.stats.acc is not None else "")
                       + ")")
        fb = _fallback_of(artifact.path, kind)
        if fb is not None:
            speed = fb.get("speed", {})
            asked = ", ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in fb["target"].items())
            click.echo(f"Kept in float for {asked} "
                       f"({fb['status']}): {len(fb['float_groups'])} of {fb['groups']} GEMM groups"
                       + (f" ({', '.join(fb['float_groups'])})" if fb["float_groups"] else "")
                       + (f"; ONNX Runtime CPU latency {speed['slowdown']:.2f}x every group quantized"
                          if speed else ""))
        click.echo(f"{kind.upper()} model: {artifact.path}")


def _sensitivity(precision, kinds, target, spec, calib, json_path, plot_path, log):
    if precision == "fp16":
        raise click.UsageError("--sensitivity measures the GEMMs of --int8 or --fp8.")
    if len(kinds) > 1:
        raise click.UsageError("--sensitivity measures one graph: choose --target cpu or --target tensorrt.")
    if calib.int8.target():
        raise click.UsageError("--sensitivity only measures; --min-cos/--max-drop/--dense-target make a model: run "
                               "them apart.")
    from ..artifacts.workspace import writing
    from ..ensure import open_model
    from ..paths import pyplot
    from ..precision.prepare import run_sensitivity
    from ..precision.sensitivity_report import plot, table, write_json

    if plot_path:
        pyplot()  # matplotlib missing: said now, not after the measuring

    folder = open_model(target, spec, log=log)
    with writing(folder, log):  # the calibration cache is the folder's
        sens = run_sensitivity(folder, kinds[0], calib, log)
    click.echo(table(sens))
    if json_path:
        write_json(sens, str(folder.path), json_path)
        click.echo(f"JSON: {json_path}")
    if plot_path:
        plot(sens, plot_path)
        click.echo(f"Plot: {plot_path}")


def _fallback_of(path: Path, kind: str) -> dict | None:
    """The manifest's record of a --min-cos/--max-drop fallback for the file just made, if it had one."""
    from ..artifacts.folder import ModelFolder

    rec = ModelFolder(path.parent).read_manifest().precisions.get(kind)
    return rec.calibration.fallback if rec is not None and rec.calibration is not None else None


def _prefetch_fp32(target: Path) -> None:
    from ..artifacts.folder import ModelFolder
    from ..artifacts.verify import prefetch_digest
    from ..errors import VitexportError
    from ..precision.graphs import prefetch

    try:
        fp32 = ModelFolder.containing(target).onnx()
        prefetch_digest(fp32)
        prefetch(fp32)
    except (OSError, VitexportError):
        pass  # the command's own checks say what is wrong with the folder
