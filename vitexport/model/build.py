"""The model a config describes: its family's class (`vit.VisionTransformer`, `eva.Eva`, `beit.Beit`,
`sam.SamViT`), built with deterministic weights."""

from __future__ import annotations

from torch import nn

from .base import TransformerBase
from .beit import Beit
from .config import ViTConfig
from .dense import DenseBase, DenseModel, EomtModel
from .detection import DetrModel
from .eva import Eva
from .sam import SamViT
from .vit import VisionTransformer

MODEL_CLASSES: dict[str, type[TransformerBase]] = {"vit": VisionTransformer, "eva": Eva, "beit": Beit, "sam": SamViT}


def model_class(cfg: ViTConfig) -> type[TransformerBase]:
    return MODEL_CLASSES[cfg.family]


def build_model(cfg: ViTConfig, seed: int = 0) -> TransformerBase | DenseBase:
    """A model in eval mode with deterministic weights (overwrite them with a checkpoint to use it); a config with a
    dense or detection head: its family's model as the backbone, the head over it (`dense.DenseModel`,
    `detection.DetrModel`)."""
    if cfg.dense is not None:
        dense = {"eomt": EomtModel, "rf_detr": DetrModel}.get(cfg.dense.head, DenseModel)
        return dense(cfg, model_class(cfg)(cfg)).init_weights(seed).eval()
    return model_class(cfg)(cfg).init_weights(seed).eval()


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["MODEL_CLASSES", "build_model", "count_params", "model_class"]
