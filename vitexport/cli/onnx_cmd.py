"""`vitexport onnx`: build, load weights, export with a symbolic batch, prove parity, write the manifest."""

from __future__ import annotations

from pathlib import Path

import click

from ..model.heads.detection_config import SAMPLINGS
from ..model.spec import DEFAULT_OPSET, MIN_OPSET, ExportOptions
from ..parity.compare import EXPORT_THRESHOLDS
from .groups import MODEL, QUIET, FiniteFloat, OptionGroup, opt, use

EXPORT = OptionGroup(
    "export",
    lambda: [
        opt("--opset", type=click.IntRange(min=MIN_OPSET), default=DEFAULT_OPSET, show_default=True,
            help=f"ONNX opset (>= {MIN_OPSET}: LayerNormalization)."),
        opt("--atol", type=FiniteFloat(min=0), default=EXPORT_THRESHOLDS.max_abs, show_default=True,
            help="Max abs logit difference allowed between ONNX Runtime and PyTorch."),
        opt("--check-batch", "check_batches", type=click.IntRange(min=1), multiple=True, default=(1, 3),
            show_default=True, help="Batch sizes to check the ONNX at (repeatable)."),
        opt("--force", is_flag=True, help="Replace an existing export of another model or checkpoint."),
        opt("--outputs", default=None, metavar="LIST",
            help="The graph's outputs, comma-separated, one named ONNX output each: logits (the head's), pooled "
                 "(the pre-logits embedding), tokens (final-norm tokens, prefix included), registers, patch (patch "
                 "tokens). Default: logits, or pooled for a model without a head (--num-classes 0)."),
        opt("--sampling", type=click.Choice(SAMPLINGS), default=None,
            help="A detector's deformable attention: grid_sample (ONNX GridSample) or gather (the same bilinear "
                 "reads as gathers, which every runtime computes alike). Default: the manifest's reason in "
                 "docs/DETECTION.md."),
    ],
    lambda opset, atol, check_batches, force, outputs, sampling: ExportOptions(
        opset=opset, check_batches=tuple(check_batches), atol=atol, force=force, outputs=outputs, sampling=sampling),
)


@click.command("onnx", epilog="Models (-m): any of timm's VisionTransformer architectures, with or without a "
                               "pretrained tag (`vitexport models` lists them), or vit_digits_patch4_32.")
@click.option("--output", "-o", type=click.Path(path_type=Path), default=None,
              help="Output folder (or .onnx path). Default: models/<variant>-<H>x<W>/.")
@use(MODEL, EXPORT, QUIET)
def onnx_command(output: Path | None, spec, export, log):
    """Export a ViT to ONNX (dynamic batch) and check it against PyTorch in ONNX Runtime."""
    from ..preflight import check_export

    check_export(spec, export.check_batches)  # an --img-size that cannot fit: refused before torch is even loaded
    from ..ensure import ensure_artifact

    artifact = ensure_artifact(output, "fp32", spec=spec, export_opts=export, fresh=True, log=log)
    click.echo(f"ONNX model: {artifact.path} (manifest: {artifact.folder.manifest_path})")
