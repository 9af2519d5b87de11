"""SAM judged by its masks: a backend's image embeddings and the FP32 reference's go through the same decoder graph
(`decoder.onnx`, FP32, in ONNX Runtime: validate.sam_masks runs it) with the same fixed prompts, and the masks are
compared by IoU.

The prompts (`PROMPTS`) are fractions of the encoder's input frame, where the image lies from the top left (SAM's
processor pads below and right): five single foreground points, a foreground and a background point together, and
two boxes. For each prompt the mask is the one SAM's own script picks from the reference's scores (`select_mask`),
and the candidate's mask of the same index is compared with it, so a candidate is judged on the mask a user would
have got, not on a choice that flipped between two near-equal scores. A mask is the decoder's low-resolution logits
(4 x the embedding's side: 256 for SAM) above 0; two empty masks agree (IoU 1).

Per image: the mean IoU over its prompts and the worst; over the set, the mean of the images' means with its 95 %
t-interval (`parity.stats.mean_interval`), and the worst prompt of any image.

Against ground truth (`<stem>.mask.png` beside an image, data.dense_truth: each value other than 0 and 255 one
object, 255 ignored): each object is prompted twice, as SAM is evaluated, by one foreground point at its most
interior pixel (`interior_point`) and by its bounding box; the chosen mask, post-processed to the image's size as
SAM's processor does (`postprocess_masks`), is compared with the object by IoU over the pixels not ignored. An
image's figure is the mean over its objects (the `MAX_OBJECTS` largest).
"""

from __future__ import annotations

import numpy as np

from .dense import IGNORE_INDEX, resize_maps

MAX_OBJECTS = 32  # the largest objects of an image's truth that are judged (each is two prompts)

# (points [(x, y, label)], box (x0, y0, x1, y1) or None), as fractions of the input frame's side
PROMPTS: tuple[tuple[tuple[tuple[float, float, int], ...], tuple[float, float, float, float] | None], ...] = (
    (((0.5, 0.3, 1),), None), (((0.3, 0.3, 1),), None), (((0.7, 0.3, 1),), None), (((0.3, 0.5, 1),), None),
    (((0.7, 0.5, 1),), None), (((0.5, 0.4, 1), (0.1, 0.1, 0)), None),
    ((), (0.2, 0.15, 0.8, 0.55)), ((), (0.05, 0.05, 0.45, 0.45)),
)


def mask_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of boolean masks (..., H, W) -> (...); 1 where both are empty."""
    inter = np.logical_and(a, b).sum(axis=(-2, -1))
    union = np.logical_or(a, b).sum(axis=(-2, -1))
    return np.where(union == 0, 1.0, inter / np.maximum(union, 1))


def compare_masks(decode, ref: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The IoU of the candidate's mask with the reference's for every image and prompt (B, P), the mask chosen from
    the reference's scores. `decode`: the prompted decoder (validate.sam_masks.PromptedMasks): decode(embeddings) ->
    (masks (B, P, M, S, S) bool, scores (B, P, M)), decode.rows(prompt), decode.select(scores, rows)."""
    ref_masks, ref_scores = decode(ref)
    out_masks, _ = decode(out)
    B, P = ref_scores.shape[:2]
    iou = np.zeros((B, P))
    for p in range(P):
        rows = decode.rows(p)
        for b in range(B):
            k = decode.select(ref_scores[b, p], rows)
            iou[b, p] = mask_iou(ref_masks[b, p, k], out_masks[b, p, k])
    return iou


def postprocess_masks(low: np.ndarray, image_size: int, resized: tuple[int, int], size: tuple[int, int]) -> np.ndarray:
    """The decoder's (M, S, S) low-resolution logits -> (M, H, W) boolean masks at the image's size, as SamProcessor
    post-processes them: up to the input frame, the resized image's part (rows, cols) cropped, then to the image."""
    frame = resize_maps(low, (image_size, image_size), "bilinear")[:, :resized[0], :resized[1]]
    return resize_maps(frame, size, "bilinear") > 0


def interior_point(obj: np.ndarray) -> tuple[int, int]:
    """(x, y) of the pixel of a boolean mask farthest inside it (4-neighbour erosions until the next would leave
    nothing; of what is left, the pixel nearest its centroid): inside even for a ring or a crescent."""
    core = obj
    while True:
        inner = core.copy()
        inner[1:] &= core[:-1]
        inner[:-1] &= core[1:]
        inner[:, 1:] &= core[:, :-1]
        inner[:, :-1] &= core[:, 1:]
        inner[0], inner[-1], inner[:, 0], inner[:, -1] = False, False, False, False  # the image's edge is outside
        if not inner.any():
            break
        core = inner
    ys, xs = np.nonzero(core)
    i = int(np.argmin((ys - ys.mean()) ** 2 + (xs - xs.mean()) ** 2))
    return int(xs[i]), int(ys[i])


def truth_objects(gt: np.ndarray) -> list[tuple[np.ndarray, tuple[int, int], tuple[int, int, int, int]]]:
    """[(object mask, interior point (x, y), box (x0, y0, x1, y1))] of an (H, W) truth map, largest first."""
    values, counts = np.unique(gt[(gt != 0) & (gt != IGNORE_INDEX)], return_counts=True)
    out = []
    for v in values[np.argsort(-counts, kind="stable")][:MAX_OBJECTS]:
        obj = gt == v
        ys, xs = np.nonzero(obj)
        out.append((obj, interior_point(obj), (int(xs.min()), int(ys.min()), int(xs.max()), int(ys.max()))))
    return out


def truth_iou(pred: np.ndarray, obj: np.ndarray, gt: np.ndarray) -> float:
    """IoU of a predicted (H, W) mask with an object over the pixels its truth map does not ignore."""
    keep = gt != IGNORE_INDEX
    return float(mask_iou(pred & keep, obj & keep))
