"""scripts/int8_vs_fp16.py, the speed gate of scripts/gpu_smoke.sh, on made-up bench reports (no GPU needed)."""

from __future__ import annotations

import importlib.util
import json

import pytest
from conftest import ROOT
from test_tensorrt_engine import _sidecar

from vitexport.artifacts.folder import ModelFolder
from vitexport.artifacts.sidecar import write_sidecar
from vitexport.errors import VitexportError

_spec = importlib.util.spec_from_file_location("int8_vs_fp16", ROOT / "scripts" / "int8_vs_fp16.py")
script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(script)


def _report(int8=2000.0, fp16=1500.0, batch=4):
    def row(precision, img_s):
        return {"backend": "tensorrt", "precision": precision, "available": True, "reason": "",
                "latency": [{"batch": 1, "throughput": img_s / 4}, {"batch": batch, "throughput": img_s}]}
    return {"results": [{"backend": "onnxruntime", "precision": "int8", "available": True, "latency": []},
                        row("fp16", fp16), row("int8", int8)]}


def _plans(tmp_path):
    folder = ModelFolder(tmp_path)
    for p in ("int8", "fp16"):
        write_sidecar(folder.sidecar(p), _sidecar(tmp_path, precision=p))  # profile 1/4/16
    return tmp_path


def test_faster_int8_passes_with_both_numbers():
    ok, line = script.compare(_report(), 4)
    assert ok and line == ("TensorRT at batch 4 (the profile's opt batch): INT8 2000.0 img/s is faster than FP16 "
                           "1500.0 img/s (INT8/FP16 = 1.33x)")


def test_slower_int8_fails_with_both_numbers():
    ok, line = script.compare(_report(int8=900.0), 4)
    assert not ok and "INT8 900.0 img/s is SLOWER than FP16 1500.0 img/s (INT8/FP16 = 0.60x)" in line


def test_missing_rows_or_batches_are_explained():
    report = _report()
    report["results"][2].update(available=False, reason="model.int8.plan cannot run here")
    with pytest.raises(VitexportError, match="TensorRT INT8 did not run \\(model.int8.plan cannot run here\\)"):
        script.compare(report, 4)
    with pytest.raises(VitexportError, match="not timed at batch 8"):
        script.compare(_report(), 8)


def test_the_opt_batch_comes_from_the_sidecars(tmp_path, capsys):
    folder = _plans(tmp_path)
    assert script.opt_batch(folder) == 4
    assert script.main(["--opt-batch", str(folder)]) == 0 and capsys.readouterr().out.strip() == "4"
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(_report(int8=900.0)))
    assert script.main([str(bench), str(folder)]) == 0  # reports only
    assert script.main([str(bench), str(folder), "--gate"]) == 1
    assert "SLOWER" in capsys.readouterr().out
    bench.write_text(json.dumps(_report()))
    assert script.main([str(bench), str(folder), "--gate"]) == 0
    assert script.main([str(bench), str(tmp_path / "nowhere")]) == 2
