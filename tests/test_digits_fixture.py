"""The shipped digits fixture: the trained checkpoint, its held-out split and its calibration images.

Regenerate all of them with `python scripts/train_digits.py` (see models/digits/README.md).
"""

from pathlib import Path

import numpy as np
import pytest
import torch

from vitexport.data.images import list_images, load_folder
from vitexport.model.variants import DIGITS_VARIANT, get_variant
from vitexport.model.build import build_model
from vitexport.paths import DIGITS_CALIB, DIGITS_CHECKPOINT, DIGITS_HELDOUT

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = ROOT.joinpath(*DIGITS_CHECKPOINT)
HELDOUT = ROOT.joinpath(*DIGITS_HELDOUT)
CALIB = ROOT.joinpath(*DIGITS_CALIB)
MIN_TOP1 = 0.95


def _indices(files) -> set[int]:
    return {int(Path(f).stem) for f in files}


@pytest.fixture(scope="module")
def digits():
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    return sklearn_datasets.load_digits()


@pytest.fixture(scope="module")
def split(digits):
    from sklearn.model_selection import train_test_split

    y = digits.target
    train_idx, test_idx = train_test_split(np.arange(len(y)), test_size=0.2, stratify=y, random_state=0)
    return np.sort(train_idx), np.sort(test_idx)


def test_checkpoint_reaches_heldout_accuracy():
    from safetensors.torch import load_file

    variant = get_variant(DIGITS_VARIANT)
    model = build_model(variant.config())
    model.load_state_dict(load_file(str(CHECKPOINT)), strict=True)
    model.eval()

    ds = load_folder(HELDOUT, variant.preprocess())
    assert ds.labels is not None and ds.classes is not None
    labels = np.array([int(ds.classes[i]) for i in ds.labels])
    with torch.no_grad():
        preds = model(torch.from_numpy(ds.x)).argmax(-1).numpy()
    top1 = float((preds == labels).mean())
    assert top1 >= MIN_TOP1, f"held-out top-1 {top1:.4f} < {MIN_TOP1} on {len(ds)} images"


def test_heldout_matches_fresh_stratified_split(digits, split):
    _, test_idx = split
    y = digits.target
    class_dirs = sorted(d.name for d in HELDOUT.iterdir() if d.is_dir() and not d.name.startswith("."))
    assert class_dirs == [str(c) for c in range(10)]
    for c in range(10):
        files = list_images(HELDOUT / str(c))
        expected = test_idx[y[test_idx] == c]
        assert len(files) == len(expected), f"class {c}: {len(files)} files, split has {len(expected)}"
        assert _indices(files) == set(expected.tolist()), f"class {c}: held-out indices differ from the split"


def test_pngs_hold_the_dataset_pixels(digits):
    from PIL import Image

    expected = np.rint(digits.images * 255.0 / 16.0).astype(np.uint8)
    for f in list_images(HELDOUT)[::40] + list_images(CALIB)[::40]:
        with Image.open(f) as img:
            assert img.mode == "L" and img.size == (8, 8)
            np.testing.assert_array_equal(np.asarray(img), expected[int(f.stem)], err_msg=str(f))


def test_calib_is_training_only_and_disjoint(split):
    train_idx, _ = split
    calib_files = list_images(CALIB)
    assert len(calib_files) == 200
    assert all(f.parent == CALIB for f in calib_files), "calib/ must be flat (no class subfolders)"
    calib = _indices(calib_files)
    heldout = _indices(list_images(HELDOUT))
    assert len(calib) == 200
    assert calib.isdisjoint(heldout)
    assert calib <= set(train_idx.tolist())
