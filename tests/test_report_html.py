"""`bench --html` and `quantize --html`: one self-contained page, rendered in a real browser (Debian's chromium,
tests/browser.py). The page is asserted on as the browser built it: its rows are the JSON's, every picture loaded,
the charts drawn, nothing logged to the console and nothing fetched; the images it shows as flipped are the ones
ONNX Runtime's own outputs flip. The images kept for a page are the worst ones and bounded, checked against numpy.
"""

import json

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from conftest import copy_export

from browser import open_page
from vitexport.benchmark.chart import PRECISION_COLOURS
from vitexport.benchmark.latency import SAMPLES, kept_samples
from vitexport.cli import cli
from vitexport.data.images import load_image
from vitexport.data.preprocess import Preprocess
from vitexport.parity.accumulate import ParityAccumulator
from vitexport.parity.examples import MAX_FLIPS, softmax


@pytest.fixture(scope="module")
def missing_int8(digits_export, tmp_path_factory):
    """The digits model with an INT8 graph made to miss: calibrated on noise far narrower than its inputs, so its
    activations clip (a real miss, not a moved bound)."""
    tmp = tmp_path_factory.mktemp("html")
    folder = copy_export(digits_export, tmp / "digits")
    noise = tmp / "noise.npy"
    np.save(noise, (np.random.default_rng(0).standard_normal((16, 3, 32, 32)) * 0.5).astype(np.float32))
    r = CliRunner().invoke(cli, ["quantize", str(folder), "--int8", "--calib-data", str(noise), "--no-check", "-q"])
    assert r.exit_code == 0, r.output
    return folder


def _bench(folder, out, *extra):
    r = CliRunner().invoke(cli, ["bench", str(folder), "--no-prepare", "--backend", "cpu int8", "--iterations", "3",
                                 "--min-time", "0", "--json", str(out / "r.json"), "--html", str(out / "r.html"),
                                 "-q", *extra])
    return r, json.loads((out / "r.json").read_text())


def _top1(path, pp, session):
    x = load_image(path, pp)[None]
    return session.run(None, {session.get_inputs()[0].name: x})[0][0]


def test_the_page_of_a_missing_int8_row_shows_its_flipped_images_in_a_real_browser(missing_int8, tmp_path):
    from vitexport.benchmark.html import render

    r, d = _bench(missing_int8, tmp_path, "--strict")
    assert r.exit_code == 1, r.output  # the INT8 row misses
    assert render(d) == (tmp_path / "r.html").read_text()  # one source: the page is the JSON's data, rendered
    with open_page(tmp_path / "r.html", tmp_path / "page.png") as page:
        assert page.messages == [] and page.requests == []  # no console message, nothing fetched
        assert (tmp_path / "page.png").stat().st_size > 50_000
        images = page.images()
        assert images and all(i["complete"] and i["width"] > 0 and i["scheme"] == "data" for i in images), images
        # the rows: one per available backend and timed batch, as the JSON has them
        rows = [(res["name"], lat.get("batch")) for res in d["results"] if res["available"]
                for lat in res["latency"] or [{}]]
        assert page.count("#rows tbody tr") == len(rows)
        assert page.texts("#rows tbody tr td:first-child") == [name for name, _ in rows]
        assert page.texts("#verdict") == ["FAIL"]
        passing = [(lat["throughput"], res["name"]) for res in d["results"] if res["available"]
                   and res["parity"]["status"] == "pass" for lat in res["latency"] if lat["batch"] == 8]
        assert f"batch 8 {max(passing)[1]} (" in page.texts("#fastest")[0]
        int8 = next(res for res in d["results"] if res["name"] == "onnxruntime cpu int8")
        assert int8["parity"]["status"] == "fail" and int8["parity"]["disagree"] > 0
        # the charts are drawn: a point per timed row and batch, in its precision's colour; a line of runs each
        timed = [(res["precision"], lat) for res in d["results"] if res["available"] for lat in res["latency"]]
        assert page.count("#pareto g.point") == len(timed)
        fills = page.page.eval_on_selector_all("#pareto g.point > :not(title)",
                                               "els => els.map(e => e.getAttribute('fill'))")
        assert sorted(fills) == sorted(PRECISION_COLOURS[p] for p, _ in timed)
        assert page.count("#latency g.dist") == len(timed)
        box = page.page.eval_on_selector("#pareto", "e => e.getBoundingClientRect().width")
        assert box > 500
        # the flipped images: the worst first, at most MAX_FLIPS, each one ONNX Runtime flips too
        heading = [t for t in page.texts("h3") if t.startswith("onnxruntime cpu int8:")]
        assert heading and f"on {int8['parity']['disagree']:,} images" in heading[0]
        shown = int8["examples"]
        assert len(shown) == min(MAX_FLIPS, int8["parity"]["disagree"])
        assert [e["score"] for e in shown] == sorted((e["score"] for e in shown), reverse=True)
        pp = Preprocess.from_dict(json.loads((missing_int8 / "manifest.json").read_text())["preprocess"])
        fp32 = ort.InferenceSession(str(missing_int8 / "model.onnx"), providers=["CPUExecutionProvider"])
        int8_session = ort.InferenceSession(str(missing_int8 / "model.int8.onnx"), providers=["CPUExecutionProvider"])
        source = d["data"]["source"]
        for e in shown:
            path = f"{source}/{d['pictures'][str(e['index'])]['file']}"
            ref, out = _top1(path, pp, fp32), _top1(path, pp, int8_session)
            assert ref.argmax() != out.argmax(), path
            assert [c for c, *_ in e["reference"]] == list(np.argsort(-ref)[:3])
            assert abs(e["reference"][0][1] - softmax(ref)[ref.argmax()]) < 1e-3
        cards = page.page.eval_on_selector_all("h3 + .cards", "els => els.map(e => e.children.length)")
        assert len(shown) in cards
        # sortable: a click on img/s orders the rows by it
        page.page.click("#rows th:nth-child(8)")
        values = [float(v) for v in page.page.eval_on_selector_all(
            "#rows tbody tr td:nth-child(8)", "els => els.map(e => e.getAttribute('data-v')).filter(v => v !== null)")]
        assert values == sorted(values) and len(values) == len(timed)


def test_names_from_the_users_files_are_text_on_the_page_never_markup(missing_int8, tmp_path):
    """A data set's file names and a folder's path are the user's input: escaped wherever the page shows them."""
    from vitexport.benchmark.html import render

    _, d = _bench(missing_int8, tmp_path)
    evil = '"><img src=x onerror=alert(1)><script>alert(2)</script>'
    d["model"]["folder"] = evil
    for pic in d["pictures"].values():
        pic["file"] = evil
    page = render(d)
    assert d["pictures"] and "<script>alert" not in page and "<img src=x" not in page
    assert page.count("&lt;script&gt;alert(2)&lt;/script&gt;") > len(d["pictures"])


def test_quantize_writes_the_page_of_the_graph_its_check_rejected_and_of_one_it_kept(missing_int8, tmp_path):
    """A check that fails: the page of the rejected graph, its flips shown; one that passes: the page of the graph
    written, with what it was made with (its record)."""
    folder = copy_export(missing_int8, tmp_path / "digits")
    pages = {}
    for name, scale in (("rejected", 0.1), ("kept", 0.5)):
        noise = tmp_path / f"noise-{name}.npy"
        np.save(noise, (np.random.default_rng(1).standard_normal((16, 3, 32, 32)) * scale).astype(np.float32))
        r = CliRunner().invoke(cli, ["quantize", str(folder), "--int8", "--calib-data", str(noise),
                                     "--html", str(tmp_path / f"{name}.html"), "-q"])
        assert r.exit_code == (1 if name == "rejected" else 0), r.output
        with open_page(tmp_path / f"{name}.html", tmp_path / f"{name}.png") as page:
            assert page.messages == [] and page.requests == []
            assert all(i["width"] > 0 for i in page.images())
            pages[name] = {"rows": page.texts("#rows tbody tr td:first-child"), "h3": page.texts("h3"),
                           "verdict": page.texts("#verdict"), "cards": page.count(".card img"),
                           "charts": page.count("svg.chart"),  # parity only: no empty charts
                           "facts": dict(zip(page.texts("table.facts td:first-child"),
                                             page.texts("table.facts td:nth-child(2)")))}
    rejected, kept = pages["rejected"], pages["kept"]
    assert rejected["rows"] == ["pytorch cpu fp32", "onnxruntime cpu int8 (rejected)"]
    assert any(t.startswith("onnxruntime cpu int8 (rejected): top-1 differs") for t in rejected["h3"])
    assert rejected["verdict"] == ["FAIL"] and rejected["cards"] > 0
    assert kept["rows"] == ["pytorch cpu fp32", "onnxruntime cpu int8"] and kept["charts"] == rejected["charts"] == 0
    assert str(tmp_path / "noise-kept.npy") in kept["facts"]["int8 made with"]  # what the graph was made with


def test_quantize_html_refuses_what_it_cannot_show(digits_export):
    r = CliRunner().invoke(cli, ["quantize", str(digits_export), "--fp16", "--target", "tensorrt", "--html", "x.html"])
    assert r.exit_code == 2 and "TensorRT" in r.output and "Traceback" not in r.output


def test_the_flips_kept_are_the_worst_ones_and_bounded():
    """Against numpy on 500 images in batches: the flipped images, scored by the probability the row took off the
    reference's answer, the MAX_FLIPS highest, worst first, with both top-3s."""
    rng = np.random.default_rng(3)
    ref = rng.standard_normal((500, 10)) * 3
    out = ref + rng.standard_normal((500, 10)) * 1.5
    acc = ParityAccumulator(500)
    for s in range(0, 500, 64):
        acc.update(s, ref[s:s + 64], out[s:s + 64])
    kept = acc.examples()
    r1, o1 = ref.argmax(1), out.argmax(1)
    flipped = np.flatnonzero(r1 != o1)
    assert len(flipped) > MAX_FLIPS
    score = {i: softmax(ref[i])[r1[i]] - softmax(out[i])[r1[i]] for i in flipped}
    want = sorted(flipped, key=lambda i: -score[i])[:MAX_FLIPS]
    assert [e["index"] for e in kept] == want
    for e in kept:
        i = e["index"]
        assert [c for c, _ in e["output"]] == list(np.argsort(-out[i])[:3])
        assert e["output"][0][1] == pytest.approx(softmax(out[i]).max())


def test_a_latency_keeps_its_runs_up_to_a_bound_then_their_quantiles():
    few = list(np.random.default_rng(0).random(50))
    assert kept_samples(few) == pytest.approx(few, abs=1e-4)
    many = list(np.random.default_rng(0).random(5000) * 10)
    kept = kept_samples(many)
    assert len(kept) == SAMPLES
    assert kept[0] == pytest.approx(min(many), abs=1e-4) and kept[-1] == pytest.approx(max(many), abs=1e-4)
    assert np.median(kept) == pytest.approx(np.median(many), rel=0.02)


def test_the_png_plot_has_a_colour_per_precision_a_marker_per_backend_and_names_its_front(missing_int8, tmp_path,
                                                                                         monkeypatch):
    """--plot's PNG, drawn from a real bench's JSON: each point in its precision's colour and its backend's marker,
    the legend outside the axes, and the points named those no other point beats on both axes (brute force here)."""
    import matplotlib
    from matplotlib.colors import to_hex

    import vitexport.benchmark.plot as plot_module
    from vitexport.benchmark.chart import MARKERS, points

    matplotlib.use("Agg")
    _, d = _bench(missing_int8, tmp_path)
    figures = []
    monkeypatch.setattr(plot_module, "save_png", lambda fig, path: figures.append(fig))
    plot_module.plot(d, tmp_path / "p.png")
    (fig,) = figures
    ax = fig.axes[0]
    drawn = [c.lines[0] for c in ax.containers]
    by_row = {res["name"]: res for res in d["results"]}
    pts = points(d)
    assert len(drawn) == len(pts) > 3
    for line, p in zip(drawn, pts):
        res = by_row[p.label.rsplit(" b", 1)[0]]
        assert to_hex(line.get_color()) == PRECISION_COLOURS[res["precision"]].lower()
        assert line.get_marker() == MARKERS[res["backend"]]
    front = {p.label for p in pts if not any(q.x >= p.x and q.y >= p.y and (q.x > p.x or q.y > p.y) for q in pts)}
    assert {t.get_text() for t in ax.texts} == front
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1  # beside the points, not on them
