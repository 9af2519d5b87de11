"""Parity figures gathered batch by batch: a backend's outputs are compared with the reference's as they come and
dropped; per image only what the statistics need is kept (a cosine, a max abs difference, top-1 indices and
whether each top-1/top-5 was right), so memory does not grow with the logits of a whole validation set."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .compare import ParityStats
from .dense_accumulate import DenseAccumulator
from .detections import DetectionAccumulator, DetectionSettings
from .examples import MAX_DENSE, MAX_FLIPS, Worst, offer_flips
from .stats import clopper_pearson, paired_drop


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    cos = (a * b).sum(axis=1) / np.maximum(na * nb, 1e-30)
    cos[(na == 0) & (nb == 0)] = 1.0  # two all-zero vectors are identical
    return cos


def _in_top5(logits: np.ndarray, target: np.ndarray) -> np.ndarray:
    k = min(5, logits.shape[1])
    top = np.argpartition(-logits, k - 1, axis=1)[:, :k] if logits.shape[1] > k else np.argsort(-logits, axis=1)
    return (top == target[:, None]).any(1)


@dataclass
class Truth:
    """What is right for each of N images: its class, the classes the set covers (when fewer than the head's: top-1
    is also taken over those alone), and ImageNet-ReaL's classes ((N, K), -1 padded; a row of -1: none)."""

    labels: np.ndarray | None = None
    subset: np.ndarray | None = None
    real: np.ndarray | None = None
    # the output is a dense map judged by its task (parity.dense: 'depth' | 'segmentation'), or SAM's embedding
    # judged by its masks ('masks': parity.masks)
    dense: str | None = None
    # per image index: its ground-truth map (depth (H, W) float, 0 no value; or class indices) or None; None: no
    # image has one (validate.evaluate reads them, data.dense_truth)
    read_truth: "Callable[[int], np.ndarray | None] | None" = None
    relative_depth: bool = True  # a relative depth model: aligned to the truth by scale and shift first
    # (maps, image size) -> the part of the maps over the image (an input padded around it: data.Preprocess)
    image_part: "Callable[[np.ndarray, tuple[int, int]], np.ndarray] | None" = None
    # SAM ('masks'): the decoder graph run with the fixed prompts on an image embedding (validate.sam_masks.PromptedMasks)
    masks: "Callable | None" = None
    # a detector ('detection': parity.detections): how its outputs become detections
    detection: "DetectionSettings | None" = None


def _restricted_top1(logits: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """The top-1 class among `classes` alone."""
    return classes[logits[:, classes].argmax(1)]


class ParityAccumulator:
    """The reference's and one candidate's outputs for images [start, start + B), in any order; `stats()` at the end.

    labels: (N,) class indices of all N images (or a Truth), or None for unlabelled data.
    examples: keep the images that explain a miss (parity.examples); False for the reference against itself.
    """

    def __init__(self, n: int, labels: np.ndarray | Truth | None = None, examples: bool = True) -> None:
        truth = labels if isinstance(labels, Truth) else Truth(labels)
        self.n, self.labels = int(n), None if truth.labels is None else np.asarray(truth.labels, dtype=np.int64)
        self.subset = None if truth.subset is None or self.labels is None else np.asarray(truth.subset, np.int64)
        self.real = None if truth.real is None else np.asarray(truth.real, np.int64)
        self.extra = {k: np.zeros(self.n, bool) for k in ("sub_ref", "sub_out", "real_ref", "real_out")}
        self.seen = np.zeros(self.n, bool)
        self.cos = np.zeros(self.n, np.float64)
        self.max_abs = np.zeros(self.n, np.float64)
        self.abs_sum, self.values, self.finite = 0.0, 0, True
        self.ref_top1 = np.zeros(self.n, np.int64)
        self.out_top1 = np.zeros(self.n, np.int64)
        self.ref_in_top5 = np.zeros(self.n, bool)  # the reference's top-1 is in the candidate's top-5
        self.right = {k: np.zeros(self.n, bool) for k in ("ref1", "out1", "ref5", "out5")}
        self.dense = truth.dense
        # the images that explain a miss (parity.examples): flipped top-1s, or a dense model's worst maps
        self.worst = Worst(0 if not examples else MAX_FLIPS if truth.dense is None else MAX_DENSE)
        self.dense_figures: DenseAccumulator | DetectionAccumulator | None = None
        if truth.dense == "detection":
            if truth.detection is None:
                raise ValueError("a detector's figures need its DetectionSettings")
            self.dense_figures = DetectionAccumulator(self.n, truth.detection, truth.read_truth, self.worst)
        elif truth.dense is not None:
            self.dense_figures = DenseAccumulator(truth.dense, self.n, truth.read_truth, truth.relative_depth,
                                                  truth.image_part, truth.masks, self.worst)

    def update(self, start: int, ref: np.ndarray, out: np.ndarray) -> None:
        if self.dense is not None:
            clean = np.nan_to_num(np.asarray(out, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
            if np.size(ref) == clean.size:  # a stored reference comes back flattened per image (data.OutputStore)
                ref = np.asarray(ref).reshape(clean.shape)
            self.dense_figures.update(start, np.asarray(ref), clean)
        ref = np.asarray(ref, dtype=np.float64).reshape(len(ref), -1)
        out = np.asarray(out, dtype=np.float64).reshape(len(out), -1)
        if ref.shape != out.shape:
            raise ValueError(f"shape mismatch: {ref.shape} vs {out.shape}")
        s = slice(start, start + len(ref))
        self.seen[s] = True
        if not np.all(np.isfinite(out)):
            self.finite = False
            out = np.nan_to_num(out, nan=0.0, posinf=0.0, neginf=0.0)
        diff = np.abs(ref - out)
        self.cos[s], self.max_abs[s] = _cosine(ref, out), diff.max(axis=1)
        self.abs_sum, self.values = self.abs_sum + float(diff.sum()), self.values + diff.size
        self.ref_top1[s], self.out_top1[s] = ref.argmax(1), out.argmax(1)
        self.ref_in_top5[s] = _in_top5(out, self.ref_top1[s])
        if self.dense is None and ref.shape[1] > 1:
            offer_flips(self.worst, start, ref, out)
        if self.labels is not None:
            y = self.labels[s]
            self.right["ref1"][s], self.right["out1"][s] = self.ref_top1[s] == y, self.out_top1[s] == y
            self.right["ref5"][s], self.right["out5"][s] = _in_top5(ref, y), _in_top5(out, y)
            if self.subset is not None:
                self.extra["sub_ref"][s] = _restricted_top1(ref, self.subset) == y
                self.extra["sub_out"][s] = _restricted_top1(out, self.subset) == y
        if self.real is not None:
            real = self.real[s]
            self.extra["real_ref"][s] = (real == self.ref_top1[s][:, None]).any(1)
            self.extra["real_out"][s] = (real == self.out_top1[s][:, None]).any(1)

    def stats(self) -> ParityStats:
        if not self.seen.all():
            raise ValueError(f"{int((~self.seen).sum())} of {self.n} images were never compared")
        n, nan = self.n, float("nan")
        agree = int((self.out_top1 == self.ref_top1).sum())
        st = ParityStats(
            n=n, max_abs=float(self.max_abs.max()) if self.finite else nan,
            mean_abs=self.abs_sum / max(self.values, 1) if self.finite else nan,
            cos_min=float(self.cos.min()) if self.finite else nan, cos_mean=float(self.cos.mean()) if self.finite else nan,
            top1_agree=agree / n if self.finite else 0.0, top5_agree=float(self.ref_in_top5.mean()) if self.finite else 0.0,
            top1_agree_ci=list(clopper_pearson(agree, n)), disagree=n - agree)
        self._real(st)
        self._dense(st)
        if self.labels is None:
            return st
        self._subset(st)
        r = {k: int(v.sum()) for k, v in self.right.items()}
        down = int((self.right["ref1"] & ~self.right["out1"]).sum())
        up = int((~self.right["ref1"] & self.right["out1"]).sum())
        drop, lo, hi = paired_drop(down, up, n)
        st.acc_ref, st.acc = r["ref1"] / n, r["out1"] / n
        st.acc_ref_ci, st.acc_ci = list(clopper_pearson(r["ref1"], n)), list(clopper_pearson(r["out1"], n))
        st.top5_acc_ref, st.top5_acc = r["ref5"] / n, r["out5"] / n
        st.top5_acc_ci = list(clopper_pearson(r["out5"], n))
        st.flips_down, st.flips_up = down, up
        st.acc_drop, st.acc_drop_ci = drop * 100, [lo * 100, hi * 100]
        if not self.finite:
            st.acc, st.acc_drop = 0.0, st.acc_ref * 100
        return st

    def _dense(self, st: ParityStats) -> None:
        if self.dense_figures is not None:
            self.dense_figures.fill(st, self.finite)

    def _subset(self, st: ParityStats) -> None:
        """Top-1 with the logits restricted to the classes the set covers."""
        if self.subset is None:
            return
        ref, out, n = self.extra["sub_ref"], self.extra["sub_out"], self.n
        _, lo, hi = paired_drop(int((ref & ~out).sum()), int((~ref & out).sum()), n)
        st.subset_classes = len(self.subset)
        st.acc_subset_ref, st.acc_subset = float(ref.mean()), float(out.mean())
        st.acc_subset_ci = list(clopper_pearson(int(out.sum()), n))
        st.acc_subset_drop_ci = [lo * 100, hi * 100]

    def _real(self, st: ParityStats) -> None:
        """ImageNet-ReaL top-1: right when the top-1 is any of the image's ReaL classes, over the images with one."""
        if self.real is None:
            return
        has = (self.real >= 0).any(1)
        n = int(has.sum())
        if n == 0:
            return
        ref, out = self.extra["real_ref"][has], self.extra["real_out"][has]
        st.real_n, st.real_acc_ref, st.real_acc = n, float(ref.mean()), float(out.mean())
        st.real_acc_ci = list(clopper_pearson(int(out.sum()), n))
        _, lo, hi = paired_drop(int((ref & ~out).sum()), int((~ref & out).sum()), n)
        st.real_acc_drop_ci = [lo * 100, hi * 100]

    def examples(self) -> list[dict]:
        """The worst images of the run, worst first (parity.examples): index, score and what to show of each."""
        return self.worst.records()

    def per_class(self) -> list[dict]:
        """Top-1 accuracy of the reference and the candidate per labelled class: [{class, n, acc_ref, acc}]."""
        if self.labels is None:
            return []
        out = []
        for c in np.unique(self.labels):
            m = self.labels == c
            out.append({"class": int(c), "n": int(m.sum()), "acc_ref": float(self.right["ref1"][m].mean()),
                        "acc": float(self.right["out1"][m].mean())})
        return out


def compare(ref: np.ndarray, out: np.ndarray, labels: np.ndarray | None = None) -> ParityStats:
    """ref, out: (N, C) logits (or (N, ...) features, flattened per sample), all at once: the streamed figures of
    one batch."""
    acc = ParityAccumulator(len(ref), labels)
    acc.update(0, ref, out)
    return acc.stats()
