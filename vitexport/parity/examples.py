"""The images that explain a miss, kept while a row's figures are gathered (parity.accumulate hands each batch
here): a classifier's images whose top-1 differs from the reference's, with both top-3s; a dense model's worst
images, with the reference's map, the row's and the error between them as small pictures. A bounded heap of the
worst few per row, so memory does not grow with the set; an image's picture is made only when it enters the heap.
"""

from __future__ import annotations

import base64
import heapq
import io
import itertools
from typing import Callable

import numpy as np

MAX_FLIPS = 16  # a classifier's flipped images kept per row, the worst first
MAX_DENSE = 6  # a dense model's worst images kept per row (three small maps each)
MAP_SIDE = 128  # the longest side of a dense map's picture, pixels
TOP = 3  # classes shown per image


class Worst:
    """The `limit` records with the highest scores offered; `make()` is called only for one that gets in."""

    def __init__(self, limit: int) -> None:
        self.limit, self._heap, self._order = limit, [], itertools.count()

    def offer(self, score: float, make: Callable[[], dict]) -> None:
        if self.limit <= 0:
            return
        if not np.isfinite(score):
            score = float("inf")  # a NaN in the output is as wrong as it gets
        if len(self._heap) >= self.limit and score <= self._heap[0][0]:
            return
        item = (score, -next(self._order), make())
        if len(self._heap) < self.limit:
            heapq.heappush(self._heap, item)
        else:
            heapq.heapreplace(self._heap, item)

    def records(self) -> list[dict]:
        """Worst first (the first offered first among equal scores)."""
        return [rec for _, _, rec in sorted(self._heap, key=lambda t: (-t[0], -t[1]))]


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def top_classes(probs: np.ndarray, k: int = TOP) -> list[list]:
    """[[class, probability], ...] of the k most probable classes, most probable first."""
    order = np.argsort(-probs, kind="stable")[:k]
    return [[int(c), float(probs[c])] for c in order]


def offer_flips(worst: Worst, start: int, ref: np.ndarray, out: np.ndarray) -> None:
    """A batch's (B, C) logits: each image whose top-1 differs from the reference's, scored by the probability the
    row took off the reference's answer (a confident answer lost is the worst)."""
    r1, o1 = ref.argmax(1), out.argmax(1)
    for i in np.flatnonzero(r1 != o1):
        pr, po = softmax(ref[i]), softmax(out[i])
        score = float(pr[r1[i]] - po[r1[i]])
        worst.offer(score, lambda i=i, pr=pr, po=po, score=score: {
            "index": start + int(i), "score": score, "reference": top_classes(pr), "output": top_classes(po)})


# -- a dense model's pictures ----------------------------------------------------------------------------------

# inferno-like stops for a depth map and a heat map (0: dark, 1: bright)
_HEAT = np.array([[0, 0, 4], [87, 16, 110], [188, 55, 84], [249, 142, 9], [252, 255, 164]], np.float64)


def colour_map(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """(H, W) values -> (H, W, 3) uint8 through _HEAT, lo..hi spread over it (clipped)."""
    t = np.clip((np.asarray(x, np.float64) - lo) / max(hi - lo, 1e-12), 0, 1) * (len(_HEAT) - 1)
    i = np.minimum(t.astype(int), len(_HEAT) - 2)
    f = (t - i)[..., None]
    return (_HEAT[i] * (1 - f) + _HEAT[i + 1] * f).round().astype(np.uint8)


def palette(classes: int) -> np.ndarray:
    """(classes, 3) uint8: distinct colours by the golden-angle hue walk (class 0 a dark grey)."""
    import colorsys

    rgb = [colorsys.hsv_to_rgb((c * 0.618034) % 1.0, 0.65, 0.95) for c in range(max(classes, 1))]
    out = (np.asarray(rgb) * 255).round().astype(np.uint8)
    out[0] = (60, 60, 60)
    return out


def picture_uri(rgb: np.ndarray, side: int, fmt: str = "PNG", nearest: bool = False) -> str:
    """An (H, W, 3) uint8 picture as a data: URI (PNG, or JPEG for a photo), its longest side at most `side`."""
    from PIL import Image

    img = Image.fromarray(np.ascontiguousarray(rgb))
    scale = side / max(img.size)
    if scale < 1:
        img = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))),
                         Image.NEAREST if nearest else Image.BILINEAR)
    buf = io.BytesIO()
    img.save(buf, format=fmt, **({"optimize": True} if fmt == "PNG" else {"quality": 82}))
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def png_uri(rgb: np.ndarray, nearest: bool = False) -> str:
    """A dense map's picture: PNG, its longest side at most MAP_SIDE."""
    return picture_uri(rgb, MAP_SIDE, nearest=nearest)


def depth_pictures(ref: np.ndarray, out: np.ndarray) -> dict:
    """An image's (H, W) depth maps: the reference's and the row's on one scale (the reference's 2nd-98th
    percentile), and |row - reference| as a heat map from 0 to its largest value (said with it)."""
    ref, out = np.asarray(ref, np.float64).reshape(ref.shape[-2:]), np.asarray(out, np.float64).reshape(ref.shape[-2:])
    lo, hi = np.percentile(ref, [2, 98])
    err = np.abs(out - ref)
    top = float(err.max())
    return {"reference": png_uri(colour_map(ref, lo, hi)), "output": png_uri(colour_map(out, lo, hi)),
            "error": png_uri(colour_map(err, 0.0, top if top > 0 else 1.0)), "error_max": top,
            "error_what": "|depth - reference depth|"}


def segmentation_pictures(ref: np.ndarray, out: np.ndarray) -> dict:
    """An image's (C, H, W) logits: both class maps in one palette, and the pixels whose class differs in red over
    the reference's map dimmed."""
    classes = ref.shape[0]
    a, b = ref.argmax(0), out.argmax(0)
    pal = palette(classes)
    differ = a != b
    dim = (pal[a] * 0.35).astype(np.uint8)
    dim[differ] = (255, 40, 40)
    return {"reference": png_uri(pal[a], nearest=True), "output": png_uri(pal[b], nearest=True),
            "error": png_uri(dim, nearest=True), "error_max": float(differ.mean()),
            "error_what": "pixels whose class differs (share of the image)"}


def boxes_picture(boxes: np.ndarray, labels: np.ndarray, size: tuple[int, int], colour=None,
                  canvas: np.ndarray | None = None) -> np.ndarray:
    """(H, W, 3) uint8: x0, y0, x1, y1 boxes outlined (each in its class's colour, or `colour`) on a dark canvas."""
    from PIL import Image, ImageDraw

    img = Image.fromarray(canvas if canvas is not None else np.full((*size, 3), 40, np.uint8))
    pen = ImageDraw.Draw(img)
    pal = palette(int(labels.max()) + 1 if len(labels) else 1)
    for b, c in zip(np.asarray(boxes, np.float64).tolist(), np.asarray(labels).tolist()):
        pen.rectangle(b, outline=tuple(int(v) for v in (colour if colour is not None else pal[c])),
                      width=max(1, round(max(size) / 96)))
    return np.asarray(img)


def detection_pictures(ref, out, size: tuple[int, int]) -> dict:
    """An image's detections (parity.detections.Detections above the threshold): the reference's boxes, the row's,
    and both over each other (the reference's green, the row's red)."""
    both = boxes_picture(ref.boxes, ref.labels, size, (60, 220, 90))
    both = boxes_picture(out.boxes, out.labels, size, (240, 60, 60), canvas=both)
    return {"reference": png_uri(boxes_picture(ref.boxes, ref.labels, size)),
            "output": png_uri(boxes_picture(out.boxes, out.labels, size)), "error": png_uri(both),
            "error_max": float(len(out.boxes)), "error_what": "the reference's boxes (green) and this row's (red); "
                                                              "its boxes above the threshold"}


def offer_dense(worst: Worst, kind: str, start: int, ref: np.ndarray, out: np.ndarray, scores: np.ndarray,
                figures: dict[str, np.ndarray]) -> None:
    """A batch of dense outputs, each scored by how far it is from the reference (higher: worse); `figures` the
    per-image task figures to show with it. SAM's masks ('masks') are listed without maps."""
    pictures = {"depth": depth_pictures, "segmentation": segmentation_pictures}.get(kind)
    for i, score in enumerate(np.asarray(scores, np.float64)):
        def make(i=i, score=score):
            rec = {"index": start + i, "score": float(score), **{k: float(v[i]) for k, v in figures.items()}}
            if pictures is not None:
                rec["maps"] = pictures(ref[i], out[i])
            return rec
        worst.offer(float(score), make)
