"""transformers' EoMT (`EomtForUniversalSegmentation`, and `EomtDinov3ForUniversalSegmentation`: a DINOv3 ViT through
`hf_dinov3`) -> the dense model's names: the ViT's tensors (DINOv2-like blocks with q/k/v projections, a position
embedding of the patches alone as an `nn.Embedding`, registers) under `backbone.` in timm's names, the head's (`query`, `class_predictor`, `mask_head`, `upscale_block`,
`attn_mask_probs`) under `head.` as transformers names them; the loss's `criterion.*` left out."""

from __future__ import annotations

from typing import Any

import torch

from . import hf_dinov3
from .common import HF_LAYER, QKV, StateDict, rename

NAME = "hf-eomt"
ANCHOR = "class_predictor.weight"
BACKBONE = "backbone."
HEAD_MODULES = ("query.", "class_predictor.", "mask_head.", "upscale_block.", "attn_mask_probs")
_TABLE = [
    (r"embeddings\.cls_token", "cls_token"),
    (r"embeddings\.register_tokens", "reg_token"),
    (r"embeddings\.patch_embeddings\.projection\.(weight|bias)", r"patch_embed.proj.\1"),
    (HF_LAYER + r"norm([12])\.(weight|bias)", r"blocks.\1.norm\2.\3"),
    (HF_LAYER + r"layer_scale([12])\.lambda1", r"blocks.\1.ls\2.gamma"),
    (HF_LAYER + r"attention\.out_proj\.(weight|bias)", r"blocks.\1.attn.proj.\2"),
    (HF_LAYER + r"mlp\.(fc[12])\.(weight|bias)", r"blocks.\1.mlp.\2.\3"),
    (HF_LAYER + r"mlp\.gate_proj\.(weight|bias)", r"blocks.\1.mlp.fc1_g.\2"),
    (HF_LAYER + r"mlp\.up_proj\.(weight|bias)", r"blocks.\1.mlp.fc1_x.\2"),
    (HF_LAYER + r"mlp\.down_proj\.(weight|bias)", r"blocks.\1.mlp.fc2.\2"),
    (r"layernorm\.(weight|bias)", r"norm.\1"),
]
_QKV = HF_LAYER + r"attention\.(q_proj|k_proj|v_proj)\.(weight|bias)"


def matches(keys: set[str]) -> bool:
    return ANCHOR in keys and "query.weight" in keys and any(k.startswith("upscale_block.") for k in keys)


def convert(raw: dict) -> StateDict:
    tensors = {k: torch.as_tensor(v) for k, v in raw.items() if not k.startswith("criterion.")}
    head = {k: v for k, v in tensors.items() if k.startswith(HEAD_MODULES)}
    if "embeddings.patch_embeddings.weight" in tensors:  # EoMT-DINOv3: a DINOv3 ViT, its final norm 'layernorm'
        rest = {("norm." + k.removeprefix("layernorm.")) if k.startswith("layernorm.") else k: v
                for k, v in tensors.items() if k not in head}
        backbone = hf_dinov3.convert(rest)
        return {**{BACKBONE + k: v for k, v in backbone.items()}, **{"head." + k: v for k, v in head.items()}}
    qkv = QKV()
    backbone = rename({k: v for k, v in tensors.items() if k not in head and
                       k != "embeddings.position_embeddings.weight"}, _TABLE, qkv, _QKV)
    backbone.update(qkv.fused())
    if "embeddings.position_embeddings.weight" in tensors:  # (N, D) of the patches alone -> (1, N, D)
        backbone["pos_embed"] = tensors["embeddings.position_embeddings.weight"][None]
    return {**{BACKBONE + k: v for k, v in backbone.items()}, **{"head." + k: v for k, v in head.items()}}


def fields(sd: StateDict) -> dict[str, Any]:
    """The registers; the position embedding covers the patches alone; nothing is pooled."""
    reg = sd.get(BACKBONE + "reg_token")
    f: dict[str, Any] = {"reg_tokens": int(reg.shape[1]) if reg is not None else 0, "class_token": True,
                         "global_pool": ""}
    if BACKBONE + "pos_embed" in sd:  # EoMT's learned table; EoMT-DINOv3 has RoPE alone
        f["no_embed_class"] = True
    return f
