"""transformers' vision towers as vitexport's ViT: a `config.json` (and `preprocessor_config.json`) -> the ViTConfig
fields, the preprocessing, and how the position embedding is resampled, for any size the config describes.

One `Family` per `model_type`. Each reads the config as transformers' config class does (its defaults where a key
is absent: configs on the hub often omit them) and says what the family is built of; the weights' converter
(`checkpoints.hf_*`) adds what only the tensors show (a pooler, a projection, a distillation head). No torch here:
the CLI resolves a model before anything heavy is imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from ...data.preprocess import Preprocess
from ...errors import VitexportError
from ..config import MAX_SIDE, to_2tuple

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
HALF = (0.5, 0.5, 0.5)
# transformers' activation names (ACT2FN) -> ViTConfig's; the tanh approximations are one function
ACTIVATIONS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh",
               "quick_gelu": "quick_gelu", "silu": "silu", "swish": "silu"}
RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}  # PIL's numbering, as processors save it
_BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
         "num_channels": 3, "image_size": 224}  # what every family's config class defaults to


@dataclass(frozen=True)
class Processing:
    """A family's documented preprocessing, relative to the input size."""

    crop_mode: str
    crop_pct: float
    interpolation: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    text: str  # what it does, for the note that says it was assumed

    def at(self, size: tuple[int, int]) -> Preprocess:
        return Preprocess(input_size=size, mean=self.mean, std=self.std, crop_pct=self.crop_pct,
                          interpolation=self.interpolation, crop_mode=self.crop_mode)


@dataclass(frozen=True)
class Family:
    """One transformers model type vitexport builds."""

    model_type: str  # config.json's model_type
    title: str  # as its users know it
    defaults: dict[str, Any]  # the config class's defaults for the keys read here
    build: Callable[[Callable[[str], Any]], dict[str, Any]]  # (config reader) -> its structure's ViTConfig fields
    pos_embed_interp: str  # how transformers resamples its position embedding (posembed.INTERPOLATIONS)
    processing: "Processing"  # its documented preprocessing, for a folder without preprocessor_config.json
    square_int: bool = True  # an old processor's `size: N` means N x N (else: the shorter side to N)
    nested: bool = False  # a whole two-tower model: the vision tower's config is under vision_config
    pooler: bool = True  # the model has a pooled output; without one, a checkpoint without a classifier gives tokens
    naflex: bool = False  # patches in (SigLIP2 NaFlex): a square image of the processor's max_num_patches

    def config_fields(self, cfg: dict[str, Any], where: str) -> dict[str, Any]:
        """The ViTConfig fields of this config (sizes, options); one sentence for what vitexport cannot build."""
        if self.nested:
            cfg = cfg.get("vision_config") if isinstance(cfg.get("vision_config"), dict) else {}

        def get(key: str) -> Any:
            return cfg.get(key, self.defaults.get(key, _BASE.get(key)))

        act = get("hidden_act")
        if act not in ACTIVATIONS:
            raise VitexportError(f"{where} uses the activation {act!r}; vitexport builds {', '.join(ACTIVATIONS)}.")
        if get("num_channels") != 3:
            raise VitexportError(f"{where} takes {get('num_channels')}-channel inputs; vitexport's preprocessing "
                                 f"makes RGB.")
        try:
            fields = {"img_size": to_2tuple(get("image_size")), "patch_size": to_2tuple(get("patch_size")),
                      "embed_dim": _int(get, "hidden_size", where), "depth": _int(get, "num_hidden_layers", where),
                      "num_heads": _int(get, "num_attention_heads", where), "act_layer": ACTIVATIONS[act],
                      "norm_eps": float(get("layer_norm_eps")), "num_classes": 0}
            fields.update(self.build(get))
        except (TypeError, ValueError) as e:
            raise VitexportError(f"{where} has an unreadable size or option ({e}).") from None
        return fields


def _int(get: Callable[[str], Any], key: str, where: str) -> int:
    v = get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise VitexportError(f"{where}'s {key} is {v!r}, not a positive integer.")
    return v


def mlp_ratio(width: int, hidden: int) -> float:
    """A ratio r with int(width * r) == hidden exactly (how the MLP's width is computed from it)."""
    r = hidden / width
    while int(width * r) < hidden:
        r = math.nextafter(r, math.inf)
    return r


def _vit(get: Callable[[str], Any]) -> dict[str, Any]:
    if get("pooler_act") not in (None, "tanh"):
        raise ValueError(f"pooler_act {get('pooler_act')!r} is not tanh")
    return {"mlp_ratio": mlp_ratio(get("hidden_size"), get("intermediate_size")), "qkv_bias": bool(get("qkv_bias")),
            "class_token": True, "global_pool": "token"}


def _dinov2(get: Callable[[str], Any]) -> dict[str, Any]:
    width, hidden = get("hidden_size"), int(get("hidden_size") * get("mlp_ratio"))
    f = {"qkv_bias": bool(get("qkv_bias")), "init_values": float(get("layerscale_value")), "class_token": True,
         "global_pool": "token", "reg_tokens": int(get("num_register_tokens") or 0)}
    f["no_embed_class"] = bool(f["reg_tokens"])
    if get("use_swiglu_ffn"):  # gate and value packed in fc1 (SiLU, whatever hidden_act says), hidden rounded to a
        # multiple of 8 as DINOv2 does
        hidden = (int(hidden * 2 / 3) + 7) // 8 * 8
        f.update(mlp_layer="swiglu_packed", mlp_ratio=mlp_ratio(width, 2 * hidden), act_layer="silu")
    else:
        f["mlp_ratio"] = mlp_ratio(width, hidden)
    return f


def _clip(get: Callable[[str], Any]) -> dict[str, Any]:
    return {"mlp_ratio": mlp_ratio(get("hidden_size"), get("intermediate_size")), "pre_norm": True,
            "class_token": True, "global_pool": "token"}


def _siglip(get: Callable[[str], Any]) -> dict[str, Any]:
    head = get("vision_use_head") is not False
    return {"mlp_ratio": mlp_ratio(get("hidden_size"), get("intermediate_size")), "class_token": False,
            "global_pool": "map" if head else "avg", "fc_norm": False}


def _headless(cls: bool) -> Callable[[Callable[[str], Any]], dict[str, Any]]:
    """A ViT tower without a pooler (ViT-MSN, ViT-MAE, I-JEPA): its users take the tokens, so nothing is pooled
    unless a classifier's tensors say how it pools (checkpoints.hf_vit.fields)."""
    def build(get: Callable[[str], Any]) -> dict[str, Any]:
        return {"mlp_ratio": mlp_ratio(get("hidden_size"), get("intermediate_size")),
                "qkv_bias": bool(get("qkv_bias")), "class_token": cls, "global_pool": ""}
    return build


def _siglip2(get: Callable[[str], Any]) -> dict[str, Any]:
    """SigLIP2 NaFlex (`Siglip2VisionModel`): SigLIP's tower on patches, whose position embedding (a square grid of
    num_patches) is resampled to each image's grid; vitexport takes a square image of the processor's
    max_num_patches (`describe`) and folds the resampling into the export."""
    n, p = _int(get, "num_patches", "the config"), to_2tuple(get("patch_size"))
    side = math.isqrt(n)
    if side * side != n:
        raise ValueError(f"num_patches {n} is not a square grid")
    return {**_siglip(get), "img_size": (side * p[0], side * p[1])}


def naflex_size(max_num_patches: Any, patch: tuple[int, int]) -> tuple[int, int]:
    """The square image Siglip2's processor lays out for at most `max_num_patches` patches: the largest square
    grid that fits, at the patch size."""
    if not isinstance(max_num_patches, int) or isinstance(max_num_patches, bool) or not 1 <= max_num_patches <= 65536:
        raise VitexportError(f"max_num_patches {max_num_patches!r} is not 1..65536.")
    side = math.isqrt(max_num_patches)
    return side * patch[0], side * patch[1]


def _beit(get: Callable[[str], Any]) -> dict[str, Any]:
    """BEiT and data2vec-vision: relative position bias (per layer or shared), LayerScale, mean pooling."""
    if get("use_relative_position_bias") and get("use_shared_relative_position_bias"):
        raise ValueError("use_relative_position_bias with use_shared_relative_position_bias")
    if get("layer_scale_init_value") is None or float(get("layer_scale_init_value")) < 0:
        raise ValueError(f"layer_scale_init_value {get('layer_scale_init_value')!r}")
    mean = bool(get("use_mean_pooling"))
    f: dict[str, Any] = {"family": "beit", "k_bias": False, "qkv_bias": True, "class_token": True,
                         "mlp_ratio": mlp_ratio(get("hidden_size"), get("intermediate_size")),
                         "abs_pos_embed": bool(get("use_absolute_position_embeddings")),
                         "rel_pos_bias": "shared" if get("use_shared_relative_position_bias") else
                         "block" if get("use_relative_position_bias") else "",
                         "global_pool": "avg" if mean else "token", "fc_norm": mean}
    if float(get("layer_scale_init_value")) > 0:
        f["init_values"] = float(get("layer_scale_init_value"))
    return f


def _dinov3(get: Callable[[str], Any]) -> dict[str, Any]:
    """DINOv3 (`DINOv3ViTModel`): RoPE on normalised patch coordinates, registers, LayerScale, query/key/value biases
    set one by one, a gated MLP optional; its pooler_output is the class token after the final norm."""
    q, k, v = bool(get("query_bias")), bool(get("key_bias")), bool(get("value_bias"))
    if q != v:
        raise ValueError("query_bias and value_bias differ (vitexport's attention has both or neither)")
    if not get("mlp_bias"):
        raise ValueError("mlp_bias false")
    if get("apply_layernorm") is False:
        raise ValueError("apply_layernorm false")
    width, hidden = get("hidden_size"), get("intermediate_size")
    f: dict[str, Any] = {"family": "eva", "rope": "dinov3", "rope_temperature": float(get("rope_theta")),
                         "rope_rotate_half": True, "abs_pos_embed": False, "class_token": True,
                         "reg_tokens": int(get("num_register_tokens") or 0), "qkv_bias": q, "k_bias": k,
                         "proj_bias": bool(get("proj_bias")), "init_values": float(get("layerscale_value")),
                         "global_pool": "token", "fc_norm": False, "mlp_ratio": mlp_ratio(width, hidden)}
    if get("use_gated_mlp"):  # gate_proj, up_proj, down_proj: act(gate) * up -> down
        f["mlp_layer"] = "swiglu"
    return f


def _aimv2(get: Callable[[str], Any]) -> dict[str, Any]:
    """AIMv2 (`Aimv2VisionModel`): RMSNorm after the patch embedding and in the blocks, SwiGLU, no class token; its
    head (checkpoints.hf_aimv2) pools, without it the tokens are the output."""
    if get("is_native"):
        raise ValueError("is_native (a sine-cosine position embedding computed for each image size)")
    if bool(get("qkv_bias")) != bool(get("mlp_bias")):
        raise ValueError("qkv_bias and mlp_bias differ")
    eps = float(get("rms_norm_eps"))
    return {"mlp_layer": "swiglu", "mlp_ratio": mlp_ratio(get("hidden_size"), get("intermediate_size")),
            "qkv_bias": bool(get("qkv_bias")), "proj_bias": bool(get("mlp_bias")), "class_token": False,
            "norm_layer": "rmsnorm", "norm_eps": eps, "embed_norm_layer": "rmsnorm", "embed_norm_eps": eps,
            "global_pool": "map" if get("use_head") else "", "pool_mlp_ratio": 0.0, "fc_norm": False}


_VIT_DEFAULTS = {"hidden_act": "gelu", "layer_norm_eps": 1e-12, "patch_size": 16, "qkv_bias": True}
_AIMV2_DEFAULTS = {"hidden_act": "silu", "layer_norm_eps": 1e-5, "rms_norm_eps": 1e-5, "patch_size": 14,
                   "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 24, "num_attention_heads": 8,
                   "qkv_bias": False, "mlp_bias": False, "use_head": True, "is_native": False}
_BEIT_DEFAULTS = {"hidden_act": "gelu", "layer_norm_eps": 1e-12, "patch_size": 16,
                  "use_absolute_position_embeddings": False, "use_relative_position_bias": False,
                  "use_shared_relative_position_bias": False, "layer_scale_init_value": 0.1,
                  "use_mean_pooling": True}
_DINOV3_DEFAULTS = {"hidden_act": "gelu", "layer_norm_eps": 1e-5, "patch_size": 16, "hidden_size": 384,
                    "intermediate_size": 1536, "num_attention_heads": 6, "rope_theta": 100.0, "query_bias": True,
                    "key_bias": False, "value_bias": True, "proj_bias": True, "mlp_bias": True,
                    "layerscale_value": 1.0, "num_register_tokens": 0, "use_gated_mlp": False,
                    "apply_layernorm": True}
_DINO_DEFAULTS = {"hidden_act": "gelu", "layer_norm_eps": 1e-6, "mlp_ratio": 4, "qkv_bias": True,
                  "layerscale_value": 1.0, "use_swiglu_ffn": False}
_CLIP_DEFAULTS = {"hidden_act": "quick_gelu", "layer_norm_eps": 1e-5, "patch_size": 32}
_SIGLIP_DEFAULTS = {"hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6, "patch_size": 16,
                    "vision_use_head": True}
_SIGLIP2_DEFAULTS = {**_SIGLIP_DEFAULTS, "num_patches": 256}
# documented preprocessing, at the config's image size: the processor class's defaults (ViT, DeiT, CLIP, SigLIP),
# and for DINOv2 what facebook/dinov2-* ship (resize 256, crop 224, ImageNet mean/std; its processor class's own
# defaults are CLIP's)
_VIT_PP = Processing("squash", 1.0, "bilinear", HALF, HALF, "resize to the input size, bilinear, mean/std 0.5")
_DEIT_PP = Processing("squash", 0.875, "bicubic", HALF, HALF, "resize to 8/7 of the input size, centre crop, "
                      "bicubic, mean/std 0.5")
_DINO_PP = Processing("center", 0.875, "bicubic", IMAGENET_MEAN, IMAGENET_STD, "shorter side to 8/7 of the input "
                      "size, centre crop, bicubic, ImageNet mean/std")
_CLIP_PP = Processing("center", 1.0, "bicubic", CLIP_MEAN, CLIP_STD, "shorter side to the input size, centre "
                      "crop, bicubic, CLIP's mean/std")
_SIGLIP_PP = Processing("squash", 1.0, "bicubic", HALF, HALF, "resize to the input size, bicubic, mean/std 0.5")
_BEIT_PP = Processing("squash", 1.0, "bicubic", HALF, HALF, "resize to the input size, bicubic, mean/std 0.5")
_DINOV3_PP = Processing("squash", 1.0, "bilinear", IMAGENET_MEAN, IMAGENET_STD, "resize to the input size, "
                        "bilinear, ImageNet mean/std")
FAMILIES = {f.model_type: f for f in (
    Family("vit", "ViT", _VIT_DEFAULTS, _vit, "bicubic", _VIT_PP),
    Family("deit", "DeiT", _VIT_DEFAULTS, _vit, "bicubic", _DEIT_PP),
    Family("dinov2", "DINOv2", {**_DINO_DEFAULTS, "patch_size": 14}, _dinov2, "bicubic", _DINO_PP, square_int=False),
    Family("dinov2_with_registers", "DINOv2 with registers",
           {**_DINO_DEFAULTS, "patch_size": 16, "num_register_tokens": 4}, _dinov2, "bicubic-antialias", _DINO_PP,
           square_int=False),
    Family("clip_vision_model", "CLIP", _CLIP_DEFAULTS, _clip, "bicubic", _CLIP_PP, square_int=False),
    Family("clip", "CLIP", _CLIP_DEFAULTS, _clip, "bicubic", _CLIP_PP, square_int=False, nested=True),
    Family("siglip_vision_model", "SigLIP", _SIGLIP_DEFAULTS, _siglip, "bicubic", _SIGLIP_PP, square_int=False),
    Family("siglip", "SigLIP", _SIGLIP_DEFAULTS, _siglip, "bicubic", _SIGLIP_PP, square_int=False, nested=True),
    Family("metaclip_2_vision_model", "MetaCLIP 2", _CLIP_DEFAULTS, _clip, "bicubic", _CLIP_PP, square_int=False),
    Family("metaclip_2", "MetaCLIP 2", _CLIP_DEFAULTS, _clip, "bicubic", _CLIP_PP, square_int=False, nested=True),
    # ViTMSNConfig's layer_norm_eps is 1e-6, not ViTConfig's 1e-12
    Family("vit_msn", "ViT-MSN", {**_VIT_DEFAULTS, "layer_norm_eps": 1e-6}, _headless(True), "bicubic", _VIT_PP,
           pooler=False),
    Family("vit_mae", "ViT-MAE", {**_VIT_DEFAULTS, "mask_ratio": 0.75}, _headless(True), "bicubic",
           _VIT_PP, pooler=False),
    Family("ijepa", "I-JEPA", _VIT_DEFAULTS, _headless(False), "bicubic", _VIT_PP, pooler=False),
    Family("beit", "BEiT", _BEIT_DEFAULTS, _beit, "bicubic", _BEIT_PP),
    Family("data2vec-vision", "data2vec-vision", _BEIT_DEFAULTS, _beit, "bicubic", _BEIT_PP),
    Family("dinov3_vit", "DINOv3", _DINOV3_DEFAULTS, _dinov3, "bicubic", _DINOV3_PP, square_int=False),
    Family("siglip2_vision_model", "SigLIP2 NaFlex", _SIGLIP2_DEFAULTS, _siglip2, "bilinear-antialias",
           _SIGLIP_PP, square_int=False, naflex=True),
    Family("siglip2", "SigLIP2 NaFlex", _SIGLIP2_DEFAULTS, _siglip2, "bilinear-antialias", _SIGLIP_PP,
           square_int=False, nested=True, naflex=True),
    Family("aimv2_vision_model", "AIMv2", _AIMV2_DEFAULTS, _aimv2, "bicubic", _CLIP_PP, square_int=False),
)}


def family(cfg: dict[str, Any], where: str) -> Family:
    """The family of a transformers config; one sentence naming a model type vitexport does not build."""
    model_type = cfg.get("model_type")
    if model_type not in FAMILIES:
        kinds = ", ".join(sorted({f.title for f in FAMILIES.values()}))
        raise VitexportError(f"{where} is a transformers {model_type!r} model; vitexport builds the vision "
                             f"transformers {kinds} (model_type {', '.join(FAMILIES)}).")
    return FAMILIES[model_type]


@dataclass
class Described:
    """A transformers config, as vitexport builds it."""

    family: Family
    fields: dict[str, Any]  # ViTConfig fields
    preprocess: Preprocess
    notes: list[str]  # what the user should know (preprocessing assumed)


def describe(cfg: dict[str, Any], processor: dict[str, Any] | None, where: str) -> Described:
    """config.json (+ preprocessor_config.json) -> the fields, the preprocessing and the notes."""
    fam = family(cfg, where)
    fields = fam.config_fields(cfg, where)
    if fam.naflex and processor is not None and "max_num_patches" in processor:
        fields["img_size"] = naflex_size(processor["max_num_patches"], fields["patch_size"])
    size = fields["img_size"]
    if processor is None:
        pp = fam.processing.at(size)
        notes = [f"{where} has no preprocessor_config.json: using {fam.title}'s documented preprocessing "
                 f"({fam.processing.text})."]
    else:
        pp, notes = processor_preprocess(processor, fam, size, where)
    if not fam.pooler:
        notes.append(f"transformers' {fam.title} model has no pooled output: without a classifier its export gives "
                     f"the tokens (last_hidden_state; `--outputs patch` for the patch tokens alone).")
    return Described(fam, fields, pp, notes)


def processor_preprocess(proc: dict[str, Any], fam: Family, img_size: tuple[int, int],
                         where: str) -> tuple[Preprocess, list[str]]:
    """A transformers image processor's settings as timm's eval transform: resize to the shorter side then centre
    crop ('center', crop_pct = crop / resize), or to a fixed size then (perhaps) crop ('squash'); its resample,
    rescale factor, mean and std (mean and std re-expressed for pixels scaled to [0, 1])."""
    notes: list[str] = []
    what = f"{where}'s preprocessor_config.json"
    base = fam.processing  # the processor class's defaults, for keys the file leaves out
    size, crop = _processor_size(proc.get("size"), fam), _processor_size(proc.get("crop_size"), fam, crop=True)
    if crop is not None and not proc.get("do_center_crop", True):
        crop = None
    if size is None:  # no size saved: the family's resize and crop, at the model's own size
        mode, crop = base.crop_mode, crop or img_size
        resized = (round(crop[0] / base.crop_pct), round(crop[1] / base.crop_pct))
    elif proc.get("do_resize", True) is False:  # no resize: the images come at the crop's size
        mode, resized = "center", crop or img_size
        notes.append(f"{what} does not resize; vitexport resizes the shorter side to the input size.")
    else:
        mode, resized = size
    if crop is None:
        if mode == "center":  # shorter side to S, nothing cropped: the input must still have one size
            notes.append(f"{what} resizes the shorter side without a crop; vitexport centre-crops a square.")
            crop = (resized[0], resized[0])
        else:
            crop = resized
    crop_pct = crop[0] / resized[0]
    resample = proc.get("resample", next(k for k, v in RESAMPLE.items() if v == base.interpolation))
    if resample not in RESAMPLE:
        raise VitexportError(f"{what} resamples with PIL filter {resample!r}; vitexport resizes with "
                             f"{', '.join(f'{k} ({v})' for k, v in RESAMPLE.items())}.")
    factor = float(proc.get("rescale_factor", 1 / 255)) if proc.get("do_rescale", True) else 1.0
    mean, std = (proc.get("image_mean", base.mean), proc.get("image_std", base.std)) \
        if proc.get("do_normalize", True) else ((0.0,) * 3, (1.0,) * 3)
    try:  # transformers: (x * factor - mean) / std on 0..255 pixels; vitexport: (x / 255 - mean') / std'
        scale = 255.0 * factor
        mean3 = tuple(float(m) / scale for m in (mean if isinstance(mean, (list, tuple)) else [mean] * 3))
        std3 = tuple(float(s) / scale for s in (std if isinstance(std, (list, tuple)) else [std] * 3))
        if len(mean3) != 3 or len(std3) != 3 or not all(s > 0 for s in std3):
            raise ValueError
        pp = Preprocess(input_size=crop, mean=mean3, std=std3, crop_pct=crop_pct,  # type: ignore[arg-type]
                        interpolation=RESAMPLE[resample], crop_mode=mode)
    except (TypeError, ValueError, ZeroDivisionError):
        raise VitexportError(f"{what} has an unreadable rescale_factor, image_mean or image_std.") from None
    return pp, notes


def _processor_size(v: Any, fam: Family, crop: bool = False) -> Any:
    """A processor's `size` -> ('center' | 'squash', (H, W)); its `crop_size` (crop=True) -> (H, W); None: absent."""
    if v is None:
        return None
    if isinstance(v, int) and not isinstance(v, bool):
        v = {"height": v, "width": v} if crop or fam.square_int else {"shortest_edge": v}
    if isinstance(v, dict):
        if isinstance(v.get("height"), int) and isinstance(v.get("width"), int):
            hw = (v["height"], v["width"])
            if all(0 < x <= MAX_SIDE for x in hw):
                return hw if crop else ("squash", hw)
        elif isinstance(v.get("shortest_edge"), int) and not crop and 0 < v["shortest_edge"] <= MAX_SIDE:
            s = v["shortest_edge"]
            return ("center", (s, s))
    raise VitexportError(f"The image processor's {'crop_size' if crop else 'size'} {v!r} is not one vitexport "
                         f"follows (height and width, or shortest_edge).")
