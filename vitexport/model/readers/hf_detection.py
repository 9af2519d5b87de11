"""transformers' detectors as vitexport's backbone + detection head: a `config.json` (and `preprocessor_config.json`)
of RF-DETR (`RfDetrForObjectDetection`) -> the windowed DINOv2's ViTConfig fields (read by DINOv2's reader with
RfDetrDinov2Config's defaults) and the head's (`heads.detection_config.DetectionConfig`), as transformers' config
classes read them: their defaults where a key is absent, the default backbone RfDetrConfig makes when there is none.
No torch here.

The detectors on CNN backbones or on ViTs vitexport does not build yet are refused by name in one sentence.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...errors import VitexportError
from ..heads.detection_config import DetectionConfig
from .hf_configs import IMAGENET_MEAN, IMAGENET_STD, Described, Family, Processing, processor_preprocess
from .hf_dense import _num_labels, taps

# RfDetrDinov2Config's defaults (configuration_rf_detr.py), and the backbone RfDetrConfig makes when a config has
# none (consolidate_backbone_kwargs_to_config's default_config_kwargs over them)
_BACKBONE_DEFAULTS = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "mlp_ratio": 4,
                      "hidden_act": "gelu", "layer_norm_eps": 1e-6, "image_size": 224, "patch_size": 14,
                      "num_channels": 3, "qkv_bias": True, "layerscale_value": 1.0, "use_swiglu_ffn": False,
                      "apply_layernorm": True, "num_windows": 4, "num_register_tokens": 0}
_DEFAULT_BACKBONE = {"model_type": "rf_detr_dinov2", "num_attention_heads": 6, "hidden_size": 384,
                     "out_features": ["stage2", "stage5", "stage8", "stage11"], "num_register_tokens": 0,
                     "image_size": 518}
# RfDetrConfig's defaults for the keys read here
_DEFAULTS = {"hidden_expansion": 0.5, "c2f_num_blocks": 3, "activation_function": "silu", "decoder_ffn_dim": 2048,
             "decoder_n_points": 4, "decoder_layers": 3, "decoder_self_attention_heads": 8,
             "decoder_cross_attention_heads": 16, "decoder_activation_function": "relu", "num_queries": 300,
             "attention_bias": True, "d_model": 256, "layer_norm_eps": 1e-5, "num_feature_levels": 1}
# RfDetrImageProcessor: resize to the checkpoint's resolution (no crop, its aspect ratio not kept), bilinear,
# ImageNet mean/std; its batch padding is none for one size
_PP = Processing("squash", 1.0, "bilinear", IMAGENET_MEAN, IMAGENET_STD, "resize to the input size, bilinear, "
                 "ImageNet mean/std")
RF_DETR = Family("rf_detr", "RF-DETR", _DEFAULTS, lambda get: {}, "bicubic-antialias", _PP, square_int=True)
DETECTION_FAMILIES = {f.model_type: f for f in (RF_DETR,)}
# the detectors transformers has that vitexport does not build (yet), and why, for one sentence
NOT_BUILT = {
    "lw_detr": "LW-DETR (its CAE-style windowed ViT) is not built yet; RF-DETR, its successor on DINOv2, is",
    "deimv2": "DEIMv2 (D-FINE's decoder over DINOv3 or HGNetv2) is not built yet",
    "yolos": "YOLOS (a ViT with detection tokens) is not built yet",
    "owlv2": "OWLv2 (open-vocabulary boxes from CLIP) is not built yet",
    "owlvit": "OWL-ViT (open-vocabulary boxes from CLIP) is not built yet",
}


def _backbone(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    bb = cfg.get("backbone_config")
    if bb is None:
        bb = dict(_DEFAULT_BACKBONE)
    if not isinstance(bb, dict):
        raise VitexportError(f"{where}'s backbone_config is not an object.")
    if bb.get("model_type") != "rf_detr_dinov2":
        raise VitexportError(f"{where} has a {bb.get('model_type')!r} backbone; vitexport builds RF-DETR on its "
                             f"windowed DINOv2 (rf_detr_dinov2).")
    return bb


def describe_detection(cfg: dict[str, Any], processor: dict[str, Any] | None, where: str) -> Described:
    """config.json (+ preprocessor_config.json) of a detector -> the fields (the head under `dense`), the
    preprocessing and the notes."""
    model_type = cfg.get("model_type")
    if model_type in NOT_BUILT:
        raise VitexportError(f"{where} is a transformers {model_type!r} model: {NOT_BUILT[model_type]}.")
    fam = DETECTION_FAMILIES[model_type]
    arch = cfg.get("architectures") or ["RfDetrForObjectDetection"]
    if not isinstance(arch, list) or arch[0] != "RfDetrForObjectDetection":
        raise VitexportError(f"{where} is a transformers {arch[0] if isinstance(arch, list) else arch}; vitexport "
                             f"builds RfDetrForObjectDetection.")

    def get(key: str) -> Any:
        return cfg.get(key, fam.defaults.get(key))

    bb = _backbone(cfg, where)
    backbone = Family("rf_detr_dinov2", "RF-DETR's DINOv2", _BACKBONE_DEFAULTS, _dinov2_fields, "bicubic-antialias",
                      _PP)
    fields = backbone.config_fields(bb, f"{where}'s backbone_config")

    def bget(key: str) -> Any:
        return bb.get(key, _BACKBONE_DEFAULTS.get(key))

    if get("num_feature_levels") != 1:
        raise VitexportError(f"{where}'s num_feature_levels {get('num_feature_levels')!r} is not 1 (transformers' "
                             f"RF-DETR projects one level).")
    if get("attention_bias") is not True:
        raise VitexportError(f"{where}'s decoder has no attention biases (attention_bias false); vitexport builds "
                             f"RF-DETR's biased ones.")
    tapped = taps(bb, fields["depth"], f"{where}'s backbone_config")
    if 0 in tapped:
        raise VitexportError(f"{where}'s backbone taps its embedding (stem); RF-DETR's projector reads block outputs.")
    nw = bget("num_windows")
    windowed = tuple(sorted(set(range(max(tapped) + 1)) - set(tapped)))  # RfDetrDinov2Config's window_block_indexes
    try:
        fields["dense"] = DetectionConfig(
            head="rf_detr", taps=tapped, tap_norm=bool(bget("apply_layernorm")), num_windows=nw,
            window_blocks=tuple(b for b in windowed if b < fields["depth"]), d_model=get("d_model"),
            hidden_expansion=get("hidden_expansion"), c2f_blocks=get("c2f_num_blocks"),
            projector_act=get("activation_function"), norm_eps=get("layer_norm_eps"),
            decoder_layers=get("decoder_layers"), self_attn_heads=get("decoder_self_attention_heads"),
            cross_attn_heads=get("decoder_cross_attention_heads"), n_points=get("decoder_n_points"),
            ffn_dim=get("decoder_ffn_dim"), decoder_act=get("decoder_activation_function"),
            num_queries=get("num_queries"), num_labels=_num_labels(cfg), top_k=get("num_queries"))
    except TypeError as e:
        raise VitexportError(f"{where} has an unreadable head option ({e}).") from None
    fields.update(num_classes=0, global_pool="")
    size = _resolution(processor, fields, nw, where)
    fields["img_size"] = size
    notes = ["The export's outputs are transformers' logits (B, queries, labels) and pred_boxes (B, queries, 4: cx, "
             "cy, w, h of the input, normalised); vitexport's post-processing (the processor's "
             "post_process_object_detection) runs beside the graph."]
    if processor is None:
        notes.insert(0, f"{where} has no preprocessor_config.json: using RF-DETR's documented preprocessing "
                        f"({fam.processing.text}) at {size[0]}x{size[1]}.")
        return Described(fam, fields, fam.processing.at(size), notes)
    square = {**processor, "size": {"height": size[0], "width": size[1]}, "do_center_crop": False}
    pp, more = processor_preprocess(square, fam, size, where)
    return Described(fam, fields, replace(pp, crop_mode="squash", crop_pct=1.0), [*more, *notes])


def _dinov2_fields(get: Any) -> dict[str, Any]:
    from .hf_configs import FAMILIES

    return FAMILIES["dinov2"].build(get)


def _resolution(processor: dict[str, Any] | None, fields: dict[str, Any], nw: int, where: str) -> tuple[int, int]:
    """The input size: the processor's {height, width} (the checkpoint's resolution), else the backbone's image_size
    rounded down to a whole number of windows of patches."""
    size = processor.get("size") if isinstance(processor, dict) else None
    if isinstance(size, dict) and isinstance(size.get("height"), int) and isinstance(size.get("width"), int):
        return (size["height"], size["width"])
    if size is not None and not isinstance(size, dict):
        raise VitexportError(f"{where}'s preprocessor_config.json size {size!r} is not a height and width.")
    step = fields["patch_size"][0] * nw
    side = max(fields["img_size"][0] // step, 1) * step
    return (side, side)


__all__ = ["DETECTION_FAMILIES", "NOT_BUILT", "describe_detection"]
