"""`vitexport onnx`: build, load weights, export with a symbolic batch, prove parity, write the manifest."""

from __future__ import annotations

from pathlib import Path

import click

from ..export import DEFAULT_ATOL, DEFAULT_OPSET, run_export
from .groups import handle_errors, make_log, model_options, quiet_option, spec_from


@click.command("onnx")
@model_options
@click.option("--opset", type=int, default=DEFAULT_OPSET, show_default=True, help="ONNX opset (>= 17).")
@click.option("--output", "-o", type=click.Path(path_type=Path), default=None,
              help="Output folder (or .onnx path). Default: models/<variant>-<H>x<W>/.")
@click.option("--atol", type=float, default=DEFAULT_ATOL, show_default=True,
              help="Max abs logit difference allowed between ONNX Runtime and PyTorch.")
@click.option("--check-batch", "check_batches", type=int, multiple=True, default=(1, 3), show_default=True,
              help="Batch sizes to check the ONNX at (repeatable).")
@click.option("--force", is_flag=True, help="Replace an existing export of another model or checkpoint.")
@quiet_option
@handle_errors
def onnx_command(variant, checkpoint, img_size, num_classes, pos_embed_interp, opset, output, atol,
                 check_batches, force, quiet):
    """Export a ViT to ONNX (dynamic batch) and check it against PyTorch in ONNX Runtime."""
    log = make_log(quiet)
    if any(b < 1 for b in check_batches):
        raise click.BadParameter("batch sizes must be at least 1", param_hint="--check-batch")
    spec = spec_from(variant, checkpoint, img_size, num_classes, pos_embed_interp)
    result = run_export(spec, output=output, opset=opset, check_batches=tuple(check_batches), atol=atol,
                        force=force, log=log)
    click.echo(f"ONNX model: {result.onnx_path} (manifest: {result.manifest_path})")
