"""transformers' dense predictors (`DepthAnythingForDepthEstimation`) -> the dense model's names: the backbone's
tensors through its family's converter under `backbone.`, the neck's and head's as transformers names them
(`model.heads.dpt` keeps its module names)."""

from __future__ import annotations

from typing import Any

import torch

from . import hf_dinov2
from .common import StateDict

NAME = "hf-depth-anything"
ANCHOR = "neck.fusion_stage.layers.0.projection.weight"
BACKBONE = "backbone."


def matches(keys: set[str]) -> bool:
    return ANCHOR in keys and any(k.startswith(BACKBONE + "embeddings.") for k in keys)


def convert(raw: dict) -> StateDict:
    backbone = {k[len(BACKBONE):]: v for k, v in raw.items() if k.startswith(BACKBONE)}
    out = {BACKBONE + k: v for k, v in hf_dinov2.convert(backbone).items()}
    out.update({k: torch.as_tensor(v) for k, v in raw.items() if not k.startswith(BACKBONE)})
    return out


def fields(sd: StateDict) -> dict[str, Any]:
    """ViTConfig fields the backbone's tensors decide (its registers); nothing is pooled."""
    f = hf_dinov2.fields({k[len(BACKBONE):]: v for k, v in sd.items() if k.startswith(BACKBONE)})
    f["global_pool"] = ""
    return f
