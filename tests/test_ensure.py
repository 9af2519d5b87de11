"""The one entry that makes sure an artifact exists: which folder a command works on, what it exports or converts,
and what it refuses (in one sentence) rather than silently using another model."""

import shutil

import pytest
import torch
from click.testing import CliRunner
from conftest import fails_cleanly

from vitexport.artifacts.folder import ARTIFACTS, ModelFolder
from vitexport.artifacts.verify import check_onnx
from vitexport.cli import cli
from vitexport.ensure import MAKERS, ensure_artifact, open_model
from vitexport.errors import VitexportError
from vitexport.model.spec import ModelSpec
from vitexport.precision import CalibOptions

TINY = ModelSpec(variant="vit_tiny_patch16_224", img_size=(32, 32))


def test_other_checkpoint_is_not_silently_ignored_by_quantize(tiny_default, monkeypatch):
    monkeypatch.chdir(tiny_default)
    from timm.models.vision_transformer import VisionTransformer as TimmViT
    torch.save(TimmViT(img_size=32, patch_size=16, embed_dim=192, depth=12, num_heads=3).state_dict(), "w.pth")
    args = ["quantize", "--fp16", "-m", "vit_tiny_patch16_224", "--img-size", "32"]
    r = CliRunner().invoke(cli, args + ["-c", "w.pth"])
    fails_cleanly(r, "another export")
    r = CliRunner().invoke(cli, args + ["-c", "missing.pth"])
    fails_cleanly(r, "does not exist")
    r = CliRunner().invoke(cli, args + ["--num-classes", "5"])
    fails_cleanly(r, "classes")
    assert CliRunner().invoke(cli, args + ["-q"]).exit_code == 0  # the same model: fine


def test_onnx_file_that_is_not_the_manifests(tiny_default, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny_default / "models" / "vit_tiny_patch16_224-32x32", folder)
    shutil.copy(folder / "model.onnx", folder / "copy.onnx")
    r = CliRunner().invoke(cli, ["quantize", "--fp16", str(folder / "copy.onnx")])
    fails_cleanly(r, "not the model")
    (folder / "junk.onnx").write_bytes(b"not a protobuf at all")
    r = CliRunner().invoke(cli, ["quantize", "--fp16", str(folder / "junk.onnx")])
    fails_cleanly(r, "not a readable ONNX")


def test_open_model_finds_the_default_folder_and_refuses_to_export_when_told(tiny_default, monkeypatch):
    monkeypatch.chdir(tiny_default)
    folder = open_model(None, TINY, export=False)
    assert folder.path.resolve() == (tiny_default / "models" / "vit_tiny_patch16_224-32x32").resolve()
    with pytest.raises(VitexportError, match="No exported model at .*; run `vitexport onnx` first"):
        open_model(None, ModelSpec(variant="vit_tiny_patch16_224", img_size=(48, 48)), export=False)
    assert not (tiny_default / "models" / "vit_tiny_patch16_224-48x48").exists()


def test_ensure_keeps_a_current_file_and_remakes_a_stale_one(tiny_default, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny_default / "models" / "vit_tiny_patch16_224-32x32", folder,
                    ignore=shutil.ignore_patterns("model.fp16.onnx"))
    first = ensure_artifact(folder, "fp16", calib=CalibOptions(check=False))
    assert first.made and first.path == folder / "model.fp16.onnx" and first.precision is not None
    again = ensure_artifact(folder, "fp16", calib=CalibOptions(check=False))
    assert not again.made and again.path == first.path  # current: kept
    other = ensure_artifact(folder, "fp16", calib=CalibOptions(check=False, keep_fp32=("LayerNormalization",)))
    assert other.made  # made with other options: made again
    record = ModelFolder(folder).read_manifest().precisions["fp16"]
    assert record.keep_fp32 == ["LayerNormalization"]
    first.path.write_bytes(first.path.read_bytes() + b"\0")  # changed since it was recorded: stale
    assert ensure_artifact(folder, "fp16").made
    assert ensure_artifact(folder, "fp32").path == folder / "model.onnx"


def test_every_kind_has_a_maker_or_says_so(digits_export, tmp_path, monkeypatch):
    assert set(MAKERS) | {"fp32"} <= set(ARTIFACTS)
    folder = tmp_path / "m"
    shutil.copytree(digits_export, folder,
                    ignore=shutil.ignore_patterns("model.*.onnx", "model.openvino.*"))  # only the export
    mf = ModelFolder(folder)
    for kind in ARTIFACTS:  # every kind is the export or is made by its step into a file that verifies
        assert kind == "fp32" or not mf.onnx(kind).exists(), kind
        made = ensure_artifact(folder, kind, calib=CalibOptions(samples=8, check=False))
        assert made.path == mf.onnx(kind) and made.made == (kind != "fp32"), kind
        check = check_onnx(mf, kind)
        assert check.ok, check.sentence()
    monkeypatch.delitem(MAKERS, "fp16")  # a kind without a step: one sentence, nothing written
    (folder / "model.fp16.onnx").unlink()
    with pytest.raises(VitexportError, match=r"No step makes model\.fp16\.onnx yet"):
        ensure_artifact(folder, "fp16")
    assert not (folder / "model.fp16.onnx").exists()
    with pytest.raises(VitexportError, match="Unknown precision 'int4'"):
        ensure_artifact(folder, "int4")
