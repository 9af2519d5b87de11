"""Box formats, each named once and converted by one function: `cxcywh` (a centre and a size, what DETRs predict,
normalised to the input), `xyxy` (two corners: x0, y0, x1, y1, what COCO's evaluation and the pictures use here),
`xywh` (COCO's JSON: a corner and a size, in pixels)."""

from __future__ import annotations

import numpy as np


def cxcywh_to_xyxy(b: np.ndarray) -> np.ndarray:
    cx, cy, w, h = np.moveaxis(np.asarray(b), -1, 0)
    return np.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], axis=-1)


def xyxy_to_xywh(b: np.ndarray) -> np.ndarray:
    x0, y0, x1, y1 = np.moveaxis(np.asarray(b), -1, 0)
    return np.stack([x0, y0, x1 - x0, y1 - y0], axis=-1)


def xywh_to_xyxy(b: np.ndarray) -> np.ndarray:
    x, y, w, h = np.moveaxis(np.asarray(b), -1, 0)
    return np.stack([x, y, x + w, y + h], axis=-1)


__all__ = ["cxcywh_to_xyxy", "xywh_to_xyxy", "xyxy_to_xywh"]
