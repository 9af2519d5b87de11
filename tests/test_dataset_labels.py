"""Labels as data sets come: class folders named by index, WordNet synset or class name, subsets of the head's
classes, flat folders with a label file (CSV/TSV, LOC_val_solution.csv, ImageNet-ReaL's real.json). Each
accuracy the bench reports is checked against one computed here from ONNX Runtime's own outputs."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from conftest import copy_export, fails_cleanly
from vitexport.artifacts.folder import ModelFolder
from vitexport.artifacts.manifest import LabelsRecord
from vitexport.cli import cli
from vitexport.data.images import load_image
from vitexport.data.labelfile import read_label_file
from vitexport.errors import VitexportError
from vitexport.model.labels import imagenet_synsets
from vitexport.validate.labels import map_classes

ROOT = Path(__file__).resolve().parents[1]
HELDOUT = ROOT / "calibration" / "digits" / "heldout"
WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
FAST = ["--backend", "onnxruntime cpu fp32", "--no-prepare", "--batch", "8", "--iterations", "1", "--min-time", "0",
        "--warmup", "0", "-q"]


def bench_json(folder: Path, tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "report.json"
    r = CliRunner().invoke(cli, ["bench", str(folder), *args, *FAST, "--json", str(out)])
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text())


def row(report: dict, name: str = "onnxruntime cpu fp32") -> dict:
    return next(r for r in report["results"] if r["name"] == name)["parity"]


@pytest.fixture(scope="module")
def digits(digits_export, tmp_path_factory):
    """The digits model, its class names set to words (as a checkpoint's id2label gives them), and ONNX Runtime's
    logits of every held-out digit: {path: logits}."""
    folder = ModelFolder(copy_export(digits_export, tmp_path_factory.mktemp("dl") / "digits"))
    manifest = folder.read_manifest()
    folder.write_manifest(replace(manifest, labels=LabelsRecord("checkpoint", WORDS)))
    sess = ort.InferenceSession(str(folder.onnx("fp32")), providers=["CPUExecutionProvider"])
    files = sorted(HELDOUT.glob("*/*.png"))
    x = np.stack([load_image(f, manifest.preprocess) for f in files])
    logits = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    return folder.path, dict(zip(files, logits))


def _copy(files: list[Path], dst: Path, folder_of) -> None:
    for f in files:
        d = dst / folder_of(f)
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, d / f"{f.parent.name}_{f.name}")


def test_folders_named_by_class_name_give_the_accuracy_computed_here(digits, tmp_path):
    model, logits = digits
    _copy(list(logits), tmp_path / "set", lambda f: WORDS[int(f.parent.name)].upper())  # case is ignored
    st = row(bench_json(model, tmp_path, "--data", str(tmp_path / "set")))
    right = [int(v.argmax()) == int(f.parent.name) for f, v in logits.items()]
    assert st["n"] == len(right) == 360
    assert st["acc"] == pytest.approx(np.mean(right), abs=1e-12)


def test_a_subset_of_classes_gives_accuracy_and_accuracy_over_the_classes_present(digits, tmp_path):
    model, logits = digits
    present = [3, 5, 8]
    chosen = [f for f in logits if int(f.parent.name) in present]
    _copy(chosen, tmp_path / "set", lambda f: f.parent.name)
    report = bench_json(model, tmp_path, "--data", str(tmp_path / "set"))
    st = row(report)
    y = np.array([int(f.parent.name) for f in chosen])
    v = np.stack([logits[f] for f in chosen])
    assert st["n"] == len(chosen)
    assert st["acc"] == pytest.approx(np.mean(v.argmax(1) == y), abs=1e-12)
    restricted = np.array(present)[v[:, present].argmax(1)]
    assert st["acc_subset"] == pytest.approx(np.mean(restricted == y), abs=1e-12)
    assert st["subset_classes"] == 3 and report["data"]["labels"]["present"] == 3


def _flat(logits: dict, dst: Path, ext: bool) -> list[tuple[str, int]]:
    dst.mkdir()
    rows = []
    for f in logits:
        name = f"{f.parent.name}_{f.name}"
        shutil.copy(f, dst / name)
        rows.append((name if ext else Path(name).stem, int(f.parent.name)))
    return rows


@pytest.mark.parametrize("form", ["csv", "tsv", "loc", "names", "spaces"])
def test_a_flat_folder_with_each_label_file_form(digits, tmp_path, form):
    model, logits = digits
    rows = _flat(logits, tmp_path / "flat", ext=form in ("tsv", "spaces"))
    drop = set(range(0, len(rows), 7))  # every 7th file has no label: left out and counted
    kept = [r for i, r in enumerate(rows) if i not in drop]
    text = {"csv": "filename,label\n" + "".join(f"{n},{c}\n" for n, c in kept),
            "tsv": "".join(f"{n}\t{c}\n" for n, c in kept),
            "loc": "ImageId,PredictionString\n" + "".join(f"{n},{c} 1 2 30 40 {c} 3 4 20 20\n" for n, c in kept),
            "names": "".join(f"{n},{WORDS[c]}\n" for n, c in kept),
            "spaces": "".join(f"{n} {c}\n" for n, c in kept)}[form]
    (tmp_path / "labels.txt").write_text(text)
    report = bench_json(model, tmp_path, "--data", str(tmp_path / "flat"), "--labels", str(tmp_path / "labels.txt"))
    st = row(report)
    files = list(logits)
    right = [int(logits[files[i]].argmax()) == c for i, (_, c) in enumerate(rows) if i not in drop]
    assert st["n"] == len(kept) and st["acc"] == pytest.approx(np.mean(right), abs=1e-12)
    assert report["data"]["skipped"]["count"] == len(drop)
    assert set(report["data"]["skipped"]["kinds"]) == {"not in the label file"}
    assert report["data"]["labels"]["how"] == ("class name" if form == "names" else "class index")


def test_a_label_file_that_names_no_image_is_one_sentence(digits, tmp_path):
    model, logits = digits
    _flat(logits, tmp_path / "flat", ext=False)
    (tmp_path / "labels.csv").write_text("cat001,3\ncat002,4\n")
    r = CliRunner().invoke(cli, ["bench", str(model), "--data", str(tmp_path / "flat"), "--labels",
                                 str(tmp_path / "labels.csv"), *FAST])
    assert r.exit_code == 2
    fails_cleanly(r, "names none of the 360 images")


def test_a_class_of_no_model_class_is_skipped_and_named(digits, tmp_path):
    model, logits = digits
    _copy(list(logits), tmp_path / "set", lambda f: f.parent.name)
    extra = tmp_path / "set" / "eleven"
    extra.mkdir()
    shutil.copy(next(iter(logits)), extra / "x.png")
    report = bench_json(model, tmp_path, "--data", str(tmp_path / "set"))
    assert row(report)["n"] == 360
    entries = report["data"]["skipped"]["files"]
    assert len(entries) == 1 and entries[0]["kind"] == "class of no model class" and "eleven" in entries[0]["why"]


@pytest.mark.parametrize("text,why", [("", "is empty"), ("a,1\na,2\n", "two labels"), ("a\n", "is not 'file,label'"),
                                      ("file,label\n", "no labels")])
def test_bad_label_files_are_one_sentence(tmp_path, text, why):
    p = tmp_path / "labels.csv"
    p.write_text(text)
    with pytest.raises(VitexportError, match=why):
        read_label_file(p)


def test_real_json_must_be_lists_of_class_indices(tmp_path):
    p = tmp_path / "real.json"
    p.write_text('{"a": 1}')
    with pytest.raises(VitexportError, match="not ImageNet-ReaL"):
        read_label_file(p)
    p.write_text("[[1, 2], [], [3]]")
    assert read_label_file(p).real == {"ILSVRC2012_val_00000001": [1, 2], "ILSVRC2012_val_00000002": [],
                                       "ILSVRC2012_val_00000003": [3]}


def test_names_two_classes_share_map_to_neither():
    names = ["crane", "crane", "tench, Tinca tinca"]
    m = map_classes(["crane", "Tinca_tinca", "tench"], 3, names)
    assert m.how == "class name" and m.index.tolist() == [-1, 2, 2]


# -- a 1000-class model: WordNet synsets, LOC_val_solution.csv, real.json ---------------------------------------

@pytest.fixture(scope="module")
def imagenet_like(tiny_default, tmp_path_factory):
    """The tiny 1000-class model, 24 photos-like images, and ONNX Runtime's top-1 of each."""
    from PIL import Image

    folder = ModelFolder(copy_export(tiny_default / "models" / "vit_tiny_patch16_224-32x32",
                                     tmp_path_factory.mktemp("in") / "tiny"))
    pp = folder.read_manifest().preprocess
    src = tmp_path_factory.mktemp("imgs")
    rng = np.random.default_rng(0)
    files = []
    for i in range(24):
        a = (rng.random((40, 40, 3)) * 255 * (0.2 + 0.8 * (i % 4) / 3)).astype(np.uint8)
        f = src / f"ILSVRC2012_val_{i + 1:08d}.JPEG"
        Image.fromarray(a).save(f, format="PNG")
        files.append(f)
    sess = ort.InferenceSession(str(folder.onnx("fp32")), providers=["CPUExecutionProvider"])
    x = np.stack([load_image(f, pp) for f in files])
    top1 = sess.run(None, {sess.get_inputs()[0].name: x})[0].argmax(1)
    return folder.path, files, top1


def test_synset_folders_of_a_subset_of_imagenet_give_the_accuracy_built_in(imagenet_like, tmp_path):
    """Images filed under the synset the model predicts (right) or the next class's (wrong): accuracy known."""
    model, files, top1 = imagenet_like
    synsets = imagenet_synsets()
    filed_right = np.arange(len(files)) % 3 != 0
    for f, p, ok in zip(files, top1, filed_right):
        d = tmp_path / "set" / synsets[p if ok else (p + 1) % 1000]
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, d / f.name)
    report = bench_json(model, tmp_path, "--data", str(tmp_path / "set"))
    st = row(report)
    assert report["data"]["labels"]["how"] == "WordNet synset"
    assert st["n"] == len(files) and st["acc"] == pytest.approx(filed_right.mean(), abs=1e-12)
    assert report["data"]["labels"]["present"] < 1000 and st["subset_classes"] == report["data"]["labels"]["present"]


def test_loc_val_solution_and_real_json_on_a_flat_folder(imagenet_like, tmp_path):
    model, files, top1 = imagenet_like
    synsets = imagenet_synsets()
    flat = tmp_path / "val"
    flat.mkdir()
    for f in files:
        shutil.copy(f, flat / f.name)
    right = np.arange(len(files)) % 4 != 1
    loc = ["ImageId,PredictionString"] + [
        f"{f.stem},{synsets[p if ok else (p + 7) % 1000]} 10 10 200 200" for f, p, ok in zip(files, top1, right)]
    (tmp_path / "LOC_val_solution.csv").write_text("\n".join(loc) + "\n")
    # ReaL: image i has the top-1 among its labels when i % 3 == 0, another class otherwise, none when i % 5 == 4
    real = [[] if i % 5 == 4 else ([int(p), 999 - int(p)] if i % 3 == 0 else [(int(p) + 1) % 1000])
            for i, p in enumerate(top1)]
    (tmp_path / "real.json").write_text(json.dumps(real))
    report = bench_json(model, tmp_path, "--data", str(flat), "--labels", str(tmp_path / "LOC_val_solution.csv"),
                        "--labels", str(tmp_path / "real.json"))
    st = row(report)
    assert st["acc"] == pytest.approx(right.mean(), abs=1e-12)
    with_real = [i for i in range(len(files)) if i % 5 != 4]
    assert st["real_n"] == len(with_real)
    assert st["real_acc"] == pytest.approx(np.mean([i % 3 == 0 for i in with_real]), abs=1e-12)
    assert report["data"]["labels"]["real"] is True
