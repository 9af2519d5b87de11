"""`vitexport bench` on a detector: every CPU row is judged by COCO's mAP against the reference's detections, with its
interval; a graph that is wrong in a way a tensor tolerance could miss (its boxes read as corners, its class indices
one off, another image's detections) fails --strict.
"""

import contextlib
import io
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import ROOT
from detectors import SQUARES_MODEL, TINY, save_rf_detr, squares_set, with_wrong_export

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


def _truth_sets(detector, model_dir, tmp_path):
    """COCO JSON and YOLO labels of the photos made from transformers' own model and processor (its detections
    above 0.5 at each photo's size): the reference's detections against them score mAP 1, up to the truth's
    rounding."""
    from PIL import Image

    from vitexport.data.images import load_image
    from vitexport.data.preprocess import Preprocess

    model = transformers.RfDetrForObjectDetection.from_pretrained(model_dir).eval()
    proc = transformers.RfDetrImageProcessor.from_pretrained(model_dir)
    pp = Preprocess.from_dict(json.loads((detector / "manifest.json").read_text())["preprocess"])
    yolo = tmp_path / "yolo"
    yolo.mkdir()
    images, anns = [], []
    for i, photo in enumerate(sorted(PHOTOS.glob("*.jpg"))):
        with Image.open(photo) as im:
            w, h = im.size
            im.convert("RGB").save(yolo / f"{photo.stem}.png")
        with torch.no_grad():
            out = model(pixel_values=torch.from_numpy(load_image(photo, pp)[None]))
        det = proc.post_process_object_detection(out, threshold=0.5, target_sizes=[(h, w)])[0]
        images.append({"id": i + 1, "file_name": photo.name, "width": w, "height": h})
        lines = []
        for (x0, y0, x1, y1), c in zip(det["boxes"].clamp(min=0).tolist(), det["labels"].tolist()):
            x1, y1 = min(x1, w), min(y1, h)
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": c, "iscrowd": 0,
                         "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0)})
            lines.append(f"{c} {(x0 + x1) / 2 / w:.7f} {(y0 + y1) / 2 / h:.7f} {(x1 - x0) / w:.7f} {(y1 - y0) / h:.7f}")
        (yolo / f"{photo.stem}.txt").write_text("\n".join(lines) + "\n")
    coco = tmp_path / "instances_val.json"
    coco.write_text(json.dumps({"images": images, "annotations": anns,
                                "categories": [{"id": c, "name": f"class {c}"} for c in range(TINY["num_labels"])]}))
    assert len(anns) > 10
    return coco, yolo


def test_a_labelled_set_is_judged_against_its_truth_by_coco_map(detector, tmp_path):
    """COCO's JSON (--annotations) and YOLO's labels beside the images: each CPU row's mAP, AP50 and AP per size
    against the truth with intervals, and the paired difference to the reference's."""
    coco, yolo = _truth_sets(detector, detector.parent / "saved", tmp_path)
    for data, extra in ((PHOTOS, ("--annotations", str(coco))), (yolo, ())):
        report = tmp_path / "truth.json"
        r = CliRunner().invoke(cli, ["bench", str(detector), "--data", str(data), *extra, "--backend", "fp32",
                                     "--batch", "2", "--iterations", "1", "--min-time", "0", "--warmup", "0",
                                     "--no-prepare", "--json", str(report)])
        assert r.exit_code == 0, r.output
        assert "categories read as the model's labels by number" in " ".join(r.output.split())
        rows = {row["name"]: row for row in json.loads(report.read_text())["results"] if row["available"]}
        assert {"pytorch cpu fp32", "onnxruntime cpu fp32", "openvino cpu fp32"} <= set(rows)
        for name, row in rows.items():
            truth = row["parity"]["truth"]
            assert truth["n"] == 13, name
            assert truth["map"]["reference"] > 0.99, (name, truth)  # its own detections, rounded
            assert abs(truth["map"]["diff"]) < 1e-3 and truth["map"]["diff_ci"][0] <= truth["map"]["diff"], name
            assert truth["map"]["ci"][0] <= truth["map"]["value"] <= truth["map"]["ci"][1], name
            assert "map_50" in truth, name
        assert "against ground truth on 13 images: mAP" in " ".join(r.output.split())


def test_predict_writes_coco_results_and_pictures(detector, tmp_path):
    """predict --out-dir: each image's detections above --threshold at its own size, equal to transformers' model
    through its processor; detections.json in COCO's results format (pycocotools loads it against the images'
    listing), a picture with the boxes drawn per image; an existing file is never overwritten."""
    from PIL import Image

    from vitexport.data.images import load_image
    from vitexport.data.preprocess import Preprocess

    photos = sorted(PHOTOS.glob("*.jpg"))[:3]
    out = tmp_path / "pred"
    r = CliRunner().invoke(cli, ["predict", str(detector), *map(str, photos), "--out-dir", str(out),
                                 "--threshold", "0.6", "-q"])
    assert r.exit_code == 0, r.output
    lines = [json.loads(ln) for ln in r.output.splitlines() if ln.startswith("{")]
    model = transformers.RfDetrForObjectDetection.from_pretrained(detector.parent / "saved").eval()
    proc = transformers.RfDetrImageProcessor.from_pretrained(detector.parent / "saved")
    pp = Preprocess.from_dict(json.loads((detector / "manifest.json").read_text())["preprocess"])
    results = json.loads((out / "detections.json").read_text())
    for i, (photo, line) in enumerate(zip(photos, lines)):
        with Image.open(photo) as im:
            size = (im.height, im.width)
        with torch.no_grad():
            o = model(pixel_values=torch.from_numpy(load_image(photo, pp)[None]))
        theirs = proc.post_process_object_detection(o, threshold=0.6, target_sizes=[size])[0]
        assert [d["label"] for d in line["detections"]] == theirs["labels"].tolist()
        ours = [d["box"] for d in line["detections"]]
        assert len(ours) and abs(np.array(ours) - theirs["boxes"].numpy()).max() < 1e-2
        mine = [d for d in results if d["image_id"] == i + 1]
        assert len(mine) == len(ours) and all(d["score"] > 0.6 for d in mine)
        with Image.open(out / f"{photo.stem}.boxes.png") as pic:
            assert pic.size == (size[1], size[0])
            assert np.asarray(pic.convert("RGB")).astype(int).sum() != np.asarray(Image.open(photo).convert("RGB")).astype(int).sum()
    from pycocotools.coco import COCO

    gt = COCO()
    gt.dataset = {"images": json.loads((out / "images.json").read_text()), "annotations": [],
                  "categories": [{"id": c} for c in range(TINY["num_labels"])]}
    gt.createIndex()
    with contextlib.redirect_stdout(io.StringIO()):
        assert len(gt.loadRes(str(out / "detections.json")).getAnnIds()) == len(results)
    again = CliRunner().invoke(cli, ["predict", str(detector), str(photos[0]), "--out-dir", str(out), "-q"])
    assert again.exit_code == 2 and "already exists" in again.output


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The tiny detector trained on coloured squares (tests/fixtures, scripts/train_tiny_detector.py), exported, with
    a set of fresh squares labelled in COCO's JSON and YOLO's text files."""
    tmp = tmp_path_factory.mktemp("trained-detector")
    r = CliRunner().invoke(cli, ["onnx", "-c", str(SQUARES_MODEL), "-o", str(tmp / "out"), "-q"])
    assert r.exit_code == 0, r.output
    return tmp / "out", squares_set(tmp / "squares", 40)


def test_a_trained_detector_is_judged_against_the_truth_on_every_row(trained, tmp_path):
    """Its detections score a real mAP against the squares' truth (the reference's own figure, no pseudo-truth),
    read by name from the COCO JSON and by number from YOLO's labels; every FP32 row agrees with the reference on
    every figure; the INT8 rows are judged by the same figures."""
    out, data = trained
    r = CliRunner().invoke(cli, ["quantize", str(out), "--int8", "--calib-data", str(data / "images"), "-q"])
    assert r.exit_code == 0, r.output
    for extra, how in ((("--annotations", str(data / "instances.json")), "by name"), ((), "by name")):
        report = tmp_path / f"{how}.json"
        r = CliRunner().invoke(cli, ["bench", str(out), "--data", str(data), *extra, "--batch", "8",
                                     "--iterations", "1", "--min-time", "0", "--warmup", "0", "--no-prepare",
                                     "--backend", "pytorch cpu fp32", "--backend", "onnxruntime", "--backend",
                                     "openvino", "--json", str(report)])
        assert r.exit_code == 0, r.output
        assert f"the categories read as the model's labels {how}" in " ".join(r.output.split())
        rows = {row["name"]: row for row in json.loads(report.read_text())["results"] if row["available"]}
        assert {"onnxruntime cpu fp32", "onnxruntime cpu int8", "openvino cpu int8"} <= set(rows)
        for name, row in rows.items():
            st = row["parity"]
            truth = st["truth"]
            assert truth["n"] == 40 and 0.4 < truth["map"]["reference"] < 0.95, (name, truth["map"])
            assert truth["map_50"]["reference"] > 0.7, name
            assert {"map_small", "map_medium"} & set(truth), name
            if "fp32" in name:
                assert st["map"] > 0.99 and abs(truth["map"]["diff"]) < 1e-3, name
            else:  # INT8 keeps the squares it found
                assert st["map"] > 0.7 and truth["map"]["diff_ci"][0] < 0.0 < truth["map"]["diff_ci"][1] + 0.05, name


@pytest.mark.e2e
def test_every_precision_and_target_of_a_trained_detector_passes_its_map_check(trained, tmp_path):
    """quantize --fp16/--int8 --target all and --fp8, openvino --precision int8, aoti and triton on the trained
    detector: each succeeds and its check (the manifest's) reports mAP against FP32."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(trained[0], out)
    data, held_out = trained[1] / "images", squares_set(tmp_path / "held-out", 24, seed=2) / "images"
    sets = ["--calib-data", str(data), "--check-data", str(held_out)]
    for args in (["quantize", str(out), "--fp16", "--target", "all", *sets],
                 ["quantize", str(out), "--int8", "--target", "all", *sets], ["quantize", str(out), "--fp8", *sets],
                 ["openvino", str(out), "--precision", "int8"], ["aoti", str(out), "--precision", "bf16"],
                 ["triton", str(out), "-o", str(tmp_path / "repo")]):
        r = CliRunner().invoke(cli, [*args, "-q"])
        assert r.exit_code == 0, (args, r.output)
    manifest = json.loads((out / "manifest.json").read_text())
    for kind, rec in manifest["precisions"].items():
        check = rec.get("check") or {}
        stats = check.get("stats", check)
        assert stats.get("dense") == "detection" and stats.get("map", 0) > 0.7, (kind, check)
    assert {"fp16", "fp16-trt", "int8", "int8-trt", "fp8", "openvino-int8", "aoti-bf16"} <= set(manifest["precisions"])
    entry = tmp_path / "repo" / "rf-detr-squares-fp32"
    config = (entry / "config.pbtxt").read_text()
    assert all(f'name: "{o}"' in config for o in ("query_outputs", "logits", "pred_boxes"))
    assert (entry / "1" / "model.onnx").is_file()


def test_truth_files_that_cannot_be_used_are_one_sentence(trained, tmp_path):
    """A JSON that is not COCO's, a box outside its image, a category the file does not list, categories that are
    none of the model's labels: each one sentence naming the file, exit 2; a YOLO label file that cannot be read is
    named and its image left without truth."""
    out, data = trained
    coco = json.loads((data / "instances.json").read_text())

    def bench_with(ann, folder=data):
        return CliRunner().invoke(cli, ["bench", str(out), "--data", str(folder), "--annotations", str(ann),
                                        "--backend", "onnxruntime cpu fp32", "--batch", "8", "--iterations", "1",
                                        "--min-time", "0", "--warmup", "0", "--no-prepare"])

    cases = {"not-json.json": b"\xff\xfe{", "list.json": json.dumps([1, 2]).encode(),
             "outside.json": json.dumps({**coco, "annotations": [{**coco["annotations"][0], "bbox": [50, 50, 40, 40]}]
                                         }).encode(),
             "unlisted.json": json.dumps({**coco, "annotations": [{**coco["annotations"][0], "category_id": 9}]
                                          }).encode(),
             "foreign.json": json.dumps({**coco, "categories": [{"id": 17, "name": "cat"}],
                                         "annotations": [{**coco["annotations"][0], "category_id": 17}]}).encode()}
    expected = {"not-json.json": "cannot be read as JSON", "list.json": "is not COCO's instances format",
                "outside.json": "outside its 64x64 image", "unlisted.json": "which the file's categories do not list",
                "foreign.json": "not among the model's 4 labels"}
    for name, body in cases.items():
        (tmp_path / name).write_bytes(body)
        r = bench_with(tmp_path / name)
        assert r.exit_code == 2 and expected[name] in r.output and "Traceback" not in r.output, (name, r.output)
        assert str(tmp_path / name) in " ".join(r.output.split()), name
    import shutil

    yolo = tmp_path / "yolo"
    shutil.copytree(data, yolo)
    (yolo / "labels" / "003.txt").write_text("1 0.5 half 0.2 0.2\n")
    r = CliRunner().invoke(cli, ["bench", str(out), "--data", str(yolo), "--backend", "onnxruntime cpu fp32",
                                 "--batch", "8", "--iterations", "1", "--min-time", "0", "--warmup", "0",
                                 "--no-prepare", "--json", str(tmp_path / "y.json")])
    assert r.exit_code == 0, r.output
    assert "Ground truth left out" in r.output and "003.txt" in r.output
    rows = json.loads((tmp_path / "y.json").read_text())["results"]
    assert next(x for x in rows if x["name"] == "onnxruntime cpu fp32")["parity"]["truth"]["n"] == 39


def test_info_names_a_detector(trained):
    r = CliRunner().invoke(cli, ["info", str(trained[0])])
    assert r.exit_code == 0 and "RF-DETR detection (4 labels, 20 queries): query_outputs, logits, pred_boxes" in \
        " ".join(r.output.split()), r.output
