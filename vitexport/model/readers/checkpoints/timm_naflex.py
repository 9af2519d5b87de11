"""timm's NaFlexViT state dicts (naflexvit.py: the SigLIP2 NaFlex towers, NVIDIA's C-RADIO, the NaFlexViT
baselines) -> the reference ViT's names.

NaFlexViT keeps its embedding in one module, `embeds`: a Linear over patches flattened channels last (P, P, C), the
class and register tokens, and a position embedding at its own grid, learned (1, H, W, D) or factorized into a row
and a column table. Used on image tensors it is a ViT, so the tensors move to where VisionTransformer keeps them:

- `embeds.proj.weight` (D, P*P*C) -> the patch convolution `patch_embed.proj.weight` (D, C, P, P);
- `embeds.pos_embed` (1, H, W, D) -> `pos_embed` (1, H*W, D), its grid a hint (resampled to the model's grid with
  the architecture's own method, as NaFlexViT resamples it for each input);
- `embeds.pos_embed_y` (1, H, D) and `embeds.pos_embed_x` (1, W, D) -> their sum at every grid position: each
  table resampled linearly and summed is that sum resampled bilinearly (both are linear and separable);
- `embeds.cls_token`, `embeds.reg_token`, `embeds.norm` -> `cls_token`, `reg_token`, `patch_embed.norm`.
"""

from __future__ import annotations

import math

import torch

from ....errors import VitexportError
from .common import StateDict

NAME = "timm-naflex"
IN_CHANS = 3  # vitexport's inputs are RGB


def matches(keys: set[str]) -> bool:
    return any(k == "embeds.proj.weight" or k.endswith(".embeds.proj.weight") for k in keys)


def _prefix(raw: dict) -> str:
    key = next(k for k in raw if k == "embeds.proj.weight" or k.endswith(".embeds.proj.weight"))
    return key[: -len("embeds.proj.weight")]


def _conv_weight(w: torch.Tensor) -> torch.Tensor:
    """(D, P*P*C) channels-last patch Linear -> (D, C, P, P); a convolution's weight stays as it is."""
    if w.ndim == 4:
        return w
    d, k = w.shape
    p = math.isqrt(k // IN_CHANS)
    if p * p * IN_CHANS != k:
        raise VitexportError(f"The NaFlexViT patch embedding reads {k} values a patch, not a square patch of "
                             f"{IN_CHANS} channels.")
    return w.reshape(d, p, p, IN_CHANS).permute(0, 3, 1, 2).contiguous()


def convert(raw: dict) -> StateDict:
    prefix = _prefix(raw)
    sd: StateDict = {}
    for k, v in raw.items():
        if not k.startswith(prefix):
            continue
        k, v = k[len(prefix):], torch.as_tensor(v)
        if k == "embeds.proj.weight":
            sd["patch_embed.proj.weight"] = _conv_weight(v)
        elif k == "embeds.pos_embed":
            sd["pos_embed"] = v.reshape(1, -1, v.shape[-1]) if v.ndim == 4 else v
        elif k in ("embeds.pos_embed_y", "embeds.pos_embed_x"):
            continue
        elif k.startswith("embeds."):
            rest = k[len("embeds."):]
            sd[{"cls_token": "cls_token", "reg_token": "reg_token"}.get(rest, "patch_embed." + rest)] = v
        else:
            sd[k] = v
    if prefix + "embeds.pos_embed_y" in raw:
        y = torch.as_tensor(raw[prefix + "embeds.pos_embed_y"])  # (1, H, D)
        x = torch.as_tensor(raw[prefix + "embeds.pos_embed_x"])  # (1, W, D)
        sd["pos_embed"] = (y[:, :, None] + x[:, None, :]).reshape(1, -1, y.shape[-1])  # (1, H*W, D)
    return sd


def hints(raw: dict) -> dict:
    """The grid the position embedding was stored at."""
    prefix = _prefix(raw)
    pe = raw.get(prefix + "embeds.pos_embed")
    if pe is not None and pe.ndim == 4:
        return {"grid": (int(pe.shape[1]), int(pe.shape[2]))}
    if prefix + "embeds.pos_embed_y" in raw:
        return {"grid": (int(raw[prefix + "embeds.pos_embed_y"].shape[1]),
                         int(raw[prefix + "embeds.pos_embed_x"].shape[1]))}
    return {}
