"""transformers' ViT and DeiT (`ViTModel`, `ViTForImageClassification`, `DeiTModel`, `DeiTForImageClassification`,
`DeiTForImageClassificationWithTeacher`), and the towers built like them without a pooler: ViT-MSN, ViT-MAE (its
encoder, unmasked; the pixel decoder of `ViTMAEForPreTraining` is left out) and I-JEPA (no class token) -> timm
names.

They share their layer names. What the tensors say about the structure:

- `pooler.dense` (a Model saved with its pooling layer): timm's representation layer, Linear + tanh
  (`pre_logits`), whose output is transformers' `pooler_output`;
- DeiT's `distillation_token`: with `distillation_classifier` (WithTeacher) the distilled ViT, both heads averaged
  as transformers does at inference; without it, a token that only takes part in attention, which is exactly a
  register token placed after the class token with its own position (the position embedding covers it).
"""

from __future__ import annotations

from typing import Any

from .common import HF_EMBEDDINGS, HF_LAYER, HF_QKV, StateDict, convert_encoder

NAME = "hf-vit"
ANCHOR = "embeddings.patch_embeddings.projection.weight"
_TABLE = HF_EMBEDDINGS + [
    (HF_LAYER + r"layernorm_before\.(weight|bias)", r"blocks.\1.norm1.\2"),
    (HF_LAYER + r"layernorm_after\.(weight|bias)", r"blocks.\1.norm2.\2"),
    (HF_LAYER + r"(?:intermediate\.dense|mlp\.fc1)\.(weight|bias)", r"blocks.\1.mlp.fc1.\2"),
    (HF_LAYER + r"(?:output\.dense|mlp\.fc2)\.(weight|bias)", r"blocks.\1.mlp.fc2.\2"),
    (r"pooler\.dense\.(weight|bias)", r"pre_logits.fc.\1"),
]
_HEADS = {"classifier": "head", "cls_classifier": "head", "distillation_classifier": "head_dist"}


def matches(keys: set[str]) -> bool:
    return any(k.endswith(ANCHOR) for k in keys) and any("layernorm_before" in k for k in keys)


def convert(raw: dict) -> StateDict:
    out = convert_encoder(raw, ANCHOR, _TABLE, HF_QKV, _HEADS, drop=("decoder.",))  # ViT-MAE's pixel decoder
    if "embeddings.distillation_token" in out:
        token = out.pop("embeddings.distillation_token")
        out["dist_token" if "head_dist.weight" in out else "reg_token"] = token
    return out


def fields(sd: StateDict) -> dict[str, Any]:
    """ViTConfig fields the converted tensors decide: a pooler pools the class token; a classifier without one reads
    the class token (ViT, DeiT, ViT-MSN) or, without a class token, the mean of the tokens (I-JEPA); with neither,
    the family's config says (ViT's pooled output is its class token; the towers without a pooler give tokens)."""
    cls = "cls_token" in sd
    f: dict[str, Any] = {"distilled": "dist_token" in sd, "reg_tokens": int(sd["reg_token"].shape[1])
                         if "reg_token" in sd else 0, "no_embed_class": False, "class_token": cls,
                         "pre_logits_size": 0}
    if "pre_logits.fc.weight" in sd:
        f.update(pre_logits_size=int(sd["pre_logits.fc.weight"].shape[0]), pre_logits_act="tanh",
                 pre_logits_bias="pre_logits.fc.bias" in sd, global_pool="token")
    elif "head.weight" in sd:  # I-JEPA's classifier averages the normalised tokens (no norm after the mean)
        f.update(global_pool="token") if cls else f.update(global_pool="avg", fc_norm=False)
    return f
