"""A model folder is input: names in its manifest and sidecars, links among its files and the external-data
locations inside its ONNX files cannot make vitexport read or write outside it; hub references are checked
before any path is built from them."""

import json
import shutil

import onnx
import pytest
from click.testing import CliRunner
from conftest import copy_export, fails_cleanly

from vitexport.artifacts.folder import LOCK_NAME, ModelFolder, external_locations
from vitexport.artifacts.sidecar import read_sidecar
from vitexport.artifacts.verify import BROKEN, check_onnx
from vitexport.cli import cli
from vitexport.errors import VitexportError
from vitexport.model.readers.hub import parse_ref
from vitexport.paths import sha256_file


@pytest.fixture(scope="module")
def made(tmp_path_factory, digits_export):
    root = tmp_path_factory.mktemp("untrusted")
    copy_export(digits_export, root / "model")
    return root / "model"


@pytest.fixture
def folder(made, tmp_path):
    shutil.copytree(made, tmp_path / "m", ignore=shutil.ignore_patterns(LOCK_NAME))
    (tmp_path / "outside.onnx").write_bytes(b"not yours")
    return tmp_path / "m"


def _edit_manifest(folder, edit):
    data = json.loads((folder / "manifest.json").read_text())
    edit(data)
    (folder / "manifest.json").write_text(json.dumps(data))


def _outside_untouched(folder):
    assert (folder.parent / "outside.onnx").read_bytes() == b"not yours"


@pytest.mark.parametrize("name", ["../outside.onnx", "/etc/hostname", "sub/model.onnx", "..", ""])
def test_a_manifest_that_names_a_file_outside_is_refused(folder, name):
    _edit_manifest(folder, lambda d: d.update(onnx=name))
    for args in (["info", str(folder)], ["quantize", str(folder), "--fp16"], ["bench", str(folder), "--no-prepare"]):
        r = CliRunner().invoke(cli, args)
        fails_cleanly(r, "not a plain file name inside the model folder")
        assert r.exit_code == 2, (args, r.output)
    _outside_untouched(folder)


def test_a_precision_record_that_names_a_file_outside_is_refused(folder):
    _edit_manifest(folder, lambda d: d.setdefault("precisions", {}).update(
        fp16={"file": "../outside.onnx", "source_sha256": d["onnx_sha256"]}))
    r = CliRunner().invoke(cli, ["info", str(folder)])
    fails_cleanly(r, "precisions.fp16.file")
    _outside_untouched(folder)


def test_a_link_out_of_the_folder_is_refused_before_it_is_read_or_written(folder):
    (folder / "model.fp16.onnx").symlink_to(folder.parent / "outside.onnx")
    for args in (["quantize", str(folder), "--fp16"], ["info", str(folder)]):
        r = CliRunner().invoke(cli, args)
        fails_cleanly(r, "outside the model folder")
        assert r.exit_code == 2
    _outside_untouched(folder)
    assert (folder / "model.fp16.onnx").is_symlink()  # left as it was: the user decides


def test_a_sidecar_that_names_a_file_outside_is_refused(folder):
    sidecar = folder / "model.fp16.plan.json"
    sidecar.write_text(json.dumps({"tensorrt": "10.13", "gpu": {"name": "GPU", "compute_capability": "9.0"},
                                   "precision": "fp16", "profile": {}, "plan_sha256": "0" * 64,
                                   "source_onnx": "../outside.onnx"}))
    with pytest.raises(VitexportError, match="'source_onnx'.*not a plain file name"):
        read_sidecar(sidecar)


@pytest.mark.parametrize("location", ["../weights.bin", "linked/weights.bin"])
def test_external_data_that_leaves_the_folder_is_refused_before_any_library_loads_it(folder, tmp_path, location):
    """Out by '..', or by a folder inside the model folder that links out of it (no '..' in the name)."""
    model = onnx.load(str(folder / "model.onnx"))
    staged = tmp_path / "staged"
    staged.mkdir()
    onnx.save(model, str(staged / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    shutil.move(staged / "weights.bin", tmp_path / "weights.bin")  # the weights now lie outside the folder
    (folder / "linked").symlink_to(tmp_path, target_is_directory=True)
    m = onnx.load(str(staged / "model.onnx"), load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = location
    onnx.save(m, str(folder / "model.onnx"))
    assert external_locations(folder / "model.onnx") == [location]
    _edit_manifest(folder, lambda d: d.update(onnx_sha256=sha256_file(folder / "model.onnx")))  # its digest too
    check = check_onnx(ModelFolder(folder), "fp32")
    assert check.status == BROKEN and "outside its folder" in check.reason
    r = CliRunner().invoke(cli, ["bench", str(folder), "--no-prepare", "--strict", "--backend", "onnxruntime cpu fp32",
                                 "--batch", "1", "--iterations", "1", "--min-time", "0", "--warmup", "0"])
    assert r.exit_code == 1 and f"names external data '{location}' outside its folder" in r.output, r.output
    assert "onnxruntime cpu fp32: not run" in r.output  # listed, never loaded
    assert (tmp_path / "weights.bin").is_file()  # nothing read, nothing moved


@pytest.mark.parametrize("ref", ["hf-hub:../x", "hf-hub:a/..", "hf-hub:a/b@../../etc", "hf-hub:a/b--c",
                                 "hf-hub:a/b@/abs", "hf-hub:a/b@x//y"])
def test_hub_references_are_checked_before_any_path_is_built(ref):
    with pytest.raises(VitexportError, match="is not a hub checkpoint"):
        parse_ref(ref)
    r = CliRunner().invoke(cli, ["onnx", "-c", ref, "-q"], env={"HF_HUB_OFFLINE": "1"})
    fails_cleanly(r, "is not a hub checkpoint")


def test_good_hub_references_still_parse():
    assert parse_ref("hf-hub:timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k").repo_id.startswith("timm/")
    assert parse_ref("hf-hub:google/vit-base-patch16-224@refs/pr/1").revision == "refs/pr/1"
