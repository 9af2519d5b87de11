"""`vitexport trt --fp16 | --int8 | --fp32`: precision step (if needed), then a TensorRT engine."""

from __future__ import annotations

from pathlib import Path

import click

from .groups import (CALIB_KEYS, MODEL_KEYS, calib_from, calib_options, handle_errors, make_log, pop_keys,
                     quiet_option, spec_from, target_options)


@click.command("trt")
@click.option("--fp16", "precision", flag_value="fp16", default=True, help="Mixed FP16 engine (default).")
@click.option("--int8", "precision", flag_value="int8", help="INT8 engine from the Q/DQ ONNX.")
@click.option("--fp32", "precision", flag_value="fp32", help="FP32 reference engine (TF32 off).")
@target_options
@click.option("--min-batch", type=int, default=1, show_default=True)
@click.option("--opt-batch", type=int, default=8, show_default=True)
@click.option("--max-batch", type=int, default=32, show_default=True)
@click.option("--workspace", type=float, default=None, help="Builder workspace limit in GiB.")
@click.option("--timing-cache", type=click.Path(path_type=Path), default=None,
              help="Timing cache file: loaded when present, saved after the build.")
@click.option("--opt-level", type=int, default=None, help="Builder optimization level (0-5).")
@calib_options
@quiet_option
@handle_errors
def trt_command(precision, model_path, min_batch, opt_batch, max_batch, workspace, timing_cache, opt_level, quiet,
                **kwargs):
    """Compile the FP16/INT8/FP32 ONNX into model.<precision>.plan with a sidecar JSON.

    The FP16/INT8 ONNX is made first when missing (same options as `vitexport quantize`). Without
    TensorRT the command still writes it, then exits 4 (TensorRT not installed) or 5 (no CUDA GPU).
    """
    from ..tensorrt_engine.options import BuildOptions
    from ..tensorrt_engine.compile import run_trt
    from ..precision.prepare import prepare_precision, resolve_model_dir

    log = make_log(quiet)
    calib = calib_from(**pop_keys(kwargs, CALIB_KEYS))
    spec = spec_from(**pop_keys(kwargs, MODEL_KEYS))
    opts = BuildOptions(precision=precision, min_batch=min_batch, opt_batch=opt_batch, max_batch=max_batch,
                        workspace_gib=workspace, timing_cache=timing_cache, opt_level=opt_level).validate()
    folder, _ = resolve_model_dir(model_path, log, spec)

    def prepare(prec: str) -> Path:
        path = prepare_precision(folder, prec, calib, log)
        click.echo(f"{prec.upper()} ONNX: {path}")
        return path

    result = run_trt(folder, opts, log, prepare)
    click.echo(f"TensorRT engine: {result.plan_path} (sidecar: {result.sidecar_path})")
