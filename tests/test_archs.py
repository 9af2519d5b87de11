"""timm's vision transformers by name: the generated table against the installed timm, every option of the
reference ViT against timm's own model with the same weights (one by one, and as each registered architecture of
vision_transformer.py, deit.py, eva.py, beit.py and naflexvit.py combines them), and the preprocessing of each crop
mode against timm's. The options of the RoPE and relative-position families one by one: tests/test_rope_families.py."""

import json
from functools import partial

import numpy as np
import pytest
import timm
import torch
from conftest import load_script
from PIL import Image
from timm.layers import GluMlp, RmsNorm, SwiGLU
from timm.layers import LayerNorm as TimmLayerNorm
from timm.models import vision_transformer as tvt

from vitexport.data.images import preprocess_image
from vitexport.data.preprocess import Preprocess
from vitexport.errors import VitexportError
from vitexport.model.archs import arch_names, get_arch, resolve, table
from vitexport.model.build import build_model, model_class
from vitexport.model.readers.checkpoints import detect_format
from vitexport.model.readers.checkpoints.adapt import adapt_state_dict
from vitexport.model.config import ViTConfig
from vitexport.model.spec import user_spec
from vitexport.model.readers.timm_args import MODULES
from vitexport.model.vit import VisionTransformer


def _without_params(t: dict) -> dict:
    t = json.loads(json.dumps(t))
    for e in t["architectures"].values():
        for d in e["tags"].values():
            d.pop("params", None)
    return t


def test_the_committed_table_is_the_installed_timm_s():
    """Regenerated from timm's registry now (parameter counts aside: the next test holds those), it is the file."""
    assert _without_params(load_script("gen_timm_archs").generate(params=False)) == _without_params(table())


def test_the_table_covers_timm_s_vision_transformer_modules():
    names = {a for m in MODULES for a in timm.list_models(module=m)}
    assert set(arch_names()) == names
    tags = {t for a in names for t in timm.list_pretrained(f"{a}.*")}
    assert {f"{a}.{t}" for a in arch_names() for t in get_arch(a).tags} == tags
    assert len(tags) >= 430  # 440 in timm 1.0.31: 333 of vision_transformer.py and deit.py, 107 of the other three
    assert {get_arch(a).module for a in arch_names()} == set(MODULES)


def _converted(ref: torch.nn.Module) -> dict:
    """timm's state dict in the reference model's names (NaFlexViT's embedding moved; the others as they are)."""
    raw = ref.state_dict()
    return detect_format(set(raw)).convert(raw)


@pytest.mark.parametrize("arch", sorted(arch_names()))
def test_every_architecture_has_timm_s_tensors_and_counts(arch, monkeypatch):
    """On the meta device (no memory): the same state-dict names and shapes as timm's model of the default tag, and
    the parameter count the table lists. NaFlexViT stores its position embedding at its own grid, which vitexport
    resamples to the model's once (timm: on every forward), so that one tensor's shape and count differ. A meta
    tensor has no values, so timm's truncated-normal fill is skipped: run on the meta device, its clamp was 85 % of
    the time."""
    monkeypatch.setattr(timm.layers.weight_init, "_trunc_normal_", lambda tensor, *args: tensor)
    a = get_arch(arch)
    with torch.device("meta"):
        ref = timm.create_model(arch, pretrained=False)
        ours = model_class(a.config())(a.config())
    want = {k: tuple(v.shape) for k, v in _converted(ref).items()}
    got = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    extra = 0
    if a.module == "naflexvit":
        extra = got["pos_embed"][1] * got["pos_embed"][2] - sum(
            p.numel() for n, p in ref.named_parameters() if n.startswith("embeds.pos_embed"))
        want.pop("pos_embed"), got.pop("pos_embed")
    assert got == want
    if a.default_tag is not None:
        assert sum(p.numel() for p in ours.parameters()) == a.default_tag.params + extra


# -- numbers: each option, then each architecture, at tiny sizes ---------------------------------------------------

TINY = dict(embed_dim=64, num_heads=4, depth=2, img_size=32, patch_size=8, num_classes=7)
_TIMM_MLP = {"mlp": None, "swiglu": SwiGLU, "glu": GluMlp, "swiglu_packed": partial(GluMlp, gate_last=False)}
_TIMM_BLOCK = {"block": tvt.Block, "res_post": tvt.ResPostBlock, "parallel_scaling": tvt.ParallelScalingBlock,
               "diff_parallel_scaling": tvt.DiffParallelScalingBlock, "parallel_things": tvt.ParallelThingsBlock}


def timm_kwargs(fields: dict) -> dict:
    """ViTConfig fields -> timm's VisionTransformer arguments (the parts as timm's classes)."""
    kw = dict(fields)
    norm = {"layernorm": TimmLayerNorm, "rmsnorm": RmsNorm}
    kw["norm_layer"] = partial(norm[kw.pop("norm_layer", "layernorm")], eps=kw.pop("norm_eps", 1e-6))
    if kw.get("embed_norm_layer"):
        kw["embed_norm_layer"] = partial(norm[kw.pop("embed_norm_layer")], eps=kw.pop("embed_norm_eps", 1e-6))
    if (mlp := _TIMM_MLP[kw.pop("mlp_layer", "mlp")]) is not None:
        kw["mlp_layer"] = mlp
    kw["block_fn"] = _TIMM_BLOCK[kw.pop("block_fn", "block")]
    kw.pop("distilled", None)
    return kw


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """The coverage run's perturbation, larger: tiny models have few tensors for an error to hide in."""
    return load_script("timm_coverage").perturb(model, scale=0.05)


def assert_same_as_timm(ref: torch.nn.Module, cfg: ViTConfig, batch: int = 2, pos_embed_interp: str | None = None,
                        size: tuple[int, int] | None = None) -> None:
    """Our model of `cfg` with timm's weights (converted, fitted to the grid as an export fits them) gives timm's
    output, eager and in the explicit attention form the export traces."""
    ours = build_model(cfg)
    raw = perturbed(ref).state_dict()
    fmt = detect_format(set(raw))
    hints = fmt.hints(raw) if hasattr(fmt, "hints") else {}
    sd, _ = adapt_state_dict(fmt.convert(raw), ours, pos_embed_interp or cfg.pos_embed_interp, hints.get("grid"))
    ours.load_state_dict(sd, strict=True)
    x = torch.randn(batch, 3, *(size or cfg.img_size), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = ref(x), ours(x)
        ours.set_fused_attn(False)  # the exported form too
        explicit = ours(x)
    assert got.shape == want.shape
    tol = 1e-5 * max(1.0, want.abs().max().item())
    assert (got - want).abs().max().item() <= tol
    assert (explicit - want).abs().max().item() <= tol


OPTIONS = {
    "reg_tokens": dict(reg_tokens=4), "reg_tokens_no_embed_class": dict(reg_tokens=4, no_embed_class=True),
    "pool_avg": dict(global_pool="avg"), "pool_avgmax": dict(global_pool="avgmax"), "pool_max": dict(global_pool="max"),
    "pool_map": dict(global_pool="map", class_token=False), "pool_none": dict(global_pool="", num_classes=0),
    "pool_include_prefix": dict(global_pool="avg", pool_include_prefix=True, reg_tokens=1),
    "gelu_tanh": dict(act_layer="gelu_tanh"), "quick_gelu": dict(act_layer="quick_gelu"),
    "silu": dict(act_layer="silu"),
    "swiglu": dict(mlp_layer="swiglu", act_layer="silu"), "swiglu_packed": dict(mlp_layer="swiglu_packed",
                                                                               act_layer="silu"),
    "glu": dict(mlp_layer="glu"), "layernorm_eps": dict(norm_eps=1e-5), "rmsnorm": dict(norm_layer="rmsnorm"),
    "qk_norm": dict(qk_norm=True), "no_proj_bias": dict(proj_bias=False), "no_qkv_bias": dict(qkv_bias=False),
    "embed_norm": dict(embed_norm_layer="rmsnorm", embed_norm_eps=1e-5), "no_final_norm": dict(final_norm=False),
    "scale_norms": dict(scale_attn_norm=True, scale_mlp_norm=True), "fc_norm": dict(fc_norm=True),
    "no_fc_norm_avg": dict(global_pool="avg", fc_norm=False), "no_embed_class": dict(no_embed_class=True),
    "pre_norm": dict(pre_norm=True), "no_class_token": dict(class_token=False, global_pool="avg"),
    "layer_scale": dict(init_values=1e-5), "res_post": dict(block_fn="res_post", init_values=1e-5),
    "parallel_scaling": dict(block_fn="parallel_scaling", qkv_bias=False, init_values=1e-5),
    "parallel_scaling_qkv_bias": dict(block_fn="parallel_scaling", qk_norm=True),
    "diff_parallel_scaling": dict(block_fn="diff_parallel_scaling", qkv_bias=False),
    "parallel_things": dict(block_fn="parallel_things"), "diff_attention": dict(attn_layer="diff"),
    "diff_attention_qk_norm": dict(attn_layer="diff", qk_norm=True, norm_layer="rmsnorm"),
    "non_square": dict(img_size=(32, 48)), "cut_patch": dict(img_size=(36, 36)),  # 36 = 4 patches + 4 pixels
}


@pytest.mark.parametrize("option", list(OPTIONS))
def test_each_option_matches_timm(option):
    fields = {**TINY, **OPTIONS[option]}
    torch.manual_seed(0)
    ref = tvt.VisionTransformer(**timm_kwargs(fields))
    assert_same_as_timm(ref, ViTConfig(**fields))


def test_the_distilled_deit_averages_its_two_heads_as_timm_does():
    from timm.models.deit import VisionTransformerDistilled

    torch.manual_seed(0)
    fields = {**TINY, "distilled": True}
    assert_same_as_timm(VisionTransformerDistilled(**timm_kwargs(fields)), ViTConfig(**fields))


def _tiny(arch: str) -> dict:
    """The architecture's own options at a tiny size: width 96 (an even hidden width for every MLP ratio the family
    uses with a packed GLU, 2 x 2.66667; a head size of 24, which RoPE splits in quarters), 4 heads, 2 blocks, a
    3 x 2 patch grid (non-square: RoPE's axes and BEiT's offsets cannot be swapped unseen; 2 x 2 for the classic
    ViTs), and grouped-query attention of 4 and 2 key/value heads where the architecture has it."""
    a = get_arch(arch)
    kw = dict(embed_dim=96, num_heads=4, depth=2, num_classes=5)
    kw["img_size"] = 2 * a.patch if a.module in ("vision_transformer", "deit") else (3 * a.patch, 2 * a.patch)
    if a.args.get("num_kv_heads"):
        kw["num_kv_heads"] = (4, 2)
    return kw


def _timm_tiny(arch: str) -> dict:
    """The same for timm's create_model: NaFlexViT takes no size (any input, its position embedding at its own grid)."""
    kw = _tiny(arch)
    if get_arch(arch).module == "naflexvit":
        kw.pop("img_size")
    return kw


def _combinations() -> list[str]:
    """One architecture for each combination of options the registry uses (sizes aside: the meta-device test above
    holds every architecture's own shapes)."""
    sizes = ("embed_dim", "depth", "num_heads", "img_size", "num_classes", "in_chans")
    seen: dict[str, str] = {}
    for arch in sorted(arch_names()):
        key = json.dumps({k: v for k, v in get_arch(arch).args.items() if k not in sizes}, sort_keys=True)
        seen.setdefault(key, arch)
    return sorted(seen.values())


@pytest.mark.parametrize("arch", _combinations())
def test_every_combination_of_options_matches_timm_at_a_tiny_size(arch):
    """Each combination of options a registered architecture uses, its width cut to 96 and depth to 2."""
    torch.manual_seed(0)
    ref = timm.create_model(arch, pretrained=False, **_timm_tiny(arch))
    assert_same_as_timm(ref, get_arch(arch).config(**_tiny(arch)))


# -- names -----------------------------------------------------------------------------------------------------------

def test_unknown_names_get_the_closest_ones():
    with pytest.raises(VitexportError) as e:
        get_arch("vit_small_patch14_dinov")
    assert "vit_small_patch14_dinov2" in str(e.value) and str(e.value).count(".") <= 3
    with pytest.raises(VitexportError, match=f"not one of the {len(arch_names())} architectures of timm's vision transformer modules"):
        resolve("eva03_base_patch14_224.mim_in22k")
    arch, tag = resolve("eva02_base_patch14_224.mim_in22k")  # eva.py's names are accepted as vision_transformer.py's
    assert (arch.module, arch.config(tag).family, tag.num_classes) == ("eva", "eva", 0)


def test_a_tag_names_its_own_size_classes_and_preprocessing():
    arch, tag = resolve("vit_small_patch14_reg4_dinov2.lvd142m")
    assert (tag.input_size, tag.num_classes, tag.crop_pct) == ((518, 518), 0, 1.0)
    cfg = arch.config(tag)
    assert (cfg.reg_tokens, cfg.no_embed_class, cfg.init_values, cfg.patch_size) == (4, True, 1e-5, (14, 14))
    spec = user_spec("vit_base_patch16_siglip_224")  # a bare architecture: the default tag's preprocessing
    assert spec.config().global_pool == "map" and not spec.config().class_token
    assert spec.preprocess_for((224, 224)).mean == (0.5, 0.5, 0.5)


# -- preprocessing of each crop mode ---------------------------------------------------------------------------------

@pytest.mark.parametrize("tag", ["vit_base_patch16_clip_384.openai_ft_in1k",  # squash
                                 "deit3_small_patch16_224.fb_in1k",  # center
                                 "vit_small_patch14_reg4_dinov2.lvd142m"])  # center, crop_pct 1.0
def test_the_preprocessing_of_a_tag_is_timm_s_resolve_data_config(tag):
    from timm.data import resolve_data_config

    with torch.device("meta"):
        model = timm.create_model(tag, pretrained=False)
    want = resolve_data_config({}, model=model)
    arch, t = resolve(tag)
    pp = arch.preprocess(tag=t)
    assert (3, *pp.input_size) == tuple(want["input_size"])
    assert pp.mean == pytest.approx(want["mean"]) and pp.std == pytest.approx(want["std"])
    assert (pp.crop_pct, pp.interpolation, pp.crop_mode) == (want["crop_pct"], want["interpolation"],
                                                              want["crop_mode"])


@pytest.mark.parametrize("mode", ["center", "squash", "border"])
@pytest.mark.parametrize("size,crop", [((64, 64), 0.9), ((64, 64), 1.0), ((48, 80), 0.875)])
def test_each_crop_mode_matches_timm_s_transform(mode, size, crop):
    from timm.data import create_transform

    pp = Preprocess(input_size=size, crop_pct=crop, interpolation="bicubic", mean=(0.485, 0.456, 0.406),
                    std=(0.229, 0.224, 0.225), crop_mode=mode)
    tf = create_transform(input_size=(3, *size), crop_pct=crop, crop_mode=mode, interpolation="bicubic",
                          mean=pp.mean, std=pp.std)
    rng = np.random.default_rng(0)
    for w, h in ((200, 120), (90, 160), (50, 50)):  # landscape, portrait, smaller than the target
        img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        img = img.resize((w // 4, h // 4)).resize((w, h))  # smooth: resize filters then differ only in rounding
        ref = tf(img).numpy()
        ours = preprocess_image(img, pp)
        assert ours.shape == ref.shape
        assert np.abs(ours - ref).mean() < 0.01, (w, h)
        if mode == "border" and crop == 1.0 and w != h:  # padded with the mean colour: 0 after normalisation
            assert np.abs(ours[:, 0, 0]).max() < 0.02 and np.abs(ref[:, 0, 0]).max() < 0.02


def test_an_option_vitexport_cannot_build_is_named_before_anything_is_built():
    """What the generator could not translate (a later timm's new option) is kept under 'unsupported' and refused."""
    from vitexport.model.archs import Architecture

    arch = Architecture("vit_future", "vision_transformer", {"embed_dim": 64, "unsupported": {"pos_embed": "rope"}}, {})
    with pytest.raises(VitexportError, match=r"vit_future needs pos_embed=rope, which vitexport's ViT does not build"):
        arch.config()


@pytest.mark.parametrize("option", ["reg_tokens_no_embed_class", "pool_map", "reg_tokens"])
def test_dynamic_image_size_matches_timm_with_prefix_tokens(option):
    """timm's dynamic_img_size resamples the position embedding per input; with register tokens and without a class
    token the prefix it skips differs, and so must ours."""
    fields = {**TINY, **OPTIONS[option], "dynamic_img_size": True}
    torch.manual_seed(0)
    ref = perturbed(tvt.VisionTransformer(**timm_kwargs(fields)))
    ours = VisionTransformer(ViTConfig(**fields)).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    for size in ((48, 24), (64, 64)):
        x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            want, got = ref(x), ours(x)
        assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item()), size


def test_the_models_command_lists_what_timm_lists():
    from click.testing import CliRunner

    from vitexport.cli import cli

    rows = json.loads(CliRunner().invoke(cli, ["models", "--json"]).output)
    names = {a for m in MODULES for a in timm.list_models(module=m)}
    assert {r["name"] for r in rows} == names | {"vit_digits_patch4_32"}
    tagged = json.loads(CliRunner().invoke(cli, ["models", "--pretrained", "--json", "*dinov2*"]).output)
    assert {r["name"] for r in tagged} == set(timm.list_pretrained("*dinov2*")) & {
        f"{a}.{t}" for a in names for t in get_arch(a).tags}
    small = next(r for r in tagged if r["name"] == "vit_small_patch14_reg4_dinov2.lvd142m")
    with torch.device("meta"):
        params = sum(p.numel() for p in timm.create_model("vit_small_patch14_reg4_dinov2").parameters())
    assert (small["embed_dim"], small["depth"], small["patch"], small["input_size"], small["params"]) == \
        (384, 12, 14, [518, 518], params)
    r = CliRunner().invoke(cli, ["models", "no_such_vit"])
    assert r.exit_code == 1 and "No architecture matches 'no_such_vit'" in r.output


def test_the_config_names_every_part_the_layers_build():
    """ViTConfig checks names without torch; the layer modules map the same names to modules."""
    from vitexport.model import config
    from vitexport.model.layers import attention, blocks, mlp, norm

    assert set(config.NORM_LAYERS) == set(norm.NORM_LAYERS) and set(config.ACT_LAYERS) == set(norm.ACT_LAYERS)
    assert set(config.MLP_LAYERS) == set(mlp.MLP_LAYERS) and set(config.BLOCK_FNS) == set(blocks.BLOCK_LAYERS)
    assert set(config.ATTN_LAYERS) == set(attention.ATTN_LAYERS)
