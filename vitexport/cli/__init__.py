"""The `vitexport` command: a click group with one small module per command."""

from __future__ import annotations

import click

from .. import __version__
from .bench_cmd import bench_command
from .onnx_cmd import onnx_command
from .predict_cmd import predict_command
from .quantize_cmd import quantize_command
from .triton_cmd import triton_command
from .trt_cmd import trt_command


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="vitexport")
def cli() -> None:
    """Vision Transformers from checkpoint to ONNX, FP16/INT8 and TensorRT, with proof of parity."""


cli.add_command(onnx_command)
cli.add_command(quantize_command)
cli.add_command(trt_command)
cli.add_command(bench_command)
cli.add_command(predict_command)
cli.add_command(triton_command)


def main() -> None:
    cli(prog_name="vitexport")
