"""A dense output's figures gathered batch by batch (parity.accumulate hands each batch here): per image only what
the task's statistics need, against the reference and, where the data set has it, against the ground truth.

- depth: AbsRel and delta1 per image; their means with 95 % t-intervals, against the truth the paired
  difference's too;
- segmentation: the pixel agreement per image (a t-interval) and each image's per-class intersections and unions,
  pooled into the set's mIoU (bootstrap interval over the images; against the truth, paired);
- masks (SAM: the output is the image embedding): each image's mean and worst IoU over the fixed prompts of the
  masks both embeddings give through the decoder graph (parity.masks).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .examples import Worst, offer_dense
from .dense import IGNORE_INDEX, bootstrap_miou, depth_truth_figures, figures, segmentation_truth_figures, set_miou
from .stats import mean_interval


# the per-image figures against the truth, each with its interval and the paired difference to the reference
TRUTH_SINGLES = {"depth": ("absrel", "delta1"), "segmentation": ("pixel_acc",), "masks": ("point_iou", "box_iou")}


class DenseAccumulator:
    def __init__(self, kind: str, n: int, read_truth: Callable[[int], np.ndarray | None] | None = None,
                 relative_depth: bool = True, image_part: Callable | None = None,
                 masks: Callable | None = None, worst: Worst | None = None) -> None:
        self.worst = worst  # the worst images' figures and maps, for a report (parity.examples)
        self.kind, self.n, self.read_truth, self.relative_depth = kind, n, read_truth, relative_depth
        self.masks = masks  # SAM: the prompted decoder (validate.sam_masks.PromptedMasks)
        self.image_part = image_part or (lambda maps, size: maps)  # the maps over the image, before resizing
        self.first = np.zeros(n)  # AbsRel, or pixel agreement
        self.second = np.zeros(n)  # delta1 (depth)
        self.counts: tuple[np.ndarray, np.ndarray] | None = None  # segmentation: (N, C) intersections, unions
        self.truth: dict[str, np.ndarray] = {}  # against the truth: per image (NaN: none) or (N, C) counts

    def update(self, start: int, ref: np.ndarray, out: np.ndarray) -> None:
        s = slice(start, start + len(ref))
        if self.kind == "masks":
            from .masks import compare_masks

            if self.masks is None:
                raise ValueError("SAM's mask figures need the decoder graph")
            iou = compare_masks(self.masks, ref, out.astype(np.float32))  # (B, prompts)
            self.first[s], self.second[s] = iou.mean(axis=1), iou.min(axis=1)
            self._offer(start, ref, out, 1 - self.first[s], {"mask_iou": self.first[s], "mask_iou_min": self.second[s]})
            for i in range(len(ref) if self.read_truth is not None else 0):
                if (gt := self.read_truth(start + i)) is not None:  # type: ignore[misc]
                    for who, x in (("ref", ref[i]), ("out", out[i])):
                        for k, v in (self.masks.against_truth(x, gt) or {}).items():
                            self._slot(f"{who}_{k}", ())[start + i] = v
            return
        got = figures(self.kind, ref, out)
        self.first[s] = got[0]
        if self.kind == "depth":
            self.second[s] = got[1]
        else:
            if self.counts is None:
                c = got[1].shape[1]
                self.counts = (np.zeros((self.n, c)), np.zeros((self.n, c)))
            self.counts[0][s], self.counts[1][s] = got[1], got[2]
        shown = {"absrel": self.first[s], "delta1": self.second[s]} if self.kind == "depth" else \
            {"pixel_agree": self.first[s]}
        self._offer(start, ref, out, self.first[s] if self.kind == "depth" else 1 - self.first[s], shown)
        if self.read_truth is not None:
            for i in range(len(ref)):
                if (gt := self.read_truth(start + i)) is not None:
                    self._against_truth(start + i, gt, ref[i], out[i])

    def _offer(self, start: int, ref: np.ndarray, out: np.ndarray, scores: np.ndarray, shown: dict) -> None:
        if self.worst is not None:
            offer_dense(self.worst, self.kind, start, ref, out, scores, shown)

    def _against_truth(self, i: int, gt: np.ndarray, ref: np.ndarray, out: np.ndarray) -> None:
        for who, x in (("ref", ref), ("out", out)):
            x = self.image_part(x, gt.shape)
            if self.kind == "depth":
                values = depth_truth_figures(x, gt, self.relative_depth)
                for k, v in zip(("absrel", "delta1"), values):
                    self._slot(f"{who}_{k}", ())[i] = v
            else:
                acc, inter, union = segmentation_truth_figures(x, gt, IGNORE_INDEX)
                self._slot(f"{who}_pixel_acc", ())[i] = acc
                self._slot(f"{who}_inter", inter.shape)[i] = inter
                self._slot(f"{who}_union", inter.shape)[i] = union

    def _slot(self, name: str, shape: tuple) -> np.ndarray:
        if name not in self.truth:
            self.truth[name] = np.full((self.n, *shape), np.nan)
        return self.truth[name]

    def fill(self, st, finite: bool) -> None:
        """The figures into a ParityStats `st` (NaN where the candidate gave non-finite values)."""
        st.dense = self.kind
        if self.kind == "masks":
            m, lo, hi = mean_interval(self.first) if finite else (float("nan"),) * 3
            st.mask_iou, st.mask_iou_ci = m, [max(lo, 0.0), min(hi, 1.0)]
            st.mask_iou_min = float(self.second.min()) if finite else float("nan")
        elif self.kind == "depth":
            for name, v in (("absrel", self.first), ("delta1", self.second)):
                m, lo, hi = mean_interval(v) if finite else (float("nan"),) * 3
                setattr(st, name, m)  # a share stays within [0, 1], an error above 0
                setattr(st, f"{name}_ci", [max(lo, 0.0), hi if name == "absrel" else min(hi, 1.0)])
        else:
            m, lo, hi = mean_interval(self.first) if finite else (float("nan"),) * 3
            st.pixel_agree, st.pixel_agree_ci = m, [max(lo, 0.0), min(hi, 1.0)]
            assert self.counts is not None
            st.miou = set_miou(*self.counts) if finite else float("nan")
            st.miou_ci = bootstrap_miou([self.counts])[0] if finite else [float("nan")] * 2
        if self.truth:
            st.truth = self._truth_figures()

    def _truth_figures(self) -> dict | None:
        """Over the images with ground truth: the candidate's figure with its 95 % interval, the reference's, and the
        paired difference (candidate - reference) with its interval."""
        key = f"ref_{TRUTH_SINGLES[self.kind][0]}"
        if key not in self.truth:  # every image's truth held no object
            return None
        has = np.isfinite(self.truth[key])
        if not has.any():
            return None
        out: dict = {"n": int(has.sum())}
        for k in TRUTH_SINGLES[self.kind]:
            ref, cand = self.truth[f"ref_{k}"][has], self.truth[f"out_{k}"][has]
            m, lo, hi = mean_interval(cand)
            d, dlo, dhi = mean_interval(cand - ref)
            out[k] = {"reference": float(ref.mean()), "value": m,
                      "ci": [max(lo, 0.0), hi if k == "absrel" else min(hi, 1.0)], "diff": d, "diff_ci": [dlo, dhi]}
        if self.kind == "segmentation":
            ref_c = (self.truth["ref_inter"][has], self.truth["ref_union"][has])
            out_c = (self.truth["out_inter"][has], self.truth["out_union"][has])
            _, ci, diff_ci = bootstrap_miou([ref_c, out_c])
            ref_m, out_m = set_miou(*ref_c), set_miou(*out_c)
            out["miou"] = {"reference": ref_m, "value": out_m, "ci": ci, "diff": out_m - ref_m, "diff_ci": diff_ci}
        return out
