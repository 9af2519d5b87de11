"""transformers' Depth Anything (`DepthAnythingForDepthEstimation`, V1 and V2 alike: one class, their differences
are config values) from `save_pretrained` folders: the export gives transformers' own `predicted_depth` with the
same weights, option by option (taps, reassemble factors, neck and head sizes, relative and metric depth), at the
config's size and, exported with --dynamic-img-size, at other multiples of the patch (one of them non-square), with
the position embedding resampled in the graph as transformers' DINOv2 does; a config saved without its defaults is
read as transformers reads it; what vitexport cannot build is one sentence.
"""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from pathlib import Path

from conftest import ROOT, fails_cleanly

from vitexport.cli import cli
from vitexport.data.images import load_image
from vitexport.data.preprocess import Preprocess
from vitexport.tensorrt_engine.graph_rules import rule_breakers

transformers = pytest.importorskip("transformers")

# a DINOv2 backbone of 4 blocks, 32 wide, patch 14, trained at 56 px (a 4 x 4 grid)
BACKBONE = dict(model_type="dinov2", hidden_size=32, num_hidden_layers=4, num_attention_heads=2, image_size=56,
                patch_size=14, mlp_ratio=2, reshape_hidden_states=False)
HEAD = dict(reassemble_hidden_size=32, neck_hidden_sizes=[8, 16, 24, 32], fusion_hidden_size=16, head_hidden_size=8)

CASES = {
    # V2's spread taps
    "relative": dict(HEAD, backbone_config=dict(BACKBONE, out_indices=[1, 2, 3, 4])),
    # metric depth (a sigmoid x max_depth); taps named as out_features, one of them the embedding output; no
    # norm on the taps; other factors; the head on another fused map
    "metric-options": dict(HEAD, backbone_config=dict(BACKBONE, out_features=["stem", "stage2", "stage3", "stage4"],
                                                      apply_layernorm=False),
                           depth_estimation_type="metric", max_depth=20, reassemble_factors=[2, 1, 0.5, 0.25],
                           head_in_index=-2),
    # V1's last four taps of a deeper backbone, three taps only
    "three-taps": dict(reassemble_hidden_size=32, neck_hidden_sizes=[8, 16, 24], reassemble_factors=[4, 2, 1],
                       fusion_hidden_size=16, head_hidden_size=8,
                       backbone_config=dict(BACKBONE, num_hidden_layers=5, out_indices=[3, 4, 5])),
}


from test_transformers_towers import perturb  # noqa: E402 -- every tensor random: no mapping hides behind an init


def save_depth_anything(folder, config: dict, seed=0):
    torch.manual_seed(seed)
    model = perturb(transformers.DepthAnythingForDepthEstimation(transformers.DepthAnythingConfig(**config)), seed)
    model.save_pretrained(folder)
    return model


def run_onnx(path, x):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {"pixel_values": x})[0]


def assert_same_depth(model, onnx_path, h, w, seed=1):
    x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        want = model(pixel_values=x).predicted_depth.numpy()
    got = run_onnx(onnx_path, x.numpy())
    assert got.shape == want.shape == (2, h, w)
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max())), (h, w)
    return want


def checked_graph(path):
    """The graph passes onnx.checker's full check and the TensorRT op rule."""
    onnx.checker.check_model(str(path), full_check=True)
    assert not rule_breakers(onnx.load(str(path))), path


@pytest.mark.parametrize("case", CASES)
def test_the_export_gives_transformers_depth(case, tmp_path):
    model = save_depth_anything(tmp_path / "saved", CASES[case])
    r = CliRunner().invoke(cli, ["onnx", "-c", str(tmp_path / "saved"), "-o", str(tmp_path / "out"), "-q"])
    assert r.exit_code == 0, r.output
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["output_name"] == "predicted_depth" and manifest["output_shape"] == ["batch", 56, 56]
    want = assert_same_depth(model, tmp_path / "out" / "model.onnx", 56, 56)
    if CASES[case].get("depth_estimation_type") == "metric":  # a sigmoid x 20: values beyond a sigmoid's range
        assert want.max() > 1 and want.max() < 20
    checked_graph(tmp_path / "out" / "model.onnx")


def test_a_dynamic_size_export_gives_transformers_depth_at_other_sizes(tmp_path):
    """One graph at the stored grid and at two other sizes, one of them non-square (transformers resamples the
    position embedding bicubically in its forward pass; so does the graph)."""
    model = save_depth_anything(tmp_path / "saved", CASES["relative"])
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["onnx", "-c", str(tmp_path / "saved"), "-o", str(out), "--dynamic-img-size",
                                 "--img-size-range", "28..112", "-q"])
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["output_shape"] == ["batch", "out_height", "out_width"]
    assert manifest["pos_embed_interp"] == "bicubic"
    for h, w in ((56, 56), (84, 84), (42, 98)):
        assert_same_depth(model, out / "model.onnx", h, w)
    checked_graph(out / "model.onnx")


def test_a_config_saved_without_its_defaults_is_read_as_transformers_reads_it(tmp_path):
    """Older transformers write only the values that differ from the defaults, nested backbone_config included:
    the top level's defaults are DepthAnythingConfig's, the backbone's Dinov2Config's own (not the default
    backbone's), so a minimal file builds the model transformers builds from the same file."""
    minimal = {"model_type": "depth_anything", "reassemble_hidden_size": 32, "neck_hidden_sizes": [8, 16, 24, 32],
               "backbone_config": {"model_type": "dinov2", "hidden_size": 32, "num_hidden_layers": 4,
                                   "num_attention_heads": 2, "image_size": 56, "out_indices": [1, 2, 3, 4],
                                   "reshape_hidden_states": False}}
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "config.json").write_text(json.dumps(minimal))
    torch.manual_seed(0)
    model = perturb(transformers.DepthAnythingForDepthEstimation(transformers.AutoConfig.from_pretrained(saved)))
    assert model.config.backbone_config.patch_size == 14 and model.config.fusion_hidden_size == 64
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(saved / "model.safetensors"))
    r = CliRunner().invoke(cli, ["onnx", "-c", str(saved), "-o", str(tmp_path / "out"), "-q"])
    assert r.exit_code == 0, r.output
    assert_same_depth(model, tmp_path / "out" / "model.onnx", 56, 56)


@pytest.mark.parametrize("change, needle", [
    (dict(backbone_config=dict(BACKBONE, out_indices=[1, 2, 3, 4], reshape_hidden_states=True)), "reshapes"),
    (dict(backbone_config=None, backbone="vit_small_patch14_dinov2"), "names its backbone"),
    (dict(backbone_config=dict(BACKBONE, model_type="swinv2")), "'swinv2' backbone"),
    (dict(reassemble_hidden_size=48), "reassemble_hidden_size 48"),
    (dict(depth_estimation_type="absolute"), "depth_type 'absolute'"),
], ids=["reshaped-taps", "timm-backbone", "swin-backbone", "reassemble-width", "depth-type"])
def test_what_cannot_be_built_is_one_sentence(tmp_path, change, needle):
    saved = tmp_path / "saved"
    save_depth_anything(saved, CASES["relative"])
    cfg = json.loads((saved / "config.json").read_text())
    cfg.update(change)
    if cfg.get("backbone_config") is None:
        cfg.pop("backbone_config")
    (saved / "config.json").write_text(json.dumps(cfg))
    r = CliRunner().invoke(cli, ["onnx", "-c", str(saved), "-o", str(tmp_path / "out"), "-q"])
    fails_cleanly(r, needle)
    assert not (tmp_path / "out" / "model.onnx").exists()


PHOTOS = ROOT / "calibration" / "photos" / "holdout"


def test_predict_writes_the_processors_depth_at_each_images_size(tmp_path):
    """`predict --out-dir`: per image the .npy is transformers' post_process_depth_estimation of the graph's depth
    (bicubic to the image's own size), the 16-bit PNG holds it times the scale its JSON line gives, and the colour
    map has the image's size; the model's input is what DPTImageProcessor makes of the photo (resized to the input
    size, as this processor is configured)."""
    from PIL import Image

    model = save_depth_anything(tmp_path / "saved", CASES["relative"])
    proc = transformers.DPTImageProcessorPil(size={"height": 56, "width": 56}, keep_aspect_ratio=False,
                                             resample=3, image_mean=[0.485, 0.456, 0.406],
                                             image_std=[0.229, 0.224, 0.225])
    proc.save_pretrained(tmp_path / "saved")
    r = CliRunner().invoke(cli, ["onnx", "-c", str(tmp_path / "saved"), "-o", str(tmp_path / "out"), "-q"])
    assert r.exit_code == 0, r.output
    photos = sorted(PHOTOS.glob("*.jpg"))[:3]
    pp = Preprocess.from_dict(json.loads((tmp_path / "out" / "manifest.json").read_text())["preprocess"])
    r = CliRunner().invoke(cli, ["predict", str(tmp_path / "out"), *map(str, photos), "--out-dir",
                                 str(tmp_path / "maps"), "-q"])
    assert r.exit_code == 0, r.output
    lines = [json.loads(line) for line in r.output.splitlines() if line.startswith("{")]
    assert [Path(line["image"]).name for line in lines] == [p.name for p in photos]
    for photo, line in zip(photos, lines):
        with Image.open(photo) as img:
            rgb = img.convert("RGB")
        pixels = proc(images=rgb, return_tensors="pt")["pixel_values"]
        ours = load_image(photo, pp)[None]
        assert np.abs(ours - pixels.numpy()).mean() < 0.02  # the same preprocessing (two resizers' pixels)
        graph_depth = run_onnx(tmp_path / "out" / "model.onnx", ours)
        want = proc.post_process_depth_estimation(
            transformers.modeling_outputs.DepthEstimatorOutput(predicted_depth=torch.from_numpy(graph_depth)),
            target_sizes=[(rgb.height, rgb.width)])[0]["predicted_depth"].numpy()
        got = np.load(tmp_path / "maps" / f"{photo.stem}.depth.npy")
        assert got.shape == (rgb.height, rgb.width)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        png = np.asarray(Image.open(tmp_path / "maps" / f"{photo.stem}.depth.png"))
        assert png.dtype == np.uint16
        np.testing.assert_allclose(png / line["depth"]["png16_scale"], got, atol=1.0 / line["depth"]["png16_scale"])
        assert Image.open(tmp_path / "maps" / f"{photo.stem}.depth.color.png").size == rgb.size
    with torch.no_grad():  # and the graph is transformers' model on those pixels
        want = model(pixel_values=torch.from_numpy(ours)).predicted_depth.numpy()
        assert np.abs(graph_depth - want).max() < 1e-4 * max(1.0, float(np.abs(want).max()))
    again = CliRunner().invoke(cli, ["predict", str(tmp_path / "out"), str(photos[0]), "--out-dir",
                                     str(tmp_path / "maps"), "-q"])
    fails_cleanly(again, "already exists")


def test_sensitivity_and_the_dense_target_speak_the_tasks_metric(tmp_path):
    """`quantize --int8 --sensitivity` ranks the GEMM groups by the AbsRel each alone costs, and `--dense-target X`
    returns the costliest to float until the INT8 depth's AbsRel against FP32 is at most X; the record says so."""
    save_depth_anything(tmp_path / "saved", CASES["relative"])
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["onnx", "-c", str(tmp_path / "saved"), "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["quantize", str(out), "--int8", "--sensitivity"])
    assert r.exit_code == 0 and "cost = AbsRel to the FP32 depth" in r.output, r.output
    costs = [float(line.split()[4]) for line in r.output.splitlines() if line.strip()[:1].isdigit()]
    assert costs == sorted(costs, reverse=True) and costs[0] > 0
    everything = float(next(line for line in r.output.splitlines() if "(all " in line).split()[3])
    target = everything / 2  # met only with some groups in float
    r = CliRunner().invoke(cli, ["quantize", str(out), "--int8", "--dense-target", f"{target:.3g}", "-q"])
    assert r.exit_code == 0, r.output
    record = json.loads((out / "manifest.json").read_text())["precisions"]["int8"]
    fallback = record["calibration"]["fallback"]
    assert fallback["status"] == "met" and fallback["float_groups"]
    assert record["check"]["absrel"] <= float(f"{target:.3g}")


def test_a_dynamic_export_predicts_each_image_at_the_processors_own_size(tmp_path):
    """Depth Anything's processor keeps each image's aspect ratio at multiples of 14 (the side whose scale is closer
    to 1 sets it, halves rounded to even): a --dynamic-img-size export's predict feeds each photo at that size, so its
    depth is transformers' whole pipeline on the photo (processor, model, post_process_depth_estimation)."""
    from PIL import Image

    model = save_depth_anything(tmp_path / "saved", CASES["relative"])
    proc = transformers.DPTImageProcessorPil(size={"height": 56, "width": 56}, keep_aspect_ratio=True,
                                             ensure_multiple_of=14, resample=3, image_mean=[0.485, 0.456, 0.406],
                                             image_std=[0.229, 0.224, 0.225])
    proc.save_pretrained(tmp_path / "saved")
    r = CliRunner().invoke(cli, ["onnx", "-c", str(tmp_path / "saved"), "-o", str(tmp_path / "out"),
                                 "--dynamic-img-size", "-q"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["preprocess"]["multiple_of"] == 14
    photos = [ROOT / "calibration" / "photos" / "calib" / "chelsea.jpg", *sorted(PHOTOS.glob("*.jpg"))[:1]]
    r = CliRunner().invoke(cli, ["predict", str(tmp_path / "out"), *map(str, photos), "--out-dir",
                                 str(tmp_path / "maps"), "-q"])
    assert r.exit_code == 0, r.output
    for photo in photos:
        with Image.open(photo) as img:
            rgb = img.convert("RGB")
        pixels = proc(images=rgb, return_tensors="pt")["pixel_values"]
        assert pixels.shape[-2] != pixels.shape[-1] or rgb.height == rgb.width  # not squashed to a square
        with torch.no_grad():
            out = model(pixel_values=pixels)
        want = proc.post_process_depth_estimation(out, target_sizes=[(rgb.height, rgb.width)])[0]
        want = want["predicted_depth"].numpy()
        got = np.load(tmp_path / "maps" / f"{photo.stem}.depth.npy")
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max(), photo.name


def test_a_model_object_exports_as_its_folder_does(tmp_path):
    """`vitexport.export(model)` with transformers' DepthAnythingForDepthEstimation in memory: the dense model its
    config describes, with its weights, gives its predicted_depth."""
    import vitexport

    torch.manual_seed(0)
    model = perturb(transformers.DepthAnythingForDepthEstimation(transformers.DepthAnythingConfig(**CASES["relative"])))
    result = vitexport.export(model, output=tmp_path / "out")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["config"]["dense"]["task"] == "depth" and result.folder == tmp_path / "out"
    assert_same_depth(model, tmp_path / "out" / "model.onnx", 56, 56)


def test_a_hub_repository_exports_offline_from_the_cache(tmp_path, monkeypatch):
    """`vitexport onnx -c hf-hub:ORG/NAME` of a Depth Anything repository in the Hugging Face cache, offline: the
    dense model its config describes, named after the repository, gives transformers' depth."""
    from test_hub import add_repo

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    model = save_depth_anything(tmp_path / "saved", CASES["relative"])
    add_repo(tmp_path / "cache", "someone/depth-anything-tiny",
             {p.name: (lambda dst, src=p: dst.write_bytes(src.read_bytes()))
              for p in (tmp_path / "saved").iterdir() if p.is_file()})
    r = CliRunner().invoke(cli, ["onnx", "-c", "hf-hub:someone/depth-anything-tiny", "-q"])
    assert r.exit_code == 0, r.output
    (folder,) = (tmp_path / "models").glob("depth-anything-tiny-*x*")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["checkpoint"]["repo"] == "someone/depth-anything-tiny"
    assert_same_depth(model, folder / "model.onnx", 56, 56)
