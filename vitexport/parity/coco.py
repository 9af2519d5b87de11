"""COCO's box evaluation (pycocotools' COCOeval, iouType 'bbox'), image by image in bounded memory, so that a set's
mAP can be resampled over its images (a bootstrap interval, paired between two backends).

What it reproduces exactly (tests: the same detections through pycocotools give the same 12 numbers):

- IoU thresholds 0.50:0.05:0.95, 101 recall points, at most 100 detections per image and category (1 and 10 for
  the recalls AR@1 and AR@10), the area ranges all / small (< 32^2) / medium / large (> 96^2) of each truth's
  `area` (a detection's is w x h);
- detections matched greedily in score order (stable: equal scores keep their order), each to the unmatched truth
  of the highest IoU >= the threshold, ignored truths (crowds, or outside the area range) last; a crowd's IoU is
  the intersection over the detection's area, and a crowd can match many detections, which are then ignored;
- precision made monotone from the right and read at each recall point; a category without truth left out of the
  mean.

Boxes are x0, y0, x1, y1 in pixels (`boxes.py` converts); categories are whatever integers the caller uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

IOU_THRESHOLDS = np.linspace(0.5, 0.95, 10)
RECALL_POINTS = np.linspace(0.0, 1.0, 101)
MAX_DETS = (1, 10, 100)
AREAS = {"all": (0.0, 1e10), "small": (0.0, 32.0 ** 2), "medium": (32.0 ** 2, 96.0 ** 2), "large": (96.0 ** 2, 1e10)}
STATS = ("map", "map_50", "map_75", "map_small", "map_medium", "map_large", "mar_1", "mar_10", "mar_100",
         "mar_small", "mar_medium", "mar_large")  # pycocotools' summarize() order


def box_iou(dt: np.ndarray, gt: np.ndarray, crowd: np.ndarray) -> np.ndarray:
    """(D, 4) x (G, 4) x0 y0 x1 y1 -> (D, G) IoU; against a crowd truth the intersection over the detection's area
    (pycocotools' maskUtils.iou on boxes)."""
    if not len(dt) or not len(gt):
        return np.zeros((len(dt), len(gt)))
    w = np.clip(np.minimum(dt[:, None, 2], gt[None, :, 2]) - np.maximum(dt[:, None, 0], gt[None, :, 0]), 0, None)
    h = np.clip(np.minimum(dt[:, None, 3], gt[None, :, 3]) - np.maximum(dt[:, None, 1], gt[None, :, 1]), 0, None)
    inter = w * h
    a_dt = ((dt[:, 2] - dt[:, 0]) * (dt[:, 3] - dt[:, 1]))[:, None]
    a_gt = ((gt[:, 2] - gt[:, 0]) * (gt[:, 3] - gt[:, 1]))[None, :]
    union = np.where(crowd[None, :], a_dt, a_dt + a_gt - inter)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def _match(ious: np.ndarray, gt_ignore: np.ndarray, crowd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """COCOeval.evaluateImg's matching of score-ordered detections to truths (already ordered ignored last) at every
    IoU threshold -> (matched (T, D), matched to an ignored truth (T, D))."""
    T, (D, G) = len(IOU_THRESHOLDS), ious.shape
    matched, ignored = np.zeros((T, D), bool), np.zeros((T, D), bool)
    if not D or not G:
        return matched, ignored
    best = ious.max(axis=1)
    for t, thr in enumerate(IOU_THRESHOLDS):
        taken = np.zeros(G, bool)
        limit = min(thr, 1 - 1e-10)
        for d in np.flatnonzero(best >= limit):
            iou, m = limit, -1
            for g in range(G):
                if taken[g] and not crowd[g]:
                    continue
                if m > -1 and not gt_ignore[m] and gt_ignore[g]:
                    break
                if ious[d, g] < iou:
                    continue
                iou, m = ious[d, g], g
            if m > -1:
                matched[t, d], ignored[t, d] = True, gt_ignore[m]
                taken[m] = True
    return matched, ignored


@dataclass
class _Cell:
    """One image and category: its detections' scores (score order, at most 100) and, per area range, which matched
    (T, D), which are ignored (T, D), and how many truths count."""

    scores: np.ndarray
    matched: dict[str, np.ndarray]
    ignored: dict[str, np.ndarray]
    truths: dict[str, int]


@dataclass
class CocoEval:
    """Images added one at a time (`add`); `stats()` the 12 numbers of pycocotools' summary, over all the images or
    any weighting of them (a bootstrap resample)."""

    categories: list[int] | None = None  # None: those of the truths seen (pycocotools: the truth file's)
    cells: dict[int, list[tuple[int, _Cell]]] = field(default_factory=dict)  # category -> (image, cell)
    seen: set[int] = field(default_factory=set)  # categories with a truth
    n: int = 0  # images added
    _cache: dict = field(default_factory=dict, repr=False)  # the pooled detections of each area and max_det

    def add(self, gt_boxes: np.ndarray, gt_labels: np.ndarray, dt_boxes: np.ndarray, dt_scores: np.ndarray,
            dt_labels: np.ndarray, gt_crowd: np.ndarray | None = None, gt_area: np.ndarray | None = None) -> None:
        """One image: its truths (x0 y0 x1 y1, category, crowd, area: w x h when not given) and its detections."""
        gt_boxes = np.asarray(gt_boxes, np.float64).reshape(-1, 4)
        gt_labels = np.asarray(gt_labels).reshape(-1).astype(np.int64)
        crowd = np.zeros(len(gt_boxes), bool) if gt_crowd is None else np.asarray(gt_crowd, bool).reshape(-1)
        area = (gt_boxes[:, 2] - gt_boxes[:, 0]) * (gt_boxes[:, 3] - gt_boxes[:, 1]) if gt_area is None else \
            np.asarray(gt_area, np.float64).reshape(-1)
        dt_boxes = np.asarray(dt_boxes, np.float64).reshape(-1, 4)
        dt_scores = np.asarray(dt_scores, np.float64).reshape(-1)
        dt_labels = np.asarray(dt_labels).reshape(-1).astype(np.int64)
        image = self.n
        self.n += 1
        self.seen.update(int(c) for c in gt_labels)
        for c in sorted(set(gt_labels.tolist()) | set(dt_labels.tolist())):
            if self.categories is not None and c not in self.categories:
                continue
            g, d = gt_labels == c, np.flatnonzero(dt_labels == c)
            order = d[np.argsort(-dt_scores[d], kind="mergesort")][:MAX_DETS[-1]]
            boxes, scores = dt_boxes[order], dt_scores[order]
            dt_area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
            cell = _Cell(scores, {}, {}, {})
            for name, (lo, hi) in AREAS.items():
                ig = crowd[g] | (area[g] < lo) | (area[g] > hi)
                gi = np.argsort(ig, kind="mergesort")
                ious = box_iou(boxes, gt_boxes[g][gi], crowd[g][gi])
                matched, ignored = _match(ious, ig[gi], crowd[g][gi])
                outside = (dt_area < lo) | (dt_area > hi)
                cell.matched[name] = matched
                cell.ignored[name] = ignored | (~matched & outside[None, :])
                cell.truths[name] = int((~ig).sum())
            self.cells.setdefault(c, []).append((image, cell))

    def _pooled(self, area: str, max_det: int) -> list[tuple | None]:
        """Per category, every image's detections pooled in score order: (matched (T, n), ignored (T, n), the image
        of each, the counted truths of each image (images,)); None for a category without truth in any image."""
        key = (area, max_det, self.n)
        if key in self._cache:
            return self._cache[key]
        cats = sorted(self.seen) if self.categories is None else list(self.categories)
        pooled: list[tuple | None] = []
        for c in cats:
            cells = self.cells.get(c, [])
            truths = np.zeros(self.n)
            for i, cell in cells:
                truths[i] = cell.truths[area]
            if not truths.any():
                pooled.append(None)
                continue
            scores = np.concatenate([cell.scores[:max_det] for _, cell in cells])
            image = np.concatenate([np.full(len(cell.scores[:max_det]), i) for i, cell in cells]).astype(np.int64)
            tm = np.concatenate([cell.matched[area][:, :max_det] for _, cell in cells], axis=1)
            ig = np.concatenate([cell.ignored[area][:, :max_det] for _, cell in cells], axis=1)
            order = np.argsort(-scores, kind="mergesort")
            pooled.append((tm[:, order], ig[:, order], image[order], truths))
        self._cache = {k: v for k, v in self._cache.items() if k[2] == self.n}
        self._cache[key] = pooled
        return pooled

    def _precision_recall(self, area: str, max_det: int, weights: np.ndarray | None) -> tuple[np.ndarray, ...]:
        """(precision (T, R, K), recall (T, K)) with -1 for a category without truth (pycocotools' accumulate)."""
        pooled = self._pooled(area, max_det)
        T, R = len(IOU_THRESHOLDS), len(RECALL_POINTS)
        precision, recall = -np.ones((T, R, len(pooled))), -np.ones((T, len(pooled)))
        for k, entry in enumerate(pooled):
            if entry is None:
                continue
            tm, ig, image, truths = entry
            dw = np.ones(len(image)) if weights is None else weights[image]
            npig = float(truths.sum() if weights is None else weights @ truths)
            if npig == 0:
                continue
            tps = np.cumsum((tm & ~ig) * dw, axis=1)
            fps = np.cumsum((~tm & ~ig) * dw, axis=1)
            for t in range(T):
                tp, fp = tps[t], fps[t]
                rc = tp / npig
                pr = tp / (fp + tp + np.spacing(1))
                recall[t, k] = rc[-1] if len(tp) else 0
                pr = np.maximum.accumulate(pr[::-1])[::-1] if len(pr) else pr  # monotone from the right
                idx = np.searchsorted(rc, RECALL_POINTS, side="left")
                q = np.zeros(R)
                ok = idx < len(pr)
                q[ok] = pr[idx[ok]]
                precision[t, :, k] = q
        return precision, recall

    def stats(self, weights: np.ndarray | None = None, keys: tuple[str, ...] = STATS) -> dict[str, float]:
        """pycocotools' 12 summary numbers (-1 where no category has truth), or those of `keys`, the images weighted
        by `weights` (None: each once)."""
        def mean(a: np.ndarray) -> float:
            a = a[a > -1]
            return float(a.mean()) if a.size else -1.0

        out: dict[str, float] = {}
        p, r = self._precision_recall("all", 100, weights)
        out["map"], out["map_50"], out["map_75"], out["mar_100"] = mean(p), mean(p[0]), mean(p[5]), mean(r)
        for name in ("small", "medium", "large"):
            if f"map_{name}" in keys or f"mar_{name}" in keys:
                ps, rs = self._precision_recall(name, 100, weights)
                out[f"map_{name}"], out[f"mar_{name}"] = mean(ps), mean(rs)
        for m in MAX_DETS[:-1]:
            if f"mar_{m}" in keys:
                out[f"mar_{m}"] = mean(self._precision_recall("all", m, weights)[1])
        return {k: out[k] for k in keys}


def bootstrap(evals: list[CocoEval], keys: tuple[str, ...] = ("map", "map_50"), resamples: int = 200,
              seed: int = 0) -> dict[str, list[list[float]]]:
    """95 % percentile intervals of each evaluation's figures and of the later ones' differences from the first,
    the images resampled together (the same resample for all: paired; the evaluations cover the same images in the
    same order), deterministic."""
    n = evals[0].n
    rng = np.random.default_rng(seed)
    draws = {k: np.zeros((resamples, len(evals))) for k in keys}
    for r in range(resamples):
        w = rng.multinomial(n, np.full(n, 1.0 / n)).astype(np.float64)
        for j, ev in enumerate(evals):
            s = ev.stats(w, keys)
            for k in keys:
                draws[k][r, j] = s[k]
    out: dict[str, list[list[float]]] = {}
    for k in keys:
        d = draws[k]
        cols = [d[:, j] for j in range(len(evals))] + [d[:, j] - d[:, 0] for j in range(1, len(evals))]
        out[k] = [[float(np.percentile(c, 2.5)), float(np.percentile(c, 97.5))] for c in cols]
    return out


__all__ = ["AREAS", "CocoEval", "IOU_THRESHOLDS", "STATS", "bootstrap", "box_iou"]
