"""`vitexport quantize --fp16 | --int8`: precision prepared in the ONNX graph, checked against FP32."""

from __future__ import annotations

import click

from ..precision import run_quantize
from .groups import (CALIB_KEYS, MODEL_KEYS, calib_from, calib_options, handle_errors, make_log, pop_keys,
                     quiet_option, spec_from, target_options)


@click.command("quantize")
@click.option("--fp16", "precision", flag_value="fp16", help="Mixed FP16, FP32 inputs/outputs.")
@click.option("--int8", "precision", flag_value="int8", help="Symmetric INT8 Q/DQ from calibration.")
@target_options
@calib_options
@quiet_option
@handle_errors
def quantize_command(precision, model_path, quiet, **kwargs):
    """Write model.fp16.onnx or model.int8.onnx beside an exported model and check it against FP32.

    MODEL_DIR is an exported model folder (or its model.onnx). Without it, the folder of --model
    (default: the default model) is used, exported first if absent.
    """
    if precision is None:
        raise click.UsageError("Choose --fp16 or --int8.")
    log = make_log(quiet)
    if precision == "fp16" and (kwargs.get("calib_data") or kwargs.get("calib_samples")):
        log.warn("--calib-data/--calib-samples only matter for --int8; FP16 needs no calibration.")
    calib = calib_from(**pop_keys(kwargs, CALIB_KEYS))
    spec = spec_from(**pop_keys(kwargs, MODEL_KEYS))
    result = run_quantize(model_path, precision, calib, log, spec=spec)
    v = result.verdict
    if v is not None:
        click.echo(f"Parity vs FP32: passed ({v.stats.n} held-out inputs, min cosine {v.stats.cos_min:.5f}"
                   + (f", top-1 {v.stats.acc_ref:.2%} -> {v.stats.acc:.2%}" if v.stats.acc is not None else "") + ")")
    click.echo(f"{precision.upper()} model: {result.onnx_path}")
