"""Named variants against timm's own definitions; preprocessing against timm's eval transform; labels from folders."""

import numpy as np
import pytest
import timm
import torch
from conftest import ROOT
from PIL import Image

from vitexport.data.images import Dataset, load_folder, load_image, preprocess_image
from vitexport.validate.labels import model_labels as labels_for_model
from vitexport.data.preprocess import Preprocess
from vitexport.model.variants import VARIANTS, get_variant, parse_img_size
from vitexport.model.vit import VisionTransformer

TIMM_NAMES = [n for n in VARIANTS if not n.startswith("vit_digits")]


@pytest.mark.parametrize("name", TIMM_NAMES)
def test_variant_shapes_match_timm(name):
    with torch.device("meta"):  # shapes only: no memory, no init
        ref = timm.create_model(name, pretrained=False)
        ours = VisionTransformer(get_variant(name).config())
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == \
           {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    cfg = ref.pretrained_cfg
    pp = get_variant(name).preprocess()
    assert tuple(cfg["input_size"][1:]) == pp.input_size
    assert tuple(cfg["mean"]) == pp.mean and tuple(cfg["std"]) == pp.std
    assert cfg["crop_pct"] == pp.crop_pct and cfg["interpolation"] == pp.interpolation


@pytest.mark.parametrize("size,crop,interp", [((224, 224), 0.9, "bicubic"), ((384, 384), 1.0, "bicubic"),
                                              ((96, 128), 0.875, "bilinear")])
def test_preprocess_matches_timm_transform(size, crop, interp):
    from timm.data import create_transform

    pp = Preprocess(input_size=size, crop_pct=crop, interpolation=interp, mean=(0.485, 0.456, 0.406),
                    std=(0.229, 0.224, 0.225))
    tf = create_transform(input_size=(3, *size), crop_pct=crop, interpolation=interp, mean=pp.mean, std=pp.std)
    for path in sorted((ROOT / "calibration" / "photos" / "calib").glob("*.jpg"))[:4]:
        img = Image.open(path)
        ref = tf(img.convert("RGB")).numpy()
        ours = preprocess_image(img, pp)
        assert ours.shape == ref.shape
        assert np.abs(ours - ref).max() < 0.05  # PIL vs torchvision resize rounding
        assert np.abs(ours - ref).mean() < 0.005


@pytest.mark.parametrize("mode", ["RGBA", "LA", "L"])
def test_grayscale_and_transparent_images_become_rgb_on_white(tmp_path, mode):
    """Random pixels with varying alpha, against PIL's own compositing on white and timm's eval transform."""
    from timm.data import create_transform

    rng = np.random.default_rng(0)
    channels = {"RGBA": 4, "LA": 2, "L": 1}[mode]
    pixels = rng.integers(0, 256, (52, 40, channels), dtype=np.uint8)
    if channels > 1:
        pixels[:13, :, -1] = 0  # fully transparent rows, fully opaque rows, the rest in between
        pixels[13:26, :, -1] = 255
    img = Image.fromarray(pixels[..., 0] if channels == 1 else pixels, mode)
    img.save(tmp_path / "img.png")
    pp = Preprocess(input_size=(32, 32), crop_pct=0.875, interpolation="bicubic", mean=(0.485, 0.456, 0.406),
                    std=(0.229, 0.224, 0.225))
    white = Image.new("RGBA", img.size, (255, 255, 255, 255))
    rgb = Image.alpha_composite(white, img.convert("RGBA")).convert("RGB") if channels > 1 else img.convert("RGB")
    tf = create_transform(input_size=(3, *pp.input_size), crop_pct=pp.crop_pct, interpolation=pp.interpolation,
                          mean=pp.mean, std=pp.std)
    ref = tf(rgb).numpy()
    assert ref.std() > 0.5  # the oracle's image is not uniform: a wrong conversion shows
    for ours in (load_image(tmp_path / "img.png", pp), preprocess_image(img, pp)):
        assert ours.shape == ref.shape
        assert np.abs(ours - ref).max() < 5e-6, np.abs(ours - ref).max()


def test_image_folder_labels_and_recursion(tmp_path):
    for cls in ("cat", "dog"):
        (tmp_path / cls / "nested").mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (20, 20), (i * 100, 0, 0)).save(tmp_path / cls / f"{i}.png")
    ds = load_folder(tmp_path, Preprocess(input_size=(16, 16), crop_pct=1.0))
    assert ds.classes == ["cat", "dog"] and list(ds.labels) == [0, 0, 1, 1]
    # a nested layout is not ImageFolder: recursive, unlabelled
    Image.new("RGB", (20, 20)).save(tmp_path / "cat" / "nested" / "deep.webp")
    ds2 = load_folder(tmp_path, Preprocess(input_size=(16, 16), crop_pct=1.0))
    assert ds2.labels is None and len(ds2) == 5


@pytest.mark.parametrize("text,expected", [("384", (384, 384)), ("384x512", (384, 512)), ("224X224", (224, 224))])
def test_parse_img_size(text, expected):
    assert parse_img_size(text) == expected


def test_labels_follow_the_model_classes():
    ds = Dataset(np.zeros((3, 3, 4, 4), np.float32), np.array([0, 1, 2]), [], ["2", "10", "7"], "x")
    labels, why = labels_for_model(ds, 1000)
    assert why is None and list(labels) == [2, 10, 7]  # folder names are class indices
    ds2 = Dataset(ds.x, np.array([0, 1, 2]), [], ["cat", "dog", "eel"], "x")
    assert labels_for_model(ds2, 1000)[0] is None and "1000" in labels_for_model(ds2, 1000)[1]
    assert list(labels_for_model(ds2, 3)[0]) == [0, 1, 2]
    assert labels_for_model(ds2, 0)[0] is None
