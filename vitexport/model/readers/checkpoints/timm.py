"""timm's own state dicts: already the reference ViT's names."""

from __future__ import annotations

import torch

from .common import StateDict

NAME = "timm"


def matches(keys: set[str]) -> bool:
    return any(k.endswith("patch_embed.proj.weight") for k in keys)


def convert(raw: dict) -> StateDict:
    sd = {k: torch.as_tensor(v) for k, v in raw.items()}
    # drop what the reference ViT has no place for (pre-logits representation layer of old checkpoints)
    return {k: v for k, v in sd.items() if not k.startswith("pre_logits.")}
