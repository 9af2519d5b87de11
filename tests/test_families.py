"""The families people deploy, by their timm names, from hub repositories laid out as timm's are (made here from
random weights by timm's own hub helpers, read offline): the export matches timm's model, every precision is made
and passes its check, every file passes onnx.checker's full check (and, for the RoPE and relative-position
families, Polygraphy's lint), and the bench runs every CPU row. Those chains (every precision, the bench, the IR and Triton) are marked `e2e`:
they run in CI's second job (`python -m pytest -q -m e2e`), not in the default run; the exports and their parity
with timm run in both.

Depth is cut to 1 block (the repository's config.json says so, as timm writes it for such a model); width, heads,
options and input size are the tag's own (DINOv2 at 518 px, EVA02-S at 336, NaFlexViT's SigLIP2 at 384).
"""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import timm
import torch
from click.testing import CliRunner
from conftest import lint, load_script, quick_bench

from vitexport.cli import cli
from vitexport.tensorrt_engine.graph_rules import rule_breakers

TAGS = ["vit_small_patch14_reg4_dinov2.lvd142m", "vit_base_patch16_siglip_224.webli",
        "vit_base_patch16_clip_quickgelu_224.openai", "deit3_small_patch16_224.fb_in1k"]
# eva.py, beit.py and naflexvit.py: DINOv3 (RoPE, registers), EVA02 (RoPE rescaled, SwiGLU), Perception Encoder (RoPE,
# its attention pool over every token), BEiT v2 (relative position bias), SigLIP2 NaFlex (a resampled embedding)
NEW_TAGS = ["vit_small_patch16_dinov3.lvd1689m", "eva02_small_patch14_336.mim_in22k_ft_in1k",
            "vit_pe_core_small_patch16_384.fb", "beitv2_base_patch16_224.in1k_ft_in22k_in1k",
            "naflexvit_base_patch16_siglip.v2_webli"]


@pytest.fixture(scope="module", params=TAGS + NEW_TAGS)
def family(request, tmp_path_factory):
    """(tag, timm model, exported folder) with the hub cache in the environment."""
    tag = request.param
    tmp = tmp_path_factory.mktemp(tag.split(".")[0])
    cache = tmp / "hf-cache"
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_CACHE", str(cache))
    mp.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    coverage = load_script("timm_coverage")  # the coverage run's own perturbation and repository layout
    model = coverage.perturb(timm.create_model(tag, pretrained=False, depth=1))
    coverage.lay_out_repo(cache, tag, model)
    folder = tmp / "model"
    r = CliRunner().invoke(cli, ["onnx", "-m", tag, "-o", str(folder), "-q"])
    assert r.exit_code == 0, r.output
    yield tag, model, folder
    mp.undo()


def test_the_export_is_timm_s_model(family):
    tag, model, folder = family
    manifest = json.loads((folder / "manifest.json").read_text())
    h, w = manifest["img_size"]
    assert (h, w) == tuple(model.pretrained_cfg["input_size"][1:])
    x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(x).numpy()
    sess = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))
    pp = manifest["preprocess"]
    assert (pp["crop_pct"], pp["crop_mode"], tuple(pp["mean"])) == (
        model.pretrained_cfg["crop_pct"], model.pretrained_cfg["crop_mode"], tuple(model.pretrained_cfg["mean"]))


@pytest.mark.e2e
def test_every_precision_is_made_checked_and_valid(family):
    _, _, folder = family
    for args in (["--int8", "--target", "all"], ["--fp8"], ["--fp16", "--target", "all"]):
        r = CliRunner().invoke(cli, ["quantize", str(folder), *args, "-q"])
        assert r.exit_code == 0, (args, r.output)
    written = sorted(p.name for p in folder.glob("*.onnx"))
    assert written == ["model.fp16.onnx", "model.fp16.trt.onnx", "model.fp8.onnx", "model.int8.onnx",
                       "model.int8.trt.onnx", "model.onnx"]
    for name in written:
        onnx.checker.check_model(str(folder / name), full_check=True)
        assert rule_breakers(onnx.load(str(folder / name), load_external_data=False)) == [], name
    records = json.loads((folder / "manifest.json").read_text())["precisions"]
    assert {"fp16", "fp16-trt", "int8", "int8-trt", "fp8"} <= set(records)
    if family[0] in NEW_TAGS:  # ONNX Runtime at every optimization level takes them (FP8's own exception aside)
        errors = lint([folder / n for n in written if n != "model.fp8.onnx"], folder.parent)
        assert errors == {n: [] for n in written if n != "model.fp8.onnx"}


@pytest.mark.e2e
def test_the_bench_runs_every_cpu_row(family, tmp_path):
    _, _, folder = family
    ran = quick_bench(folder, tmp_path)
    assert {"pytorch cpu fp32", "onnxruntime cpu fp32", "onnxruntime cpu fp16", "onnxruntime cpu int8",
            "openvino cpu fp32", "openvino cpu int8"} <= set(ran), ran
    for name, row in ran.items():
        assert not row["parity"]["failures"], (name, row["parity"]["failures"])


def test_every_attention_site_is_found_with_its_tokens(family):
    """Register tokens lengthen the sequence, SigLIP's pool attends from one latent query to the patch tokens: the
    fusion check finds each block's site and the pool's, with their real head size and sequence length, and expects
    TensorRT to fuse them in FP16."""
    from dataclasses import replace

    from vitexport.tensorrt_engine.fusion import attention_sites, why_not_fused

    tag, model, folder = family
    manifest = json.loads((folder / "manifest.json").read_text())
    sites = attention_sites(onnx.load(str(folder / "model.onnx")))
    grid = manifest["grid"][0] * manifest["grid"][1]
    blocks = [s for s in sites if s.bmm1.startswith("blocks.")]
    pool = [s for s in sites if s.bmm1.startswith("attn_pool")]
    assert len(blocks) == len(model.blocks) and len(pool) == (1 if model.global_pool == "map" else 0)
    head = model.embed_dim // model.blocks[0].attn.num_heads
    assert {(s.head_size, s.seq_len) for s in blocks} == {(head, model.num_prefix_tokens + grid)}
    pooled = grid + (model.num_prefix_tokens if manifest["config"]["pool_include_prefix"] else 0)
    pool_head = model.embed_dim // model.attn_pool.num_heads if pool else None  # PE's pool has heads of its own
    assert all(s.seq_len == pooled and s.head_size == pool_head for s in pool)
    assert all(why_not_fused(replace(s, dtype="fp16")) is None for s in sites)
    # RoPE'd blocks (not the pool, whose latent query has no position) and BEiT's biased ones are named so
    config = manifest["config"]
    assert {s.rotary for s in blocks} == {bool(config["rope"])} and not any(s.rotary for s in pool)
    assert {s.bias is not None for s in blocks} == {bool(config["rel_pos_bias"])}


@pytest.mark.e2e
@pytest.mark.parametrize("family", ["vit_small_patch16_dinov3.lvd1689m", "beitv2_base_patch16_224.in1k_ft_in22k_in1k"],
                         indirect=True)
def test_the_ir_and_the_triton_repository_of_a_rope_and_a_biased_model(family, tmp_path):
    """`vitexport openvino --precision int8` (from the CPU INT8 graph) verifies and runs like its source; `vitexport
    triton` writes a repository whose config.pbtxt is Triton's ModelConfig and agrees with the graph."""
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from google.protobuf import text_format

    _, _, folder = family
    r = CliRunner().invoke(cli, ["openvino", str(folder), "--precision", "int8", "-q"])
    assert r.exit_code == 0, r.output
    record = json.loads((folder / "manifest.json").read_text())["precisions"]["openvino-int8"]
    assert record["check"]["passed"], record["check"]
    r = CliRunner().invoke(cli, ["triton", str(folder), "-o", str(tmp_path / "repo"), "-q"])
    assert r.exit_code == 0, r.output
    config = next((tmp_path / "repo").glob("*/config.pbtxt"))
    cfg = text_format.Parse(config.read_text(), model_config_pb2.ModelConfig())
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    assert [i.name for i in cfg.input] == [i.name for i in graph.input]
    assert [o.name for o in cfg.output] == [o.name for o in graph.output]


@pytest.mark.e2e
@pytest.mark.parametrize("family", ["vit_small_patch16_dinov3.lvd1689m", "beitv2_base_patch16_224.in1k_ft_in22k_in1k",
                                    "eva02_small_patch14_336.mim_in22k_ft_in1k"], indirect=True)
def test_pytorchs_compiled_packages_of_the_rope_and_biased_families(family):
    """`vitexport aoti`: the RoPE and relative-bias families through torch.export and AOTInductor, INT8 (PT2E) and
    bf16, each checked against the FP32 export and its linears fused."""
    pytest.importorskip("torchao")
    _, _, folder = family
    for precision in ("int8", "bf16"):
        r = CliRunner().invoke(cli, ["aoti", str(folder), "--precision", precision, "-q"])
        assert r.exit_code == 0, (precision, r.output)
        record = json.loads((folder / "manifest.json").read_text())["precisions"][f"aoti-{precision}"]
        assert record["check"]["passed"] and record["aoti"]["facts"]["linear" if precision == "bf16" else "qlinear"]
