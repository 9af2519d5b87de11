"""transformers' RF-DETR (`RfDetrForObjectDetection`) -> the detector's names (model.detection): the windowed DINOv2's
tensors through `hf_dinov2` under `backbone.`, the projector, the two-stage selection, the decoder and the heads under
`head.` as transformers names them (heads/detr.py keeps its module names), with four differences:

- inference uses the first of the training's query groups alone: group 0's `enc_output.0` (and its norm, class and
  box heads) without its index, the other groups' left out, and the first num_queries rows of `query_feat` and
  `reference_point_embed` (a group's queries are a slice of those tables);
- a box or position MLP's `layers.0 .. layers.n` are SAM's FeedForward's `proj_in`, `layers.*`, `proj_out`;
- the decoder's self-attention `o_proj` is SAM's attention's `out_proj` (the same module);
- `model.backbone.projector.` is `head.projector.`.

A folder `save_pretrained` wrote holds the original RF-DETR layout (`backbone.0.encoder.encoder.*`, `transformer.*`,
`refpoint_embed`, a fused `in_proj_weight`), which transformers renames when it loads (its conversion_mapping's
RfDetrModel entries, repeated here as `_ORIGINAL`); a model object's state dict has transformers' own names. Both are
read.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from . import hf_dinov2
from .common import StateDict

NAME = "hf-rf-detr"
BACKBONE_PREFIX = "model.backbone.backbone."
ANCHOR = "model.decoder.layers.0.cross_attn.sampling_offsets.weight"
_MLPS = ("enc_out_bbox_embed.", "bbox_embed.", "decoder.ref_point_head.")
_GROUPED = ("enc_output.", "enc_output_norm.", "enc_out_class_embed.", "enc_out_bbox_embed.")
# the original layout -> transformers' names, in conversion_mapping's order (each a re.sub on every name)
_ORIGINAL = [
    (r"^backbone\.0\.encoder\.encoder\.", "backbone.backbone."),
    (r"^backbone\.0\.projector\.", "backbone.projector."),
    (r"projector\.stages\.0\.0\.cv([12])\.conv", r"projector.projector_layer.conv\1.conv"),
    (r"projector\.stages\.0\.0\.cv([12])\.bn", r"projector.projector_layer.conv\1.norm"),
    (r"projector\.stages\.0\.1\.", "projector.layer_norm."),
    (r"projector\.stages\.0\.0\.m\.(\d+)\.cv([12])\.conv", r"projector.projector_layer.bottlenecks.\1.conv\2.conv"),
    (r"projector\.stages\.0\.0\.m\.(\d+)\.cv([12])\.bn", r"projector.projector_layer.bottlenecks.\1.conv\2.norm"),
    (r"^transformer\.decoder\.", "decoder."),
    (r"^decoder\.layers\.(\d+)\.norm1\.", r"decoder.layers.\1.self_attn_layer_norm."),
    (r"^decoder\.layers\.(\d+)\.norm2\.", r"decoder.layers.\1.cross_attn_layer_norm."),
    (r"^decoder\.layers\.(\d+)\.linear([12])\.", r"decoder.layers.\1.mlp.fc\2."),
    (r"^decoder\.layers\.(\d+)\.norm3\.", r"decoder.layers.\1.layer_norm."),
    (r"^decoder\.norm\.", "decoder.layernorm."),
    (r"^transformer\.enc_", "enc_"),
    (r"^refpoint_embed\.", "reference_point_embed."),
    (r"attention\.attention\.query\.", "attention.q_proj."),
    (r"attention\.attention\.key\.", "attention.k_proj."),
    (r"attention\.attention\.value\.", "attention.v_proj."),
    (r"attention\.output\.dense\.", "attention.o_proj."),
    (r"self_attn\.out_proj\.", "self_attn.o_proj."),
]
_TOP = ("class_embed.", "bbox_embed.")  # RfDetrForObjectDetection's own modules; the rest is its `model.`
_LAYER = re.compile(r"^(?P<mlp>.*?)layers\.(?P<i>\d+)\.(?P<rest>weight|bias)$")


def _original(keys: set[str]) -> bool:
    return any(k.startswith("backbone.0.encoder.encoder.embeddings.") for k in keys) and \
        "transformer.decoder.layers.0.cross_attn.sampling_offsets.weight" in keys


def matches(keys: set[str]) -> bool:
    return _original(keys) or (ANCHOR in keys and "model.query_feat.weight" in keys and
                               any(k.startswith(BACKBONE_PREFIX + "embeddings.") for k in keys))


def as_transformers(raw: dict) -> dict:
    """The original layout's names as transformers' (the fused self-attention projection split in three); a state
    dict already in transformers' names as it is."""
    if not _original(set(raw)):
        return raw
    out = {}
    for k, v in raw.items():
        for pattern, new in _ORIGINAL:
            k = re.sub(pattern, new, k)
        if ".self_attn.in_proj_" in k:
            for part, chunk in zip(("q_proj", "k_proj", "v_proj"), torch.as_tensor(v).chunk(3, dim=0)):
                out["model." + k.replace("in_proj_weight", f"{part}.weight").replace("in_proj_bias", f"{part}.bias")] = chunk
            continue
        out[k if k.startswith(_TOP) else "model." + k] = v
    return out


def _mlp_depths(head: dict[str, torch.Tensor]) -> dict[str, int]:
    """Each MLP's number of Linears, from its tensors."""
    depths: dict[str, int] = {}
    for k in head:
        for mlp in _MLPS:
            m = _LAYER.match(k[len(mlp):]) if k.startswith(mlp) and "decoder.layers." not in k else None
            if m is not None and not m["mlp"]:
                depths[mlp] = max(depths.get(mlp, 0), int(m["i"]) + 1)
    return depths


def _renamed(k: str, depths: dict[str, int]) -> str:
    for mlp, n in depths.items():
        if k.startswith(mlp) and "decoder.layers." not in k:
            m = _LAYER.match(k[len(mlp):])
            if m is not None and not m["mlp"]:
                i = int(m["i"])
                part = "proj_in" if i == 0 else "proj_out" if i == n - 1 else f"layers.{i - 1}"
                return f"{mlp}{part}.{m['rest']}"
    return k.replace(".self_attn.o_proj.", ".self_attn.out_proj.")


def convert(raw: dict) -> StateDict:
    tensors = {k: torch.as_tensor(v) for k, v in as_transformers(raw).items()}
    backbone = hf_dinov2.convert({k[len(BACKBONE_PREFIX):]: v for k, v in tensors.items()
                                  if k.startswith(BACKBONE_PREFIX)})
    head: dict[str, torch.Tensor] = {}
    for k, v in tensors.items():
        if k.startswith(BACKBONE_PREFIX):
            continue
        k = k.removeprefix("model.").replace("backbone.projector.", "projector.")
        if k.startswith(_GROUPED):  # the first query group's
            name, _, rest = k.partition(".")
            group, _, rest = rest.partition(".")
            if group != "0":
                continue
            k = f"{name}.{rest}"
        head[k] = v
    depths = _mlp_depths(head)
    out = {"backbone." + k: v for k, v in backbone.items()}
    out.update({"head." + _renamed(k, depths): v for k, v in head.items()})
    return out


def fields(sd: StateDict) -> dict[str, Any]:
    """ViTConfig fields the tensors decide: the backbone's class token, nothing pooled."""
    return {"reg_tokens": 0, "no_embed_class": False, "class_token": True, "global_pool": ""}

