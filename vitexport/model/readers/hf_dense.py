"""transformers' dense predictors as vitexport's backbone + head: a `config.json` (and `preprocessor_config.json`)
of Depth Anything (V1 and V2, relative and metric), DPT (depth over its own ViT or a DINOv2 backbone,
segmentation over its ViT) or EoMT -> the backbone's ViTConfig fields (read by the backbone family's own reader,
`hf_configs`) and the head's (`heads.config.DenseConfig`), as transformers' config classes read them: their defaults
where a key is absent, the nested `backbone_config`'s own class defaults included (a config saved by an older
transformers omits every value equal to its default). No torch here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from ...errors import VitexportError
from ..heads.config import DenseConfig
from .hf_configs import ACTIVATIONS, FAMILIES, HALF, IMAGENET_MEAN, IMAGENET_STD, Described, Family, Processing, \
    mlp_ratio, processor_preprocess

# DepthAnythingConfig's defaults (configuration_depth_anything.py), and the DINOv2 backbone it makes when a config
# has no backbone_config at all (its sub-config spec's init_kwargs)
_DA_DEFAULTS = {"patch_size": 14, "reassemble_hidden_size": 384, "reassemble_factors": [4, 2, 1, 0.5],
                "neck_hidden_sizes": [48, 96, 192, 384], "fusion_hidden_size": 64, "head_in_index": -1,
                "head_hidden_size": 32, "depth_estimation_type": "relative", "max_depth": 1}
_DA_BACKBONE = {"model_type": "dinov2", "image_size": 518, "hidden_size": 384, "num_attention_heads": 6,
                "out_indices": [9, 10, 11, 12], "reshape_hidden_states": False}
# Depth Anything's checkpoints ship a DPTImageProcessor set to: keep the aspect ratio, a multiple of 14, bicubic,
# ImageNet mean/std; at a fixed input size vitexport resizes to it
_DA_PP = Processing("squash", 1.0, "bicubic", IMAGENET_MEAN, IMAGENET_STD, "resize to the input size, bicubic, "
                    "ImageNet mean/std")
DEPTH_ANYTHING = Family("depth_anything", "Depth Anything", _DA_DEFAULTS, lambda get: {}, "bicubic", _DA_PP,
                        square_int=True)
# DPTConfig's defaults (configuration_dpt.py): its own ViT's sizes and options (read by ViT's reader), the neck's
# and heads'; DPTImageProcessor's defaults (384 x 384, bicubic, mean/std 0.5) for a folder without its processor
_DPT_DEFAULTS = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
                 "hidden_act": "gelu", "layer_norm_eps": 1e-12, "image_size": 384, "patch_size": 16,
                 "num_channels": 3, "qkv_bias": True, "is_hybrid": False, "backbone_out_indices": [2, 5, 8, 11],
                 "readout_type": "project", "reassemble_factors": [4, 2, 1, 0.5],
                 "neck_hidden_sizes": [96, 192, 384, 768], "fusion_hidden_size": 256, "head_in_index": -1,
                 "use_batch_norm_in_fusion_residual": False, "use_bias_in_fusion_residual": None,
                 "add_projection": False, "use_auxiliary_head": True, "pooler_act": "tanh"}
_DPT_PP = Processing("squash", 1.0, "bicubic", HALF, HALF, "resize to the input size, bicubic, mean/std 0.5")
# DPT's ViT resamples its position embedding bilinearly (no antialias) in every forward pass; over a DINOv2 backbone
# the backbone's own bicubic resampling
DPT = Family("dpt", "DPT", _DPT_DEFAULTS, FAMILIES["vit"].build, "bilinear", _DPT_PP, square_int=True)
DPT_DINOV2 = replace(DPT, title="DPT (DINOv2 backbone)", pos_embed_interp="bicubic")
DPT_HEAD_HIDDEN = 32  # the depth head's second conv: hard-coded in DPTDepthEstimationHead
# EomtConfig's defaults (configuration_eomt.py): a DINOv2-like ViT-L/16 at 640 with 4 registers, 200 queries joining
# the last 4 blocks; its processor: the longer side to 640, padded below and right (do_pad), bilinear, ImageNet's
_EOMT_DEFAULTS = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "hidden_act": "gelu",
                  "layer_norm_eps": 1e-6, "image_size": 640, "patch_size": 16, "mlp_ratio": 4,
                  "layerscale_value": 1.0, "use_swiglu_ffn": False, "num_blocks": 4, "num_queries": 200,
                  "num_register_tokens": 4, "num_upscale_blocks": 2, "qkv_bias": True}
_EOMT_PP = Processing("pad", 1.0, "bilinear", IMAGENET_MEAN, IMAGENET_STD, "the longer side to the input size, "
                      "black below and right, bilinear, ImageNet mean/std")
EOMT = Family("eomt", "EoMT", _EOMT_DEFAULTS, FAMILIES["dinov2"].build, "bicubic", _EOMT_PP, square_int=False)
# EomtDinov3Config's: a DINOv3 ViT (RoPE of theta 100 on the patches alone, no key bias) under the same head
_EOMT_DINOV3_DEFAULTS = {**_EOMT_DEFAULTS, "intermediate_size": 4096, "query_bias": True, "key_bias": False,
                         "value_bias": True, "proj_bias": True, "mlp_bias": True, "use_gated_mlp": False,
                         "apply_layernorm": True, "rope_theta": 100.0}
EOMT_DINOV3 = Family("eomt_dinov3", "EoMT (DINOv3)", _EOMT_DINOV3_DEFAULTS, FAMILIES["dinov3_vit"].build, "bicubic",
                     _EOMT_PP, square_int=False)
DENSE_FAMILIES = {f.model_type: f for f in (DEPTH_ANYTHING, DPT, EOMT, EOMT_DINOV3)}
BACKBONES = ("dinov2",)  # the backbone families vitexport puts a dense head on


def taps(backbone: dict[str, Any], depth: int, where: str) -> tuple[int, ...]:
    """The backbone's out_indices (or out_features 'stem' / 'stageN') as hidden-state indices, as transformers'
    BackboneMixin resolves them: negative ones from the end, neither given: the last stage."""
    stages = depth + 1  # stem, stage1 .. stageN
    names = backbone.get("out_features")
    idx = backbone.get("out_indices")
    if idx is None and names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise VitexportError(f"{where}'s out_features {names!r} is not a list of stage names.")
        try:
            idx = [0 if n == "stem" else int(n.removeprefix("stage")) for n in names]
        except ValueError:
            raise VitexportError(f"{where}'s out_features {names!r} are not stem/stageN names.") from None
    if idx is None:
        idx = [depth]
    if not isinstance(idx, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in idx) or \
            not all(-stages <= i < stages for i in idx):
        raise VitexportError(f"{where}'s out_indices {idx!r} are not layer indices of its {depth} blocks.")
    return tuple(i % stages for i in idx)


def backbone_of(cfg: dict[str, Any], default: dict[str, Any], where: str) -> tuple[Family, dict[str, Any]]:
    """The backbone's config as transformers builds it: the model's default backbone when there is none, else the
    saved one read with its own class's defaults (not the model's)."""
    if cfg.get("backbone") is not None and cfg.get("backbone_config") is None:
        raise VitexportError(f"{where} names its backbone {cfg['backbone']!r} instead of describing it "
                             f"(backbone_config); vitexport builds a described DINOv2 backbone.")
    bb = cfg.get("backbone_config")
    if bb is None:
        bb = dict(default)
    if not isinstance(bb, dict):
        raise VitexportError(f"{where}'s backbone_config is not an object.")
    kind = bb.get("model_type")
    if kind not in BACKBONES:
        raise VitexportError(f"{where} has a {kind!r} backbone; vitexport builds its dense heads on "
                             f"{', '.join(BACKBONES)}.")
    if bb.get("reshape_hidden_states", True):
        raise VitexportError(f"{where}'s backbone reshapes its hidden states (reshape_hidden_states is true or "
                             f"absent): transformers' own model cannot run that config.")
    return FAMILIES[kind], bb


def describe_dense(cfg: dict[str, Any], processor: dict[str, Any] | None, where: str) -> Described:
    """config.json (+ preprocessor_config.json) of a dense model -> the fields (the head under `dense`), the
    preprocessing and the notes."""
    fam = DENSE_FAMILIES[cfg["model_type"]]

    def get(key: str) -> Any:
        return cfg.get(key, fam.defaults.get(key))

    if fam in (EOMT, EOMT_DINOV3):
        return _eomt(cfg, processor, where, fam)
    notes: list[str] = []
    try:
        if fam is DPT:
            fam, fields = _dpt(cfg, get, where, notes)
        else:
            fields = _depth_anything(get, cfg, where)
    except TypeError as e:
        raise VitexportError(f"{where} has an unreadable head option ({e}).") from None
    fields.update(num_classes=0, global_pool="")
    size = fields["img_size"]
    if processor is None:
        pp = fam.processing.at(size)
        notes.insert(0, f"{where} has no preprocessor_config.json: using {fam.title}'s documented preprocessing "
                        f"({fam.processing.text}).")
    else:
        pp, more = processor_preprocess(processor, fam, size, where)
        notes[:0] = more
        if processor.get("keep_aspect_ratio"):
            multiple = processor.get("ensure_multiple_of", 1)
            if not isinstance(multiple, int) or isinstance(multiple, bool) or not 0 < multiple <= 1024:
                raise VitexportError(f"{where}'s preprocessor ensure_multiple_of {multiple!r} is not 1..1024.")
            pp = replace(pp, multiple_of=multiple)
            notes.append(f"{where}'s processor keeps each image's aspect ratio (its sides multiples of {multiple}): "
                         f"a --dynamic-img-size export takes each image at that size (predict); at a fixed size, and "
                         f"for calibration and the bench, every image is resized to {size[0]}x{size[1]}.")
    return Described(fam, fields, pp, notes)


def _depth_anything(get: Callable[[str], Any], cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """Depth Anything: its DINOv2 backbone's fields, the head under `dense`."""
    bfam, bb = backbone_of(cfg, _DA_BACKBONE, where)
    fields = bfam.config_fields(bb, f"{where}'s backbone_config")
    if tuple(fields["patch_size"]) != (get("patch_size"),) * 2:
        raise VitexportError(f"{where}'s patch_size {get('patch_size')} differs from its backbone's "
                             f"{fields['patch_size'][0]}.")
    if get("reassemble_hidden_size") != fields["embed_dim"]:
        raise VitexportError(f"{where}'s reassemble_hidden_size {get('reassemble_hidden_size')} differs from its "
                             f"backbone's width {fields['embed_dim']}.")
    fields["dense"] = DenseConfig(
        task="depth", taps=taps(bb, fields["depth"], f"{where}'s backbone_config"),
        tap_norm=bool(bb.get("apply_layernorm", True)), readout="ignore",
        reassemble_factors=tuple(get("reassemble_factors")), neck_hidden_sizes=tuple(get("neck_hidden_sizes")),
        fusion_hidden_size=get("fusion_hidden_size"), fusion_upsample="next", head_in_index=get("head_in_index"),
        head_hidden_size=get("head_hidden_size"), head_upsample="patch",
        depth_type=get("depth_estimation_type"), max_depth=float(get("max_depth") or 1))
    return fields


def _dpt(cfg: dict[str, Any], get: Callable[[str], Any], where: str,
         notes: list[str]) -> tuple[Family, dict[str, Any]]:
    """DPT: its own ViT (fields read with DPTConfig's defaults, taps at 0-based block indices, not normed, a square
    grid) or a DINOv2 backbone (as Depth Anything's); the head per DPTConfig."""
    if get("is_hybrid"):
        raise VitexportError(f"{where} is DPT-Hybrid (is_hybrid: a BiT convolutional backbone under the ViT); "
                             f"vitexport builds DPT over its own ViT or a DINOv2 backbone.")
    task = _dpt_task(cfg, where)
    if cfg.get("backbone_config") is None and cfg.get("backbone") is None:
        fam, fields = DPT, DPT.config_fields(cfg, where)
        tapped = _dpt_taps(get("backbone_out_indices"), fields["depth"], where)
        tap_norm, square = False, True
    elif task == "segmentation":
        raise VitexportError(f"{where} is a DPTForSemanticSegmentation with a backbone_config, which transformers "
                             f"ignores for its own ViT; vitexport builds DPT segmentation over DPT's own ViT.")
    else:
        bfam, bb = backbone_of(cfg, {}, where)
        fam, fields = DPT_DINOV2, bfam.config_fields(bb, f"{where}'s backbone_config")
        tapped = taps(bb, fields["depth"], f"{where}'s backbone_config")
        tap_norm, square = bool(bb.get("apply_layernorm", True)), False
    act, bn, bias = get("hidden_act"), bool(get("use_batch_norm_in_fusion_residual")), \
        get("use_bias_in_fusion_residual")
    if act not in ACTIVATIONS:
        raise VitexportError(f"{where}'s readout uses the activation {act!r}; vitexport builds "
                             f"{', '.join(ACTIVATIONS)}.")
    seg = task == "segmentation"
    fields["dense"] = DenseConfig(
        task=task, taps=tapped, tap_norm=tap_norm, readout=get("readout_type"), readout_act=ACTIVATIONS[act],
        square_grid=square, reassemble_factors=tuple(get("reassemble_factors")),
        neck_hidden_sizes=tuple(get("neck_hidden_sizes")), fusion_hidden_size=get("fusion_hidden_size"),
        fusion_upsample="x2", fusion_batch_norm=bn, fusion_bias=(not bn) if bias is None else bool(bias),
        head_in_index=get("head_in_index"), head_hidden_size=DPT_HEAD_HIDDEN, head_upsample="x2",
        head_projection=not seg and bool(get("add_projection")), num_labels=_num_labels(cfg) if seg else 0)
    if seg and get("use_auxiliary_head"):
        notes.append(f"{where}'s auxiliary head is left out: transformers runs it and discards its output (it only "
                     f"feeds the training loss).")
    return fam, fields


def _dpt_task(cfg: dict[str, Any], where: str) -> str:
    """Depth or segmentation, from the class config.json names (depth when it names none)."""
    arch = cfg.get("architectures") or []
    if not isinstance(arch, list):
        raise VitexportError(f"{where}'s architectures {arch!r} is not a list of class names.")
    if "DPTForSemanticSegmentation" in arch:
        return "segmentation"
    if not arch or "DPTForDepthEstimation" in arch:
        return "depth"
    raise VitexportError(f"{where} is a transformers {arch[0]}; vitexport builds DPTForDepthEstimation and "
                         f"DPTForSemanticSegmentation.")


def _dpt_taps(indices: Any, depth: int, where: str) -> tuple[int, ...]:
    """DPT's backbone_out_indices (0-based blocks; transformers keeps the hidden states whose index is among them,
    in order) as hidden-state indices."""
    if not isinstance(indices, (list, tuple)) or not indices or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < depth for i in indices):
        raise VitexportError(f"{where}'s backbone_out_indices {indices!r} are not block indices 0..{depth - 1}.")
    return tuple(i + 1 for i in sorted(set(indices)))


def _num_labels(cfg: dict[str, Any]) -> int:
    """The labels a segmentation head scores, as transformers counts them: id2label's, else num_labels (2)."""
    id2label = cfg.get("id2label")
    if isinstance(id2label, dict) and id2label:
        return len(id2label)
    return cfg.get("num_labels", 2)


def _eomt(cfg: dict[str, Any], processor: dict[str, Any] | None, where: str, fam: Family) -> Described:
    """EoMT: a DINOv2-like ViT (its position embedding on the patches alone; a gated MLP of separate projections
    when use_swiglu_ffn) or a DINOv3 one (its RoPE theta under rope_parameters), its queries and predictors under
    `dense`, at its image_size alone; its processor's resize-and-pad (a sliding window of do_split_image is one
    window per image here, said in a note)."""
    def get(key: str) -> Any:
        return cfg.get(key, fam.defaults.get(key))

    if fam is EOMT_DINOV3:
        rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
        fields = fam.config_fields({**cfg, "rope_theta": rope.get("rope_theta", 100.0)}, where)
    else:
        fields = fam.config_fields(cfg, where)
        fields["no_embed_class"] = True
    fields.update(global_pool="", num_classes=0)
    act = get("hidden_act")
    if fam is EOMT and get("use_swiglu_ffn"):  # gate_proj, up_proj, down_proj: two thirds of the width, rounded up to 8
        hidden = (int(int(fields["embed_dim"] * get("mlp_ratio")) * 2 / 3) + 7) // 8 * 8
        fields.update(mlp_layer="swiglu", mlp_ratio=mlp_ratio(fields["embed_dim"], hidden), act_layer="silu")
    size = fields["img_size"]
    try:
        fields["dense"] = DenseConfig(
            task="segmentation", head="eomt", readout_act=ACTIVATIONS[act], num_labels=_num_labels(cfg),
            num_queries=get("num_queries"), query_blocks=get("num_blocks"), upscale_blocks=get("num_upscale_blocks"),
            grid=(size[0] // fields["patch_size"][0], size[1] // fields["patch_size"][1]))
    except TypeError as e:
        raise VitexportError(f"{where} has an unreadable head option ({e}).") from None
    notes: list[str] = ["The export adds semantic_probs to EoMT's two outputs: per class and pixel at the masks' "
                        "resolution, the sum over queries of P(class) x sigmoid(mask) (the processor's semantic "
                        "post-processing before its resizes), the map every check judges."]
    if processor is None:
        return Described(fam, fields, fam.processing.at(size), [f"{where} has no preprocessor_config.json: using "
                         f"EoMT's documented preprocessing ({fam.processing.text}).", *notes])
    square = {**processor, "size": {"height": size[0], "width": size[1]}, "do_center_crop": False}
    pp, more = processor_preprocess(square, fam, size, where)
    if processor.get("do_split_image"):
        notes.append(f"{where}'s processor splits an image into overlapping windows; vitexport fits each image into "
                     f"one {size[0]}x{size[1]} window, padded below and right.")
    return Described(fam, fields, replace(pp, crop_mode="pad", crop_pct=1.0), [*more, *notes])
