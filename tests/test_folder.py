"""The model folder and its manifest: every artifact's path from one table, a typed manifest that round-trips the
JSON written today, and one sentence for a manifest this version cannot read."""

import json

import pytest

from vitexport.artifacts.folder import ARTIFACTS, PLAN_SOURCE, ModelFolder, onnx_digest
from vitexport.artifacts.manifest import FORMAT, Manifest, read_manifest, write_manifest
from vitexport.errors import VitexportError
from vitexport.paths import sha256_file


def test_paths_of_every_artifact(tmp_path):
    f = ModelFolder(tmp_path)
    assert f.manifest_path == tmp_path / "manifest.json"
    assert [f.onnx(k).name for k in ARTIFACTS] == ["model.onnx", "model.fp16.onnx", "model.fp16.trt.onnx",
                                                   "model.int8.onnx", "model.int8.trt.onnx", "model.fp8.onnx", "model.openvino.fp32.xml",
                                                   "model.openvino.fp16.xml", "model.openvino.int8.xml",
                                                   "model.aoti.fp32.pt2", "model.aoti.bf16.pt2", "model.aoti.int8.pt2"]
    assert f.rejected("aoti-int8") == tmp_path / "model.aoti.int8.rejected.pt2"
    assert f.ir_weights("openvino-int8") == tmp_path / "model.openvino.int8.bin"
    assert f.rejected("openvino-fp16") == tmp_path / "model.openvino.fp16.rejected.xml"
    assert {"model.openvino.fp32.xml", "model.openvino.fp32.bin"} <= {p.name for p in f.derived_files()}
    assert [f.plan(p).name for p in PLAN_SOURCE] == ["model.fp32.plan", "model.fp16.plan", "model.int8.plan",
                                                     "model.fp8.plan"]
    assert f.sidecar("int8") == tmp_path / "model.int8.plan.json"
    assert {p: f.plan_source(p).name for p in PLAN_SOURCE} == {
        "fp32": "model.onnx", "fp16": "model.fp16.trt.onnx", "int8": "model.int8.trt.onnx",
        "fp8": "model.fp8.onnx"}
    assert f.rejected("fp16") == tmp_path / "model.fp16.rejected.onnx"
    assert f.rejected("int8-trt") == tmp_path / "model.int8.trt.rejected.onnx"
    assert f.calib_cache("abc") == tmp_path / "calib-cache" / "abc.json"
    assert f.external_data() == tmp_path / "model.onnx.data"
    derived = {p.name for p in f.derived_files()}
    assert "model.onnx" not in derived and {"model.int8.trt.onnx", "model.fp32.plan.json"} <= derived
    with pytest.raises(VitexportError, match="Unknown precision 'bf16'"):
        f.onnx("bf16")


def test_an_export_under_another_name_is_found_through_the_manifest(tmp_path):
    assert ModelFolder.for_output(tmp_path / "custom.onnx").onnx() == tmp_path / "custom.onnx"
    assert ModelFolder.for_output(tmp_path).onnx() == tmp_path / "model.onnx"
    (tmp_path / "manifest.json").write_text(json.dumps({**_manifest_json(), "onnx": "custom.onnx"}))
    folder = ModelFolder(tmp_path)
    assert folder.onnx() == tmp_path / "custom.onnx" and folder.plan_source("fp32") == tmp_path / "custom.onnx"
    assert ModelFolder.containing(tmp_path / "manifest.json") == folder


def test_digests_fold_in_external_data(tmp_path):
    model = tmp_path / "model.onnx"
    model.write_bytes(b"graph")
    alone = onnx_digest(model)
    assert alone == sha256_file(model)
    (tmp_path / "model.onnx.data").write_bytes(b"weights")
    assert onnx_digest(model) != alone


def _manifest_json() -> dict:
    """A manifest as `vitexport onnx` writes it (vitexport-manifest/1)."""
    return {
        "format": "vitexport-manifest/1", "variant": "vit_digits_patch4_32", "img_size": [32, 32],
        "patch_size": [4, 4], "grid": [8, 8], "num_classes": 10,
        "config": {"img_size": [32, 32], "patch_size": [4, 4], "in_chans": 3, "num_classes": 10, "embed_dim": 64,
                   "depth": 4, "num_heads": 4, "mlp_ratio": 2.0},
        "preprocess": {"input_size": [32, 32], "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "crop_pct": 1.0,
                       "interpolation": "bilinear", "crop_mode": "squash"},
        "checkpoint": {"path": "/abs/vit.safetensors", "sha256": "ab" * 32, "format": "timm"},
        "seed": None, "pos_embed_interp": "bicubic-antialias", "opset": 18, "onnx": "model.onnx",
        "input_name": "pixel_values", "output_name": "logits", "input_shape": ["batch", 3, 32, 32],
        "output_shape": ["batch", 10], "versions": {"vitexport": "0.1.0", "python": "3.12.0"},
        "parity": {"atol": 0.0001, "checks": [{"batch": 1, "passed": True, "n": 1, "max_abs": 1e-6,
                                               "mean_abs": 1e-7, "cos_min": 1.0, "cos_mean": 1.0, "top1_agree": 1.0,
                                               "top5_agree": 1.0, "acc_ref": None, "acc": None}]},
        "onnx_sha256": "cd" * 32, "onnx_bytes": 123,
        "precisions": {
            "fp16": {"file": "model.fp16.onnx", "source_sha256": "cd" * 32, "keep_fp32": ["LayerNormalization"],
                     "sha256": "ef" * 32},
            "int8": {"file": "model.int8.onnx", "source_sha256": "cd" * 32,
                     "calibration": {"key": "k", "method": "percentile", "samples": 10, "data": "/abs/calib",
                                     "requested_samples": 10, "percentile": 99.999, "quantize_attention": False,
                                     "exclude_nodes": [], "exclude_blocks": [0]},
                     "qdq": {"qdq_nodes": 40, "nonzero_zero_points": 0},
                     "check": {"data": "held", "passed": True, "failures": [], "thresholds": {"cos_min": 0.95},
                               "n": 7, "max_abs": 0.1, "mean_abs": 0.01, "cos_min": 0.99, "cos_mean": 0.995,
                               "top1_agree": 1.0, "top5_agree": 1.0, "acc_ref": 1.0, "acc": 1.0},
                     "sha256": "01" * 32},
        },
    }


def test_manifest_round_trips_the_json_written_today(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(_manifest_json()))
    m = read_manifest(path)
    assert isinstance(m, Manifest) and m.format == FORMAT
    assert m.img_size == (32, 32) and m.preprocess.crop_pct == 1.0 and m.checkpoint.format == "timm"
    assert m.parity.checks[0].stats.max_abs == 1e-6
    int8 = m.precisions["int8"]
    assert int8.calibration.exclude_blocks == [0] and int8.check.stats.n == 7 and int8.qdq["qdq_nodes"] == 40
    write_manifest(path, m)
    assert json.loads(path.read_text()) == _manifest_json()
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]  # written atomically: no temporary left


def test_a_manifest_from_before_crop_modes_reads_as_timm_s_default(tmp_path):
    path = tmp_path / "manifest.json"
    data = _manifest_json()
    del data["preprocess"]["crop_mode"]
    path.write_text(json.dumps(data))
    assert read_manifest(path).preprocess.crop_mode == "center"
    assert _manifest_json()["preprocess"]["crop_mode"] == "squash"
    assert read_manifest(_written(tmp_path / "today.json", _manifest_json())).preprocess.crop_mode == "squash"


def _written(path, data):
    path.write_text(json.dumps(data))
    return path


def test_unknown_fields_are_kept(tmp_path):
    path = tmp_path / "manifest.json"
    data = _manifest_json()
    data["future"] = {"x": 1}
    data["precisions"]["fp16"]["future"] = 2
    path.write_text(json.dumps(data))
    write_manifest(path, read_manifest(path))
    assert json.loads(path.read_text()) == data


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(format="vitexport-manifest/2"),
     "is a 'vitexport-manifest/2' manifest, which vitexport .* cannot read .*vitexport-manifest/1.*upgrade"),
    (lambda d: d.update(format="something-else/1"), "is a 'something-else/1' manifest"),
    (lambda d: d.pop("format"), "lacks the field 'format'; re-export the model"),
    (lambda d: d.pop("input_name"), "lacks the field 'input_name'; re-export the model"),
    (lambda d: d["precisions"]["int8"]["calibration"].pop("key"),
     "lacks the field 'precisions.int8.calibration.key'"),
    (lambda d: d.update(img_size=[32]), "not two sizes"),
    (lambda d: d.update(num_classes="ten"), "has a str in the field 'num_classes'"),
    (lambda d: d["preprocess"].pop("mean"), "unreadable 'preprocess' field"),
])
def test_a_manifest_this_version_cannot_read_is_one_sentence(tmp_path, edit, message):
    path = tmp_path / "manifest.json"
    data = _manifest_json()
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(VitexportError, match=message) as e:
        read_manifest(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_not_a_manifest_at_all(tmp_path):
    path = tmp_path / "manifest.json"
    with pytest.raises(VitexportError, match="has no manifest.json beside it"):
        read_manifest(path)
    path.write_text("{oops")
    with pytest.raises(VitexportError, match="is not valid JSON"):
        read_manifest(path)
    path.write_text("[1, 2]")
    with pytest.raises(VitexportError, match="holds a JSON list"):
        read_manifest(path)
