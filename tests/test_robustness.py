"""User mistakes and odd inputs found in review: each gives one sentence, never a traceback or a silent wrong result."""

import json
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from vitexport.backends.base import Runner
from vitexport.bench import infer_all
from vitexport.cli import cli
from vitexport.data import Dataset, labels_for_model
from vitexport.export import ModelSpec, run_export
from vitexport.precision import CalibOptions, run_quantize
from vitexport.variants import DIGITS_VARIANT


def _fails_cleanly(r, needle):
    assert r.exit_code != 0, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)  # no traceback
    assert "Traceback" not in r.output
    assert needle.lower() in r.output.lower(), r.output


@pytest.fixture(scope="module")
def tiny_default(tmp_path_factory):
    """A tiny model exported to its default folder under a scratch working directory."""
    root = tmp_path_factory.mktemp("work")
    import os
    old = os.getcwd()
    os.chdir(root)
    try:
        run_export(ModelSpec(variant="vit_tiny_patch16_224", img_size=(32, 32)))
    finally:
        os.chdir(old)
    return root


def test_other_checkpoint_is_not_silently_ignored_by_quantize(tiny_default, monkeypatch):
    monkeypatch.chdir(tiny_default)
    from timm.models.vision_transformer import VisionTransformer as TimmViT
    torch.save(TimmViT(img_size=32, patch_size=16, embed_dim=192, depth=12, num_heads=3).state_dict(), "w.pth")
    args = ["quantize", "--fp16", "-m", "vit_tiny_patch16_224", "--img-size", "32"]
    r = CliRunner().invoke(cli, args + ["-c", "w.pth"])
    _fails_cleanly(r, "another export")
    r = CliRunner().invoke(cli, args + ["-c", "missing.pth"])
    _fails_cleanly(r, "does not exist")
    r = CliRunner().invoke(cli, args + ["--num-classes", "5"])
    _fails_cleanly(r, "classes")
    assert CliRunner().invoke(cli, args + ["-q"]).exit_code == 0  # the same model: fine


def test_export_under_another_name_needs_force(tiny_default, monkeypatch):
    monkeypatch.chdir(tiny_default)
    folder = tiny_default / "models" / "vit_tiny_patch16_224-32x32"
    r = CliRunner().invoke(cli, ["onnx", "-m", "vit_tiny_patch16_224", "--img-size", "32", "--num-classes", "0",
                                 "-o", str(folder / "other.onnx")])
    _fails_cleanly(r, "--force")
    assert not (folder / "other.onnx").exists()
    assert json.loads((folder / "manifest.json").read_text())["onnx"] == "model.onnx"


def test_onnx_file_that_is_not_the_manifests(tiny_default, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny_default / "models" / "vit_tiny_patch16_224-32x32", folder)
    shutil.copy(folder / "model.onnx", folder / "copy.onnx")
    r = CliRunner().invoke(cli, ["quantize", "--fp16", str(folder / "copy.onnx")])
    _fails_cleanly(r, "not the model")
    (folder / "junk.onnx").write_bytes(b"not a protobuf at all")
    r = CliRunner().invoke(cli, ["quantize", "--fp16", str(folder / "junk.onnx")])
    _fails_cleanly(r, "not a readable ONNX")


def test_output_path_that_is_a_folder(in_tmp):
    (in_tmp / "x.onnx").mkdir()
    r = CliRunner().invoke(cli, ["onnx", "-m", "vit_tiny_patch16_224", "--img-size", "32", "-o", "x.onnx"])
    _fails_cleanly(r, "is a folder")


def test_bench_report_path_checked_before_work(tiny_default, tmp_path):
    (tmp_path / "adir").mkdir()
    folder = tiny_default / "models" / "vit_tiny_patch16_224-32x32"
    r = CliRunner().invoke(cli, ["bench", str(folder), "--json", str(tmp_path / "adir")])
    _fails_cleanly(r, "--json")
    r = CliRunner().invoke(cli, ["bench", str(folder), "--threshold", "int8.nope=1"])
    _fails_cleanly(r, "--threshold")
    assert not (folder / "model.int8.onnx").exists()  # nothing was prepared before the mistake was found


def test_labels_follow_the_model_classes():
    ds = Dataset(np.zeros((3, 3, 4, 4), np.float32), np.array([0, 1, 2]), [], ["2", "10", "7"], "x")
    labels, why = labels_for_model(ds, 1000)
    assert why is None and list(labels) == [2, 10, 7]  # folder names are class indices
    ds2 = Dataset(ds.x, np.array([0, 1, 2]), [], ["cat", "dog", "eel"], "x")
    assert labels_for_model(ds2, 1000)[0] is None and "1000" in labels_for_model(ds2, 1000)[1]
    assert list(labels_for_model(ds2, 3)[0]) == [0, 1, 2]
    assert labels_for_model(ds2, 0)[0] is None


def test_damaged_calibration_cache_is_recomputed(tmp_path):
    out = tmp_path / "d"
    run_export(ModelSpec(variant=DIGITS_VARIANT), output=out)
    first = run_quantize(out, "int8", CalibOptions(samples=10, check=False))
    cache = out / "calib-cache" / f"{first.calib_key}.json"
    cache.write_text(cache.read_text()[:50])  # as if a write had been cut short
    again = run_quantize(out, "int8", CalibOptions(samples=10, check=False))
    assert again.cache_reused is False and json.loads(cache.read_text())


class _Ranged(Runner):
    backend, precision = "fake", "fp32"
    batch_range = (2, 4)

    def load(self):
        pass

    def run(self, staged):
        assert 2 <= len(staged) <= 4
        return staged.reshape(len(staged), -1)[:, :3] * 2


def test_infer_all_respects_an_engine_batch_range():
    r = _Ranged()
    r.loaded = True
    x = np.random.default_rng(0).standard_normal((9, 3, 2, 2)).astype(np.float32)
    out = infer_all(r, x)
    assert np.allclose(out, x.reshape(9, -1)[:, :3] * 2)
