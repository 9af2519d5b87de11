"""Ground truth of a dense model's data set, beside each image with the image's stem:

- depth: `<stem>.depth.npy` (float, the model's units: metres for a metric model) or `<stem>.depth.png` (16-bit,
  value / scale; the scale is --depth-scale, 1000 by default: millimetres, as NYUv2 ships them; KITTI's is 256);
  0 (or a non-finite .npy value) means no value at that pixel;
- segmentation: `<stem>.mask.png`, class indices as the model numbers its classes, 255 ignored.

These files are ground truth, not images: listing a data folder leaves them out (`is_truth`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import VitexportError
from ..parity.dense import IGNORE_INDEX

TRUTH_SUFFIXES = {"depth": (".depth.npy", ".depth.png"), "segmentation": (".mask.png",)}
DEFAULT_DEPTH_SCALE = 1000.0


def is_truth(path: Path) -> bool:
    name = path.name.lower()
    return any(name.endswith(s) for suffixes in TRUTH_SUFFIXES.values() for s in suffixes)


def truth_for(image: Path, kind: str) -> Path | None:
    """The ground-truth file beside `image` for a `kind` model, or None."""
    for suffix in TRUTH_SUFFIXES.get(kind, ()):
        p = image.with_name(image.stem + suffix)
        if p.is_file():
            return p
    return None


def read_depth(path: Path, scale: float = DEFAULT_DEPTH_SCALE) -> np.ndarray:
    """(H, W) float64 depth, 0 where there is no value; one sentence for a file that is not a depth map."""
    try:
        if path.suffix.lower() == ".npy":
            d = np.load(path, allow_pickle=False).astype(np.float64)
            if d.ndim == 3 and 1 in (d.shape[0], d.shape[-1]):
                d = d.reshape(d.shape[1:] if d.shape[0] == 1 else d.shape[:2])
        else:
            from PIL import Image

            with Image.open(path) as img:
                d = np.asarray(img).astype(np.float64) / scale
    except (OSError, ValueError) as e:
        raise VitexportError(f"Depth map {path} cannot be read ({e}).") from None
    if d.ndim != 2:
        raise VitexportError(f"Depth map {path} has shape {d.shape}, not (height, width).")
    d[~np.isfinite(d) | (d < 0)] = 0.0
    return d


def read_mask(path: Path) -> np.ndarray:
    """(H, W) int64 class indices (IGNORE_INDEX: no class)."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            if img.mode not in ("L", "P", "I", "I;16"):
                raise VitexportError(f"Mask {path} is a {img.mode} image, not one of class indices (L, P or I).")
            return np.asarray(img).astype(np.int64)
    except OSError as e:
        raise VitexportError(f"Mask {path} cannot be read ({e}).") from None


def truth_reader(files: list, kind: str, scale: float = DEFAULT_DEPTH_SCALE):
    """index -> that image's truth map (read when asked, so memory holds one at a time) or None."""
    def read(i: int) -> np.ndarray | None:
        path = files[i]
        if path is None:
            return None
        return read_depth(path, scale) if kind == "depth" else read_mask(path)
    return read
