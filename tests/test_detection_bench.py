"""`vitexport bench` on a detector: every CPU row is judged by COCO's mAP against the reference's detections, with its
interval; a graph that is wrong in a way a tensor tolerance could miss (its boxes read as corners, its class indices
one off, another image's detections) fails --strict.
"""

import json

import pytest
import torch
from click.testing import CliRunner
from conftest import ROOT
from detectors import TINY, save_rf_detr, with_wrong_export

from vitexport.cli import cli

transformers = pytest.importorskip("transformers")

PHOTOS = ROOT / "calibration" / "photos" / "calib"


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("detection-bench")
    save_rf_detr(transformers, torch, tmp / "saved")
    r = CliRunner().invoke(cli, ["onnx", "-c", str(tmp / "saved"), "-o", str(tmp / "out"), "-q"])
    assert r.exit_code == 0, r.output
    return tmp / "out"


def bench(folder, *extra):
    report = folder.parent / f"{folder.name}-bench.json"
    r = CliRunner().invoke(cli, ["bench", str(folder), "--data", str(PHOTOS), "--backend", "pytorch", "--backend",
                                 "onnxruntime", "--backend", "openvino", "--batch", "2", "--iterations", "1",
                                 "--min-time", "0", "--warmup", "0", "--no-prepare", "--json", str(report), *extra])
    return r, {row["name"]: row for row in json.loads(report.read_text())["results"] if row["available"]}


def test_every_cpu_row_is_judged_by_map_against_the_reference(detector):
    """The FP32 rows agree with the reference (mAP 1); the bf16 ones are judged by the same figures (this random
    detector, its class logits spread wide, loses much of its ranking in bf16: they miss their bounds)."""
    r, rows = bench(detector)
    assert r.exit_code == 0, r.output
    assert {"pytorch cpu fp32", "onnxruntime cpu fp32", "openvino cpu fp32"} <= set(rows)
    for name, row in rows.items():
        st = row["parity"]
        assert st["dense"] == "detection" and "top1_agree" not in st, name
        assert st["map_ci"][0] <= st["map"] <= st["map_ci"][1] and st["map_50_ci"][0] <= st["map_50"], name
        if "fp32" in name:
            assert st["map"] > 0.99 and st["box_iou"] > 0.999 and st["status"] == "pass", name
        else:
            assert st["map"] < 0.99 and st["status"] == "fail" and any("mAP" in f for f in st["failures"]), name
    assert "mAP 100.00%" in " ".join(r.output.split())


@pytest.mark.parametrize("how", ["xyxy", "classes", "images"])
def test_a_wrong_graph_fails_strict(detector, tmp_path, how):
    wrong = with_wrong_export(detector, tmp_path / "wrong", how, TINY["num_labels"])
    r, rows = bench(wrong, "--strict", "--backend", "onnxruntime")
    assert r.exit_code == 1, r.output
    st = rows["onnxruntime cpu fp32"]["parity"]
    assert st["status"] == "fail" and any("mAP" in f for f in st["failures"]), st["failures"]
    assert st["map_ci"][1] < 0.9
    assert rows["pytorch cpu fp32"]["parity"]["status"] == "pass"  # the reference rebuilt from the checkpoint
