"""One export for many image sizes (--dynamic-img-size): timm's dynamic_img_size=True model is the oracle, in
PyTorch and through ONNX Runtime running the exported file, at several sizes (non-square, and above the grid the
checkpoint was trained at)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from conftest import ROOT, copy_export, fails_cleanly
from timm.models.vision_transformer import VisionTransformer as TimmViT

from vitexport.artifacts.folder import ModelFolder
from vitexport.cli import cli
from vitexport.errors import VitexportError
from vitexport.model.spec import check_range, check_sizes, default_range
from vitexport.model.vit import VisionTransformer, ViTConfig

TINY = dict(embed_dim=64, depth=2, num_heads=4)
HELDOUT = ROOT / "calibration" / "digits" / "heldout"
DIGITS = dict(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0, num_classes=10)


def _randomised(model):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    return model.eval()


@pytest.mark.parametrize("kwargs", [dict(img_size=32, patch_size=8), dict(img_size=32, patch_size=8, no_embed_class=True),
                                    dict(img_size=32, patch_size=8, class_token=False, global_pool="avg"),
                                    dict(img_size=(28, 42), patch_size=14)])
def test_the_pytorch_model_matches_timms_dynamic_model_at_any_size(kwargs):
    ref = _randomised(TimmViT(**TINY, **kwargs, dynamic_img_size=True))
    ours = VisionTransformer(ViTConfig(**TINY, **kwargs, dynamic_img_size=True)).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    p = ours.patch_embed.patch_size[0]
    for grid in ((4, 4), (2, 6), (7, 3), (9, 9)):
        x = torch.randn(2, 3, grid[0] * p, grid[1] * p)
        with torch.no_grad():
            torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def dynamic_export(tmp_path_factory):
    """The digits-shaped model with timm's weights, exported dynamic at a default size above its stored grid."""
    tmp = tmp_path_factory.mktemp("dynamic")
    ref = _randomised(TimmViT(**DIGITS, dynamic_img_size=True))
    torch.save(ref.state_dict(), tmp / "w.pth")
    r = CliRunner().invoke(cli, ["onnx", "-m", "vit_digits_patch4_32", "-c", str(tmp / "w.pth"), "--img-size", "48",
                                 "--dynamic-img-size", "--img-size-range", "16..64x80", "-o", str(tmp / "m"), "-q"])
    assert r.exit_code == 0, r.output
    return ref, tmp / "m"


def test_the_export_equals_timm_at_several_sizes(dynamic_export):
    ref, folder = dynamic_export
    path = folder / "model.onnx"
    onnx.checker.check_model(str(path), full_check=True)
    dims = onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in dims] == ["batch", 3, "height", "width"]
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for h, w in ((48, 48), (32, 32), (16, 64), (64, 80), (36, 20)):  # default, stored grid, non-square, the max
        x = torch.randn(3, 3, h, w)
        with torch.no_grad():
            want = ref(x).numpy()
        got = sess.run(None, {"pixel_values": x.numpy()})[0]
        assert np.abs(got - want).max() < 1e-4, (h, w)


def test_the_manifest_records_the_range_and_the_checks_at_each_size(dynamic_export):
    _, folder = dynamic_export
    manifest = ModelFolder(folder).read_manifest()
    assert manifest.img_size_range == ((16, 16), (64, 80)) and manifest.img_size == (48, 48)
    assert manifest.input_shape == ["batch", 3, "height", "width"]
    assert manifest.config["dynamic_img_size"] is True and manifest.config["pos_embed_grid"] == [8, 8]
    sizes = {c.img_size for c in manifest.parity.checks}
    assert sizes == {(48, 48), (64, 80), (16, 80)} and all(c.passed for c in manifest.parity.checks)
    meta = {p.key: p.value for p in onnx.load(str(folder / "model.onnx"), load_external_data=False).metadata_props}
    assert json.loads(meta["img_size_range"]) == [[16, 16], [64, 80]]


def test_the_default_folder_says_dynamic(tmp_path, monkeypatch):
    from vitexport.model.spec import ModelSpec

    monkeypatch.setenv("VITEXPORT_MODELS", str(tmp_path / "models"))
    fixed, dynamic = ModelSpec("vit_base_patch16_224"), ModelSpec("vit_base_patch16_224", dynamic_img_size=True)
    assert fixed.default_folder().path == tmp_path / "models" / "vit_base_patch16_224-224x224"
    assert dynamic.default_folder().path == tmp_path / "models" / "vit_base_patch16_224-224x224-dynamic"


@pytest.mark.parametrize("args,needle", [
    (["--img-size-range", "16..48"], "--img-size-range needs --dynamic-img-size"),
    (["--dynamic-img-size", "--img-size-range", "18..48"], "the minimum 18x18 is not a multiple of the patch size 4x4"),
    (["--dynamic-img-size", "--img-size-range", "4..48"], "the minimum 4x4 is under 2 patches a side (8x8)"),
    (["--dynamic-img-size", "--img-size-range", "40..48"], "does not hold the default size 32x32"),
    (["--dynamic-img-size", "--img-size-range", "16"], "is not MIN..MAX"),
])
def test_a_range_that_cannot_be_is_one_sentence_and_writes_nothing(tmp_path, args, needle):
    r = CliRunner().invoke(cli, ["onnx", "-m", "vit_digits_patch4_32", "-o", str(tmp_path / "m"), *args])
    fails_cleanly(r, needle)
    assert not (tmp_path / "m").exists()


def test_ranges_and_check_sizes():
    assert default_range((224, 224), (16, 16)) == ((112, 112), (448, 448))
    assert default_range((32, 48), (16, 16)) == ((32, 32), (64, 96))  # at least two patches
    assert check_sizes((48, 48), ((16, 16), (64, 80))) == [(48, 48), (64, 80), (16, 80)]
    assert check_sizes((32, 32), ((32, 32), (32, 32))) == [(32, 32)]
    assert check_range(((16, 16), (64, 64)), (32, 32), (4, 4)) == ((16, 16), (64, 64))
    with pytest.raises(VitexportError, match="maximum 66x64 is not a multiple"):
        check_range(((16, 16), (66, 64)), (32, 32), (4, 4))


def test_a_fixed_size_export_has_no_resampling_in_its_graph(tiny_default):
    graph = onnx.load(str(tiny_default / "models" / "vit_tiny_patch16_224-32x32" / "model.onnx")).graph
    assert "Resize" not in {n.op_type for n in graph.node}
    assert [d.dim_param or d.dim_value for d in graph.input[0].type.tensor_type.shape.dim] == ["batch", 3, 32, 32]


# -- TensorRT: the profile over batch x height x width, the antialias refusal, the runner's range -----------------

def test_trt_refuses_an_antialiased_dynamic_export_before_anything_else(dynamic_export):
    _, folder = dynamic_export
    r = CliRunner().invoke(cli, ["trt", "--fp32", str(folder)])
    assert r.exit_code == 2, r.output
    fails_cleanly(r, "model.onnx resamples its position embedding with an antialiased Resize")
    assert "--pos-embed-interp bicubic" in r.output and not list(folder.glob("*.plan"))


@pytest.fixture(scope="module")
def bicubic_export(tmp_path_factory):
    out = tmp_path_factory.mktemp("bicubic") / "m"
    r = CliRunner().invoke(cli, ["onnx", "-m", "vit_digits_patch4_32", "--dynamic-img-size", "--pos-embed-interp",
                                 "bicubic", "--img-size-range", "16..64x48", "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    return out


def test_a_bicubic_dynamic_export_builds_over_its_range_and_the_runner_keeps_to_it(bicubic_export, monkeypatch):
    import fake_tensorrt
    from test_gpu_runners_cpu import RecordingStream
    from test_tensorrt_engine import H200

    from vitexport.artifacts.sidecar import read_sidecar
    from vitexport.backends import tensorrt as trt_runner_module
    from vitexport.backends.tensorrt import TensorRTRunner
    from vitexport.tensorrt_engine import compiler
    from vitexport.tensorrt_engine.options import BuildOptions

    graph = onnx.load(str(bicubic_export / "model.onnx")).graph
    assert {(a.name, a.i) for n in graph.node if n.op_type == "Resize" for a in n.attribute if a.name == "antialias"} \
        == {("antialias", 0)}
    fake_tensorrt.install(monkeypatch)
    fake_tensorrt.NETWORK_INPUTS = [("pixel_values", (-1, 3, -1, -1))]  # what the parser makes of this graph
    monkeypatch.setattr(compiler, "require_trt_and_gpu", lambda: ("10.13.0.35", dict(H200)))
    res = compiler.run_trt(bicubic_export, BuildOptions(precision="fp32", min_batch=1, opt_batch=2, max_batch=4))
    assert fake_tensorrt.builds[-1]["profile"] == ("pixel_values", (1, 3, 16, 16), (2, 3, 32, 32), (4, 3, 64, 48))
    assert res.sidecar["profile"]["min"] == [1, 3, 16, 16] and res.sidecar["profile"]["max"] == [4, 3, 64, 48]
    assert res.sidecar["build_options"]["img_size_range"] == [[16, 16], [64, 48]]
    assert read_sidecar(res.sidecar_path) == res.sidecar

    fake_tensorrt.ENGINE_PROFILE = ((1, 3, 16, 16), (2, 3, 32, 32), (4, 3, 64, 48))
    monkeypatch.setattr(trt_runner_module, "require_trt_and_gpu", lambda: ("10.13.0.35", dict(H200)))
    monkeypatch.setattr(trt_runner_module, "CudaStream", RecordingStream)
    with TensorRTRunner(res.plan_path) as runner:
        assert runner.info["image_range"] == [[16, 16], [64, 48]]
        for h, w in ((16, 16), (32, 32), (64, 48), (20, 44)):
            x = np.random.default_rng(h).standard_normal((2, 3, h, w)).astype(np.float32)
            np.testing.assert_allclose(runner.infer(x), fake_tensorrt.logits_of(x), rtol=1e-6)
        for h, w in ((12, 16), (64, 52), (80, 80)):
            with pytest.raises(VitexportError) as e:
                runner.stage(np.zeros((2, 3, h, w), np.float32))
            assert str(e.value) == (f"model.fp32.plan takes images from 16x16 to 64x48 with 3 channels, got "
                                    f"(3, {h}, {w}); rebuild it from an export with a wider --img-size-range to "
                                    f"take it.")


def _heldout_at(size):
    from vitexport.data.images import load_folder
    from vitexport.model.variants import VARIANTS

    return load_folder(HELDOUT, VARIANTS["vit_digits_patch4_32"].preprocess(size))


def _logits(path, x):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, {"pixel_values": x[i:i + 64]})[0] for i in range(0, len(x), 64)])


def test_fp16_and_int8_keep_parity_at_two_sizes(bicubic_export):
    for args in (["--fp16"], ["--int8"], ["--int8", "--target", "tensorrt"]):
        r = CliRunner().invoke(cli, ["quantize", *args, str(bicubic_export), "-q"])
        assert r.exit_code == 0, r.output
    manifest = ModelFolder(bicubic_export).read_manifest()
    for kind in ("fp16", "int8", "int8-trt"):
        rec = manifest.precisions[kind]
        assert rec.check.img_size is None and rec.size_check.img_size == (16, 48) and rec.size_check.passed, kind
    for size in ((32, 32), (16, 48), (64, 48)):  # the default, the second checked size, the largest
        held = _heldout_at(size)
        ref = _logits(bicubic_export / "model.onnx", held.x)
        for kind, (cos_min, cos_mean) in (("fp16", (0.999, 0.9995)), ("int8", (0.95, 0.99)),
                                          ("int8.trt", (0.95, 0.99))):  # docs/PARITY.md's bounds
            got = _logits(bicubic_export / f"model.{kind}.onnx", held.x)
            cos = (ref * got).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(got, axis=1)
            agree = (ref.argmax(1) == got.argmax(1)).mean()
            assert cos.min() >= cos_min and cos.mean() >= cos_mean and agree >= 0.95, (kind, size, cos.min(), agree)
    for kind in ("model.fp16.onnx", "model.int8.onnx", "model.int8.trt.onnx"):
        model = onnx.load(str(bicubic_export / kind))
        onnx.checker.check_model(model, full_check=True)
        assert [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim][2:] == ["height", "width"]


def test_openvino_converts_a_bicubic_export_exactly_and_refuses_an_antialiased_one(bicubic_export, dynamic_export):
    pytest.importorskip("openvino")
    r = CliRunner().invoke(cli, ["openvino", "--precision", "fp32", str(bicubic_export), "-q"])
    assert r.exit_code == 0, r.output
    rec = ModelFolder(bicubic_export).read_manifest().precisions["openvino-fp32"]
    assert rec.size_check.img_size == (16, 48) and rec.size_check.stats.max_abs < 1e-4
    _, folder = dynamic_export  # bicubic with antialias: OpenVINO resamples it otherwise than PyTorch does
    r = CliRunner().invoke(cli, ["openvino", "--precision", "fp32", str(folder), "-q", "--check-data",
                                 str(HELDOUT)])
    assert r.exit_code == 1, r.output
    assert "failed the parity check at 16x80" in r.output and "--pos-embed-interp bicubic" in r.output
    assert not (folder / "model.openvino.fp32.xml").exists()





# -- bench at several sizes; predict and triton ----------------------------------------------------------------

def test_bench_times_a_dynamic_export_at_each_size(bicubic_export, tmp_path):
    out = tmp_path / "b.json"
    r = CliRunner().invoke(cli, ["bench", str(bicubic_export), "--img-size", "32", "--img-size", "16x48",
                                 "--backend", "onnxruntime cpu fp32", "--batch", "1", "--batch", "2",
                                 "--max-images", "60", "--iterations", "2", "--min-time", "0", "--json", str(out),
                                 "--data", str(HELDOUT)])  # the originals: read well at the size trained
    assert r.exit_code == 0, r.output
    report = json.loads(out.read_text())
    rows = {x["name"]: x for x in report["results"]}
    assert set(rows) == {"pytorch cpu fp32 @ 32x32", "onnxruntime cpu fp32 @ 32x32", "pytorch cpu fp32 @ 16x48",
                         "onnxruntime cpu fp32 @ 16x48"}
    assert report["options"]["img_sizes"] == [[32, 32], [16, 48]]
    for size in ("32x32", "16x48"):
        row = rows[f"onnxruntime cpu fp32 @ {size}"]
        assert row["img_size"] == [int(v) for v in size.split("x")] and row["parity"]["passed"]
        assert row["parity"]["n"] == 60 and [lt["batch"] for lt in row["latency"]] == [1, 2]
    # the digits were trained at 32x32: squeezed to 16x48 they are read far worse, so each size really ran
    acc = {s: rows[f"pytorch cpu fp32 @ {s}"]["parity"]["acc_ref"] for s in ("32x32", "16x48")}
    assert acc["32x32"] > 0.9 > acc["16x48"] + 0.2


@pytest.mark.parametrize("args,needle", [
    (["--img-size", "80x48"], "--img-size 80x48 is not one this export takes: from 16x16 to 64x48"),
    (["--img-size", "18x20"], "in multiples of the patch size 4x4"),
])
def test_bench_refuses_a_size_the_export_does_not_take(bicubic_export, args, needle):
    fails_cleanly(CliRunner().invoke(cli, ["bench", str(bicubic_export), *args]), needle)


def test_bench_refuses_other_sizes_of_a_fixed_size_export_and_onnx_takes_one_size(tiny_default, tmp_path):
    folder = copy_export(tiny_default / "models" / "vit_tiny_patch16_224-32x32", tmp_path / "m")
    fails_cleanly(CliRunner().invoke(cli, ["bench", str(folder), "--img-size", "64"]),
                  "was exported for 32x32 only; bench other sizes with an export made with `vitexport onnx "
                  "--dynamic-img-size`")
    assert not (folder / "model.int8.onnx").exists()  # refused before the bench made its FP16 and INT8 graphs
    fails_cleanly(CliRunner().invoke(cli, ["onnx", "--img-size", "32", "--img-size", "64"]),
                  "--img-size is given once here")


def test_predict_and_triton_take_a_dynamic_export(bicubic_export, tmp_path):
    image = next((HELDOUT / "7").iterdir())
    r = CliRunner().invoke(cli, ["predict", "-q", str(bicubic_export), str(image), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)[0]["top"][0]["label"] == "7"
    r = CliRunner().invoke(cli, ["triton", str(bicubic_export), "-o", str(tmp_path / "repo"), "-q"])
    assert r.exit_code == 0, r.output
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from google.protobuf import text_format

    config = next((tmp_path / "repo").glob("*/config.pbtxt"))
    cfg = text_format.Parse(config.read_text(), model_config_pb2.ModelConfig())
    assert list(cfg.input[0].dims) == [3, -1, -1] and list(cfg.output[0].dims) == [10]


def test_info_shows_the_range_and_each_checked_size(bicubic_export):
    r = CliRunner().invoke(cli, ["info", str(bicubic_export)])
    assert r.exit_code == 0, r.output
    assert "32x32 (default; any size from 16x16 to 64x48, position embedding resampled with bicubic)" in r.output
    assert "1 at 64x48 (passed)" in r.output and "3 at 16x48 (passed)" in r.output
