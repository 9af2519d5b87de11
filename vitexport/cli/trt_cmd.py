"""`vitexport trt --fp16 | --int8 | --fp8 | --fp32`: precision step (if needed), then a TensorRT engine."""

from __future__ import annotations

from pathlib import Path

import click

from ..tensorrt_engine.options import BuildOptions, LogOptions
from .groups import CALIB, MODEL, QUIET, TARGET, OptionGroup, one_flag, opt, use

BUILD = OptionGroup(
    "build",
    lambda: [
        opt("--fp16", is_flag=True, help="Mixed FP16 engine (default)."),
        opt("--int8", is_flag=True, help="INT8 engine from the Q/DQ ONNX."),
        opt("--fp8", is_flag=True, help="FP8 (E4M3) engine from the FP8 Q/DQ ONNX; compute capability 8.9 or newer "
                                        "(Ada, Hopper)."),
        opt("--fp32", is_flag=True, help="FP32 reference engine (TF32 off)."),
        opt("--min-batch", type=click.IntRange(min=1), default=1, show_default=True),
        opt("--opt-batch", type=click.IntRange(min=1), default=8, show_default=True),
        opt("--max-batch", type=click.IntRange(min=1), default=32, show_default=True),
        opt("--workspace", type=click.FloatRange(min=0, min_open=True), default=None,
            help="Builder workspace limit in GiB."),
        opt("--timing-cache", type=click.Path(path_type=Path), default=None,
            help="Timing cache file: loaded when present, saved after the build."),
        opt("--opt-level", type=click.IntRange(0, 5), default=None, help="Builder optimization level (0-5)."),
    ],
    lambda fp16, int8, fp8, fp32, min_batch, opt_batch, max_batch, workspace, timing_cache, opt_level: BuildOptions(
        precision=one_flag("fp16", fp16=fp16, int8=int8, fp8=fp8, fp32=fp32), min_batch=min_batch, opt_batch=opt_batch,
        max_batch=max_batch, workspace_gib=workspace, timing_cache=timing_cache, opt_level=opt_level).validate(),
)


TRT_LOG = OptionGroup(
    "trt_log",
    lambda: [
        opt("--verbose", is_flag=True, help="Show TensorRT's own INFO and VERBOSE messages on stderr."),
        opt("--verbose-log", type=click.Path(path_type=Path), default=None, metavar="FILE",
            help="Write every message TensorRT logs (all severities) to FILE."),
    ],
    lambda verbose, verbose_log: LogOptions(verbose=verbose, file=verbose_log).validate(),
)


@click.command("trt")
@use(BUILD, TARGET, MODEL, CALIB, TRT_LOG, QUIET)
def trt_command(build, target, spec, calib, trt_log, log):
    """Compile the FP16/INT8/FP8/FP32 ONNX into model.<precision>.plan with a sidecar JSON.

    The FP16/INT8/FP8 ONNX is made first when missing (same options as `vitexport quantize`). Without
    TensorRT the command still writes it, then exits 4 (TensorRT not installed) or 5 (no CUDA GPU).
    """
    from ..ensure import build_plan
    from ..tensorrt_engine.events import MESSAGES

    if calib.int8.weight_bits is not None:
        raise click.UsageError("--weight-bits sets the CPU INT8 graph's weights (`vitexport quantize --int8`); "
                               "TensorRT's graphs have 8-bit ones.")
    with MESSAGES.echo(trt_log):
        result = build_plan(target, build, spec=spec, calib=calib, log=log,
                            on_source=lambda prec, path: click.echo(f"{prec.upper()} ONNX: {path}"))
    click.echo(f"TensorRT engine: {result.plan_path} (sidecar: {result.sidecar_path})")
