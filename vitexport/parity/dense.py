"""What "the same answers" means for a dense output, judged by the task's own metric per image:

- depth (`predicted_depth`, (B, H, W)): AbsRel, mean |d - d_ref| / d_ref over the pixels where the reference has a
  depth (d_ref > 0: a relative model's ReLU gives zeros), and delta1, the share of those pixels with
  max(d / d_ref, d_ref / d) < 1.25 (a pixel the candidate puts at 0 or below misses it), as they are: a backend must
  give the same numbers, scale included;
- segmentation (`logits`, (B, C, H, W)): the share of pixels whose class (the argmax) is the reference's, and the mIoU
  of the candidate's map against the reference's (over the classes either map has).

Per image only these figures are kept (parity.accumulate); the means carry 95 % t-intervals (parity.stats).
"""

from __future__ import annotations

import numpy as np

DELTA1 = 1.25
IGNORE_INDEX = 255  # a segmentation truth's pixel without a class
DENSE_KINDS = ("depth", "segmentation")
# per kind: the figures kept per image, in order
FIGURES = {"depth": ("absrel", "delta1"), "segmentation": ("pixel_agree", "miou")}


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


def miou(a: np.ndarray, b: np.ndarray, classes: int, ignore: int | None = None) -> np.ndarray:
    """Per image of (B, P) class maps: the mean IoU of `b` against `a` over the classes present in either (pixels
    where `a` is `ignore` left out)."""
    out = np.zeros(len(a))
    for i, (x, y) in enumerate(zip(a, b)):
        keep = x != ignore if ignore is not None else slice(None)
        x, y = x[keep], y[keep]
        if not len(x):
            out[i] = 1.0
            continue
        inter = np.bincount(x[x == y], minlength=classes)
        union = np.bincount(x, minlength=classes) + np.bincount(y, minlength=classes) - inter
        present = union > 0
        out[i] = float((inter[present] / union[present]).mean())
    return out


def segmentation_figures(ref: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per image of (B, C, H, W) logits: (pixel agreement, mIoU) of the candidate's class map with the reference's."""
    a, b = class_maps(ref), class_maps(out)
    return (a == b).mean(1), miou(a, b, ref.shape[1])


def figures(kind: str, ref: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return depth_figures(ref, out) if kind == "depth" else segmentation_figures(ref, out)


# -- against ground truth (data.dense_truth): each backend's map at the truth's own size, as the processor
# post-processes it (depth bicubic, segmentation logits bilinear), judged by the task's metric ------------------------

TRUTH_FIGURES = {"depth": ("absrel", "delta1"), "segmentation": ("miou", "pixel_acc")}


def _resize(maps: np.ndarray, size: tuple[int, int], mode: str) -> np.ndarray:
    import torch
    import torch.nn.functional as F

    t = torch.from_numpy(np.ascontiguousarray(maps, np.float32))[None]
    return F.interpolate(t, size=size, mode=mode, align_corners=False)[0].numpy().astype(np.float64)


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
    depth = _resize(pred[None], gt.shape, "bicubic")[0]
    valid = gt > 0
    if not valid.any():
        return float("nan"), float("nan")
    if relative:
        depth = scale_shift_depth(depth, gt, valid)
    d, g = depth[valid], gt[valid]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(d > 0, np.maximum(d / g, g / d), np.inf)
    return float((np.abs(d - g) / g).mean()), float((ratio < DELTA1).mean())


def segmentation_truth_figures(logits: np.ndarray, mask: np.ndarray, ignore: int) -> tuple[float, float]:
    """(mIoU, pixel accuracy) of one (C, h, w) logits map against its (H, W) class-index truth."""
    pred = _resize(logits, mask.shape, "bilinear").argmax(0).ravel()
    truth = mask.ravel()
    keep = truth != ignore
    if not keep.any():
        return float("nan"), float("nan")
    classes = max(logits.shape[0], int(truth[keep].max()) + 1)
    return float(miou(truth[keep][None], pred[keep][None], classes)[0]), float((pred[keep] == truth[keep]).mean())
