"""transformers' DINOv3 (`DINOv3ViTModel`) -> timm's EVA names for DINOv3 (model.eva, `rope='dinov3'`).

The block is EVA's: `norm1`, attention with a fused `qkv` weight and its biases as timm keeps them (a query and a
value bias without a key bias: `q_bias`/`v_bias`; all three: one `qkv` bias), LayerScale (`layer_scale1.lambda1`:
timm's `gamma_1`), `norm2`, and an MLP (`up_proj`/`down_proj`) or a gated one (`gate_proj`, `up_proj`,
`down_proj`: timm's SwiGLU `fc1_g`, `fc1_x`, `fc2`). The class token, the register tokens and the patches are in
the same order as timm's; the position is RoPE alone (no table to load).
"""

from __future__ import annotations

import re

import torch

from .common import QKV, StateDict, convert_encoder

NAME = "hf-dinov3"
ANCHOR = "embeddings.patch_embeddings.weight"
_LAYER = r"(?:model\.)?(?:encoder\.)?(?:layer|layers)\.(\d+)\."
_ATTN = _LAYER + r"attention\."
_TABLE = [
    (r"embeddings\.cls_token", "cls_token"),
    (r"embeddings\.register_tokens", "reg_token"),
    (r"embeddings\.mask_token", ""),  # masked-image modelling only
    (r"embeddings\.patch_embeddings\.(weight|bias)", r"patch_embed.proj.\1"),
    (_LAYER + r"norm([12])\.(weight|bias)", r"blocks.\1.norm\2.\3"),
    (_LAYER + r"layer_scale([12])\.lambda1", r"blocks.\1.gamma_\2"),
    (_ATTN + r"o_proj\.(weight|bias)", r"blocks.\1.attn.proj.\2"),
    (_LAYER + r"mlp\.up_proj\.(weight|bias)", r"blocks.\1.mlp.UP.\2"),  # fc1, or fc1_x beside a gate
    (_LAYER + r"mlp\.gate_proj\.(weight|bias)", r"blocks.\1.mlp.fc1_g.\2"),
    (_LAYER + r"mlp\.down_proj\.(weight|bias)", r"blocks.\1.mlp.fc2.\2"),
    (r"norm\.(weight|bias)", r"norm.\1"),
]
_QKV = _ATTN + r"(q_proj|k_proj|v_proj)\.(weight|bias)"


def matches(keys: set[str]) -> bool:
    return any(k.endswith(ANCHOR) for k in keys) and any(".layer_scale1.lambda1" in k for k in keys)


def convert(raw: dict) -> StateDict:
    biases = QKV()  # the q/k/v biases, collected apart from the weights: a key bias may be missing
    keep = {}
    for k, v in raw.items():
        m = re.fullmatch(r"(?:.*\.)?" + _ATTN + r"(q|k|v)_proj\.bias", k)
        if m:
            biases.add(int(m.group(1)), m.group(2), "bias", torch.as_tensor(v))
        else:
            keep[k] = v
    out = convert_encoder(keep, ANCHOR, _TABLE, _QKV, {"classifier": "head"})
    if "reg_token" in out and out["reg_token"].numel() == 0:  # num_register_tokens 0: an empty parameter
        del out["reg_token"]
    gated = any(k.endswith("mlp.fc1_g.weight") for k in out)
    for k in [k for k in out if ".mlp.UP." in k]:
        out[k.replace(".mlp.UP.", ".mlp.fc1_x." if gated else ".mlp.fc1.")] = out.pop(k)
    for (i, _), parts in sorted(biases.parts.items()):
        if set(parts) == {"q", "k", "v"}:
            out[f"blocks.{i}.attn.qkv.bias"] = torch.cat([parts["q"], parts["k"], parts["v"]])
        else:  # EVA's: no key bias
            out[f"blocks.{i}.attn.q_bias"], out[f"blocks.{i}.attn.v_bias"] = parts["q"], parts["v"]
    return out
