"""Embedding models judged by what embeddings are for: the bench's k-NN top-1 and nearest-neighbour agreement,
checked against a k-NN computed here with numpy on ONNX Runtime's own embeddings (all pairs at once: the oracle
holds the whole similarity matrix the product never does)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from vitexport.cli import cli
from vitexport.data.images import load_image
from vitexport.parity.compare import ParityStats, Thresholds
from vitexport.parity.knn import neighbour_changes, neighbours

ROOT = Path(__file__).resolve().parents[1]
HELDOUT = ROOT / "calibration" / "digits" / "heldout"
FAST = ["--no-prepare", "--batch", "8", "--iterations", "1", "--min-time", "0", "--warmup", "0", "-q"]


def oracle_knn(emb: np.ndarray, labels: np.ndarray, k: int = 20, t: float = 0.07) -> tuple[np.ndarray, np.ndarray]:
    """DINO's weighted k-NN, leave-one-out, written from its description: (predicted class, nearest other image)."""
    u = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    sim = u @ u.T
    np.fill_diagonal(sim, -np.inf)
    idx = np.argsort(-sim, axis=1, kind="stable")[:, :k]
    weights = np.exp(np.take_along_axis(sim, idx, 1) / t)
    votes = np.zeros((len(emb), labels.max() + 1))
    for i in range(len(emb)):
        for j, w in zip(idx[i], weights[i]):
            votes[i, labels[j]] += w
    return votes.argmax(1), sim.argmax(1)


@pytest.fixture(scope="module")
def headless(tmp_path_factory):
    """The digits model without its head (`--num-classes 0`), with its INT8 graph."""
    out = tmp_path_factory.mktemp("emb") / "digits0"
    r = CliRunner().invoke(cli, ["onnx", "-m", "vit_digits_patch4_32", "--num-classes", "0", "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["quantize", str(out), "--int8", "--target", "cpu", "--no-check", "-q"])
    assert r.exit_code == 0, r.output
    return out


def _embeddings(onnx: Path, files: list[Path], pp) -> np.ndarray:
    sess = ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    x = np.stack([load_image(f, pp) for f in files])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def test_knn_accuracy_of_each_row_is_the_one_computed_here(headless, tmp_path):
    from vitexport.artifacts.folder import ModelFolder

    out = tmp_path / "report.json"
    r = CliRunner().invoke(cli, ["bench", str(headless), "--data", str(HELDOUT), "--backend", "onnxruntime cpu",
                                 *FAST, "--json", str(out), "--html", str(tmp_path / "page.html")])
    assert r.exit_code == 0, r.output
    report = json.loads(out.read_text())
    rows = {x["name"]: x["parity"] for x in report["results"] if x["available"]}
    folder = ModelFolder(headless)
    pp = folder.read_manifest().preprocess
    files = sorted(HELDOUT.glob("*/*.png"))
    labels = np.array([int(f.parent.name) for f in files])
    ref_pred, ref_nn = oracle_knn(_embeddings(folder.onnx("fp32"), files, pp), labels)
    assert abs((ref_pred == labels).mean() - rows["pytorch cpu fp32"]["knn_acc"]) <= 0.005
    for name, kind in (("onnxruntime cpu fp32", "fp32"), ("onnxruntime cpu int8", "int8")):
        pred, nn = oracle_knn(_embeddings(folder.onnx(kind), files, pp), labels)
        st = rows[name]
        assert abs((pred == labels).mean() - st["knn_acc"]) <= 0.005, name
        assert abs((nn == ref_nn).mean() - st["neighbour_agree"]) <= 0.01, name
        assert st["knn_acc_ci"][0] <= st["knn_acc"] <= st["knn_acc_ci"][1]
        assert st["knn_drop_ci"][0] <= st["knn_drop"] <= st["knn_drop_ci"][1]
        assert "top1_agree" not in st and st["knn_k"] == 20 and st["knn_t"] == 0.07
    assert rows["onnxruntime cpu int8"]["neighbour_agree"] < 1.0  # INT8 moves some neighbours: the figure can tell
    assert report["data"]["embeddings"] == {"k": 20, "t": 0.07, "labelled": True}
    # the page shows the images whose neighbour moved, with both neighbours: those the oracle finds moved
    _, int8_nn = oracle_knn(_embeddings(folder.onnx("int8"), files, pp), labels)
    shown = next(x for x in report["results"] if x["name"] == "onnxruntime cpu int8")["examples"]
    moved = [e for e in shown if int8_nn[e["index"]] != ref_nn[e["index"]]]
    assert shown and len(moved) >= 0.8 * len(shown)  # PyTorch's reference and ONNX Runtime's FP32 differ by ties
    assert all(int8_nn[e["index"]] == e["output_neighbour"] for e in moved)
    from browser import open_page

    with open_page(tmp_path / "page.html", tmp_path / "page.png") as page:
        assert page.messages == [] and page.requests == []
        section = 'section[data-row="onnxruntime cpu int8"]'
        assert page.count(f"{section} .card") == len(shown)
        assert page.count(f"{section} .card img") == 3 * len(shown)
        assert all(i["complete"] and i["width"] > 0 for i in page.images())


def test_an_unlabelled_set_gives_neighbour_agreement_alone_and_k_is_settable(headless, tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    for f in sorted(HELDOUT.glob("*/*.png"))[::3]:
        shutil.copy(f, flat / f"{f.parent.name}_{f.name}")
    out = tmp_path / "report.json"
    r = CliRunner().invoke(cli, ["bench", str(headless), "--data", str(flat), "--backend", "onnxruntime cpu int8",
                                 "--knn-k", "5", *FAST, "--json", str(out)])
    assert r.exit_code == 0, r.output
    st = next(x for x in json.loads(out.read_text())["results"] if x["name"] == "onnxruntime cpu int8")["parity"]
    assert "knn_acc" not in st and 0 < st["neighbour_agree"] <= 1 and st["knn_k"] == 5


def test_blocked_neighbours_equal_all_pairs_at_once():
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 6, 700)
    emb = rng.normal(size=(700, 24)) + 1.5 * np.eye(24)[labels]
    pred, nn = oracle_knn(emb, labels, k=7, t=0.1)
    nb = neighbours(lambda s, c: emb[s:s + c], 700, labels, k=7, t=0.1, query_block=128, key_block=150)
    assert (nb.pred == pred).all() and (nb.nearest == nn).all()


def test_the_page_lists_the_images_whose_nearest_neighbour_changed_as_the_oracle_finds_them():
    """Embeddings perturbed: the images the report shows (the first 12 whose nearest other image moved) are the ones
    the all-pairs oracle finds, with both neighbours."""
    rng = np.random.default_rng(5)
    emb = rng.normal(size=(300, 16))
    moved = emb + rng.normal(size=emb.shape) * 0.3
    _, nn_ref = oracle_knn(emb, np.zeros(300, int), k=3)
    _, nn_out = oracle_knn(moved, np.zeros(300, int), k=3)
    read = (lambda e: lambda s, c: e[s:s + c])
    shown = neighbour_changes(neighbours(read(emb), 300, None, k=3), neighbours(read(moved), 300, None, k=3))
    changed = np.flatnonzero(nn_ref != nn_out)
    assert len(changed) > 12
    assert [(e["index"], e["reference_neighbour"], e["output_neighbour"]) for e in shown] == \
        [(int(i), int(nn_ref[i]), int(nn_out[i])) for i in changed[:12]]


def _knn_stats(lo: float, hi: float) -> ParityStats:
    return ParityStats(n=1000, max_abs=0.1, mean_abs=0.01, cos_min=0.99, cos_mean=0.995, top1_agree=0.0,
                       top5_agree=0.0, knn_k=20, knn_t=0.07, knn_acc_ref=0.9, knn_acc=0.87, knn_drop=(lo + hi) / 2,
                       knn_drop_ci=[lo, hi], knn_flips_down=40, knn_flips_up=10, neighbour_agree=0.9)


def test_the_knn_drop_is_judged_like_accuracy_and_argmax_agreement_is_not():
    bound = Thresholds(acc_drop=1.5, top1_agree=0.99)
    assert not bound.check(_knn_stats(-0.5, 1.0))  # within: passes, though "top-1 agreement" would be 0 %
    fails, undecided = bound.assess(_knn_stats(2.0, 4.0))
    assert fails and "k-NN" in fails[0] and not undecided
    fails, undecided = bound.assess(_knn_stats(0.5, 2.5))
    assert not fails and "k-NN top-1 drop" in undecided[0]


def test_predict_writes_a_headless_models_embeddings_with_their_file_order(headless, tmp_path):
    from vitexport.artifacts.folder import ModelFolder

    folder = ModelFolder(headless)
    out = tmp_path / "emb.npy"
    r = CliRunner().invoke(cli, ["predict", str(headless), str(HELDOUT / "3"), str(HELDOUT / "7"), "--embeddings",
                                 str(out), "-q"])
    assert r.exit_code == 0, r.output
    files = [Path(line).resolve() for line in (tmp_path / "emb.files.txt").read_text().splitlines()]  # as given, or relative to here
    assert files == sorted(HELDOUT.glob("3/*.png")) + sorted(HELDOUT.glob("7/*.png"))
    got = np.load(out)
    want = _embeddings(folder.onnx("fp32"), files, folder.read_manifest().preprocess)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-5)
    lines = CliRunner().invoke(cli, ["predict", str(headless), str(HELDOUT / "3"), "--jsonl", "-q"]).output
    rows = [json.loads(x) for x in lines.splitlines() if x.startswith("{")]
    np.testing.assert_allclose(np.array([x["embedding"] for x in rows]), want[:len(rows)], atol=1e-5)


def test_predict_on_a_headless_model_without_an_output_asks_for_one(headless, tmp_path):
    from conftest import fails_cleanly

    r = CliRunner().invoke(cli, ["predict", str(headless), str(HELDOUT / "3")])
    assert r.exit_code != 0
    fails_cleanly(r, "--embeddings OUT.npy")


def test_predict_writes_the_pooled_output_of_a_classifier_exported_with_it(tmp_path):
    out = tmp_path / "m"
    r = CliRunner().invoke(cli, ["onnx", "-m", "vit_digits_patch4_32", "--outputs", "logits,pooled", "-o", str(out),
                                 "-q"])
    assert r.exit_code == 0, r.output
    files = sorted(HELDOUT.glob("5/*.png"))
    from vitexport.artifacts.folder import ModelFolder

    pp = ModelFolder(out).read_manifest().preprocess
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    want = sess.run(["pooled"], {"pixel_values": np.stack([load_image(f, pp) for f in files])})[0]
    for backend in ("onnxruntime", "pytorch"):
        r = CliRunner().invoke(cli, ["predict", str(out), str(HELDOUT / "5"), "--embeddings", str(tmp_path / "e.npy"),
                                     "--backend", backend, "-q"])
        assert r.exit_code == 0, r.output
        np.testing.assert_allclose(np.load(tmp_path / "e.npy"), want, atol=1e-4, err_msg=backend)
    r = CliRunner().invoke(cli, ["predict", str(out), str(HELDOUT / "5"), "--json", "-q"])  # classes, as ever
    assert r.exit_code == 0, r.output
    top = [p["top"][0]["label"] for p in json.loads(r.output)]
    assert len(top) == len(files) and top.count("5") > 0.9 * len(top)
