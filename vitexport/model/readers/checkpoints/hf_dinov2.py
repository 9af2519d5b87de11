"""transformers' DINOv2 (`Dinov2Model`, `Dinov2ForImageClassification`, and the same with registers) -> timm names.

What the tensors say about the structure:

- `register_tokens` (R of them): transformers adds the position embedding to the class and patch tokens, then puts
  the registers between them; timm's layout with `no_embed_class` is the same once the class token's position is
  folded into the class token itself (as timm's own DINOv2 conversion does), so nothing is resampled twice;
- a classifier reading 2 x D features: the class token beside the mean of the patch tokens (`token_avg`);
- `mlp.weights_in` / `weights_out`: the packed SwiGLU of the giant models (value and gate in one Linear).
"""

from __future__ import annotations

from typing import Any

from .common import HF_EMBEDDINGS, HF_LAYER, HF_QKV, StateDict, convert_encoder

NAME = "hf-dinov2"
ANCHOR = "embeddings.patch_embeddings.projection.weight"
_TABLE = HF_EMBEDDINGS + [
    (r"embeddings\.register_tokens", "reg_token"),
    (HF_LAYER + r"norm([12])\.(weight|bias)", r"blocks.\1.norm\2.\3"),
    (HF_LAYER + r"layer_scale([12])\.lambda1", r"blocks.\1.ls\2.gamma"),
    (HF_LAYER + r"mlp\.(fc[12])\.(weight|bias)", r"blocks.\1.mlp.\2.\3"),
    (HF_LAYER + r"mlp\.weights_in\.(weight|bias)", r"blocks.\1.mlp.fc1.\2"),
    (HF_LAYER + r"mlp\.weights_out\.(weight|bias)", r"blocks.\1.mlp.fc2.\2"),
]


def matches(keys: set[str]) -> bool:
    return any(k.endswith(ANCHOR) for k in keys) and any(".layer_scale1." in k for k in keys)


def convert(raw: dict) -> StateDict:
    out = convert_encoder(raw, ANCHOR, _TABLE, HF_QKV, {"classifier": "head"})
    if "reg_token" in out and "pos_embed" in out and "cls_token" in out:
        pos = out["pos_embed"]  # (1, 1 + N, D): the class token's position, then the patches'
        out["cls_token"] = out["cls_token"] + pos[:, :1]
        out["pos_embed"] = pos[:, 1:]
    return out


def fields(sd: StateDict) -> dict[str, Any]:
    """ViTConfig fields the converted tensors decide."""
    width = int(sd["patch_embed.proj.weight"].shape[0])
    head = sd.get("head.weight")
    registers = int(sd["reg_token"].shape[1]) if "reg_token" in sd else 0
    return {"reg_tokens": registers, "no_embed_class": bool(registers), "class_token": True,
            "global_pool": "token_avg" if head is not None and head.shape[1] == 2 * width else "token"}
