"""The `vitexport` command: a click group with one small module per command that only parses, calls the library
and prints; option groups defined once (`groups`), every failure as one sentence and an exit code (`failures`).

The top layer: it may import anything; nothing imports it.
"""

from __future__ import annotations

import sys

import click

from ..version import __version__
from .bench_cmd import bench_command
from .failures import DEBUG_ENV, VitexportGroup, set_debug, stop_on_signals
from .info_cmd import info_command
from .models_cmd import models_command
from .onnx_cmd import onnx_command
from .aoti_cmd import aoti_command
from .openvino_cmd import openvino_command
from .predict_cmd import predict_command
from .quantize_cmd import quantize_command
from .triton_cmd import triton_command
from .trt_cmd import trt_command


@click.group(cls=VitexportGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="vitexport")
@click.option("--debug", is_flag=True, help=f"On an error, print the traceback too (for a bug report; also {DEBUG_ENV}=1).")
@click.option("--lock-timeout", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="How long to wait for another run writing the same model folder. Default: 1800 "
                   "($VITEXPORT_LOCK_TIMEOUT).")
def cli(debug: bool, lock_timeout: float | None) -> None:
    """Vision Transformers from checkpoint to ONNX, FP16/INT8 and TensorRT, with proof of parity."""
    set_debug(debug)
    if lock_timeout is not None or sys.modules.get("vitexport.artifacts.workspace") is not None:
        from ..artifacts.workspace import set_lock_timeout

        set_lock_timeout(lock_timeout)


cli.add_command(onnx_command)
cli.add_command(quantize_command)
cli.add_command(trt_command)
cli.add_command(bench_command)
cli.add_command(openvino_command)
cli.add_command(aoti_command)
cli.add_command(predict_command)
cli.add_command(triton_command)
cli.add_command(info_command)
cli.add_command(models_command)


def main() -> None:
    stop_on_signals()
    cli(prog_name="vitexport")
