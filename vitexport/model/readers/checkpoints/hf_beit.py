"""transformers' BEiT and data2vec-vision (`BeitModel`, `BeitForImageClassification`, `Data2VecVisionModel`,
`Data2VecVisionForImageClassification`) -> timm's `Beit` names (model.beit).

Their blocks are ViT's names with BEiT's parts: a query and a value bias without a key bias (timm's `q_bias`,
`v_bias` beside one fused `qkv` weight), LayerScale as `lambda_1`/`lambda_2` (timm's `gamma_1`/`gamma_2`), and a
relative position bias table per layer or one shared by the encoder (`rel_pos_bias`), laid out as the original
BEiT's (and timm's) rows. Mean pooling normalises the mean of the patch tokens with `pooler.layernorm` (timm's
`fc_norm`); without it the final `layernorm` normalises every token and the class token is pooled.
"""

from __future__ import annotations

from typing import Any

from .common import HF_EMBEDDINGS, HF_LAYER, StateDict, convert_encoder

NAME = "hf-beit"
ANCHOR = "embeddings.patch_embeddings.projection.weight"
_ATTN = HF_LAYER + r"attention\.(?:attention\.)?"
_TABLE = HF_EMBEDDINGS + [
    (HF_LAYER + r"lambda_([12])", r"blocks.\1.gamma_\2"),
    (HF_LAYER + r"layernorm_before\.(weight|bias)", r"blocks.\1.norm1.\2"),
    (HF_LAYER + r"layernorm_after\.(weight|bias)", r"blocks.\1.norm2.\2"),
    (HF_LAYER + r"(?:intermediate\.dense|mlp\.fc1)\.(weight|bias)", r"blocks.\1.mlp.fc1.\2"),
    (HF_LAYER + r"(?:output\.dense|mlp\.fc2)\.(weight|bias)", r"blocks.\1.mlp.fc2.\2"),
    (_ATTN + r"(?:query|q_proj)\.bias", r"blocks.\1.attn.q_bias"),
    (_ATTN + r"(?:value|v_proj)\.bias", r"blocks.\1.attn.v_bias"),
    (HF_LAYER + r"(?:attention\.)?(?:attention\.)?relative_position_bias\.relative_position_bias_table",
     r"blocks.\1.attn.relative_position_bias_table"),
    (r"(?:encoder\.)?relative_position_bias\.relative_position_bias_table",
     "rel_pos_bias.relative_position_bias_table"),
    (r".*relative_position_index", ""),  # a buffer older checkpoints saved: the model computes its own
    (r"pooler\.layernorm\.(weight|bias)", r"fc_norm.\1"),
]
_QKV_WEIGHTS = _ATTN + r"(query|key|value|q_proj|k_proj|v_proj)\.(weight)"


def matches(keys: set[str]) -> bool:
    """BEiT's names: LayerScale as lambda_N, a relative position table, or a query bias without a key bias."""
    if not any(k.endswith(ANCHOR) for k in keys):
        return False
    q_bias = any(k.endswith(("query.bias", "q_proj.bias")) for k in keys)
    k_bias = any(k.endswith(("key.bias", "k_proj.bias")) for k in keys)
    return any(".lambda_1" in k or "relative_position_bias_table" in k for k in keys) or (q_bias and not k_bias)


def convert(raw: dict) -> StateDict:
    return convert_encoder(raw, ANCHOR, _TABLE, _QKV_WEIGHTS, {"classifier": "head"})


def hints(raw: dict) -> dict[str, Any]:
    """transformers resamples the tables bilinearly at another window (not with timm's geometric spacing)."""
    return {"rel_pos_resample": "bilinear"}


def fields(sd: StateDict) -> dict[str, Any]:
    """A mean-pooling model saved without its pooler (`Data2VecVisionModel`'s default): no norm at all after the
    blocks, and no pooled output (transformers' pooler_output is None); its users take the tokens as they are."""
    if "fc_norm.weight" in sd or "norm.weight" in sd:
        return {}
    return {"global_pool": "", "fc_norm": False, "final_norm": False}
