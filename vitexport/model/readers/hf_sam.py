"""transformers' Segment Anything as vitexport's SAM family: a `SamModel` config.json (its vision_config, and the
prompt encoder and mask decoder configs that become `heads.config.PromptDecoderConfig`) or a `SamVisionModel` one
(the encoder alone), with SamImageProcessor's preprocessing (the longer side to 1024, bilinear, ImageNet mean/std,
padded below and right). transformers' config classes' defaults where a key is absent. No torch here.
"""

from __future__ import annotations

from typing import Any

from ...data.preprocess import Preprocess
from ...errors import VitexportError
from ..heads.config import PromptDecoderConfig
from .hf_configs import ACTIVATIONS, IMAGENET_MEAN, IMAGENET_STD, RESAMPLE, Described, Family, Processing, mlp_ratio

# SamVisionConfig's, SamPromptEncoderConfig's and SamMaskDecoderConfig's defaults (configuration_sam.py)
_VISION = {"hidden_size": 768, "output_channels": 256, "num_hidden_layers": 12, "num_attention_heads": 12,
           "num_channels": 3, "image_size": 1024, "patch_size": 16, "hidden_act": "gelu", "layer_norm_eps": 1e-6,
           "qkv_bias": True, "mlp_ratio": 4.0, "use_abs_pos": True, "use_rel_pos": True, "window_size": 14,
           "global_attn_indexes": [2, 5, 8, 11], "num_pos_feats": 128, "mlp_dim": None}
_PROMPT = {"hidden_size": 256, "image_size": 1024, "patch_size": 16, "mask_input_channels": 16,
           "num_point_embeddings": 4, "hidden_act": "gelu", "layer_norm_eps": 1e-6}
_DECODER = {"hidden_size": 256, "hidden_act": "relu", "mlp_dim": 2048, "num_hidden_layers": 2,
            "num_attention_heads": 8, "attention_downsample_rate": 2, "num_multimask_outputs": 3,
            "iou_head_depth": 3, "iou_head_hidden_dim": 256, "layer_norm_eps": 1e-6}
_SAM_PP = Processing("longest", 1.0, "bilinear", IMAGENET_MEAN, IMAGENET_STD, "the longer side to 1024, bilinear, "
                     "ImageNet mean/std, padded below and right")
SAM = Family("sam", "Segment Anything", _VISION, lambda get: {}, "bicubic-antialias", _SAM_PP)
SAM_VISION = Family("sam_vision_model", "Segment Anything (vision encoder)", _VISION, lambda get: {},
                    "bicubic-antialias", _SAM_PP)
SAM_FAMILIES = {f.model_type: f for f in (SAM, SAM_VISION)}
# model types that reuse SAM's encoder under another decoder, each with why vitexport does not export it
NOT_BUILT = {
    "sam_hq": "SAM-HQ's mask decoder also reads the encoder's early global-block features (intermediate "
              "embeddings), which its encoder graph would have to give as a second output; export its vision "
              "encoder alone as a SamVisionModel folder (model_type 'sam_vision_model'), or SAM itself",
    "sam_hq_vision_model": "SAM-HQ's vision model returns the early global-block features beside the embedding",
    "sam2": "SAM 2's image encoder is a hierarchical Hiera, not a plain ViT",
    "sam2_video": "SAM 2's image encoder is a hierarchical Hiera, not a plain ViT",
}


def _sub(cfg: dict[str, Any], key: str) -> dict[str, Any]:
    v = cfg.get(key)
    return v if isinstance(v, dict) else {}


def describe_sam(cfg: dict[str, Any], processor: dict[str, Any] | None, where: str) -> Described:
    """A SamModel or SamVisionModel config -> the encoder's ViTConfig fields (and the decoder's config, for a
    SamModel), its preprocessing and notes."""
    model_type = cfg.get("model_type")
    if model_type in NOT_BUILT:
        raise VitexportError(f"{where} is a transformers {model_type!r} model: {NOT_BUILT[model_type]}.")
    fam = SAM_FAMILIES[model_type]
    vision = _sub(cfg, "vision_config") if model_type == "sam" else cfg

    def get(key: str) -> Any:
        return vision.get(key, _VISION[key])

    act = get("hidden_act")
    if act not in ACTIVATIONS:
        raise VitexportError(f"{where} uses the activation {act!r}; vitexport builds {', '.join(ACTIVATIONS)}.")
    try:
        width = int(get("hidden_size"))
        hidden = int(get("mlp_dim")) if get("mlp_dim") is not None else int(width * float(get("mlp_ratio")))
        size, patch = int(get("image_size")), int(get("patch_size"))
        fields: dict[str, Any] = {
            "family": "sam", "img_size": (size, size), "patch_size": (patch, patch), "embed_dim": width,
            "depth": int(get("num_hidden_layers")), "num_heads": int(get("num_attention_heads")),
            "mlp_ratio": mlp_ratio(width, hidden), "act_layer": ACTIVATIONS[act],
            "norm_eps": float(get("layer_norm_eps")), "qkv_bias": bool(get("qkv_bias")), "class_token": False,
            "global_pool": "avg", "num_classes": 0, "abs_pos_embed": bool(get("use_abs_pos")),
            "rel_pos_bias": "decomposed" if get("use_rel_pos") else "",
            "window_size": int(get("window_size")), "global_attn_indexes": [int(i) for i in get("global_attn_indexes")],
            "neck_chans": int(get("output_channels")),
            "pos_embed_grid": (size // patch, size // patch)}  # transformers' SAM takes its image_size alone
        if get("num_channels") != 3:
            raise ValueError(f"{get('num_channels')} input channels")
        if model_type == "sam":
            fields["sam_decoder"] = _decoder(cfg, get, size // patch).to_dict()
    except (TypeError, ValueError) as e:
        raise VitexportError(f"{where} has an unreadable size or option ({e}).") from None
    notes = [f"transformers' SAM runs at its image_size alone ({size}x{size}); the export takes that size."]
    return Described(fam, fields, _preprocess(processor, size, where, notes), notes)


def _decoder(cfg: dict[str, Any], vision_get: Any, grid: int) -> PromptDecoderConfig:
    prompt, dec = _sub(cfg, "prompt_encoder_config"), _sub(cfg, "mask_decoder_config")

    def p(key: str) -> Any:
        return prompt.get(key, _PROMPT[key])

    def d(key: str) -> Any:
        return dec.get(key, _DECODER[key])

    embedding = int(p("image_size")) // int(p("patch_size"))
    if embedding != grid:
        raise ValueError(f"the prompt encoder's {embedding}x{embedding} embedding is not the encoder's {grid}x{grid}")
    return PromptDecoderConfig(
        hidden_size=int(p("hidden_size")), image_size=int(p("image_size")), embedding_size=embedding,
        num_pos_feats=int(vision_get("num_pos_feats")), mask_input_channels=int(p("mask_input_channels")),
        num_point_embeddings=int(p("num_point_embeddings")), prompt_act=str(p("hidden_act")),
        prompt_norm_eps=float(p("layer_norm_eps")), decoder_layers=int(d("num_hidden_layers")),
        decoder_heads=int(d("num_attention_heads")), decoder_mlp_dim=int(d("mlp_dim")),
        decoder_act=str(d("hidden_act")), attention_downsample_rate=int(d("attention_downsample_rate")),
        num_multimask_outputs=int(d("num_multimask_outputs")), iou_head_depth=int(d("iou_head_depth")),
        iou_head_hidden_dim=int(d("iou_head_hidden_dim")), decoder_norm_eps=float(d("layer_norm_eps")))


def _preprocess(proc: dict[str, Any] | None, size: int, where: str, notes: list[str]) -> Preprocess:
    """SamImageProcessor: the longer side to size['longest_edge'] (int(x * s / longest + 0.5)), its resample,
    rescale and normalisation, padded to pad_size below and right."""
    if proc is None:
        notes.append(f"{where} has no preprocessor_config.json: using SAM's documented preprocessing "
                     f"({_SAM_PP.text}).")
        return _SAM_PP.at((size, size))
    what = f"{where}'s preprocessor_config.json"
    longest = (proc.get("size") or {}).get("longest_edge", size) if isinstance(proc.get("size"), dict) else size
    if longest != size:
        notes.append(f"{what} resizes the longer side to {longest}; the encoder takes {size}: vitexport resizes to "
                     f"{size}.")
    resample = proc.get("resample", 2)
    if resample not in RESAMPLE:
        raise VitexportError(f"{what} resamples with PIL filter {resample!r}; vitexport resizes with "
                             f"{', '.join(f'{k} ({v})' for k, v in RESAMPLE.items())}.")
    factor = float(proc.get("rescale_factor", 1 / 255)) if proc.get("do_rescale", True) else 1.0
    mean, std = (proc.get("image_mean", IMAGENET_MEAN), proc.get("image_std", IMAGENET_STD)) \
        if proc.get("do_normalize", True) else ((0.0,) * 3, (1.0,) * 3)
    try:
        scale = 255.0 * factor
        mean3 = tuple(float(m) / scale for m in mean)
        std3 = tuple(float(s) / scale for s in std)
        if len(mean3) != 3 or len(std3) != 3 or not all(s > 0 for s in std3):
            raise ValueError
    except (TypeError, ValueError, ZeroDivisionError):
        raise VitexportError(f"{what} has an unreadable rescale_factor, image_mean or image_std.") from None
    return Preprocess(input_size=(size, size), mean=mean3, std=std3, crop_pct=1.0,  # type: ignore[arg-type]
                      interpolation=RESAMPLE[resample], crop_mode="longest")
