"""What to build and how to export it: a named variant, an optional checkpoint, the overrides a user can give,
and the export's options.

Plain data, no torch: the CLI turns its options into these objects before anything heavy is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .compare import EXPORT_THRESHOLDS
from .errors import VitexportError
from .folder import ModelFolder, sha256_file
from .paths import shipped_checkpoint
from .posembed import DEFAULT_INTERPOLATION
from .variants import DEFAULT_VARIANT, get_variant

if TYPE_CHECKING:
    from .manifest import Manifest
    from .model import ViTConfig


@dataclass
class ModelSpec:
    variant: str = DEFAULT_VARIANT  # a name from variants.VARIANTS
    checkpoint: Path | None = None  # weights file or folder; None: shipped weights of the variant, else random
    img_size: tuple[int, int] | None = None  # (H, W); None: the variant's
    num_classes: int | None = None  # None: the checkpoint's head, else the variant's; 0: features
    pos_embed_interp: str = DEFAULT_INTERPOLATION  # how to resize the position embedding (posembed.INTERPOLATIONS)
    seed: int = 0  # of the random weights, when there is no checkpoint

    def resolved_checkpoint(self) -> Path | None:
        if self.checkpoint is not None:
            return Path(self.checkpoint)
        return shipped_checkpoint(self.variant)  # the shipped trained digits model, or None

    def config(self) -> "ViTConfig":
        """The model config this spec gives, without reading weights (the checkpoint's class count aside)."""
        return get_variant(self.variant).config(img_size=self.img_size, num_classes=self.num_classes)

    def default_folder(self) -> ModelFolder:
        """models/<variant>-<H>x<W>: where this spec's export goes without --output."""
        variant = get_variant(self.variant)
        return ModelFolder.default_for(self.variant, self.img_size or variant.img_size)

    def differences(self, manifest: "Manifest") -> list[str]:
        """How an existing export differs from what this spec asks for; empty when it is that model."""
        from .checkpoints import resolve_weights  # imports torch: only when an export is compared

        diffs = []
        if manifest.variant != self.variant:
            diffs.append(f"it is {manifest.variant}, not {self.variant}")
        have = None if manifest.checkpoint is None else manifest.checkpoint.sha256
        ckpt = self.resolved_checkpoint()
        if ckpt is None and have:
            diffs.append("it was made from a checkpoint, not from random weights")
        elif ckpt is not None:
            if not ckpt.exists():
                raise VitexportError(f"Checkpoint {ckpt} does not exist.")
            if sha256_file(resolve_weights(ckpt)[0]) != have:
                diffs.append(f"it was made from {'random weights' if not have else 'another checkpoint'}, not {ckpt}")
        if self.num_classes is not None and self.num_classes != manifest.num_classes:
            diffs.append(f"it has {manifest.num_classes} classes, not {self.num_classes}")
        if self.pos_embed_interp != manifest.pos_embed_interp:
            diffs.append(f"its position embedding was resized with {manifest.pos_embed_interp}")
        return diffs


DEFAULT_OPSET = 18
MIN_OPSET = 17  # LayerNormalization


@dataclass
class ExportOptions:
    opset: int = DEFAULT_OPSET  # ONNX opset (>= MIN_OPSET)
    check_batches: tuple[int, ...] = (1, 3)  # batch sizes ONNX Runtime is checked at against PyTorch
    atol: float = EXPORT_THRESHOLDS.max_abs  # max abs logit difference allowed at that check (docs/PARITY.md)
    force: bool = False  # replace an existing export of another model or checkpoint
