"""Outputs a user chooses (`vitexport onnx --outputs`): each a named ONNX output, checked here against timm's
VisionTransformer with the same weights (`forward_features`, `forward_head(pre_logits=True)`), carried through every
precision, the OpenVINO IR and the Triton configuration, and judged by the bench when asked (`--judge-output`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from timm.models.vision_transformer import VisionTransformer as TimmViT

from conftest import ROOT, fails_cleanly
from vitexport.cli import cli
from vitexport.exporter.to_onnx import export_onnx
from vitexport.model.vit import VisionTransformer, ViTConfig

HELDOUT = ROOT / "calibration" / "digits" / "heldout"
DIGITS_WEIGHTS = ROOT / "models" / "digits" / "vit_digits_patch4_32.safetensors"


def _run(onnx_path: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, {sess.get_inputs()[0].name: x})))


@pytest.fixture(scope="module")
def digits_outputs(tmp_path_factory):
    out = tmp_path_factory.mktemp("outputs") / "digits"
    r = CliRunner().invoke(cli, ["onnx", "-m", "vit_digits_patch4_32", "--outputs", "pooled,tokens", "-o", str(out),
                                 "-q"])
    assert r.exit_code == 0, r.output
    return out


def test_pooled_and_tokens_match_timms_forward_head_and_forward_features(digits_outputs):
    from safetensors.torch import load_file

    timm_model = TimmViT(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0,
                         num_classes=10).eval()
    timm_model.load_state_dict(load_file(str(DIGITS_WEIGHTS)))
    x = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        features = timm_model.forward_features(x)
        pooled = timm_model.forward_head(features, pre_logits=True)
    got = _run(digits_outputs / "model.onnx", x.numpy())
    assert list(got) == ["pooled", "tokens"]
    np.testing.assert_allclose(got["pooled"], pooled.numpy(), atol=1e-4, rtol=0)
    np.testing.assert_allclose(got["tokens"], features.numpy(), atol=1e-4, rtol=0)
    onnx.checker.check_model(str(digits_outputs / "model.onnx"), full_check=True)
    manifest = json.loads((digits_outputs / "manifest.json").read_text())
    assert manifest["output_name"] == "pooled"
    assert manifest["outputs"] == {"pooled": ["batch", 64], "tokens": ["batch", 65, 64]}


def test_registers_and_patch_tokens_of_a_model_with_registers_match_timm(tmp_path):
    kw = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, reg_tokens=4, num_classes=7)
    ref = TimmViT(**kw).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    ours = VisionTransformer(ViTConfig(**kw)).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    path = export_onnx(ours, tmp_path / "m.onnx", outputs=("logits", "registers", "patch", "tokens", "pooled"))
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        f = ref.forward_features(x)
        want = {"logits": ref(x), "tokens": f, "registers": f[:, 1:5], "patch": f[:, 5:],
                "pooled": ref.forward_head(f, pre_logits=True)}
    got = _run(path, x.numpy())
    assert list(got) == ["logits", "registers", "patch", "tokens", "pooled"]
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value.numpy(), atol=1e-4, rtol=0, err_msg=name)


def test_every_precision_the_ir_and_the_triton_config_carry_every_output(digits_outputs, tmp_path):
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(digits_outputs, folder)
    for args in (["quantize", str(folder), "--int8", "--target", "all", "--no-check"],
                 ["quantize", str(folder), "--fp16", "--target", "all", "--no-check"],
                 ["openvino", str(folder), "--precision", "fp32"],
                 ["triton", str(folder), "-o", str(tmp_path / "repo")]):
        r = CliRunner().invoke(cli, [*args, "-q"])
        assert r.exit_code == 0, (args, r.output)
    x = np.stack([np.zeros((3, 32, 32), np.float32), np.ones((3, 32, 32), np.float32)])
    ref = _run(folder / "model.onnx", x)
    for kind in ("fp16", "fp16.trt", "int8", "int8.trt"):
        got = _run(folder / f"model.{kind}.onnx", x)
        assert list(got) == ["pooled", "tokens"], kind
        for name in got:
            assert got[name].dtype == np.float32 and got[name].shape == ref[name].shape, (kind, name)
            cos = (got[name] * ref[name]).sum() / np.linalg.norm(got[name]) / np.linalg.norm(ref[name])
            assert cos > 0.95, (kind, name, cos)
    import openvino as ov

    ir = ov.Core().read_model(str(folder / "model.openvino.fp32.xml"))
    assert [o.get_any_name() for o in ir.outputs] == ["pooled", "tokens"]
    config = (tmp_path / "repo" / "vit_digits_patch4_32-fp32" / "config.pbtxt").read_text()
    assert 'name: "pooled"' in config and "dims: [ 65, 64 ]" in config


def test_the_bench_judges_the_pooled_output_of_a_classifier_as_an_embedding(tmp_path):
    out = tmp_path / "digits"
    r = CliRunner().invoke(cli, ["onnx", "-m", "vit_digits_patch4_32", "--outputs", "logits,pooled", "-o", str(out),
                                 "-q"])
    assert r.exit_code == 0, r.output
    fast = ["--no-prepare", "--backend", "onnxruntime cpu fp32", "--batch", "8", "--iterations", "1", "--min-time",
            "0", "--warmup", "0", "-q", "--data", str(HELDOUT)]
    report = tmp_path / "r.json"
    r = CliRunner().invoke(cli, ["bench", str(out), "--judge-output", "pooled", *fast, "--json", str(report)])
    assert r.exit_code == 0, r.output
    rows = {x["name"]: x["parity"] for x in json.loads(report.read_text())["results"] if x["available"]}
    st = rows["onnxruntime cpu fp32"]
    assert st["knn_acc"] > 0.9 and st["neighbour_agree"] > 0.95 and "top1_agree" not in st and st.get("acc") is None
    r = CliRunner().invoke(cli, ["bench", str(out), *fast, "--json", str(report)])  # default: the logits
    assert r.exit_code == 0, r.output
    st = next(x for x in json.loads(report.read_text())["results"] if x["name"] == "onnxruntime cpu fp32")["parity"]
    assert st["acc"] > 0.95 and "knn_acc" not in st


@pytest.mark.parametrize("args,needle", [
    (["--outputs", "pooled,cls"], "'cls' is not an output"),
    (["--outputs", "registers"], "has no registers output"),
    (["--outputs", "logits", "--num-classes", "0"], "has no logits output"),
    (["--outputs", "pooled,pooled"], "named twice"),
])
def test_outputs_a_model_cannot_give_are_one_sentence_before_any_work(tmp_path, args, needle):
    r = CliRunner().invoke(cli, ["onnx", "-m", "vit_digits_patch4_32", *args, "-o", str(tmp_path / "m")])
    assert r.exit_code == 2
    fails_cleanly(r, needle)
    assert not (tmp_path / "m").exists()


def test_judging_an_output_the_export_lacks_is_one_sentence(digits_outputs, tmp_path):
    r = CliRunner().invoke(cli, ["bench", str(digits_outputs), "--judge-output", "logits", "--no-prepare"])
    assert r.exit_code == 2
    fails_cleanly(r, "--outputs pooled,tokens,logits")
