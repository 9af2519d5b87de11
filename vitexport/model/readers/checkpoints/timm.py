"""timm's own state dicts: already the reference ViT's names. Two of timm's own renames on loading are done here too:
SAM's classifier head (`head.fc.*`, timm's ClassifierHead over the neck's map) is the model's `head.*`, and the
original Segment Anything checkpoint's image encoder (`image_encoder.*`, its MLP's `lin1`/`lin2`) is read as timm's
`checkpoint_filter_fn` reads it, its prompt encoder and mask decoder left out."""

from __future__ import annotations

import torch

from .common import StateDict

NAME = "timm"
SAM_ENCODER = "image_encoder."


def matches(keys: set[str]) -> bool:
    return any(k.endswith("patch_embed.proj.weight") for k in keys)


def convert(raw: dict) -> StateDict:
    sd = {k: torch.as_tensor(v) for k, v in raw.items()}
    if SAM_ENCODER + "patch_embed.proj.weight" in sd:  # the original SAM checkpoint
        sd = {k.removeprefix(SAM_ENCODER).replace("mlp.lin", "mlp.fc"): v for k, v in sd.items()
              if k.startswith(SAM_ENCODER)}
    if "head.fc.weight" in sd and ("neck.0.weight" in sd or "neck.weight" in sd):  # SAM's ClassifierHead
        sd = {("head." + k.removeprefix("head.fc.")) if k.startswith("head.fc.") else k: v for k, v in sd.items()}
    # drop what the reference ViT has no place for (pre-logits representation layer of old checkpoints)
    return {k: v for k, v in sd.items() if not k.startswith("pre_logits.")}
