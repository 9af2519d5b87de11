"""`vitexport aoti [MODEL_DIR] --precision fp32|bf16|int8`: PyTorch's compiled CPU path as an AOTInductor package
beside the ONNX, checked against FP32."""

from __future__ import annotations

import click

from .groups import CALIB, MODEL, QUIET, TARGET, parity_line, use

PRECISIONS = ("fp32", "bf16", "int8")  # aoti.package.AOTI_PRECISIONS; here so --help loads no torch


@click.command("aoti")
@click.option("--precision", type=click.Choice(PRECISIONS), default="int8", show_default=True,
              help="fp32: Inductor with freezing; bf16: under bf16 autocast; int8: PT2E INT8 (torchao's "
                   "X86InductorQuantizer, calibrated with the options below), the float parts in bf16 where the CPU "
                   "has BF16 arithmetic.")
@use(TARGET, MODEL, CALIB, QUIET)
def aoti_command(precision, target, spec, calib, log):
    """Write an AOTInductor package (model.aoti.<precision>.pt2) of the reference model beside an exported
    model, check it against the FP32 ONNX on held-out images, and record it.

    The package runs with torch._inductor.aoti_load_package, without the model's Python code; `bench` shows it
    as a row (pytorch cpu bf16 (compiled), pytorch cpu int8 (pt2e)) and `predict --backend aoti` runs it. A
    package whose linears Inductor did not fuse (built without freezing) fails its check. MODEL_DIR is an
    exported model folder; without it, the folder of --model is used, exported first if absent.
    """
    from ..aoti.make import aoti_kind
    from ..ensure import ensure_artifact

    if calib.int8.weight_bits is not None:
        raise click.UsageError("--weight-bits sets the CPU INT8 graph's weights (`vitexport quantize --int8`); a "
                               "package's INT8 is PT2E's, with 8-bit weights.")
    result = ensure_artifact(target, aoti_kind(precision), spec=spec, calib=calib, fresh=True, log=log).precision
    if line := parity_line(result.verdict):
        click.echo(line)
    click.echo(f"AOTInductor {precision.upper()} package: {result.onnx_path}")
