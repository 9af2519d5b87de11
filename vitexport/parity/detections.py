"""A detector's outputs as detections, and a backend's detections judged by the task: COCO's mAP (parity.coco).

`postprocess` is transformers' RF-DETR post_process_object_detection in numpy: a sigmoid per class (no background
column), the best top_k over queries x classes (a query may give several labels), boxes cx, cy, w, h -> x0, y0, x1,
y1 at each image's own size (no clipping), the scores above a threshold kept (strictly).

`DetectionAccumulator` judges a candidate against the reference, image by image as the bench streams them: the
reference's detections above its threshold are the truth (pseudo ground truth: agreement, not accuracy), the
candidate's top_k the detections, scored with COCO's mAP@[.5:.95] and AP50 (95 % bootstrap intervals over the
images); beside them each reference box's best IoU with a candidate box of its class, and their score difference
(means over the images with t-intervals). With ground truth (data.detection_truth), both the reference's and the
candidate's detections are scored against it: mAP, AP50 and AP per size, each with its interval, and the paired
difference (candidate - reference) with its interval.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .boxes import cxcywh_to_xyxy
from .coco import CocoEval, box_iou, bootstrap
from .examples import Worst, detection_pictures
from .stats import mean_interval


@dataclass
class Detections:
    """One image's detections: boxes (n, 4) x0, y0, x1, y1 in pixels, scores (n,) float32, labels (n,) int64, best
    first."""

    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray

    def above(self, threshold: float) -> "Detections":
        keep = self.scores > threshold
        return Detections(self.boxes[keep], self.scores[keep], self.labels[keep])


def sigmoid(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x))).astype(np.float32)


def postprocess(logits: np.ndarray, boxes: np.ndarray, sizes: list[tuple[int, int]], top_k: int,
                threshold: float = 0.0) -> list[Detections]:
    """logits (B, Q, C), boxes (B, Q, 4) normalised cx, cy, w, h; sizes: each image's (height, width) -> its
    detections (the processor's post_process_object_detection; ties in score keep the lower index first)."""
    prob = sigmoid(logits)
    B, Q, C = prob.shape
    k = min(top_k, Q * C)
    flat = prob.reshape(B, Q * C)
    order = np.argsort(-flat, axis=1, kind="stable")[:, :k]  # (B, k)
    out = []
    for b in range(B):
        h, w = sizes[b]
        idx = order[b]
        xyxy = cxcywh_to_xyxy(np.asarray(boxes[b], np.float32))[idx // C] * np.array([w, h, w, h], np.float32)
        out.append(Detections(xyxy, flat[b, idx], (idx % C).astype(np.int64)).above(threshold))
    return out


def split(query_outputs: np.ndarray, num_labels: int) -> tuple[np.ndarray, np.ndarray]:
    """The judged output (B, Q, labels + 4) -> logits (B, Q, labels), boxes (B, Q, 4)."""
    q = np.asarray(query_outputs, np.float32)
    return q[..., :num_labels], q[..., num_labels:num_labels + 4]


def matched_boxes(ref: Detections, out: Detections) -> tuple[float, float]:
    """(mean over the reference's boxes of the best IoU of a candidate box of its class, mean |score difference|
    to that box); (1, 0) for an image where the reference finds nothing, (0, 1) where the candidate finds nothing."""
    if not len(ref.boxes):
        return 1.0, 0.0
    ious = box_iou(ref.boxes.astype(np.float64), out.boxes.astype(np.float64), np.zeros(len(out.boxes), bool))
    ious = np.where(ref.labels[:, None] == out.labels[None, :], ious, -1.0)
    if not ious.size:
        return 0.0, 1.0
    best = ious.argmax(axis=1)
    iou = np.clip(ious[np.arange(len(best)), best], 0.0, None)
    diff = np.where(iou > 0, np.abs(ref.scores - out.scores[best]), ref.scores)
    return float(iou.mean()), float(diff.mean())


@dataclass
class DetectionSettings:
    """How a detector's outputs become detections (model.heads.detection_config's fields)."""

    num_labels: int
    top_k: int
    threshold: float  # the reference's detections above it are the candidate's truth
    size: tuple[int, int]  # the model's input (height, width): boxes against the reference are in its pixels


TRUTH_KEYS = ("map", "map_50", "map_small", "map_medium", "map_large")


class DetectionAccumulator:
    def __init__(self, n: int, settings: DetectionSettings,
                 read_truth: Callable[[int], object | None] | None = None, worst: Worst | None = None) -> None:
        self.n, self.s, self.read_truth = n, settings, read_truth
        self.worst = worst  # the images whose detections differ most from the reference's (parity.examples)
        self.coco = CocoEval()
        self.iou, self.score_diff = np.zeros(n), np.zeros(n)
        self.truth_evals: tuple[CocoEval, CocoEval] | None = None
        self.truth_n = 0

    def update(self, start: int, ref: np.ndarray, out: np.ndarray) -> None:
        s = self.s
        ref = np.asarray(ref, np.float32).reshape(len(ref), -1, s.num_labels + 4)
        out = np.asarray(out, np.float32).reshape(len(out), -1, s.num_labels + 4)
        sizes = [s.size] * len(ref)
        ref_dets = postprocess(*split(ref, s.num_labels), sizes, s.top_k)
        out_dets = postprocess(*split(out, s.num_labels), sizes, s.top_k)
        for i, (r, o) in enumerate(zip(ref_dets, out_dets)):
            truth = r.above(s.threshold)
            self.coco.add(truth.boxes, truth.labels, o.boxes, o.scores, o.labels)
            self.iou[start + i], self.score_diff[start + i] = matched_boxes(truth, o)
            self._offer(start + i, truth, o.above(s.threshold))
            if self.read_truth is not None:
                self._against_truth(start + i, ref[i:i + 1], out[i:i + 1])

    def _offer(self, i: int, ref: Detections, out: Detections) -> None:
        """An image for the report, worst first by its matched box IoU (the reference's boxes against the row's)."""
        if self.worst is None:
            return
        iou, diff = float(self.iou[i]), float(self.score_diff[i])
        self.worst.offer(1.0 - iou + diff / 10, lambda: {"index": i, "score": 1.0 - iou, "box_iou": iou,
                                                          "score_diff": diff,
                                                          "maps": detection_pictures(ref, out, self.s.size)})

    def _against_truth(self, i: int, ref: np.ndarray, out: np.ndarray) -> None:
        """Both backends' detections at the image's own size against its ground truth (data.detection_truth)."""
        assert self.read_truth is not None
        gt = self.read_truth(i)
        if self.truth_evals is None:
            self.truth_evals = (CocoEval(), CocoEval())
        for ev, x in zip(self.truth_evals, (ref, out)):
            if gt is None:  # every image is added, so that the reference and the candidate resample together
                ev.add(np.zeros((0, 4)), np.zeros(0), np.zeros((0, 4)), np.zeros(0), np.zeros(0))
                continue
            det = postprocess(*split(x, self.s.num_labels), [gt.size], self.s.top_k)[0]  # type: ignore[attr-defined]
            ev.add(gt.boxes, gt.labels, det.boxes, det.scores, det.labels, gt.crowd,  # type: ignore[attr-defined]
                   gt.area)  # type: ignore[attr-defined]
        self.truth_n += gt is not None

    def fill(self, st, finite: bool) -> None:
        """The figures into a ParityStats `st` (NaN where the candidate gave non-finite values)."""
        st.dense = "detection"
        nan = float("nan")
        figures = self.coco.stats(keys=("map", "map_50"))
        if figures["map"] >= 0:  # -1: the reference detects nothing above its threshold on any image
            ci = bootstrap([self.coco], ("map", "map_50"))
            st.map, st.map_ci = (figures["map"], ci["map"][0]) if finite else (nan, [nan, nan])
            st.map_50, st.map_50_ci = (figures["map_50"], ci["map_50"][0]) if finite else (nan, [nan, nan])
        for name, v in (("box_iou", self.iou), ("score_diff", self.score_diff)):
            m, lo, hi = mean_interval(v) if finite else (nan,) * 3
            setattr(st, name, m)
            setattr(st, f"{name}_ci", [max(lo, 0.0), min(hi, 1.0)])
        if self.truth_evals is not None and self.truth_n:
            st.truth = self._truth_figures()

    def _truth_figures(self) -> dict:
        """Over the images with ground truth: the candidate's figure with its 95 % interval, the reference's, and the
        paired difference (candidate - reference) with its interval."""
        assert self.truth_evals is not None
        ref_ev, out_ev = self.truth_evals
        ref_s, out_s = ref_ev.stats(), out_ev.stats()
        ci = bootstrap([ref_ev, out_ev], TRUTH_KEYS)
        out: dict = {"n": self.truth_n}
        for k in TRUTH_KEYS:
            if out_s[k] < 0:  # no truth of that size
                continue
            out[k] = {"reference": ref_s[k], "value": out_s[k], "ci": ci[k][1], "diff": out_s[k] - ref_s[k],
                      "diff_ci": ci[k][2]}
        return out


__all__ = ["DetectionAccumulator", "DetectionSettings", "Detections", "matched_boxes", "postprocess", "split"]
