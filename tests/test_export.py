"""`vitexport onnx`: the ONNX file, run by ONNX Runtime, against PyTorch; and every bad input."""

import json

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from conftest import fails_cleanly

from vitexport.artifacts.folder import LOCK_NAME, ModelFolder
from vitexport.backends.ort_session import create_session
from vitexport.cli import cli
from vitexport.exporter.torch_model import model_from_manifest


def _run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _dims(value_info):
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def test_tiny_export_non_square_any_batch(in_tmp):
    r = _run("onnx", "-m", "vit_tiny_patch16_224", "--img-size", "32x48", "-q")
    assert r.exit_code == 0, r.output
    folder = in_tmp / "models" / "vit_tiny_patch16_224-32x48"
    model = onnx.load(str(folder / "model.onnx"))
    assert _dims(model.graph.input[0])[1:] == [3, 32, 48] and isinstance(_dims(model.graph.input[0])[0], str)
    ops = {n.op_type for n in model.graph.node}
    assert "LayerNormalization" in ops and "Resize" not in ops
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["grid"] == [2, 3] and manifest["pos_embed_interp"] == "bicubic-antialias"
    meta = {p.key: p.value for p in model.metadata_props}
    assert json.loads(meta["vitexport.preprocess"]) == manifest["preprocess"]
    # the ONNX file (not our check) against a freshly rebuilt PyTorch model
    torch_model = model_from_manifest(ModelFolder(folder).read_manifest())
    sess = create_session(folder / "model.onnx")
    for b in (1, 2, 5):
        x = torch.randn(b, 3, 32, 48)
        with torch.no_grad():
            ref = torch_model(x).numpy()
        out = sess.run(None, {"pixel_values": x.numpy()})[0]
        assert np.abs(out - ref).max() < 1e-4


def test_checkpoint_at_new_size_is_baked(in_tmp):
    from timm.models.vision_transformer import VisionTransformer as TimmViT
    from timm.models.vision_transformer import checkpoint_filter_fn

    torch.manual_seed(0)
    src = TimmViT(img_size=224, patch_size=16, embed_dim=192, depth=12, num_heads=3).eval()
    with torch.no_grad():
        for p in src.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    torch.save(src.state_dict(), in_tmp / "tiny224.pth")
    r = _run("onnx", "-m", "vit_tiny_patch16_224", "-c", "tiny224.pth", "--img-size", "96", "-q")
    assert r.exit_code == 0, r.output
    ref = TimmViT(img_size=96, patch_size=16, embed_dim=192, depth=12, num_heads=3).eval()
    ref.load_state_dict(checkpoint_filter_fn(src.state_dict(), ref))
    x = torch.randn(2, 3, 96, 96)
    sess = create_session(in_tmp / "models" / "vit_tiny_patch16_224-96x96" / "model.onnx")
    out = sess.run(None, {"pixel_values": x.numpy()})[0]
    with torch.no_grad():
        assert np.abs(out - ref(x).numpy()).max() < 1e-4


@pytest.mark.e2e
def test_default_vit_b16_at_384(in_tmp):
    """The size that matters: the default ViT-B/16 exported at 384 from a 224 checkpoint, ONNX Runtime running the
    file against timm's own VisionTransformer at 384 with the same weights (timm's resizing of the position
    embedding) at batch 1: the export traces batch 2 (a batch of 1 would be specialised), and its own check runs
    batches 1 and 3."""
    import onnxruntime as ort
    from timm.models.vision_transformer import VisionTransformer as TimmViT
    from timm.models.vision_transformer import checkpoint_filter_fn

    vit_b = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12)
    torch.manual_seed(0)
    src = TimmViT(img_size=224, **vit_b).eval()
    with torch.no_grad():
        for p in src.parameters():  # every tensor random, LayerNorm affine and biases included
            p.add_(torch.randn_like(p) * 0.02)
    torch.save(src.state_dict(), in_tmp / "b224.pth")
    r = _run("onnx", "-c", "b224.pth", "--img-size", "384", "-q")
    assert r.exit_code == 0, r.output
    folder = in_tmp / "models" / "vit_base_patch16_224-384x384"
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    dims = _dims(model.graph.input[0])
    assert dims[1:] == [3, 384, 384] and isinstance(dims[0], str)
    del model
    ref = TimmViT(img_size=384, **vit_b).eval()
    ref.load_state_dict(checkpoint_filter_fn(src.state_dict(), ref))
    del src
    x = torch.randn(1, 3, 384, 384)
    with torch.no_grad():
        want = ref(x).numpy()
    del ref
    sess = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    assert got.shape == want.shape == (1, 1000)
    diff = float(np.abs(got - want).max())
    assert diff < 1e-4, diff


def _no_onnx_left(root):
    return not list(root.rglob("*.onnx")) and not list(root.rglob(".*"))  # no export, no temporary


@pytest.mark.parametrize("args,needle", [
    (["--checkpoint", "missing.pth"], "does not exist"),
    (["--checkpoint", "corrupt.pth"], "not a PyTorch"),
    (["--checkpoint", "other.pth"], "does not fit"),
    (["--img-size", "100"], "not a multiple of the patch size"),
    (["--img-size", "abc"], "is not N or HxW"),
    (["--opset", "13"], "opset"),
    (["--output", "afile/sub"], "output"),
])
def test_bad_input_one_sentence(in_tmp, args, needle):
    (in_tmp / "corrupt.pth").write_bytes(b"\x00garbage" * 10)
    from timm.models.vision_transformer import VisionTransformer as TimmViT
    torch.save(TimmViT(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4).state_dict(), in_tmp / "other.pth")
    (in_tmp / "afile").write_text("x")
    r = CliRunner().invoke(cli, ["onnx", "-m", "vit_tiny_patch16_224", *args])
    assert r.exit_code != 0
    assert r.exception is None or isinstance(r.exception, SystemExit)  # no traceback
    assert needle.lower() in r.output.lower()
    assert "Traceback" not in r.output
    assert _no_onnx_left(in_tmp)


def _tiny_copy(tiny_default, in_tmp):
    """The session's tiny export, copied to in_tmp's default folder (an export of its own takes ~10 s)."""
    import shutil

    shutil.copytree(tiny_default / "models", in_tmp / "models", ignore=shutil.ignore_patterns(LOCK_NAME))
    return in_tmp / "models" / "vit_tiny_patch16_224-32x32"


def test_failed_parity_keeps_previous_model(in_tmp, tiny_default, monkeypatch):
    path = _tiny_copy(tiny_default, in_tmp) / "model.onnx"
    before = path.read_bytes()
    import vitexport.exporter.check as check
    real = check.compare

    def skewed(ref, out, labels=None):
        return real(ref, out + 1.0, labels)  # as if ONNX Runtime computed something else
    monkeypatch.setattr(check, "compare", skewed)
    r = CliRunner().invoke(cli, ["onnx", "-m", "vit_tiny_patch16_224", "--img-size", "32", "-q"])
    assert r.exit_code == 1 and "disagree" in r.output
    assert path.read_bytes() == before
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".") and p.name != LOCK_NAME]  # no temporary


def test_other_checkpoint_needs_force(in_tmp, tiny_default):
    _tiny_copy(tiny_default, in_tmp)
    from timm.models.vision_transformer import VisionTransformer as TimmViT
    torch.save(TimmViT(img_size=224, patch_size=16, embed_dim=192, depth=12, num_heads=3).state_dict(), in_tmp / "w.pth")
    r = CliRunner().invoke(cli, ["onnx", "-m", "vit_tiny_patch16_224", "--img-size", "32", "-c", "w.pth", "-q"])
    assert r.exit_code != 0 and "--force" in r.output
    r = CliRunner().invoke(cli, ["onnx", "-m", "vit_tiny_patch16_224", "--img-size", "32", "-c", "w.pth", "-q", "--force"])
    assert r.exit_code == 0, r.output


def test_python_dash_m(in_tmp):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "vitexport", "onnx", "--img-size", "7"], capture_output=True, text=True)
    assert r.returncode == 2 and "not a multiple" in r.stderr and "Traceback" not in r.stderr


def test_large_models_use_external_data(in_tmp, monkeypatch):
    """Models over protobuf's 2 GB cap are written with external data; shown here by lowering the cap."""
    import vitexport.exporter.to_onnx as ex
    monkeypatch.setattr(ex, "PROTOBUF_LIMIT", 1024)
    r = _run("onnx", "-m", "vit_tiny_patch16_224", "--img-size", "32", "-q")
    assert r.exit_code == 0, r.output
    folder = in_tmp / "models" / "vit_tiny_patch16_224-32x32"
    assert (folder / "model.onnx.data").stat().st_size > (folder / "model.onnx").stat().st_size
    onnx.checker.check_model(str(folder / "model.onnx"))
    sess = create_session(folder / "model.onnx")
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32), np.float32)
    with torch.no_grad():
        ref = model_from_manifest(ModelFolder(folder).read_manifest())(torch.from_numpy(x)).numpy()
    assert np.abs(sess.run(None, {"pixel_values": x})[0] - ref).max() < 1e-4
    assert not [p for p in folder.iterdir() if p.name.startswith(".") and p.name != LOCK_NAME]


def test_export_under_another_name_needs_force(tiny_default, monkeypatch):
    monkeypatch.chdir(tiny_default)
    folder = tiny_default / "models" / "vit_tiny_patch16_224-32x32"
    r = CliRunner().invoke(cli, ["onnx", "-m", "vit_tiny_patch16_224", "--img-size", "32", "--num-classes", "0",
                                 "-o", str(folder / "other.onnx")])
    fails_cleanly(r, "--force")
    assert not (folder / "other.onnx").exists()
    assert json.loads((folder / "manifest.json").read_text())["onnx"] == "model.onnx"


def test_output_path_that_is_a_folder(in_tmp):
    (in_tmp / "x.onnx").mkdir()
    r = CliRunner().invoke(cli, ["onnx", "-m", "vit_tiny_patch16_224", "--img-size", "32", "-o", "x.onnx"])
    fails_cleanly(r, "is a folder")
