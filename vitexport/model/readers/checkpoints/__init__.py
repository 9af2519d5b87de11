"""Checkpoints a user actually has -> the reference ViT's (timm-named) state dict.

The format is chosen from what the file contains, never from its name; each is one small module with a pure
`convert(raw tensors) -> state dict` (as timm's `checkpoint_filter_fn`s are) and, for transformers' models, the
ViTConfig fields its tensors decide (`fields`: a pooler, a projection, registers, a distillation head):

- `timm`: timm state dicts (`.pth`/`.pt`/`.bin` read with `weights_only`, or `.safetensors`);
- `jax`: the original JAX `.npz` files of google-research/vision_transformer;
- `hf_vit`: transformers' ViT and DeiT, and ViT-MSN, ViT-MAE and I-JEPA; `hf_dinov2`: DINOv2, with and without
  registers; `hf_dinov3`: DINOv3; `hf_beit`: BEiT and data2vec-vision; `hf_aimv2`: AIMv2; `hf_clip`: the CLIP,
  MetaCLIP 2, SigLIP and SigLIP2 NaFlex vision towers;
- `hf_dense`: transformers' Depth Anything and DPT (depth over DPT's own ViT or DINOv2, segmentation over its ViT):
  the backbone through `hf_vit` or `hf_dinov2`, the neck and head as named;
- `hf_detr`: transformers' RF-DETR (the windowed DINOv2 through `hf_dinov2` under `backbone.`, the projector,
  decoder and heads under `head.`, the first query group's);
- `hf_eomt`: transformers' EoMT (the ViT in timm's names under `backbone.`, its queries and predictors under `head.`);
- `hf_sam`: transformers' SAM (`SamModel`, `SamVisionModel`): the image encoder in timm's names, the prompt encoder
  and mask decoder under `decoder.` in transformers' own;
- `timm_naflex`: timm's NaFlexViT (its `embeds` module: a patch Linear, a position embedding at its own grid).

`reading` finds and reads the raw tensors; `adapt` fits them to a model. The sizes and options of a transformers
model come from its config.json (`model.hf_configs`), not from here.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType
from typing import Any

from ....errors import VitexportError
from ...labels import checkpoint_labels
from . import hf_aimv2, hf_beit, hf_dense, hf_detr, hf_dinov2, hf_dinov3, hf_eomt, hf_sam, hf_vit, jax, timm, timm_naflex
from .adapt import adapt_state_dict, describe_checkpoint, load_into
from .common import Checkpoint, StateDict
from .hf_clip import CLIP, SIGLIP
from .reading import SHARD_INDEXES, WEIGHT_FILES, read_raw, resolve_weights, weights_digest

# tried in this order: the first whose `matches` holds converts the file (timm last: the others' names are unlike it)
FORMATS: tuple[Any, ...] = (*hf_dense.FORMATS, hf_detr, hf_eomt, hf_sam, jax, CLIP, SIGLIP, hf_aimv2, hf_dinov3, hf_beit, hf_dinov2, hf_vit,
                            timm_naflex, timm)


def detect_format(raw: dict) -> ModuleType | Any:
    """The format module whose names the checkpoint holds."""
    keys = set(raw)
    for fmt in FORMATS:
        if fmt.matches(keys):
            return fmt
    raise VitexportError("The checkpoint's tensor names match no known ViT format (timm, JAX .npz, or transformers' "
                         "ViT, DeiT, ViT-MSN, ViT-MAE, I-JEPA, DINOv2, DINOv3, BEiT, data2vec-vision, AIMv2, CLIP, "
                         "MetaCLIP 2, SigLIP, Depth Anything, DPT, EoMT, SAM or RF-DETR).")


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint file or directory into timm names, with the config facts it carries."""
    weights, config = resolve_weights(Path(path))
    raw = read_raw(weights)
    fmt = detect_format(raw)
    try:
        sd = fmt.convert(raw)
    except KeyError as e:
        raise VitexportError(f"Checkpoint {weights} ({fmt.NAME} format) lacks tensor {e.args[0]!r}.") from None
    fields_ = fmt.fields(sd) if hasattr(fmt, "fields") else {}
    hints: dict = dict(fmt.hints(raw)) if hasattr(fmt, "hints") else {}
    if fmt.NAME.startswith("hf-"):
        hints.update(_transformers_hints(config))
    if names := checkpoint_labels(config):
        hints["labels"] = names  # class names, in head order
    return Checkpoint(sd, fmt.NAME, weights, weights_digest(weights), hints, fields_)


def _transformers_hints(config: dict) -> dict:
    """The facts a weights file's config.json adds when the model is named with -m: LayerNorm eps, qkv bias and
    the grid the position embedding was trained at (a SigLIP or CLIP config nests them under vision_config, a dense
    model with a backbone under backbone_config: DPT's own image and patch size are not its DINOv2's)."""
    nested = next((config[k] for k in ("vision_config", "backbone_config") if isinstance(config.get(k), dict)), None)
    cfg = config if nested is None else nested
    hints: dict = {}
    if isinstance(cfg.get("layer_norm_eps"), (int, float)):
        hints["norm_eps"] = float(cfg["layer_norm_eps"])
    if isinstance(cfg.get("qkv_bias"), bool):
        hints["qkv_bias"] = cfg["qkv_bias"]
    img, patch, patches = cfg.get("image_size"), cfg.get("patch_size"), cfg.get("num_patches")
    if isinstance(patches, int) and 0 < patches and math.isqrt(patches) ** 2 == patches:  # SigLIP2 NaFlex's grid
        hints["grid"] = (math.isqrt(patches), math.isqrt(patches))
    elif isinstance(img, int) and isinstance(patch, int) and 0 < patch <= img:
        hints["grid"] = (img // patch, img // patch)
    return hints


__all__ = ["FORMATS", "SHARD_INDEXES", "WEIGHT_FILES", "Checkpoint", "StateDict", "adapt_state_dict",
           "describe_checkpoint", "detect_format", "load_checkpoint", "load_into", "read_raw", "resolve_weights",
           "weights_digest"]
