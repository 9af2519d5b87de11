"""What "the same answers" means for a dense output, judged by the task's own metric per image:

- depth (`predicted_depth`, (B, H, W)): AbsRel, mean |d - d_ref| / d_ref over the pixels where the reference has a
  depth (d_ref > 0: a relative model's ReLU gives zeros), and delta1, the share of those pixels with
  max(d / d_ref, d_ref / d) < 1.25 (a pixel the candidate puts at 0 or below misses it), as they are: a backend must
  give the same numbers, scale included;
- segmentation (`logits`, (B, C, H, W)): the share of pixels whose class (the argmax) is the reference's, and the mIoU
  of the candidate's map against the reference's over the set (each class's pixels pooled over the images).

Per image only these figures are kept (parity.accumulate: a depth's two numbers, a segmentation's pixel share and
its classes' intersections and unions); means carry 95 % t-intervals (parity.stats), a set's mIoU a bootstrap one.
"""

from __future__ import annotations

import numpy as np

DELTA1 = 1.25
IGNORE_INDEX = 255  # a segmentation truth's pixel without a class


def depth_figures(ref: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per image of (B, H, W) depth maps: (AbsRel, delta1) of `out` against `ref`."""
    ref = ref.reshape(len(ref), -1).astype(np.float64)
    out = out.reshape(len(out), -1).astype(np.float64)
    valid = ref > 0
    count = np.maximum(valid.sum(1), 1)
    safe_ref = np.where(valid, ref, 1.0)
    absrel = (np.abs(out - ref) / safe_ref * valid).sum(1) / count
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.maximum(out / safe_ref, safe_ref / np.where(out > 0, out, np.nan))
    within = valid & (out > 0) & (ratio < DELTA1)
    delta1 = within.sum(1) / count
    none = ~valid.any(1)  # an image the reference puts at no depth anywhere: right only if the candidate does too
    if none.any():
        zero = np.abs(out[none]).max(1) == 0
        absrel[none], delta1[none] = np.where(zero, 0.0, 1.0), zero.astype(np.float64)
    return absrel, delta1


def class_maps(logits: np.ndarray) -> np.ndarray:
    """(B, C, H, W) logits -> (B, H*W) class indices."""
    return logits.reshape(logits.shape[0], logits.shape[1], -1).argmax(1)


def class_counts(a: np.ndarray, b: np.ndarray, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Per image of (B, P) class maps: (intersection, union) of each class's pixels in `a` and in `b`, (B, C)
    each."""
    inter = np.stack([np.bincount(x[x == y], minlength=classes)[:classes] for x, y in zip(a, b)])
    union = np.stack([np.bincount(x, minlength=classes)[:classes] + np.bincount(y, minlength=classes)[:classes]
                      for x, y in zip(a, b)]) - inter
    return inter.astype(np.float64), union.astype(np.float64)


def set_miou(inter: np.ndarray, union: np.ndarray) -> float:
    """The mIoU of a set from its images' (N, C) counts: per class, its pixels' IoU over the whole set; their mean
    over the classes the set has (the standard mIoU; a per-image mean swings with each image's rarest class)."""
    i, u = inter.sum(0), union.sum(0)
    present = u > 0
    return float((i[present] / u[present]).mean()) if present.any() else 1.0


def bootstrap_miou(counts: list[tuple[np.ndarray, np.ndarray]], resamples: int = 1000,
                   seed: int = 0) -> list[list[float]]:
    """95 % percentile intervals of each set's mIoU and of the differences of the later ones from the first, the
    images resampled together (the same resample for every set: paired), deterministic."""
    n = len(counts[0][0])
    rng = np.random.default_rng(seed)
    draws = np.zeros((resamples, len(counts)))
    for start in range(0, resamples, 100):
        w = rng.multinomial(n, np.full(n, 1.0 / n), size=min(100, resamples - start)).astype(np.float64)
        for j, (inter, union) in enumerate(counts):
            i, u = w @ inter, w @ union  # (R, C)
            with np.errstate(invalid="ignore", divide="ignore"):
                iou = np.where(u > 0, i / np.where(u > 0, u, 1), np.nan)
            draws[start:start + len(w), j] = np.nan_to_num(np.nanmean(iou, axis=1), nan=1.0)
    cols = [draws[:, j] for j in range(len(counts))] + [draws[:, j] - draws[:, 0] for j in range(1, len(counts))]
    return [[float(np.percentile(c, 2.5)), float(np.percentile(c, 97.5))] for c in cols]


def figures(kind: str, ref: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per image: depth's (AbsRel, delta1); segmentation's (pixel agreement, intersections, unions)."""
    if kind == "depth":
        return depth_figures(ref, out)
    a, b = class_maps(ref), class_maps(out)
    return ((a == b).mean(1), *class_counts(a, b, ref.shape[1]))


# -- against ground truth (data.dense_truth): each backend's map at the truth's own size, as the processor
# post-processes it (depth bicubic, segmentation logits bilinear), judged by the task's metric ------------------------

TRUTH_FIGURES = {"depth": ("absrel", "delta1"), "segmentation": ("pixel_acc", "miou")}


def resize_maps(maps: np.ndarray, size: tuple[int, int], mode: str) -> np.ndarray:
    """(C, h, w) float maps -> (C, H, W) at the image's size, as transformers' processors resize them."""
    import torch
    import torch.nn.functional as F

    t = torch.from_numpy(np.ascontiguousarray(maps, np.float32))[None]
    return F.interpolate(t, size=size, mode=mode, align_corners=False)[0].numpy()


def scale_shift_depth(pred: np.ndarray, gt: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """A relative model's output (affine-invariant disparity) as depth: the least-squares scale and shift that
    bring it to the truth's disparity (1 / depth) over the valid pixels, as MiDaS and Depth Anything evaluate."""
    p, target = pred[valid], 1.0 / gt[valid]
    a = np.stack([p, np.ones_like(p)], axis=1)
    (s, t), *_ = np.linalg.lstsq(a, target, rcond=None)
    disparity = s * pred + t
    return 1.0 / np.maximum(disparity, 1.0 / max(float(gt[valid].max()), 1e-6) / 10)  # at most 10x the far end


def depth_truth_figures(pred: np.ndarray, gt: np.ndarray, relative: bool) -> tuple[float, float]:
    """(AbsRel, delta1) of one (h, w) depth output against its (H, W) truth (0: no value)."""
    depth = resize_maps(pred[None], gt.shape, "bicubic")[0].astype(np.float64)
    valid = gt > 0
    if not valid.any():
        return float("nan"), float("nan")
    if relative:
        depth = scale_shift_depth(depth, gt, valid)
    d, g = depth[valid], gt[valid]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(d > 0, np.maximum(d / g, g / d), np.inf)
    return float((np.abs(d - g) / g).mean()), float((ratio < DELTA1).mean())


def segmentation_truth_figures(logits: np.ndarray, mask: np.ndarray, ignore: int) -> tuple[np.ndarray, ...]:
    """One (C, h, w) logits map against its (H, W) class-index truth: (pixel accuracy, the C classes' intersections,
    unions) over the pixels the truth does not ignore (a truth class the model does not have counts against the
    class predicted there)."""
    pred = resize_maps(logits, mask.shape, "bilinear").argmax(0).ravel()
    truth = mask.ravel()
    keep = truth != ignore
    classes = logits.shape[0]
    if not keep.any():
        return np.array(np.nan), np.zeros(classes), np.zeros(classes)
    inter, union = class_counts(truth[keep][None], pred[keep][None], classes)
    return np.array((pred[keep] == truth[keep]).mean()), inter[0], union[0]
