"""`vitexport quantize --fp16 | --int8`: precision prepared in the ONNX graph, checked against FP32."""

from __future__ import annotations

import click

from .groups import CALIB, MODEL, QUIET, TARGET, use


@click.command("quantize")
@click.option("--fp16", "precision", flag_value="fp16", help="Mixed FP16, FP32 inputs/outputs.")
@click.option("--int8", "precision", flag_value="int8", help="Symmetric INT8 Q/DQ from calibration.")
@use(TARGET, MODEL, CALIB, QUIET)
def quantize_command(precision, target, spec, calib, log):
    """Write model.fp16.onnx or model.int8.onnx beside an exported model and check it against FP32.

    MODEL_DIR is an exported model folder (or its model.onnx). Without it, the folder of --model
    (default: the default model) is used, exported first if absent.
    """
    from ..ensure import ensure_artifact

    if precision is None:
        raise click.UsageError("Choose --fp16 or --int8.")
    if precision == "fp16" and (calib.data or calib.samples):
        log.warn("--calib-data/--calib-samples only matter for --int8; FP16 needs no calibration.")
    artifact = ensure_artifact(target, precision, spec=spec, calib=calib, fresh=True, log=log)
    v = artifact.precision.verdict if artifact.precision else None
    if v is not None:
        click.echo(f"Parity vs FP32: passed ({v.stats.n} held-out inputs, min cosine {v.stats.cos_min:.5f}"
                   + (f", top-1 {v.stats.acc_ref:.2%} -> {v.stats.acc:.2%}" if v.stats.acc is not None else "") + ")")
    click.echo(f"{precision.upper()} model: {artifact.path}")
