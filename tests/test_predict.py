"""`vitexport predict`: the labels of the held-out digits, the default model on a photo, backends agreeing, and
every bad input as one sentence."""

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import ROOT, fails_cleanly

from vitexport.artifacts.folder import ModelFolder
from vitexport.cli import cli
from vitexport.deploy.predict import top_classes
from vitexport.model.labels import class_names, imagenet_names, labels_record

HELDOUT = ROOT / "calibration" / "digits" / "heldout"
PHOTO = ROOT / "calibration" / "photos" / "holdout" / "flower.jpg"


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    """`vitexport predict -m vit_digits_patch4_32 --json calibration/digits/heldout` in an empty folder."""
    root = tmp_path_factory.mktemp("predict")
    old = os.getcwd()
    os.chdir(root)
    try:
        r = CliRunner().invoke(cli, ["predict", "-q", "-m", "vit_digits_patch4_32", "--json", str(HELDOUT)])
    finally:
        os.chdir(old)
    assert r.exit_code == 0, r.output
    return ModelFolder(root / "models" / "vit_digits_patch4_32-32x32"), json.loads(r.stdout)


def test_digits_are_named_right(digits_run):
    folder, preds = digits_run
    n_images = sum(1 for _ in HELDOUT.rglob("*.png"))
    assert len(preds) == n_images > 300
    right = [p["top"][0]["label"] == os.path.basename(os.path.dirname(p["image"])) for p in preds]
    assert np.mean(right) >= 0.90, np.mean(right)
    for p in preds:
        top = p["top"]
        assert len(top) == 5 and set(top[0]) == {"index", "label", "prob"}
        assert [t["label"] for t in top] == [str(t["index"]) for t in top]  # the digits' names are the digits
        probs = [t["prob"] for t in top]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
    assert folder.read_manifest().labels.source == "digits"


def test_backends_agree_on_the_digits(digits_run):
    folder, preds = digits_run
    images = [str(HELDOUT / d) for d in ("0", "4")]
    runs = {}
    for backend in ("onnxruntime", "pytorch"):
        r = CliRunner().invoke(cli, ["predict", "-q", str(folder.path), *images, "--backend", backend, "--json",
                                     "--top-k", "2"])
        assert r.exit_code == 0, r.output
        runs[backend] = json.loads(r.stdout)
    ort_probs = np.array([[t["prob"] for t in p["top"]] for p in runs["onnxruntime"]])
    pt_probs = np.array([[t["prob"] for t in p["top"]] for p in runs["pytorch"]])
    assert [p["top"][0]["index"] for p in runs["onnxruntime"]] == [p["top"][0]["index"] for p in runs["pytorch"]]
    assert np.abs(ort_probs - pt_probs).max() < 1e-4
    # the JSON's images are the ones the folders hold, in order
    assert [os.path.basename(p["image"]) for p in runs["pytorch"]][:3] == sorted(os.listdir(HELDOUT / "0"))[:3]


@pytest.mark.parametrize("precision,backend", [("int8", "onnxruntime"), ("fp16", "openvino")])
def test_a_precision_not_yet_made_is_made_then_run(digits_export, tmp_path, precision, backend):
    """--precision of a file the folder does not hold yet: it is made (under the folder's writer lock) and then
    read (under the reader's), and the answers are those of the file made, run by ONNX Runtime itself."""
    import onnxruntime as ort
    from conftest import copy_export

    from vitexport.data.images import load_folder

    folder = copy_export(digits_export, tmp_path / "m")
    r = CliRunner().invoke(cli, ["predict", "-q", str(folder), str(HELDOUT / "7"), "--precision", precision,
                                 "--backend", backend, "--json", "--top-k", "1"])
    assert r.exit_code == 0, r.output
    made = folder / f"model.{precision}.onnx"
    manifest = ModelFolder(folder).read_manifest()
    assert manifest.precisions[precision].file == made.name
    held = load_folder(HELDOUT / "7", manifest.preprocess)
    logits = ort.InferenceSession(str(made), providers=["CPUExecutionProvider"]).run(None, {"pixel_values": held.x})[0]
    got = [p["top"][0]["index"] for p in json.loads(r.stdout)]
    assert len(got) == len(held.x) > 20
    assert np.mean(np.array(got) == logits.argmax(1)) >= 0.95  # another runtime, the same file
    assert np.mean(np.array(got) == 7) >= 0.8  # and still the digits model


@pytest.mark.e2e
def test_default_model_on_a_photo_prints_a_table(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["predict", "-q", str(PHOTO), "--top-k", "3"])
    assert r.exit_code == 0, r.output
    assert "random weights" in r.stderr  # the default model's classes mean nothing, and it says so
    lines = r.stdout.strip().splitlines()
    assert lines[0].endswith("flower.jpg") and lines[1].split() == ["rank", "class", "label", "prob"]
    rows = [ln.split() for ln in lines[2:]]
    assert len(rows) == 3 and [int(r[0]) for r in rows] == [1, 2, 3]
    names = imagenet_names()
    for row in rows:  # the 1000-class head is named with ImageNet-1k's classes (long names shortened)
        label, name = " ".join(row[2:-1]), names[int(row[1])]
        assert label == name or (label.endswith("...") and name.startswith(label[:-3])), (label, name)
    probs = [float(r[-1]) for r in rows]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6


@pytest.mark.parametrize("args,needle", [
    (["--top-k", "0"], "--top-k must be at least 1"),
    (["NOT_AN_IMAGE"], "not an image"),
    (["MISSING"], "does not exist"),
    (["--backend", "pytorch", "--precision", "int8"], "PyTorch runs fp32"),
])
def test_bad_input_is_one_sentence(digits_run, tmp_path, args, needle):
    folder, _ = digits_run
    bad = tmp_path / "notes.png"
    bad.write_text("this is text, not a PNG")
    args = [{"NOT_AN_IMAGE": str(bad), "MISSING": str(tmp_path / "gone.png")}.get(a, a) for a in args]
    images = [] if any(a.startswith(str(tmp_path)) for a in args) else [str(HELDOUT / "1")]
    r = CliRunner().invoke(cli, ["predict", "-q", str(folder.path), *images, *args])
    fails_cleanly(r, needle)
    assert len(r.output.strip().splitlines()) == 1, r.output


def test_top_classes_softmax():
    logits = np.array([[0.0, 2.0, 1.0], [5.0, 5.0, -1.0]], dtype=np.float32)
    tops = top_classes(logits, 2, ["a", "b", "c"])
    assert [[c.index for c in t] for t in tops] == [[1, 2], [0, 1]]
    e = np.exp([0.0, 2.0, 1.0])
    assert abs(tops[0][0].prob - e[1] / e.sum()) < 1e-12 and tops[1][0].label == "a"


def test_label_sources():
    assert labels_record(1000, "vit_base_patch16_224").source == "imagenet-1k"
    assert labels_record(10, "vit_digits_patch4_32").source == "digits"
    assert labels_record(7, "vit_base_patch16_224").source == "indices"
    assert labels_record(3, "x", ["a", "b", "c"]).names == ["a", "b", "c"]
    assert labels_record(3, "x", ["a", "b"]).source == "indices"  # names of another head size are not these
    assert labels_record(0, "vit_huge_patch14_224") is None
    names = imagenet_names()
    assert len(names) == 1000 and names[0].startswith("tench") and names[999].startswith("toilet tissue")


def test_manifest_without_labels_names_by_default(digits_run):
    folder, _ = digits_run
    m = folder.read_manifest()
    m.labels = None  # an export made before the field existed
    assert class_names(m) == [str(i) for i in range(10)]
