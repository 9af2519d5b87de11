"""Sharded checkpoints (`model.safetensors.index.json`, `pytorch_model.bin.index.json` + their shards, as
huggingface_hub saves large models): read shard by shard into the same model as one file, from a folder or a hub
repository in the cache; an index that names a file outside its folder, a missing shard or a tensor twice is one
sentence, before anything is built."""

import json

import numpy as np
import onnxruntime as ort
import pytest
import timm
import torch
from click.testing import CliRunner
from conftest import fails_cleanly, load_script

from vitexport.cli import cli
from vitexport.model.readers.checkpoints import load_checkpoint

TAG = "vit_small_patch16_dinov3.lvd1689m"


@pytest.fixture(scope="module")
def sharded_repo(tmp_path_factory):
    """timm/TAG (one block) in a hub cache, its weights in shards of at most 1 MB, and the model."""
    cache = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    coverage = load_script("timm_coverage")
    model = coverage.perturb(timm.create_model(TAG, pretrained=False, depth=1))
    snap = coverage.lay_out_repo(cache, TAG, model, shard_bytes=1 << 20)
    assert not (snap / "model.safetensors").exists() and len(list(snap.glob("model-*.safetensors"))) > 2
    return cache, snap, model


def test_a_sharded_hub_repository_exports_as_timm_s_model(sharded_repo, tmp_path, monkeypatch):
    cache, snap, model = sharded_repo
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = CliRunner().invoke(cli, ["onnx", "-m", TAG, "-o", str(tmp_path / "m"), "-q"])
    assert r.exit_code == 0, r.output
    x = torch.randn(2, 3, 256, 256, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(x).numpy()
    sess = ort.InferenceSession(str(tmp_path / "m" / "model.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"pixel_values": x.numpy()})[0]
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))
    record = json.loads((tmp_path / "m" / "manifest.json").read_text())["checkpoint"]
    assert record["path"].endswith("model.safetensors.index.json") and record["repo"] == f"timm/{TAG}"


def test_shards_read_as_the_one_file_they_were_split_from(sharded_repo, tmp_path):
    from safetensors.torch import save_file

    _, snap, model = sharded_repo
    whole = tmp_path / "whole"
    whole.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(whole / "model.safetensors"))
    a, b = load_checkpoint(snap), load_checkpoint(whole)
    assert a.state_dict.keys() == b.state_dict.keys()
    assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)
    assert a.sha256 != b.sha256  # a sharded checkpoint is named by its index and every shard


def test_pytorch_bin_shards_too(sharded_repo, tmp_path):
    _, _, model = sharded_repo
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    names = sorted(sd)
    half = len(names) // 2
    folder = tmp_path / "bins"
    folder.mkdir()
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:]), 1):
        shard = f"pytorch_model-0000{i}-of-00002.bin"
        torch.save({k: sd[k] for k in part}, folder / shard)
        weight_map.update({k: shard for k in part})
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    got = load_checkpoint(folder).state_dict
    assert got.keys() == sd.keys() and all(torch.equal(got[k], sd[k]) for k in sd)


@pytest.mark.parametrize("damage,needle", [
    (lambda m: {**m, next(iter(m)): "../elsewhere.safetensors"}, "which is not a file beside it"),
    (lambda m: {**m, next(iter(m)): "/etc/passwd"}, "which is not a file beside it"),
    (lambda m: {**m, next(iter(m)): "model-00009-of-00009.safetensors"}, "which is not in"),
    (lambda m: {**m, "blocks.0.not_a_tensor": next(iter(m.values()))}, "lacks tensor 'blocks.0.not_a_tensor'"),
])
def test_a_bad_index_is_one_sentence(sharded_repo, tmp_path, damage, needle):
    import shutil

    _, snap, _ = sharded_repo
    folder = tmp_path / "ckpt"
    shutil.copytree(snap, folder)
    index = folder / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"] = damage(data["weight_map"])
    index.write_text(json.dumps(data))
    r = CliRunner().invoke(cli, ["onnx", "-m", TAG.split(".")[0], "-c", str(folder), "-o", str(tmp_path / "m")])
    fails_cleanly(r, needle)
    assert not (tmp_path / "m").exists()


def test_a_tensor_named_twice_is_one_sentence(sharded_repo, tmp_path):
    import shutil

    _, snap, _ = sharded_repo
    folder = tmp_path / "ckpt"
    shutil.copytree(snap, folder)
    index = folder / "model.safetensors.index.json"
    text = index.read_text()
    first, shard = next(iter(json.loads(text)["weight_map"].items()))
    index.write_text(text.replace('"weight_map": {', f'"weight_map": {{"{first}": "{shard}", ', 1))
    r = CliRunner().invoke(cli, ["onnx", "-m", TAG.split(".")[0], "-c", str(folder), "-o", str(tmp_path / "m")])
    fails_cleanly(r, f"names tensor '{first}' twice")
