"""`vitexport bench` on the labelled digits fixture, a corrupted INT8 model, the report files, and one contract
test that every backend passes through the same checks."""

import json
import math
import shutil

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from conftest import ROOT, copy_export, fails_cleanly
from onnx import numpy_helper
from scipy.stats import binomtest

from vitexport.artifacts.folder import ModelFolder
from vitexport.backends.base import Runner
from vitexport.benchmark.run import PREPARED_KINDS, discover
from vitexport.cli import cli
from vitexport.data.digits import cached_set
from vitexport.data.images import load_folder
from vitexport.ensure import ensure_artifact
from vitexport.environment import cpu_has_bf16
from vitexport.errors import BackendUnavailable
from vitexport.exporter.torch_model import model_from_manifest
from vitexport.parity.accumulate import compare
from vitexport.parity.compare import judge
from vitexport.paths import sha256_file
from vitexport.precision import CalibOptions

HELDOUT = ROOT / "calibration" / "digits" / "heldout"
CPU_BACKENDS = {"pytorch cpu fp32", "onnxruntime cpu fp32", "onnxruntime cpu fp16",
                "onnxruntime cpu int8", "openvino cpu fp32", "openvino cpu int8"} | \
    ({"pytorch cpu bf16"} if cpu_has_bf16() is not False else set())  # emulated bf16 is not run


@pytest.fixture(scope="module")
def digits(tmp_path_factory, digits_export):
    """The digits export with every graph a CPU bench prepares (the INT8-TRT one too: a test of a backend then runs
    it whichever test of this module ran first in the worker)."""
    out = tmp_path_factory.mktemp("bench") / "model"
    copy_export(digits_export, out)
    for prec in PREPARED_KINDS:
        ensure_artifact(out, prec, calib=CalibOptions(check=False))
    return out


@pytest.fixture(scope="module")
def report(digits, tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    r = CliRunner().invoke(cli, ["bench", str(digits), "--iterations", "2", "--min-time", "0", "--warmup", "1",
                                 "--json", str(out / "r.json"), "--markdown", str(out / "r.md"),
                                 "--csv", str(out / "r.csv"), "--plot", str(out / "r.png"), "-q", "--strict"])
    assert r.exit_code == 0, r.output
    return out, r.output


def _finite_numbers(obj, path="$"):
    if isinstance(obj, float):
        assert math.isfinite(obj), path
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _finite_numbers(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _finite_numbers(v, f"{path}[{i}]")


def test_digits_bench_reports_real_accuracy(digits, report):
    out, _ = report
    data = json.loads((out / "r.json").read_text())
    _finite_numbers(data)
    for key in ("environment", "model", "artifacts", "data", "reference", "thresholds", "options", "results", "passed"):
        assert key in data
    # without --data: the default set, generated from the held-out digits, large enough to decide every bound
    default_set = cached_set(HELDOUT)
    assert data["data"]["labelled"] and data["data"]["n_parity"] == len(list(default_set.rglob("*.png"))) == 2000
    assert "generated" in data["data"] and "360 held-out digits" in data["data"]["generated"]
    ran = {r["name"]: r for r in data["results"] if r["available"]}
    assert CPU_BACKENDS <= set(ran)
    for name, r in ran.items():  # the provider the row ran with, as loading settled it: OpenVINO's precision too
        if r["backend"] == "openvino":
            assert r["provider"].startswith(f"CPU plugin, {r['info']['inference_precision']} inference"), r
    # the reference accuracy, recomputed here from the real labels with a freshly rebuilt model
    manifest = ModelFolder(digits).read_manifest()
    ds = load_folder(default_set, manifest.preprocess)
    with torch.no_grad():
        acc = float((model_from_manifest(manifest)(torch.from_numpy(ds.x)).argmax(1).numpy() == ds.labels).mean())
    assert ran["pytorch cpu fp32"]["parity"]["acc"] == pytest.approx(acc, abs=1e-9)
    for name, r in ran.items():
        p = r["parity"]
        assert not p["failures"], (name, p["failures"])
        # 2,000 images decide every default bound: each row passes (--strict exited 0)
        assert p["status"] == "pass" and p["passed"] and not p["inconclusive"], (name, p["inconclusive"])
        assert 0.85 <= p["acc"] <= 0.92  # the generated digits are harder than the originals (98.89 %)
        n, right = p["n"], round(p["acc"] * p["n"])
        ci = binomtest(right, n).proportion_ci(0.95, method="exact")  # an independent computation of the interval
        assert p["acc_ci"] == pytest.approx([ci.low, ci.high], abs=1e-9)
        assert p["flips_down"] - p["flips_up"] == round((p["acc_ref"] - p["acc"]) * n)
        # every row is timed at both batches, but the TensorRT-shaped graph on the CPU (accuracy only)
        assert {lt["batch"] for lt in r["latency"]} == (set() if name.endswith("int8-trt") else {1, 8})
        for lt in r["latency"]:
            assert lt["iterations"] >= 2 and lt["mean_ms"] > 0 and lt["throughput"] > 0
            assert lt["p50_ms"] <= lt["p99_ms"]
    for r in data["results"]:
        if not r["available"]:
            assert r["reason"]
    assert data["passed"] is True
    assert data["artifacts"] and all(len(a["sha256"]) == 64 for a in data["artifacts"])


def test_markdown_and_csv(report):
    out, stdout = report
    md = (out / "r.md").read_text().splitlines()
    header = next(i for i, line in enumerate(md) if line.startswith("| backend"))
    ncols = md[header].count("|")
    assert set(md[header + 1].replace("|", "").replace("-", "").replace(":", "")) <= {""}
    body = [line for line in md[header + 2:] if line.startswith("|")]
    assert len(body) >= 2 * len(CPU_BACKENDS) and all(line.count("|") == ncols for line in body)
    csv_lines = (out / "r.csv").read_text().splitlines()
    assert csv_lines[0].startswith("backend,precision") and len(csv_lines) == len(body) + 1
    assert "unavailable" in stdout and "onnxruntime cpu int8" in stdout
    png = (out / "r.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_the_csv_and_markdown_cells_are_the_jsons_numbers(report):
    """Each file parsed back: every CSV row and Markdown row is a (backend, batch) of the JSON, with its numbers."""
    import csv

    out, _ = report
    data = json.loads((out / "r.json").read_text())
    want = {}
    for r in data["results"]:
        if r["available"]:
            for lat in r["latency"] or [None]:  # parity only (not timed): one row without latency
                want[(r["name"], lat and lat["batch"])] = (r, lat or {})
    assert sum(lat is not None for _, lat in want) > 5

    def batch(text):
        return int(text) if text.strip().isdigit() else None

    rows = list(csv.DictReader((out / "r.csv").read_text().splitlines()))
    assert {(row["backend"], batch(row["batch"])) for row in rows} == set(want)
    for row in rows:
        r, lat = want[(row["backend"], batch(row["batch"]))]
        for col, value in (("mean_ms", lat.get("mean_ms")), ("p50_ms", lat.get("p50_ms")),
                           ("p99_ms", lat.get("p99_ms")), ("throughput", lat.get("throughput")),
                           ("max_abs", r["parity"]["max_abs"]), ("cos_min", r["parity"]["cos_min"]),
                           ("top1_agree", r["parity"]["top1_agree"])):
            if value is None:
                assert row[col] == "", (row["backend"], col)
            else:
                assert float(row[col]) == pytest.approx(value, rel=1e-9), (row["backend"], col)
        assert row["precision"] == r["precision"] and row["device"] == r["device"]
        assert row["parity"] == {"pass": "pass", "fail": "FAIL", "inconclusive": "inconclusive"}[r["parity"]["status"]]
    md = (out / "r.md").read_text().splitlines()
    header = next(i for i, line in enumerate(md) if line.startswith("| backend"))
    names = [c.strip() for c in md[header].strip("|").split("|")]
    seen = set()
    for line in md[header + 2:]:
        if not line.startswith("|"):
            break
        cell = dict(zip(names, (c.strip() for c in line.strip("|").split("|"))))
        key = (cell["backend"], batch(cell["batch"]))
        r, lat = want[key]
        seen.add(key)
        if lat:
            assert cell["mean ms"] == f"{lat['mean_ms']:.2f}" and cell["img/s"] == f"{lat['throughput']:.1f}"
        assert cell["cos min"] == f"{r['parity']['cos_min']:.5f}"
        lo, hi = r["parity"]["top1_agree_ci"]
        assert cell["top-1 agree % (95% CI)"].startswith(f"{r['parity']['top1_agree'] * 100:.1f}")
        assert f"{lo * 100:.1f}" in cell["top-1 agree % (95% CI)"] and f"{hi * 100:.1f}" in cell["top-1 agree % (95% CI)"]
    assert seen == set(want)


def _corrupt_int8(src, dst):
    model = onnx.load(str(src))
    inits = {i.name: i for i in model.graph.initializer}
    # blow up the scale of the first quantized activation: a calibration gone wrong
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and node.input[1] in inits:
            scale = inits[node.input[1]]
            arr = numpy_helper.to_array(scale) * 50.0
            scale.CopyFrom(numpy_helper.from_array(arr.astype(np.float32), scale.name))
            break
    onnx.save_model(model, str(dst))
    # recorded as if the precision step had written it: its digest verifies, so the parity check must catch it
    folder = ModelFolder(dst.parent)
    manifest = folder.read_manifest()
    manifest.precisions["int8"].sha256 = sha256_file(dst)
    folder.write_manifest(manifest)


def test_corrupted_int8_fails_parity_under_strict(digits, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(digits, folder)
    _corrupt_int8(digits / "model.int8.onnx", folder / "model.int8.onnx")
    args = ["bench", str(folder), "--backend", "int8", "--iterations", "1", "--min-time", "0", "--warmup", "0",
            "--batch", "1", "--no-prepare", "-q", "--data", str(HELDOUT)]  # 360 decide INT8's 1.5-point bound
    strict = CliRunner().invoke(cli, args + ["--strict"])
    assert strict.exit_code == 1, strict.output
    assert "onnxruntime cpu int8" in strict.output.splitlines()[-1]
    lenient = CliRunner().invoke(cli, args)
    assert lenient.exit_code == 0 and "--strict" in lenient.output
    # and the honest model passes the same command
    honest = CliRunner().invoke(cli, ["bench", str(digits), *args[2:], "--strict"])
    assert honest.exit_code == 0, honest.output


def test_the_digits_default_bench_fails_with_another_checkpoints_int8(digits, tmp_path):
    """The shipped example's gate can fail: model.int8.onnx made from other weights (the head's rows rolled by one),
    recorded as if made here (its digest verifies), fails parity on the default set under --strict."""
    from safetensors.numpy import load_file, save_file

    weights = load_file(str(ROOT / "models" / "digits" / "vit_digits_patch4_32.safetensors"))
    for k in ("head.weight", "head.bias"):
        weights[k] = np.roll(weights[k], 1, axis=0)
    save_file(weights, str(tmp_path / "other.safetensors"))
    other = tmp_path / "other"
    for args in (["onnx", "-m", "vit_digits_patch4_32", "-c", str(tmp_path / "other.safetensors"), "-o", str(other)],
                 ["quantize", str(other), "--int8", "--target", "cpu", "--no-check"]):
        r = CliRunner().invoke(cli, [*args, "-q"])
        assert r.exit_code == 0, r.output
    folder = tmp_path / "m"
    shutil.copytree(digits, folder)
    shutil.copy(other / "model.int8.onnx", folder / "model.int8.onnx")
    manifest = ModelFolder(folder).read_manifest()
    manifest.precisions["int8"].sha256 = sha256_file(folder / "model.int8.onnx")
    ModelFolder(folder).write_manifest(manifest)
    r = CliRunner().invoke(cli, ["bench", str(folder), "--backend", "onnxruntime cpu int8", "--no-prepare", "--batch",
                                 "8", "--iterations", "1", "--min-time", "0", "--warmup", "0", "-q", "--strict"])
    assert r.exit_code == 1, r.output
    assert "parity missed by onnxruntime cpu int8" in r.output


def _runners(folder):
    manifest = ModelFolder(folder).read_manifest()
    return discover(ModelFolder(folder), model_from_manifest(manifest), threads=2, gpu=torch.cuda.is_available(),
                    io=(manifest.input_name, manifest.output_name))


# every backend this machine could have, named without loading anything
NAMES = [r.name for r in discover(ModelFolder(ROOT / "none"), None, threads=1, gpu=torch.cuda.is_available())]


@pytest.mark.parametrize("name", NAMES)
def test_backend_contract(digits, name):
    """Every backend: dynamic batch, (B, classes) float32, deterministic, agrees with PyTorch FP32."""
    runner = next(r for r in _runners(digits) if r.name == name)
    try:
        runner.load()
    except BackendUnavailable as e:
        pytest.skip(f"{runner.name}: unavailable: {e}")
    assert runner.loaded
    manifest = ModelFolder(digits).read_manifest()
    ds = load_folder(HELDOUT, manifest.preprocess, limit=40)
    ref_model = model_from_manifest(manifest)
    try:
        for b in (1, 3, 8):
            out = runner.infer(ds.x[:b])
            assert out.shape == (b, 10) and out.dtype == np.float32
        a, b2 = runner.infer(ds.x[:5]), runner.infer(ds.x[:5])
        assert np.array_equal(a, b2) if runner.device == "cpu" else np.allclose(a, b2, atol=1e-3)
        out = np.concatenate([runner.infer(ds.x[i:i + 8]) for i in range(0, len(ds), 8)])
        with torch.no_grad():
            ref = ref_model(torch.from_numpy(ds.x)).numpy()
        verdict = judge(compare(ref, out, ds.labels), runner.precision)
        # 40 images are too few to decide an accuracy bound: no bound may fail, and only that one stay undecided
        assert not verdict.failed, (runner.name, verdict.failures)
        assert all("accuracy drop" in line for line in verdict.inconclusive)
    finally:
        runner.close()
    assert not runner.loaded


def test_bench_on_calibration_images_warns(digits):
    calib = ROOT / "calibration" / "digits" / "calib"
    r = CliRunner().invoke(cli, ["bench", str(digits), "--data", str(calib), "--backend", "int8", "--iterations", "1",
                                 "--min-time", "0", "--warmup", "0", "--batch", "1", "--no-prepare", "-q"])
    assert r.exit_code == 0, r.output
    assert "calibrated on" in r.output


def test_bench_report_path_checked_before_work(tiny_default, tmp_path):
    (tmp_path / "adir").mkdir()
    # a copy: other tests may add files to the session's export (bench, quantize), and this one asserts on them
    folder = copy_export(tiny_default / "models" / "vit_tiny_patch16_224-32x32", tmp_path / "m")
    r = CliRunner().invoke(cli, ["bench", str(folder), "--json", str(tmp_path / "adir")])
    fails_cleanly(r, "--json")
    r = CliRunner().invoke(cli, ["bench", str(folder), "--threshold", "int8.nope=1"])
    fails_cleanly(r, "--threshold")
    assert not (folder / "model.int8.onnx").exists()  # nothing was prepared before the mistake was found


class _Ranged(Runner):
    backend, precision = "fake", "fp32"
    batch_range = (2, 4)

    def _load(self):
        pass

    def run(self, staged):
        assert 2 <= len(staged) <= 4
        return staged.reshape(len(staged), -1)[:, :3] * 2


def test_infer_all_respects_an_engine_batch_range():
    x = np.random.default_rng(0).standard_normal((9, 3, 2, 2)).astype(np.float32)
    with pytest.raises(BackendUnavailable, match="not loaded"):
        _Ranged().infer_all(x)
    with _Ranged() as r:  # the base class loads and closes it
        assert r.loaded
        out = r.infer_all(x)
    assert not r.loaded
    assert np.allclose(out, x.reshape(9, -1)[:, :3] * 2)


def test_bf16_is_not_run_where_the_cpu_would_emulate_it(digits, monkeypatch):
    from vitexport.backends import torch_backend

    model = model_from_manifest(ModelFolder(digits).read_manifest())
    monkeypatch.setattr(torch_backend, "cpu_has_bf16", lambda: False)
    with pytest.raises(BackendUnavailable, match="no BF16 arithmetic"):
        torch_backend.TorchRunner(model, "bf16", "cpu").load()
    monkeypatch.setattr(torch_backend, "cpu_has_bf16", lambda: True)
    with torch_backend.TorchRunner(model, "bf16", "cpu") as r:
        assert r.infer(np.zeros((1, 3, 32, 32), np.float32)).shape == (1, 10)


def test_default_timing_stops_once_the_median_is_stable():
    """Without --iterations: five runs at least, then stop when the last two runs moved the median by 2 % or less,
    at ten runs at most, and never before --min-time; a given count is kept exactly as before."""
    from vitexport.benchmark.latency import enough

    steady, drifting = [100.0] * 5, [100.0, 110.0, 120.0, 130.0, 140.0, 150.0, 160.0]
    assert not enough(steady[:4], None, 10.0, 1.0) and enough(steady, None, 10.0, 1.0)
    assert not enough(steady, None, 0.5, 1.0)  # min_time first
    assert not enough(drifting, None, 10.0, 1.0) and enough(drifting + [170.0, 180.0, 190.0], None, 10.0, 1.0)
    assert not enough(steady * 2, 12, 10.0, 1.0) and enough(steady * 2 + [1.0, 1.0], 12, 10.0, 1.0)
    assert enough([1.0], 1, 0.0, 0.0)
