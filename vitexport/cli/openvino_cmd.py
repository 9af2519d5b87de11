"""`vitexport openvino [MODEL_DIR] --precision fp32|fp16|int8`: OpenVINO IR beside the ONNX, checked against FP32."""

from __future__ import annotations

from pathlib import Path

import click

from .groups import CALIB, MODEL, QUIET, TARGET, parity_line, use

PRECISIONS = ("fp32", "fp16", "int8")  # the IR kinds' precisions (folder.IR_SOURCE); here so --help loads no numpy


@click.command("openvino")
@click.option("--precision", type=click.Choice(PRECISIONS), default=None,
              help="fp32: the export as it is; fp16: weights stored in FP16; int8: the INT8 Q/DQ model "
                   "(made first when missing, with the calibration options below).  [default: fp32]")
@use(TARGET, MODEL, CALIB, QUIET)
def openvino_command(precision, target, spec, calib, log):
    """Write OpenVINO IR (model.openvino.<precision>.xml + .bin) beside an exported model and check it
    against FP32 on held-out images; given an IR's .xml instead, check that IR again.

    MODEL_DIR is an exported model folder (or its model.onnx). Without it, the folder of --model
    (default: the default model) is used, exported first if absent. An IR .xml is refused when its
    .bin is missing or truncated, or when it is not the IR vitexport made from that folder's model.
    """
    from ..ensure import ensure_artifact
    from ..openvino_ir.convert import ir_kind, verify_ir

    if target is not None and Path(target).suffix == ".xml":
        result = verify_ir(Path(target), precision, calib, log)
        what = "OpenVINO IR verified"
    else:
        result = ensure_artifact(target, ir_kind(precision or "fp32"), spec=spec, calib=calib, fresh=True,
                                 log=log).precision
        what = f"OpenVINO {(precision or 'fp32').upper()} IR"
    if line := parity_line(result.verdict):
        click.echo(line)
    click.echo(f"{what}: {result.onnx_path} (weights: {result.onnx_path.with_suffix('.bin').name})")
