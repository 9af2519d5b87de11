"""transformers' AIMv2 vision tower (`Aimv2VisionModel`) -> timm's AIMv2 names (vision_transformer.py's `aimv2_*`:
RMSNorm after the patch embedding and in the blocks, SwiGLU, no class token), with its pooling head as an attention
pool.

The head (`head`: a learned query `cls_token` attending to the normalised tokens through `k_proj` and `v_proj`, then
`output_proj`) is timm's AttentionPoolLatent without its MLP and norm (`pool_mlp_ratio=0`) and without a query
projection: the converter gives the pool an identity one (and zero biases where AIMv2 has none), which computes
exactly the same thing.
"""

from __future__ import annotations

from typing import Any

import torch

from .common import StateDict, convert_encoder

NAME = "hf-aimv2"
ANCHOR = "embeddings.patch_embed.weight"
_LAYER = r"encoder\.layers\.(\d+)\."
_QKV = _LAYER + r"attention\.(q_proj|k_proj|v_proj)\.(weight|bias)"
_TABLE = [
    (r"embeddings\.patch_embed\.(weight|bias)", r"patch_embed.proj.\1"),
    (r"embeddings\.rms_norm\.weight", "patch_embed.norm.weight"),
    (r"embeddings\.position_ids", ""),  # a buffer
    (_LAYER + r"rms_norm([12])\.weight", r"blocks.\1.norm\2.weight"),
    (_LAYER + r"attention\.out_proj\.(weight|bias)", r"blocks.\1.attn.proj.\2"),
    (_LAYER + r"ffn\.gate_proj\.(weight|bias)", r"blocks.\1.mlp.fc1_g.\2"),
    (_LAYER + r"ffn\.up_proj\.(weight|bias)", r"blocks.\1.mlp.fc1_x.\2"),
    (_LAYER + r"ffn\.down_proj\.(weight|bias)", r"blocks.\1.mlp.fc2.\2"),
    (r"rms_norm\.weight", "norm.weight"),
    (r"head\.cls_token", "attn_pool.latent"),
    (r"head\.output_proj\.(weight|bias)", r"attn_pool.proj.\1"),
]


def matches(keys: set[str]) -> bool:
    return any(k.endswith(ANCHOR) for k in keys) and any(".ffn.gate_proj." in k for k in keys)


def convert(raw: dict) -> StateDict:
    out = convert_encoder(raw, ANCHOR, _TABLE, _QKV, {})
    if "embeddings.position_embedding.weight" in out:
        out["pos_embed"] = out.pop("embeddings.position_embedding.weight").unsqueeze(0)  # (N, D) -> (1, N, D)
    if "head.k_proj.weight" in out:
        k, v = out.pop("head.k_proj.weight"), out.pop("head.v_proj.weight")
        d = k.shape[0]
        zeros = torch.zeros(d, dtype=k.dtype)
        kb, vb = out.pop("head.k_proj.bias", zeros), out.pop("head.v_proj.bias", zeros)
        out["attn_pool.kv.weight"], out["attn_pool.kv.bias"] = torch.cat([k, v]), torch.cat([kb, vb])
        out["attn_pool.q.weight"], out["attn_pool.q.bias"] = torch.eye(d, dtype=k.dtype), zeros.clone()
    return out


def fields(sd: StateDict) -> dict[str, Any]:
    """ViTConfig fields the converted tensors decide: the head (an attention pool without MLP), else the tokens."""
    if "attn_pool.latent" in sd:
        return {"global_pool": "map", "pool_mlp_ratio": 0.0}
    return {"global_pool": ""}
