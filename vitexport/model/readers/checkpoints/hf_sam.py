"""transformers' Segment Anything (`SamModel`, `SamVisionModel`) -> SAM's image encoder in timm's names
(`model.sam.SamViT`), and `SamModel`'s prompt encoder and mask decoder under `decoder.` in transformers' own names
(`heads.sam_decoder.SamPromptDecoder`), the tied copy of the shared positional embedding left out."""

from __future__ import annotations

from typing import Any

import torch

from .common import StateDict, rename

NAME = "hf-sam"
ENCODER = "vision_encoder."
DECODER = "decoder."
DECODER_MODULES = ("shared_image_embedding.", "prompt_encoder.", "mask_decoder.")
TIED = "prompt_encoder.shared_embedding.positional_embedding"  # = shared_image_embedding.positional_embedding
_LAYER = r"vision_encoder\.layers\.(\d+)\."
_TABLE = [
    (r"vision_encoder\.patch_embed\.projection\.(weight|bias)", r"patch_embed.proj.\1"),
    (r"vision_encoder\.pos_embed", "pos_embed"),
    (_LAYER + r"layer_norm([12])\.(weight|bias)", r"blocks.\1.norm\2.\3"),
    (_LAYER + r"attn\.(qkv|proj)\.(weight|bias)", r"blocks.\1.attn.\2.\3"),
    (_LAYER + r"attn\.(rel_pos_[hw])", r"blocks.\1.attn.\2"),
    (_LAYER + r"mlp\.lin([12])\.(weight|bias)", r"blocks.\1.mlp.fc\2.\3"),
    (r"vision_encoder\.neck\.conv1\.weight", "neck.0.weight"),
    (r"vision_encoder\.neck\.layer_norm1\.(weight|bias)", r"neck.1.\1"),
    (r"vision_encoder\.neck\.conv2\.weight", "neck.2.weight"),
    (r"vision_encoder\.neck\.layer_norm2\.(weight|bias)", r"neck.3.\1"),
]


def matches(keys: set[str]) -> bool:
    return "vision_encoder.patch_embed.projection.weight" in keys and any(k.startswith("vision_encoder.neck.")
                                                                            for k in keys)


def convert(raw: dict) -> StateDict:
    tensors = {k: torch.as_tensor(v) for k, v in raw.items()}
    encoder = rename({k: v for k, v in tensors.items() if k.startswith(ENCODER)}, _TABLE)
    decoder = {k: v for k, v in tensors.items() if k.startswith(DECODER_MODULES) and k != TIED}
    if decoder and "shared_image_embedding.positional_embedding" not in decoder and TIED in tensors:
        decoder["shared_image_embedding.positional_embedding"] = tensors[TIED]
    return {**encoder, **{DECODER + k: v for k, v in decoder.items()}}


def fields(sd: StateDict) -> dict[str, Any]:
    """No class token, the neck's map; absolute positions when the checkpoint has them."""
    return {"class_token": False, "abs_pos_embed": "pos_embed" in sd,
            "rel_pos_bias": "decomposed" if "blocks.0.attn.rel_pos_h" in sd else ""}
