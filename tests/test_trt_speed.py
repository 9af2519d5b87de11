"""scripts/trt_speed.py, the speed gate of scripts/gpu_smoke.sh: interleaved rounds, medians, ratios to FP16, the
gate and the table, with stand-in runners whose timings the test sets (no GPU needed)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import statistics
import sys

import pytest
from conftest import ROOT
from test_tensorrt_engine import _sidecar

from vitexport.artifacts.folder import ModelFolder
from vitexport.artifacts.sidecar import write_sidecar
from vitexport.errors import VitexportError

_spec = importlib.util.spec_from_file_location("trt_speed", ROOT / "scripts" / "trt_speed.py")
script = importlib.util.module_from_spec(_spec)
sys.modules["trt_speed"] = script  # its dataclasses look their module up
_spec.loader.exec_module(script)


def _plans(tmp_path, precisions=("fp16", "int8"), opt=32, opts=None):
    folder = ModelFolder(tmp_path)
    for p in precisions:
        side = _sidecar(tmp_path, precision=p)
        side["profile"]["opt"][0] = (opts or {}).get(p, opt)
        side["source_onnx"] = folder.plan_source(p).name
        write_sidecar(folder.sidecar(p), side)
        folder.plan(p).write_bytes(b"plan")
    return folder


def test_the_order_rotates_each_round_so_no_plan_always_runs_first():
    names = ["fp16", "int8", "fp8"]
    orders = [script.rotation(names, r) for r in range(3)]
    assert orders == [["fp16", "int8", "fp8"], ["int8", "fp8", "fp16"], ["fp8", "fp16", "int8"]]
    assert {o[0] for o in orders} == set(names) and script.rotation(names, 4) == orders[1]


def test_rounds_interleave_and_keep_each_rounds_median():
    calls = []

    def timer(name, values):
        it = itertools.cycle(values)

        def t():
            calls.append(name)
            return next(it)
        return t

    per_round = script.interleave({"fp16": timer("fp16", [10, 11, 30]), "int8": timer("int8", [5, 6, 50])}, 4, 3)
    assert per_round == {"fp16": [11] * 4, "int8": [6] * 4}  # one slow run in three moves no median
    # fp16's 3 runs, int8's 3, then int8 first in the next round: interleaved, not one plan's rounds in a row
    assert calls[:9] == ["fp16"] * 3 + ["int8"] * 6


def test_ratios_are_taken_round_by_round_so_a_drifting_clock_cancels():
    # the GPU slows down by half during the run; INT8 stays 1.5x faster than FP16 in every round
    fp16 = [10.0, 12.0, 15.0, 20.0, 22.0]
    per_round = {"fp16": fp16, "int8": [t / 1.5 for t in fp16]}
    rows = script.summarize("vit_base_patch16_224", per_round, 32, {"fp16": "model.fp16.trt.onnx"})
    fp, i8 = rows
    assert (fp.precision, fp.vs_fp16, fp.ms_median, fp.source_onnx) == ("fp16", None, 15.0, "model.fp16.trt.onnx")
    assert i8.vs_fp16 == pytest.approx(1.5) and i8.vs_fp16_range == pytest.approx((1.5, 1.5))
    assert i8.throughput == pytest.approx(32 * 1000 / statistics.median(per_round["int8"]))
    assert i8.source_onnx == "?"


@pytest.mark.parametrize("ratio,fails", [(1.25, False), (1.10, False), (1.09, True), (0.8, True)])
def test_the_gate_fails_a_plan_below_it(ratio, fails):
    rows = script.summarize("m", {"fp16": [10.0] * 3, "int8": [10.0 / ratio] * 3}, 32, {})
    failures = script.gate_failures(rows, 1.1)
    assert bool(failures) == fails
    if fails:
        assert failures == [f"m: TensorRT INT8 is {ratio:.2f}x FP16 at batch 32 (rounds {ratio:.2f}-{ratio:.2f}x), "
                            f"below the 1.10x gate"]


def test_the_gate_refuses_to_judge_below_batch_32():
    rows = script.summarize("m", {"fp16": [10.0], "int8": [5.0]}, 8, {})
    assert script.gate_failures(rows, 1.1) == ["the speed gate needs an opt batch of at least 32; these plans were "
                                               "tuned for 8 (rebuild with --opt-batch 32)"]


def test_accuracy_comes_from_the_benchs_tensorrt_rows_and_the_table_shows_it():
    rows = script.summarize("digits", {"fp16": [2.0, 2.0], "int8": [1.0, 1.6]}, 32, {"fp16": "a.onnx"})
    report = {"results": [
        {"backend": "onnxruntime", "precision": "int8", "available": True, "parity": {"top1_agree": 0.5}},
        {"backend": "tensorrt", "precision": "fp16", "available": True,
         "parity": {"top1_agree": 0.999, "acc": 0.9812, "cos_min": 0.99991}},
        {"backend": "tensorrt", "precision": "int8", "available": True,
         "parity": {"top1_agree": 0.995, "acc": 0.9801, "cos_min": 0.99712}}]}
    script.add_accuracy(rows, report)
    assert [(r.top1_agree, r.acc) for r in rows] == [(0.999, 0.9812), (0.995, 0.9801)]
    rows[1].engine_problems = ("quantized GEMM 'fc1' runs in fp16",)
    lines = script.table(rows).splitlines()
    rows[1].placement = "modelopt"
    lines = script.table(rows).splitlines()
    assert lines[0].split() == ["model", "precision", "graph", "placement", "batch", "img/s", "x", "FP16", "(rounds)",
                                "top-1", "agree", "top-1", "acc", "cos", "min", "engine"]
    assert lines[1].split() == ["digits", "FP16", "a.onnx", "-", "32", "16,000", "1.00", "99.90%", "98.12%",
                                "0.99991", "ok"]
    # INT8: 2/1 = 2.0 and 2/1.6 = 1.25 in its rounds, median 1.625; 1.3 ms median -> 24,615 img/s
    assert lines[2].split() == ["digits", "INT8", "?", "modelopt", "32", "24,615", "1.62", "(1.25-2.00)", "99.50%",
                                "98.01%", "0.99712", "1", "problem(s)"]


def test_the_plans_of_a_folder(tmp_path):
    folder = _plans(tmp_path)
    assert list(script.plans_of(folder)) == ["fp16", "int8"]
    folder.plan("fp16").unlink()
    with pytest.raises(VitexportError, match="model.fp16.plan does not exist: the other plans are timed against it"):
        script.plans_of(folder)
    folder = _plans(tmp_path, opts={"fp16": 32, "int8": 8})
    with pytest.raises(VitexportError, match="tuned for different batches"):
        script.plans_of(folder)


class _FakeRunner:
    """A loaded plan whose timed runs take the milliseconds the test gives its precision."""

    ms = {"fp16": 4.0, "int8": 2.5}
    log: list = []

    def __init__(self, plan_path):
        self.precision = plan_path.name.split(".")[1]
        self.info = {"engine_problems": [] if self.precision == "fp16" else ["attention 'a' is not fused"]}

    def load(self):
        self.log.append(("load", self.precision))

    def stage(self, x):
        assert x.shape == (32, 3, 32, 32)  # the profile's opt shape
        return x

    def timed_run(self, staged):
        return self.ms[self.precision]

    def close(self):
        self.log.append(("close", self.precision))


def test_main_times_every_plan_and_writes_and_reads_its_json(tmp_path, monkeypatch, capsys):
    import vitexport.backends.tensorrt as trt_backend

    monkeypatch.setattr(trt_backend, "TensorRTRunner", _FakeRunner)
    _plans(tmp_path)
    out = tmp_path / "speed.json"
    assert script.main([str(tmp_path), "--rounds", "3", "--iters", "2", "--json", str(out), "--gate", "1.1"]) == 0
    assert {("close", "fp16"), ("close", "int8")} <= set(_FakeRunner.log)
    rows = json.loads(out.read_text())["rows"]
    assert [(r["precision"], r["vs_fp16"], r["engine_problems"]) for r in rows] == [
        ("fp16", None, []), ("int8", 1.6, ["attention 'a' is not fused"])]
    printed = capsys.readouterr().out
    assert script.main(["--table", str(out), str(out)]) == 0
    assert capsys.readouterr().out.count("INT8") == 2 and "INT8" in printed
    monkeypatch.setattr(_FakeRunner, "ms", {"fp16": 4.0, "int8": 3.9})
    assert script.main([str(tmp_path), "--rounds", "3", "--iters", "2", "--gate", "1.1"]) == 1
    assert "INT8 is 1.03x FP16 at batch 32" in capsys.readouterr().err
    assert script.main([str(tmp_path / "nowhere")]) == 2
