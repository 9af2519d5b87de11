"""The RoPE and relative-position families option by option against timm's own classes with the same weights:
`Eva` (EVA, EVA02, DINOv3, PE, the RoPE ViTs, Sapiens2), `Beit` and `NaFlexVit` on image tensors. Each option is
set alone on a tiny model (a 3 x 2 patch grid: RoPE's axes and BEiT's offsets cannot be swapped unseen) and
translated by the same rules as the architecture table (`vitexport.model.readers.timm_args`); the combinations the registry
uses are tests/test_archs.py's. Then the same weights at other sizes: a checkpoint loaded at a new fixed size, and a
dynamic-size model at two sizes, one of them non-square, against timm's model at those sizes."""

from functools import partial

import pytest
import timm
import torch
from conftest import load_script
from test_archs import assert_same_as_timm, perturbed
from timm.layers import LayerNorm, RmsNorm
from timm.models.beit import Beit as TimmBeit
from timm.models.eva import Eva as TimmEva
from timm.models.naflexvit import NaFlexVit

from vitexport.errors import VitexportError
from vitexport.model.build import build_model
from vitexport.model.readers.checkpoints import Checkpoint, detect_format, load_into
from vitexport.model.config import ViTConfig

TINY = dict(embed_dim=96, num_heads=4, depth=2, num_classes=5, img_size=(48, 32), patch_size=16)


def translated(kwargs: dict, module: str) -> ViTConfig:
    """timm's arguments -> our config, by the generator's own translation (parts as names)."""
    fields = load_script("gen_timm_archs").normalise(kwargs, module)
    assert "unsupported" not in fields, fields
    return ViTConfig(**fields)


EVA_OPTIONS = {
    "abs_pos_only": dict(),
    "rope_cat": dict(use_rot_pos_emb=True),
    "rope_cat_ref_grid": dict(use_rot_pos_emb=True, ref_feat_shape=(16, 16)),
    "rope_cat_xy_offset": dict(use_rot_pos_emb=True, rope_grid_indexing="xy", rope_grid_offset=1.0,
                               ref_feat_shape=(7, 5)),
    "rope_cat_half_temperature": dict(use_rot_pos_emb=True, rope_rotate_half=True, rope_temperature=100.0),
    "rope_dinov3": dict(use_rot_pos_emb=True, rope_type="dinov3", rope_temperature=100, rope_rotate_half=True,
                        use_abs_pos_emb=False),
    "rope_dinov3_interleaved_xy": dict(use_rot_pos_emb=True, rope_type="dinov3", rope_grid_indexing="xy"),
    "rope_mixed": dict(use_rot_pos_emb=True, rope_type="mixed", attn_type="rope", rope_grid_indexing="xy",
                       rope_temperature=10.0, use_abs_pos_emb=False, global_pool="token"),
    "rope_ape_no_embed_class": dict(use_rot_pos_emb=True, attn_type="rope", no_embed_class=True),
    "attn_rope_fused": dict(use_rot_pos_emb=True, attn_type="rope"),
    "qkv_separate": dict(qkv_fused=False),
    "qkv_separate_rope_attn": dict(qkv_fused=False, attn_type="rope"),
    "no_qkv_bias": dict(qkv_bias=False),
    "gqa": dict(use_rot_pos_emb=True, rope_type="dinov3", attn_type="rope", qkv_fused=False, num_kv_heads=2),
    "gqa_per_block": dict(use_rot_pos_emb=True, attn_type="rope", qkv_fused=False, num_kv_heads=(1, 4)),
    "swiglu_packed": dict(swiglu_mlp=True, mlp_ratio=2.6666666666666665),
    "swiglu_scale_mlp": dict(swiglu_mlp=True, scale_mlp=True, mlp_ratio=2.6666666666666665),
    "swiglu_align": dict(swiglu_mlp=True, swiglu_align_to=64, mlp_ratio=2.5),
    "scale_mlp_plain": dict(scale_mlp=True),
    "scale_attn_inner": dict(scale_attn_inner=True),
    "post_norm": dict(use_post_norm=True, use_rot_pos_emb=True),
    "pre_transformer_norm": dict(use_pre_transformer_norm=True),
    "no_post_norm_no_fc_norm": dict(use_post_transformer_norm=False, use_fc_norm=False),
    "token_pool": dict(global_pool="token"),
    "map_pool": dict(global_pool="map", attn_pool_num_heads=2, attn_pool_mlp_ratio=2.0, attn_type="rope",
                     use_rot_pos_emb=True, use_pre_transformer_norm=True),
    "no_pool": dict(global_pool="", num_classes=0),
    "registers_no_class": dict(class_token=False, num_reg_tokens=2, use_rot_pos_emb=True),
    "registers_and_class": dict(num_reg_tokens=3, use_rot_pos_emb=True, rope_type="dinov3", use_abs_pos_emb=False),
    "layer_scale": dict(init_values=0.1),
    "attn_only_layer_scale": dict(init_values=0.5, attn_only_layer_scale=True),
    "qk_norm_rmsnorm": dict(qk_norm=True, norm_layer=partial(RmsNorm, eps=1e-6)),
    "layernorm_eps": dict(norm_layer=partial(LayerNorm, eps=1e-5)),
}


@pytest.mark.parametrize("option", list(EVA_OPTIONS))
def test_each_eva_option_matches_timm(option):
    kwargs = {**TINY, **EVA_OPTIONS[option]}
    torch.manual_seed(0)
    ref = TimmEva(**kwargs)
    cfg = translated(kwargs, "eva")
    assert cfg.family == "eva"
    assert_same_as_timm(ref, cfg)


BEIT_OPTIONS = {
    "rel_pos_per_block": dict(use_abs_pos_emb=False, use_rel_pos_bias=True, init_values=0.1),
    "rel_pos_shared": dict(use_abs_pos_emb=False, use_shared_rel_pos_bias=True),
    "abs_pos": dict(use_abs_pos_emb=True),
    "abs_and_rel_pos": dict(use_abs_pos_emb=True, use_rel_pos_bias=True),
    "swiglu": dict(use_rel_pos_bias=True, swiglu_mlp=True),
    "scale_mlp": dict(use_rel_pos_bias=True, scale_mlp=True),
    "token_pool": dict(use_rel_pos_bias=True, global_pool="token"),
    "token_pool_fc_norm": dict(use_rel_pos_bias=True, global_pool="token", use_fc_norm=True),
    "no_qkv_bias": dict(use_rel_pos_bias=True, qkv_bias=False),
}


@pytest.mark.parametrize("option", list(BEIT_OPTIONS))
def test_each_beit_option_matches_timm(option):
    kwargs = {**TINY, **BEIT_OPTIONS[option]}
    torch.manual_seed(0)
    ref = TimmBeit(**kwargs)
    cfg = translated(kwargs, "beit")
    assert cfg.family == "beit"
    assert_same_as_timm(ref, cfg)


NAFLEX_OPTIONS = {
    "learned_bicubic": dict(pos_embed_grid_size=(4, 4), reg_tokens=2, global_pool="avg"),
    "learned_bilinear_antialias": dict(pos_embed_interp_mode="bilinear", pos_embed_grid_size=(2, 5)),
    "learned_corners_square": dict(pos_embed_interp_mode="bilinear", pos_embed_antialias=False,
                                   pos_embed_align_corners=True, pos_embed_ar_preserving=True,
                                   pos_embed_grid_size=(8, 8), class_token=True, reg_tokens=3, global_pool="token",
                                   final_norm=False, init_values=1e-5),
    "learned_same_grid": dict(pos_embed_grid_size=(3, 2)),
    "factorized": dict(pos_embed="factorized", pos_embed_grid_size=(5, 4), pos_embed_ar_preserving=True,
                       reg_tokens=1, global_pool="avg", fc_norm=True),
    "factorized_downsample": dict(pos_embed="factorized", pos_embed_grid_size=(6, 6)),
    "conv_embed": dict(embed_proj_type="conv", pos_embed_grid_size=(4, 4)),
    "map_gelu_tanh": dict(act_layer="gelu_tanh", global_pool="map", attn_pool_num_heads=2),
}


@pytest.mark.parametrize("option", list(NAFLEX_OPTIONS))
def test_each_naflex_option_matches_timm_on_images(option):
    """NaFlexVit on an image tensor: its patch Linear, position embedding grid and resampling as the reference
    ViT's patch convolution and an embedding resampled once to the model's grid."""
    kwargs = dict(embed_dim=96, num_heads=4, depth=2, **NAFLEX_OPTIONS[option])
    torch.manual_seed(0)
    ref = NaFlexVit(num_classes=5, **kwargs)
    cfg = translated({**kwargs, "num_classes": 5, "img_size": [48, 32]}, "naflexvit")
    assert cfg.family == "vit" and cfg.no_embed_class
    assert_same_as_timm(ref, cfg)


# -- other sizes -----------------------------------------------------------------------------------------------------

def _fixed_size_ref(cls, kwargs: dict, size: tuple[int, int], module):
    """timm's model at `size` with the weights of the model at TINY's size, as timm loads a checkpoint at another size
    (its checkpoint_filter_fn: the position embedding and BEiT's tables resampled)."""
    torch.manual_seed(0)
    src = perturbed(cls(**kwargs))
    ref = cls(**{**kwargs, "img_size": size}).eval()
    ref.load_state_dict(module.checkpoint_filter_fn(src.state_dict(), ref))
    return src, ref


@pytest.mark.parametrize("family,kwargs", [
    ("eva", dict(use_rot_pos_emb=True, ref_feat_shape=(3, 3), swiglu_mlp=True)),  # EVA02: abs + RoPE rescaled
    ("eva", dict(use_rot_pos_emb=True, rope_type="dinov3", use_abs_pos_emb=False, num_reg_tokens=2)),
    ("beit", dict(use_abs_pos_emb=False, use_rel_pos_bias=True, init_values=0.1)),
    ("beit", dict(use_abs_pos_emb=True, use_shared_rel_pos_bias=True, img_size=64)),
])
def test_a_checkpoint_loaded_at_another_size_is_timm_s_at_that_size(family, kwargs):
    """Trained at a square size, as checkpoints are (timm's filters assume a square trained grid), loaded at a
    non-square one."""
    from timm.models import beit, eva

    cls, module = (TimmEva, eva) if family == "eva" else (TimmBeit, beit)
    kwargs = {**TINY, "img_size": 48, **kwargs}
    size = (80, 64)
    src, ref = _fixed_size_ref(cls, kwargs, size, module)
    cfg = ViTConfig(**{**translated(kwargs, family).to_dict(), "img_size": size})
    ours = build_model(cfg)
    notes = load_into(ours, Checkpoint(src.state_dict(), "timm", None, ""), "bicubic-antialias")  # type: ignore
    assert any("Resized" in n for n in notes) == (cfg.abs_pos_embed or bool(cfg.rel_pos_bias))
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want, got = ref(x), ours(x)
    assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())


@pytest.mark.parametrize("kwargs", [
    dict(use_rot_pos_emb=True, rope_type="dinov3", rope_rotate_half=True, use_abs_pos_emb=False, num_reg_tokens=4),
    dict(use_rot_pos_emb=True, ref_feat_shape=(3, 2), swiglu_mlp=True, scale_mlp=True),  # EVA02
    dict(use_rot_pos_emb=True, rope_type="mixed", attn_type="rope", rope_grid_indexing="xy", global_pool="token",
         use_abs_pos_emb=True, no_embed_class=True),
])
def test_a_dynamic_size_eva_is_timm_s_dynamic_model_at_other_sizes(kwargs):
    kwargs = {**TINY, **kwargs, "dynamic_img_size": True}
    torch.manual_seed(0)
    ref = perturbed(TimmEva(**kwargs))
    cfg = translated(kwargs, "eva")
    assert cfg.dynamic_img_size
    ours = build_model(cfg)
    ours.load_state_dict(ref.state_dict(), strict=True)
    for size in ((64, 96), (80, 80)):
        x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(5))
        with torch.no_grad():
            want, got = ref(x), ours(x)
        assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item()), size


def test_naflex_at_another_size_is_timm_s_forward_at_that_size():
    """NaFlexVit takes any image size: its embedding, stored at its own grid, resampled to the new one."""
    kwargs = dict(embed_dim=96, num_heads=4, depth=2, pos_embed_grid_size=(4, 4), pos_embed_ar_preserving=True,
                  pos_embed_interp_mode="bilinear", pos_embed_antialias=False, pos_embed_align_corners=True,
                  class_token=True, global_pool="token")
    torch.manual_seed(0)
    ref = perturbed(NaFlexVit(num_classes=5, **kwargs))
    raw = ref.state_dict()
    fmt = detect_format(set(raw))
    for size in ((96, 64), (32, 80)):
        cfg = translated({**kwargs, "num_classes": 5, "img_size": list(size)}, "naflexvit")
        ours = build_model(cfg)
        load_into(ours, Checkpoint(fmt.convert(raw), fmt.NAME, None, "", fmt.hints(raw)), cfg.pos_embed_interp)
        x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(6))
        with torch.no_grad():
            want, got = ref(x), ours(x)
        assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item()), size


# -- what cannot be built ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fields,needle", [
    (dict(family="eva", rope="cat", embed_dim=96, num_heads=16), "head size divisible by 4"),
    (dict(family="eva", rope="mixed", rope_rotate_half=True), "interleaved"),
    (dict(family="eva", num_kv_heads=5, num_heads=12), "does not divide"),
    (dict(family="eva", num_kv_heads=4, num_heads=12), "separate q/k/v"),
    (dict(family="vit", rope="cat"), "needs family='eva'"),
    (dict(family="beit", reg_tokens=2), "one class token"),
    (dict(family="eva", block_fn="parallel_scaling"), "not one the eva family builds"),
    (dict(family="eva", distilled=True), "VisionTransformer option"),
])
def test_what_a_family_cannot_build_is_one_sentence(fields, needle):
    with pytest.raises(VitexportError, match=needle):
        ViTConfig(**fields)


def test_an_option_timm_adds_later_is_named_before_anything_is_built():
    """An argument the translation does not know (a later timm's) is kept under 'unsupported' and refused by name."""
    from vitexport.model.archs import Architecture
    from vitexport.model.readers.timm_args import translate

    args = translate("eva", {"embed_dim": 96, "use_rot_pos_emb": True, "rope_type": "mrope", "gated_attn": True})
    assert set(args["unsupported"]) == {"rope_type", "gated_attn"}
    with pytest.raises(VitexportError, match=r"eva_future needs .*rope_type=mrope"):
        Architecture("eva_future", "eva", args, {}).config()


@pytest.mark.parametrize("tag", ["vit_base_patch16_sapiens2.fb", "vit_small_patch16_dinov3.lvd1689m",
                                 "eva02_base_patch14_448.mim_in22k_ft_in22k_in1k", "beitv2_base_patch16_224.in1k_ft_in1k",
                                 "naflexvit_base_patch16_siglip.v2_webli", "vit_pe_core_small_patch16_384.fb"])
def test_a_tag_s_preprocessing_is_timm_s_resolve_data_config(tag):
    """Sapiens2's 1024 x 768 (non-square, squash), EVA02's squash crop, the mean and std of each family."""
    from timm.data import resolve_data_config

    from vitexport.model.archs import resolve

    with torch.device("meta"):
        model = timm.create_model(tag, pretrained=False)
    want = resolve_data_config({}, model=model)
    arch, t = resolve(tag)
    pp = arch.preprocess(tag=t)
    assert (3, *pp.input_size) == tuple(want["input_size"])
    assert pp.mean == pytest.approx(want["mean"]) and pp.std == pytest.approx(want["std"])
    assert (pp.crop_pct, pp.interpolation, pp.crop_mode) == (want["crop_pct"], want["interpolation"],
                                                              want["crop_mode"])
    assert arch.config(t).img_size == pp.input_size


# -- one export for many sizes: DINOv3, EVA02 and BEiT through ONNX Runtime ---------------------------------------------

@pytest.mark.parametrize("tag,sizes", [
    ("vit_small_patch16_dinov3.lvd1689m", ((192, 320), (384, 384))),
    ("eva02_small_patch14_336.mim_in22k_ft_in1k", ((224, 448), (532, 532))),
    ("beitv2_base_patch16_224.in1k_ft_in22k_in1k", ((160, 288), (320, 320))),
])
def test_a_dynamic_export_is_timm_s_model_at_other_sizes(tag, sizes, tmp_path, monkeypatch):
    """`vitexport onnx -m TAG --dynamic-img-size` from a repository laid out as timm's (width 96, one block), run by
    ONNX Runtime at two sizes other than the default, one non-square: timm's dynamic_img_size=True model (DINOv3,
    EVA02: RoPE recomputed and the position embedding resampled per input), and for BEiT, which has no dynamic mode
    in timm, timm's model set to each size (set_input_size: its tables resampled for that grid)."""
    import copy

    import numpy as np
    import onnxruntime as ort
    from click.testing import CliRunner

    from vitexport.cli import cli

    coverage = load_script("timm_coverage")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    beit = tag.startswith("beit")
    torch.manual_seed(0)
    model = coverage.perturb(timm.create_model(tag, pretrained=False, depth=1, embed_dim=96, num_heads=4,
                                               **({} if beit else {"dynamic_img_size": True})), scale=0.05)
    coverage.lay_out_repo(tmp_path / "hf", tag, model)
    r = CliRunner().invoke(cli, ["onnx", "-m", tag, "--dynamic-img-size", "--img-size-range", "112..560",
                                 "-o", str(tmp_path / "m"), "-q"])
    assert r.exit_code == 0, r.output
    sess = ort.InferenceSession(str(tmp_path / "m" / "model.onnx"), providers=["CPUExecutionProvider"])
    for size in sizes:
        ref = model
        if beit:
            ref = copy.deepcopy(model).eval()
            ref.set_input_size(img_size=size)
        x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            want = ref(x).numpy()
        got = sess.run(None, {"pixel_values": x.numpy()})[0]
        assert np.abs(got - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max())), size


def test_a_dynamic_beit_is_timm_s_model_set_to_each_size():
    """In PyTorch, at the trained size, at sizes with one side the trained one (timm then stretches that axis too),
    smaller and larger: per-block and shared tables."""
    import copy

    for extra in (dict(use_abs_pos_emb=False, use_rel_pos_bias=True, init_values=0.1),
                  dict(use_abs_pos_emb=True, use_shared_rel_pos_bias=True)):
        kwargs = {**TINY, "img_size": 64, **extra}
        torch.manual_seed(0)
        src = perturbed(TimmBeit(**kwargs))
        ours = build_model(ViTConfig(**{**translated(kwargs, "beit").to_dict(), "dynamic_img_size": True}))
        ours.load_state_dict(src.state_dict(), strict=True)
        for size in ((64, 64), (96, 48), (64, 80), (32, 32), (128, 112)):
            ref = copy.deepcopy(src).eval()
            ref.set_input_size(img_size=size)
            x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(8))
            with torch.no_grad():
                want, got = ref(x), ours(x)
            assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item()), (extra, size)


# -- INT8 of the new blocks: every GEMM quantized and grouped; the tools that work on groups ---------------------------

TINY_OVERRIDES = dict(embed_dim=96, num_heads=4, depth=2)


@pytest.fixture(scope="module")
def sapiens_like(tmp_path_factory):
    """Sapiens2's options (RoPE, separate q/k/v, 4 and 2 key/value heads, packed SwiGLU, RmsNorm, LayerScale on the
    attention only) at width 96, 2 blocks, 64 x 48 px; random weights."""
    from vitexport.exporter.run import run_export
    from vitexport.model.spec import ModelSpec

    out = tmp_path_factory.mktemp("sapiens") / "model"
    spec = ModelSpec(variant="vit_base_patch16_sapiens2", img_size=(64, 48),
                     overrides={**TINY_OVERRIDES, "num_kv_heads": (4, 2)})
    run_export(spec, output=out)
    return out


def test_the_new_blocks_gemms_are_quantized_and_grouped(sapiens_like, tmp_path):
    from conftest import copy_export

    from vitexport.precision.groups import gemm_groups
    from vitexport.precision.int8 import selection_for
    from vitexport.precision.settings import Int8Settings

    import onnx

    from vitexport.precision.selection import signed_permutations

    selection = selection_for(sapiens_like / "model.onnx", Int8Settings(), "int8")
    groups = gemm_groups(selection)
    # RoPE's rotation is two slices and a concatenation (the form OpenVINO fuses): no MatMul by a constant signed
    # permutation (an older export's x @ R) is left for either selection to skip
    graph = onnx.load(sapiens_like / "model.onnx").graph
    assert not signed_permutations(graph)
    assert sum(n.op_type == "Concat" and "attn" in n.name for n in graph.node) >= 4  # q and k of 2 blocks
    kinds = {(g.block, g.kind) for g in groups}
    assert {(b, k) for b in (0, 1) for k in ("q", "k", "v", "proj", "fc1", "fc2")} <= kinds, kinds
    assert (None, "patch_embed") in kinds
    # INT8 attention groups Q.K^T and A.V together, the RoPE'd ones too
    with_attn = gemm_groups(selection_for(sapiens_like / "model.onnx", Int8Settings(quantize_attention=True), "int8"))
    assert [len(g.nodes) for g in with_attn if g.kind == "attention"] == [2, 2]

    from click.testing import CliRunner

    from vitexport.cli import cli

    folder = copy_export(sapiens_like, tmp_path / "m")
    out = tmp_path / "sens.json"
    r = CliRunner().invoke(cli, ["quantize", str(folder), "--int8", "--sensitivity", "--json", str(out), "-q"])
    assert r.exit_code == 0, r.output
    import json

    rows = json.loads(out.read_text())["groups"]
    assert {(row["block"], row["kind"]) for row in rows} == kinds
    for args in (["--min-cos", "0.99999"], ["--smoothquant"], ["--target", "tensorrt", "--placement", "modelopt"]):
        r = CliRunner().invoke(cli, ["quantize", str(folder), "--int8", *args, "-q"])
        assert r.exit_code == 0, (args, r.output)


def test_openvino_runs_a_rope_graph_with_int8_attention_in_f32_where_bf16_unfuses_it(sapiens_like, tmp_path):
    """OpenVINO's RoPE kernel takes no quantization after it: with bf16 for the float layers, a RoPE'd graph whose
    attention products are INT8 gets a bf16 -> f32 Reorder and an unfused FakeQuantize on every query and key. The
    `openvino cpu int8` row reads that from the compiled plan and runs such a graph in f32; a graph without INT8
    attention keeps bf16 on a CPU with BF16 (f32 on one without)."""
    pytest.importorskip("openvino")
    import json

    import openvino as ov
    from click.testing import CliRunner
    from conftest import copy_export

    from vitexport.backends.openvino_backend import (OpenVinoRunner, bf16_unfuses_quantization, cpu_capabilities,
                                                     has_bf16)
    from vitexport.cli import cli

    bf16 = has_bf16(cpu_capabilities())
    chosen = {}
    for attention in ("--quantize-attention", "--no-quantize-attention"):
        folder = copy_export(sapiens_like, tmp_path / attention.strip("-"))
        r = CliRunner().invoke(cli, ["quantize", str(folder), "--int8", attention, "--no-check", "--calib-samples", "4",
                                     "-q"])
        assert r.exit_code == 0, r.output
        path = folder / "model.int8.onnx"
        if bf16:  # the plan the rule reads, compiled as the row would without it
            plan = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "bf16"})
            assert bf16_unfuses_quantization(plan) == (attention == "--quantize-attention")
        manifest = json.loads((folder / "manifest.json").read_text())
        runner = OpenVinoRunner(path, "int8", input_name=manifest["input_name"],
                                output_name=manifest["output_name"]).load()
        chosen[attention] = runner.info["inference_precision"]
        runner.close()
    assert chosen == {"--quantize-attention": "f32", "--no-quantize-attention": "bf16" if bf16 else "f32"}


def _perturbed_norms(model: torch.nn.Module) -> None:
    """Norm weights and biases away from one and zero, so that a channel order they must follow is seen."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("fields", [
    dict(rope="cat"),  # EVA02's interleaved pairs, fused qkv with q/v biases
    dict(rope="mixed", qkv_bias=False),  # naver's learned per-head frequencies, interleaved
    dict(rope="cat", qkv_fused=False, num_kv_heads=2, qk_norm=True, norm_layer="layernorm"),
    dict(rope="dinov3", rope_rotate_half=True, qk_norm=True, mlp_layer="swiglu_packed", act_layer="silu"),
    dict(rope="cat", mlp_layer="swiglu_packed", act_layer="silu"),
])
def test_what_an_export_prepares_is_the_same_function(fields):
    """prepare_export regroups interleaved RoPE pairs as halves (query and key channels reordered in the weights,
    q/k norms included) and splits a packed GLU's fc1 in two: the model before it is the oracle."""
    import copy

    cfg = ViTConfig(family="eva", embed_dim=64, num_heads=4, depth=2, img_size=(48, 32), patch_size=16,
                    num_classes=5, **fields)
    torch.manual_seed(0)
    before = perturbed(build_model(cfg)).eval()
    _perturbed_norms(before)
    after = copy.deepcopy(before)
    after.prepare_export()
    assert after.rope.rotate_half and all(m.rotate_half for m in after.modules() if hasattr(m, "rotate_half"))
    x = torch.randn(3, 3, 48, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = before(x), after(x)
    assert (got - want).abs().max() <= 1e-5 * max(1.0, want.abs().max().item())
    if fields.get("mlp_layer") == "swiglu_packed":
        assert not any(type(m).__name__ == "GluMlp" for m in after.modules())


@pytest.mark.parametrize("fields,dynamic", [
    *[(f, d) for f in (dict(rope="cat"), dict(rope="mixed", qkv_bias=False), dict(rope="dinov3", rope_rotate_half=True))
      for d in (False, True)],
    (dict(rope="cat", mlp_layer="swiglu_packed", act_layer="silu"), False),
    # the packed GLU's split does not depend on the size: at a dynamic one with the e2e tests, for the suite's length
    pytest.param(dict(rope="cat", mlp_layer="swiglu_packed", act_layer="silu"), True, marks=pytest.mark.e2e),
])
def test_every_rope_export_is_what_openvino_fuses(fields, dynamic):
    """OpenVINO's own pattern matcher, not ours: compiled for its CPU plugin, every block's q and k rotation is one
    RoPE kernel (interleaved pairs too, regrouped at export, and a table computed in the graph); a packed GLU is
    exported as two GEMMs, with no split of one GEMM's output to run. At a fixed size no Sin, Cos or Range is left
    for a runtime (mixed RoPE's table from its learned frequencies as the export found them); at a dynamic size the
    table is computed from the input's grid, without If or Loop."""
    import openvino as ov

    from vitexport.exporter.to_onnx import _tidy_graph, _trace
    from vitexport.tensorrt_engine.graph_rules import rule_breakers

    cfg = ViTConfig(family="eva", embed_dim=64, num_heads=4, depth=2, img_size=(48, 32), patch_size=16,
                    num_classes=5, dynamic_img_size=dynamic, **fields)
    torch.manual_seed(0)
    proto = _trace(perturbed(build_model(cfg)).eval(), 18, 2, img_size_range=((32, 32), (96, 96)) if dynamic else None)
    ops = {n.op_type for n in proto.graph.node}
    assert not rule_breakers(proto)
    assert ({"Sin", "Cos", "Range"} <= ops) == dynamic and not ({"Sin", "Cos"} & ops and not dynamic), ops
    _tidy_graph(proto)  # nodes named after their modules, as an export writes them
    compiled = ov.Core().compile_model(ov.Core().read_model(proto.SerializeToString(), b""), "CPU",
                                       {"INFERENCE_PRECISION_HINT": "f32"})
    kinds = [op.get_rt_info()["layerType"].astype(str) for op in compiled.get_runtime_model().get_ordered_ops()]
    assert kinds.count("RoPE") == 2 * cfg.depth, sorted(set(kinds))
    if fields.get("mlp_layer") == "swiglu_packed":  # fc1_g and fc1_x GEMMs, nothing split in the MLP
        mlp = [(n.op_type, n.name) for n in proto.graph.node if ".mlp" in n.name]
        assert not [n for n in mlp if n[0] in ("Split", "Slice")], mlp
        assert sum(op == "MatMul" and (".fc1_g/" in name or ".fc1_x/" in name) for op, name in mlp) == 2 * cfg.depth


def test_an_older_export_s_rotation_by_a_signed_permutation_is_never_quantized():
    """Folders exported before RoPE took the slice form rotate by x @ R, R a constant signed permutation (exact data
    movement): quantize skips those products and takes the weight GEMM beside them."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from vitexport.precision.selection import select_gemms

    rng = np.random.default_rng(0)
    r = np.zeros((8, 8), np.float32)
    r[np.arange(8), (np.arange(8) + 4) % 8] = np.where(np.arange(8) < 4, -1.0, 1.0)
    near = r.copy()
    near[0, 4] = -0.5  # not a permutation: a GEMM like any other
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w"),
             numpy_helper.from_array(r, "rot"), numpy_helper.from_array(near, "near")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="proj"),
             helper.make_node("MatMul", ["y", "rot"], ["z"], name="rotation"),
             helper.make_node("MatMul", ["z", "near"], ["out"], name="almost")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 8])], inits)
    onnx.checker.check_model(helper.make_model(graph), full_check=True)
    assert select_gemms(graph, set()).nodes == ["proj", "almost"]
