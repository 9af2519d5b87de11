"""timm's constructor arguments in ViTConfig's vocabulary: what `scripts/gen_timm_archs.py` records from timm's
registry for the table, and what a timm hub repository's `model_args` says, translated by the same rules. No timm
and no torch here: timm's parts arrive as names.

Each model class of timm names its options its own way, with its own defaults:

- `vision_transformer` and `deit` (`VisionTransformer`): ViTConfig's own names;
- `eva` (`Eva`: EVA, EVA02, DINOv3, PE, the RoPE ViTs, Sapiens2, LingBot): family 'eva';
- `beit` (`Beit`): family 'beit';
- `naflexvit` (`NaFlexVit`, its `NaFlexVitCfg` fields): an image-tensor ViT whose patch embedding is a Linear over
  channels-last patches (`checkpoints.timm_naflex` turns it into the patch convolution) and whose position
  embedding, at its own grid, is resampled to each input's grid: family 'vit';
- `vision_transformer_sam` (`VisionTransformerSAM`: Segment Anything's image encoder and its 224-px classifier
  form): family 'sam'.

A part (norm, activation, MLP, block, attention) is its class's or function's name, a string timm resolves itself,
or `{"partial": NAME, **keywords}` for a functools.partial. What has no translation is kept under 'unsupported',
so vitexport names it and refuses, before anything is built.
"""

from __future__ import annotations

from typing import Any

MODULES = ("vision_transformer", "deit", "eva", "beit", "naflexvit", "vision_transformer_sam")

ACTS = {"GELU": "gelu", "gelu": "gelu", "gelu_tanh": "gelu_tanh", "GELUTanh": "gelu_tanh", "quick_gelu": "quick_gelu",
        "QuickGELU": "quick_gelu", "SiLU": "silu", "silu": "silu", "swish": "silu"}
NORMS = {"LayerNorm": "layernorm", "layernorm": "layernorm", "RmsNorm": "rmsnorm", "rmsnorm": "rmsnorm"}
BLOCKS = {"Block": "block", "ResPostBlock": "res_post", "ParallelScalingBlock": "parallel_scaling",
          "DiffParallelScalingBlock": "diff_parallel_scaling", "ParallelThingsBlock": "parallel_things"}
ATTNS = {"": "attn", "attn": "attn", "Attention": "attn", "diff": "diff", "DiffAttention": "diff"}
MLPS = {"Mlp": "mlp", "SwiGLU": "swiglu", "GluMlp": "glu"}
# VisionTransformer's arguments that are ViTConfig fields of the same name
PLAIN = ("img_size", "patch_size", "in_chans", "num_classes", "global_pool", "embed_dim", "depth", "num_heads",
         "mlp_ratio", "qkv_bias", "qk_norm", "scale_attn_norm", "scale_mlp_norm", "proj_bias", "init_values",
         "class_token", "no_embed_class", "reg_tokens", "pre_norm", "final_norm", "fc_norm", "pool_include_prefix",
         "dynamic_img_size", "distilled")
# training-only, run-time, or how timm loads weights: no part of the model's function
IGNORED = ("weight_init", "drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate", "attn_drop_rate",
           "drop_path_rate", "fix_init", "out_indices", "pretrained_cfg", "pretrained_cfg_overlay", "cache_dir",
           "feature_cfg", "pretrained_strict", "head_init_scale", "device", "dtype",
           # DINOv3's and Sapiens2's RoPE coordinate augmentations apply in training only
           "rope_shift_coords", "rope_jitter_coords", "rope_rescale_coords")


def _part(v: Any) -> tuple[str, dict]:
    """A recorded part -> (its name, the keywords of a partial)."""
    if isinstance(v, dict) and "partial" in v:
        return str(v["partial"]), {k: w for k, w in v.items() if k != "partial"}
    return ("" if v is None else str(v)), {}


def _norm(v: Any, key: str, out: dict, bad: dict) -> None:
    """norm_layer (or embed_norm_layer) -> its name and, when the partial sets one, its eps."""
    name, kw = _part(v)
    if name not in NORMS or set(kw) - {"eps"}:
        bad[key] = v if not isinstance(v, dict) else repr(v)
        return
    out[key] = NORMS[name]
    if "eps" in kw:
        out[key.replace("_layer", "_eps")] = float(kw["eps"])


def _vit_part(k: str, v: Any, out: dict, bad: dict) -> None:
    """One of VisionTransformer's part arguments."""
    name, kw = _part(v)
    if k == "act_layer":
        (out.__setitem__(k, ACTS[name]) if name in ACTS else bad.__setitem__(k, name))
    elif k in ("norm_layer", "embed_norm_layer"):
        _norm(v, k, out, bad)
    elif k == "mlp_layer":
        if name == "GluMlp" and kw and set(kw) <= {"act_layer", "gate_last"}:
            out[k] = "glu" if kw.get("gate_last", True) else "swiglu_packed"
        elif not kw and name in MLPS:
            out[k] = MLPS[name]
        else:
            bad[k] = repr(v)
    elif k == "block_fn":
        (out.__setitem__(k, BLOCKS[name]) if name in BLOCKS and not kw else bad.__setitem__(k, name))
    elif k == "attn_layer":
        (out.__setitem__(k, ATTNS[name]) if name in ATTNS and not kw else bad.__setitem__(k, name))


def _finish(out: dict, bad: dict) -> dict:
    out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in out.items()}
    if bad:
        out["unsupported"] = {k: (v if isinstance(v, (int, float, str, bool, type(None))) else repr(v))
                              for k, v in bad.items()}
    return out


def translate_vit(kwargs: dict) -> dict:
    """VisionTransformer's arguments (vision_transformer.py, deit.py)."""
    out: dict = {}
    bad: dict = {}
    for k, v in kwargs.items():
        if k in IGNORED:
            continue
        if k in PLAIN:
            out[k] = v
        elif k in ("act_layer", "norm_layer", "embed_norm_layer", "mlp_layer", "block_fn", "attn_layer"):
            _vit_part(k, v, out, bad)
        else:
            bad[k] = v
    return _finish(out, bad)


# Eva's defaults where they are not ViTConfig's, so a translation says everything the model is
EVA_DEFAULTS = {"global_pool": "avg", "qkv_bias": True, "attn_type": "eva", "rope_type": "cat", "mlp_ratio": 4.0}
_EVA_RENAMES = {"num_reg_tokens": "reg_tokens", "use_abs_pos_emb": "abs_pos_embed", "ref_feat_shape": "rope_ref_grid",
                "use_pre_transformer_norm": "pre_norm", "scale_mlp": "scale_mlp_norm",
                "scale_attn_inner": "scale_attn_norm", "attn_pool_num_heads": "pool_heads",
                "attn_pool_mlp_ratio": "pool_mlp_ratio", "swiglu_align_to": "mlp_align_to"}
_EVA_PLAIN = ("img_size", "patch_size", "in_chans", "num_classes", "global_pool", "embed_dim", "depth", "num_heads",
              "num_kv_heads", "qkv_bias", "qkv_fused", "qk_norm", "mlp_ratio", "init_values",
              "attn_only_layer_scale", "class_token", "no_embed_class", "rope_grid_offset", "rope_grid_indexing",
              "rope_temperature", "rope_rotate_half", "dynamic_img_size")
_EVA_HANDLED = ("norm_layer", "attn_type", "use_rot_pos_emb", "rope_type", "swiglu_mlp", "use_post_norm",
                "use_post_transformer_norm", "use_fc_norm")


def translate_eva(kwargs: dict) -> dict:
    """Eva's arguments (eva.py) -> family 'eva'."""
    a = {**EVA_DEFAULTS, **kwargs}
    out: dict = {"family": "eva"}
    bad: dict = {}
    for k, v in a.items():
        if k in IGNORED or k in _EVA_HANDLED:
            continue
        if k in _EVA_PLAIN:
            out[k] = v
        elif k in _EVA_RENAMES:
            out[_EVA_RENAMES[k]] = v
        elif k == "dynamic_img_pad" and not v:
            continue
        else:
            bad[k] = v
    if "norm_layer" in a:
        _norm(a["norm_layer"], "norm_layer", out, bad)
    out["k_bias"] = a["attn_type"] == "rope"  # EVA's own attention learns no key bias; timm's AttentionRope does
    if a["attn_type"] not in ("eva", "rope"):
        bad["attn_type"] = a["attn_type"]
    if a.get("use_rot_pos_emb"):
        if a["rope_type"] in ("cat", "dinov3", "mixed"):
            out["rope"] = a["rope_type"]
        else:
            bad["rope_type"] = a["rope_type"]
    if a.get("swiglu_mlp"):  # SiLU-gated; timm packs value and gate in one fc1 unless it norms or aligns them
        out["act_layer"] = "silu"
        out["mlp_layer"] = "swiglu" if a.get("scale_mlp") or a.get("swiglu_align_to") else "swiglu_packed"
    if a.get("use_post_norm"):
        out["block_fn"] = "res_post"
    if out.get("global_pool") == "map":
        out["pool_include_prefix"] = True  # EVA's attention pool reads every token, the prefix too
    # the final norm before pooling, after it (fc_norm), or neither, as Eva resolves its two options
    fc = a.get("use_fc_norm") if a.get("use_fc_norm") is not None else a["global_pool"] == "avg"
    post = a.get("use_post_transformer_norm") if a.get("use_post_transformer_norm") is not None else not fc
    if fc and post:
        bad["use_post_transformer_norm"] = "with use_fc_norm"
    out["final_norm"], out["fc_norm"] = bool(fc or post), bool(fc)
    return _finish(out, bad)


BEIT_DEFAULTS = {"global_pool": "avg", "qkv_bias": True, "mlp_ratio": 4.0}
_BEIT_PLAIN = ("img_size", "patch_size", "in_chans", "num_classes", "global_pool", "embed_dim", "depth", "num_heads",
               "qkv_bias", "mlp_ratio", "init_values")


def translate_beit(kwargs: dict) -> dict:
    """Beit's arguments (beit.py) -> family 'beit'."""
    a = {**BEIT_DEFAULTS, **kwargs}
    out: dict = {"family": "beit", "k_bias": False}
    bad: dict = {}
    for k, v in a.items():
        if k in IGNORED or k in ("norm_layer", "use_rel_pos_bias", "use_shared_rel_pos_bias", "use_fc_norm",
                                 "swiglu_mlp", "scale_mlp", "use_abs_pos_emb"):
            continue
        if k in _BEIT_PLAIN:
            out[k] = v
        else:
            bad[k] = v
    if "norm_layer" in a:
        _norm(a["norm_layer"], "norm_layer", out, bad)
    if not out.get("init_values"):
        out.pop("init_values", None)  # BEiT's LayerScale is on only for a non-zero init value
    out["abs_pos_embed"] = bool(a.get("use_abs_pos_emb", True))
    if a.get("use_rel_pos_bias") and a.get("use_shared_rel_pos_bias"):
        bad["use_rel_pos_bias"] = "with use_shared_rel_pos_bias"
    out["rel_pos_bias"] = "shared" if a.get("use_shared_rel_pos_bias") else "block" if a.get("use_rel_pos_bias") \
        else ""
    if a.get("swiglu_mlp"):
        out["mlp_layer"], out["act_layer"] = "swiglu", "silu"
    out["scale_mlp_norm"] = bool(a.get("scale_mlp"))
    out["fc_norm"] = a["use_fc_norm"] if a.get("use_fc_norm") is not None else a["global_pool"] == "avg"
    return _finish(out, bad)


# NaFlexVitCfg's fields by what they become; the defaults are NaFlexVitCfg's (timm 1.0.31)
NAFLEX_DEFAULTS = {"patch_size": 16, "embed_dim": 768, "depth": 12, "num_heads": 12, "mlp_ratio": 4.0,
                   "qkv_bias": True, "class_token": False, "reg_tokens": 0, "pos_embed": "learned",
                   "pos_embed_grid_size": (16, 16), "pos_embed_interp_mode": "bicubic", "pos_embed_antialias": True,
                   "pos_embed_align_corners": False, "pos_embed_ar_preserving": False, "global_pool": "map",
                   "final_norm": True, "embed_proj_type": "linear", "patchify_channels_last": True}
_NAFLEX_PLAIN = ("img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads", "mlp_ratio",
                 "scale_mlp_norm", "qkv_bias", "qk_norm", "proj_bias", "init_values", "class_token", "reg_tokens",
                 "pre_norm", "final_norm", "fc_norm", "global_pool", "pool_include_prefix")
_NAFLEX_RENAMES = {"scale_attn_inner_norm": "scale_attn_norm", "attn_pool_num_heads": "pool_heads",
                   "attn_pool_mlp_ratio": "pool_mlp_ratio"}
# options that must keep NaFlexVitCfg's default for the image-tensor ViT vitexport builds
_NAFLEX_FIXED = {"num_kv_heads": None, "rope_type": "", "dynamic_img_pad": False, "input_norm_layer": None,
                 "block_fn": None, "mlp_layer": None, "attn_layer": None, "attn_type": "standard",
                 "attn_gated": False, "swiglu_mlp": False, "swiglu_align_to": 0, "qkv_fused": True,
                 "attn_only_layer_scale": False, "enable_patch_interpolator": False, "rope_mrope_section": None}
# only NaFlex mode (patch dictionaries, masks) reads these: an image tensor never does
_NAFLEX_UNUSED = ("use_key_only_attn_mask", "pos_embed_use_grid_sample", "rope_temperature", "rope_ref_feat_shape",
                  "rope_grid_offset", "rope_grid_indexing", "rope_rotate_half")
# (mode, antialias, align_corners) -> posembed.INTERPOLATIONS' name
_INTERP_NAMES = {("bicubic", True, False): "bicubic-antialias", ("bicubic", False, False): "bicubic",
                 ("bilinear", False, False): "bilinear", ("bilinear", True, False): "bilinear-antialias",
                 ("bilinear", False, True): "bilinear-corners"}


def translate_naflex(kwargs: dict) -> dict:
    """NaFlexVit's configuration (naflexvit.py: its NaFlexVitCfg fields and the keywords overlaid on them) ->
    family 'vit' with the position embedding on the patch tokens at its own grid."""
    a = {**NAFLEX_DEFAULTS, **kwargs}
    out: dict = {"no_embed_class": True}  # the position embedding is added to the patch tokens, never the prefix
    bad: dict = {}
    for k, v in a.items():
        if k in IGNORED or k in _NAFLEX_UNUSED:
            continue
        if k in _NAFLEX_PLAIN:
            out[k] = v
        elif k in _NAFLEX_RENAMES:
            out[_NAFLEX_RENAMES[k]] = v
        elif k in _NAFLEX_FIXED:
            if v != _NAFLEX_FIXED[k] and not (k == "rope_type" and v == "none"):
                bad[k] = v
        elif k in ("act_layer", "norm_layer", "embed_norm_layer"):
            if v is not None:
                _vit_part(k, v, out, bad)
        elif k in ("pos_embed", "pos_embed_grid_size", "pos_embed_interp_mode", "pos_embed_antialias",
                   "pos_embed_align_corners", "pos_embed_ar_preserving", "embed_proj_type",
                   "patchify_channels_last"):
            continue
        else:
            bad[k] = v
    if a["embed_proj_type"] not in ("linear", "conv"):
        bad["embed_proj_type"] = a["embed_proj_type"]
    if a["pos_embed"] == "factorized":
        # two 1-D tables, each resampled linearly and summed: the same as their sum resampled bilinearly (both
        # are linear and separable), which is how the converter stores them
        out["pos_embed_interp"] = "bilinear"
    elif a["pos_embed"] == "learned":
        key = (a["pos_embed_interp_mode"], bool(a["pos_embed_antialias"]), bool(a["pos_embed_align_corners"]))
        if key in _INTERP_NAMES:
            out["pos_embed_interp"] = _INTERP_NAMES[key]
        else:
            bad["pos_embed_interp_mode"] = f"{key[0]} (antialias={key[1]}, align_corners={key[2]})"
    else:
        bad["pos_embed"] = a["pos_embed"]
    if a["pos_embed_ar_preserving"]:
        out["pos_embed_square"] = True
    return _finish(out, bad)


# VisionTransformerSAM's defaults where they are not ViTConfig's; its blocks' LayerNorm is the class itself, so its
# eps is PyTorch's 1e-5 (the 1e-6 fallback in its constructor applies only to norm_layer=None)
SAM_DEFAULTS = {"img_size": 1024, "num_classes": 768, "global_pool": "avg", "use_abs_pos": True, "use_rel_pos": False,
                "window_size": 14, "global_attn_indexes": (), "neck_chans": 256}
_SAM_PLAIN = ("img_size", "patch_size", "in_chans", "num_classes", "global_pool", "embed_dim", "depth", "num_heads",
              "mlp_ratio", "qkv_bias", "qk_norm", "init_values", "pre_norm", "window_size", "global_attn_indexes")
_SAM_DEFAULT_PARTS = {"embed_layer": None, "block_fn": "Block", "mlp_layer": "Mlp", "use_rope": False,
                      "head_hidden_size": None, "ref_feat_shape": None}


def translate_sam(kwargs: dict) -> dict:
    """VisionTransformerSAM's arguments (vision_transformer_sam.py) -> family 'sam'."""
    a = {**SAM_DEFAULTS, **kwargs}
    out: dict = {"family": "sam", "class_token": False, "norm_eps": 1e-5}
    bad: dict = {}
    for k, v in a.items():
        if k in IGNORED or k in ("use_abs_pos", "use_rel_pos", "neck_chans"):
            continue
        if k in _SAM_PLAIN:
            out[k] = v
        elif k in ("norm_layer", "act_layer"):
            if v is not None:
                _vit_part(k, v, out, bad)
        elif k in _SAM_DEFAULT_PARTS:
            if v not in (_SAM_DEFAULT_PARTS[k], None) and not (k == "embed_layer" and "PatchEmbed" in str(v)):
                bad[k] = v
        else:
            bad[k] = v
    if out.get("init_values") in (0, 0.0):
        out.pop("init_values")
    out["abs_pos_embed"] = bool(a["use_abs_pos"])
    out["rel_pos_bias"] = "decomposed" if a["use_rel_pos"] else ""
    out["neck_chans"] = int(a["neck_chans"] or 0)
    if not out.get("window_size"):
        out["window_size"] = 0
    return _finish(out, bad)


# the arguments a hub repository's model_args may change, by their names in each module (create_model's keywords:
# sizes, the head, pooling), and the ViTConfig field each is
_OVERRIDES = {
    "eva": {**{k: k for k in _EVA_PLAIN}, **_EVA_RENAMES},
    "beit": {**{k: k for k in _BEIT_PLAIN}, "use_abs_pos_emb": "abs_pos_embed"},
    "naflexvit": {**{k: k for k in _NAFLEX_PLAIN}, **_NAFLEX_RENAMES},
    "vision_transformer_sam": {**{k: k for k in _SAM_PLAIN}, "use_abs_pos": "abs_pos_embed",
                               "neck_chans": "neck_chans"},
}


def translate_overrides(module: str, kwargs: dict) -> dict:
    """The arguments a timm repository's config.json changes (`model_args`: what create_model was given) -> the
    ViTConfig fields they change, the rest under 'unsupported'. Unlike `translate`, nothing is filled in from the
    class's defaults: the architecture's table entry holds the rest."""
    if module not in _OVERRIDES:
        return translate_vit(kwargs)
    names = _OVERRIDES[module]
    out: dict = {}
    bad: dict = {}
    for k, v in kwargs.items():
        if k in IGNORED or (k == "dynamic_img_pad" and not v):
            continue
        if k in names:
            out[names[k]] = v
        elif k == "norm_layer":
            _norm(v, k, out, bad)
        else:
            bad[k] = v
    return _finish(out, bad)


TRANSLATORS = {"vision_transformer": translate_vit, "deit": translate_vit, "eva": translate_eva,
               "beit": translate_beit, "naflexvit": translate_naflex, "vision_transformer_sam": translate_sam}


def translate(module: str, kwargs: dict) -> dict:
    """timm's arguments of a model of `module` -> ViTConfig fields (and 'unsupported': what has no translation)."""
    return TRANSLATORS[module](kwargs)
