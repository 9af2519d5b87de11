"""`vitexport bench` on a dense model with a labelled data set the test makes: every CPU row reports its task
figures against the reference (AbsRel and delta1 for depth) and against the ground-truth maps beside the images,
each with its 95 % interval and the paired difference to the reference; a graph that gives a wrong map (flipped
left to right) fails --strict however close its tensors' statistics look. The truth is made from the FP32 model's
own depth put through a known affine map in disparity, so the reference's AbsRel against it is the 16-bit PNG's
rounding alone: an alignment by scale and shift that did not undo it would show.
"""

import json

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from conftest import ROOT
from PIL import Image

from vitexport.cli import cli
from vitexport.data.images import list_images, load_image
from vitexport.data.preprocess import Preprocess
from vitexport.paths import sha256_file

transformers = pytest.importorskip("transformers")

PHOTOS = sorted((ROOT / "calibration" / "photos").rglob("*.jpg"))[:8]


def _preprocess_of(folder):
    return Preprocess.from_dict(json.loads((folder / "manifest.json").read_text())["preprocess"])


def _photos_into(data):
    """Each photo saved into `data` as PNG, with its RGB image: (photo path, image)."""
    data.mkdir()
    for photo in PHOTOS:
        with Image.open(photo) as img:
            rgb = img.convert("RGB")
        rgb.save(data / f"{photo.stem}.png")
        yield photo, rgb


@pytest.fixture(scope="module")
def depth_folder(tmp_path_factory):
    """A Depth Anything export with its CPU INT8 graph, and a folder of photos with ground-truth depth PNGs."""
    tmp = tmp_path_factory.mktemp("dense-bench")
    cfg = transformers.DepthAnythingConfig(
        backbone_config=dict(model_type="dinov2", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                             image_size=56, patch_size=14, out_indices=[1, 2], reshape_hidden_states=False),
        reassemble_hidden_size=32, neck_hidden_sizes=[16, 32], reassemble_factors=[2, 1], fusion_hidden_size=16,
        head_hidden_size=8)
    torch.manual_seed(0)
    model = transformers.DepthAnythingForDepthEstimation(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        model.head.conv3.weight.mul_(20)
        model.head.conv3.bias.fill_(3.0)  # a depth above zero that varies across the image
    model.save_pretrained(tmp / "saved")
    out = tmp / "out"
    for args in (["onnx", "-c", str(tmp / "saved"), "-o", str(out)], ["quantize", str(out), "--int8"]):
        r = CliRunner().invoke(cli, [*args, "-q"])
        assert r.exit_code == 0, r.output
    pp, data = _preprocess_of(out), tmp / "data"
    for photo, rgb in _photos_into(data):
        with torch.no_grad():
            d = model(pixel_values=torch.from_numpy(load_image(photo, pp)[None])).predicted_depth
        d = F.interpolate(d[None], size=(rgb.height, rgb.width), mode="bicubic", align_corners=False)[0, 0].numpy()
        depth_m = 1.0 / (0.2 * d + 0.5)  # the model's disparity, affinely, as depth in metres (at most 2 m)
        Image.fromarray((depth_m * 1000).round().astype(np.uint16)).save(data / f"{photo.stem}.depth.png")
    return out, data


def bench(folder, data, *extra):
    report = folder.parent / "bench.json"
    r = CliRunner().invoke(cli, ["bench", str(folder), "--data", str(data), "--backend", "pytorch", "--backend",
                                 "onnxruntime", "--backend", "openvino", "--batch", "2", "--iterations", "1",
                                 "--min-time", "0", "--warmup", "0", "--no-prepare", "--json", str(report), *extra])
    return r, {row["name"]: row for row in json.loads(report.read_text())["results"] if row["available"]}


def test_every_cpu_row_is_judged_by_its_task_against_the_reference_and_the_truth(depth_folder):
    out, data = depth_folder
    assert len(list_images(data)) == len(PHOTOS)  # the truth maps are not taken for images
    r, rows = bench(out, data, "--strict")
    assert r.exit_code == 0, r.output
    assert {"pytorch cpu fp32", "onnxruntime cpu fp32", "onnxruntime cpu int8", "openvino cpu fp32",
            "openvino cpu int8"} <= set(rows)
    for name, row in rows.items():
        st = row["parity"]
        assert st["dense"] == "depth" and "top1_agree" not in st, name
        assert st["absrel_ci"][0] <= st["absrel"] <= st["absrel_ci"][1], name
        truth = st["truth"]
        assert truth["n"] == len(PHOTOS), name
        ref = truth["absrel"]["reference"]
        assert ref < 2e-3, name  # the PNG's millimetres: the alignment undid the affine map
        lo, hi = truth["absrel"]["diff_ci"]
        assert lo <= truth["absrel"]["diff"] <= hi, name
        if "fp32" in name:
            assert st["absrel"] < 1e-4 and abs(truth["absrel"]["value"] - ref) < 1e-4, name
    assert rows["onnxruntime cpu int8"]["parity"]["truth"]["absrel"]["diff"] > 0  # INT8 moves off the truth a bit
    assert "against ground truth on 8 images: AbsRel" in " ".join(r.output.split())


def _flipped(out, tmp_path):
    """A copy of the folder whose INT8 graph mirrors its depth map left to right (its record's digest updated, so
    the folder is consistent): its values and their spread are the same, its task figures are not."""
    import shutil

    folder = tmp_path / "out"
    shutil.copytree(out, folder)
    path = folder / "model.int8.onnx"
    g = onnx.load(str(path))
    name = g.graph.output[0].name
    g.graph.node[-1].output[0] = "unflipped"
    for init, value in (("flip_starts", [-1]), ("flip_ends", [-(2 ** 62)]), ("flip_axes", [2]),
                        ("flip_steps", [-1])):
        g.graph.initializer.append(onnx.numpy_helper.from_array(np.array(value, np.int64), init))
    for n in g.graph.node:
        n.output[:] = ["unflipped" if o == name else o for o in n.output]
    g.graph.node.append(onnx.helper.make_node("Slice", ["unflipped", "flip_starts", "flip_ends", "flip_axes",
                                                        "flip_steps"], [name], name="flip"))
    onnx.save(g, str(path))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["precisions"]["int8"]["sha256"] = sha256_file(path)
    manifest["precisions"]["int8"]["bytes"] = path.stat().st_size
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_a_flipped_map_fails_strict(depth_folder, tmp_path):
    out, data = depth_folder
    r, rows = bench(_flipped(out, tmp_path), data, "--strict")
    assert r.exit_code == 1, r.output
    st = rows["onnxruntime cpu int8"]["parity"]
    assert st["status"] == "fail" and any("AbsRel" in f for f in st["failures"])
    assert st["truth"]["absrel"]["diff_ci"][0] > 0  # worse against the truth too, decided on these images


def test_the_page_of_a_flipped_map_shows_its_worst_images_with_their_maps_in_a_browser(depth_folder, tmp_path):
    """`bench --html`: the INT8 row's images worst first by their AbsRel against the reference (here against ONNX
    Runtime's FP32 graph, which the reference matches to 1e-4), each with the reference's map, the row's and the
    error between them, every picture loaded in a real browser."""
    import onnxruntime as ort
    from browser import open_page

    from vitexport.parity.examples import MAX_DENSE

    out, data = depth_folder
    folder = _flipped(out, tmp_path)
    r, rows = bench(folder, data, "--html", str(tmp_path / "page.html"))
    assert r.exit_code == 0, r.output
    section = 'section[data-row="onnxruntime cpu int8"]'
    with open_page(tmp_path / "page.html", tmp_path / "page.png") as page:
        assert page.messages == [] and page.requests == []
        images = page.images()
        assert images and all(i["complete"] and i["width"] > 0 for i in images)
        counts = page.count(f"{section} .dense"), page.count(f"{section} .dense figure img")
        assert page.page.is_visible(f"{section} .dense img")  # a row that misses: shown, not folded away
    shown = rows["onnxruntime cpu int8"]["examples"]
    assert len(shown) == min(MAX_DENSE, len(PHOTOS)) and all(set(e["maps"]) >= {"reference", "output", "error"}
                                                             for e in shown)
    pp = _preprocess_of(folder)
    fp32, int8 = (ort.InferenceSession(str(folder / f), providers=["CPUExecutionProvider"])
                  for f in ("model.onnx", "model.int8.onnx"))
    absrel = {}
    for photo in sorted(data.glob("*.png")):
        if photo.name.endswith(".depth.png"):
            continue
        x = load_image(photo, pp)[None]
        ref, got = (s.run(None, {s.get_inputs()[0].name: x})[0][0] for s in (fp32, int8))
        valid = ref > 0
        absrel[photo.name] = float((np.abs(got - ref)[valid] / ref[valid]).mean())
    pictures = json.loads((folder.parent / "bench.json").read_text())["pictures"]
    named = [pictures[str(e["index"])]["file"] for e in shown]
    assert named == sorted(absrel, key=lambda k: -absrel[k])[:len(shown)]
    for e in shown:
        assert e["absrel"] == pytest.approx(absrel[pictures[str(e["index"])]["file"]], rel=2e-2)
    assert counts == (len(shown), 4 * len(shown))


@pytest.fixture(scope="module")
def segmentation_folder(tmp_path_factory):
    """An EoMT export, and photos with class masks: the reference's own map (argmax of its semantic map, cut to the
    photo and resized as predict does), with a band of ignored pixels."""
    from test_dense_eomt import TINY, save_eomt

    from vitexport.deploy.dense import resize_maps

    tmp = tmp_path_factory.mktemp("seg-bench")
    save_eomt(tmp / "saved", TINY, sharp=True, seed=5)
    out = tmp / "out"
    r = CliRunner().invoke(cli, ["onnx", "-c", str(tmp / "saved"), "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    import onnxruntime as ort

    pp, data = _preprocess_of(out), tmp / "data"
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    for photo, rgb in _photos_into(data):
        semantic = sess.run(["semantic_probs"], {"pixel_values": load_image(photo, pp)[None]})[0][0]
        size = (rgb.height, rgb.width)
        mask = resize_maps(pp.image_part(semantic, size), size, "bilinear").argmax(0).astype(np.uint8)
        mask[: rgb.height // 10] = 255  # ignored
        Image.fromarray(mask, mode="L").save(data / f"{photo.stem}.mask.png")
    return out, data


def test_a_segmentation_set_is_judged_by_pixel_agreement_and_miou(segmentation_folder, tmp_path):
    """Every CPU row: pixel agreement and the set's mIoU against the reference, and against the class masks mIoU
    and pixel accuracy; the reference's map is the truth here, so its own figures are 1. A graph whose two classes
    are swapped fails --strict."""
    out, data = segmentation_folder
    r, rows = bench(out, data)
    assert r.exit_code == 0, r.output
    for name, row in rows.items():
        st = row["parity"]
        assert st["dense"] == "segmentation" and st["miou_ci"][0] <= st["miou"] <= st["miou_ci"][1], name
        assert st["truth"]["miou"]["reference"] == pytest.approx(1.0, abs=0.02), name  # resized twice: edges
        assert st["truth"]["pixel_acc"]["reference"] > 0.99, name
    assert rows["onnxruntime cpu fp32"]["parity"]["pixel_agree"] > 0.9999
    import shutil

    folder = tmp_path / "swapped"
    shutil.copytree(out, folder)
    path = folder / "model.onnx"
    g = onnx.load(str(path))
    g.graph.node[-1].output[:] = ["semantic_unswapped" if o == "semantic_probs" else o for o in g.graph.node[-1].output]
    for n in g.graph.node:
        n.output[:] = ["semantic_unswapped" if o == "semantic_probs" else o for o in n.output]
        n.input[:] = ["semantic_unswapped" if i == "semantic_probs" else i for i in n.input]
    g.graph.initializer.append(onnx.numpy_helper.from_array(np.array([1, 0, 2], np.int64), "swap"))
    g.graph.node.append(onnx.helper.make_node("Gather", ["semantic_unswapped", "swap"], ["semantic_probs"], axis=1,
                                              name="swap"))
    onnx.save(g, str(path))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["onnx_sha256"], manifest["onnx_bytes"] = sha256_file(path), path.stat().st_size
    (folder / "manifest.json").write_text(json.dumps(manifest))
    r, rows = bench(folder, data, "--strict", "--html", str(tmp_path / "page.html"))
    assert r.exit_code == 1, r.output
    st = rows["onnxruntime cpu fp32"]["parity"]
    assert st["status"] == "fail" and any("pixel agreement" in f for f in st["failures"])
    assert st["truth"]["miou"]["diff_ci"][1] < 0  # worse against the truth, decided on these images
    # the page: each worst image's share of differing pixels is the share of the reference's map in the two
    # swapped classes (ONNX Runtime on the unswapped graph)
    import onnxruntime as ort
    from browser import open_page

    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    pictures = json.loads((folder.parent / "bench.json").read_text())["pictures"]
    shown = rows["onnxruntime cpu fp32"]["examples"]
    assert shown and [e["score"] for e in shown] == sorted((e["score"] for e in shown), reverse=True)
    for e in shown:
        x = load_image(data / pictures[str(e["index"])]["file"], _preprocess_of(out))[None]
        (probs,) = sess.run(["semantic_probs"], {sess.get_inputs()[0].name: x})
        swapped = float((probs[0].argmax(0) <= 1).mean())
        assert e["maps"]["error_max"] == pytest.approx(swapped, abs=1e-6)
        assert e["pixel_agree"] == pytest.approx(1 - swapped, abs=1e-6)
    with open_page(tmp_path / "page.html", tmp_path / "page.png") as page:
        assert page.messages == [] and page.requests == []
        section = 'section[data-row="onnxruntime cpu fp32"]'
        assert page.count(f"{section} .dense figure img") == 4 * len(shown)
        assert all(i["complete"] and i["width"] > 0 for i in page.images())
