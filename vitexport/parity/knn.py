"""Embeddings judged by what embeddings are for: k-NN classification and nearest neighbours.

k-NN top-1 as DINO and DINOv2 report it (facebookresearch/dino `eval_knn.py`): cosine similarity of L2-normalised
embeddings, the k most similar images vote for their class with weight exp(similarity / T) (k = 20, T = 0.07),
here leave-one-out within one labelled set (an image never votes for itself). Nearest-neighbour agreement: the
share of images whose most similar other image is the same one for the candidate as for the reference.

Memory is flat in N: the embeddings are read from disk block by block (`read(start, count)`), the N x N similarity
is never held, only each query block's running top k.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .stats import clopper_pearson, paired_drop

Read = Callable[[int, int], np.ndarray]  # (start, count) -> (count, D) embeddings
DEFAULT_K, DEFAULT_T = 20, 0.07
QUERY_BLOCK, KEY_BLOCK = 1024, 4096  # 16 MB of similarities at a time


@dataclass
class Neighbours:
    """Per image: the k-NN's predicted class (None unlabelled) and the index of its nearest other image."""

    pred: np.ndarray | None
    nearest: np.ndarray
    k: int
    t: float


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32).reshape(len(x), -1)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def neighbours(read: Read, n: int, labels: np.ndarray | None, k: int = DEFAULT_K, t: float = DEFAULT_T,
               query_block: int = QUERY_BLOCK, key_block: int = KEY_BLOCK) -> Neighbours:
    """The k-NN of every image among the others (see the module docstring)."""
    if n < 2:
        raise ValueError("a k-NN needs at least two images")
    k = max(1, min(k, n - 1))
    pred = None if labels is None else np.zeros(n, np.int64)
    nearest = np.zeros(n, np.int64)
    classes = None if labels is None else int(labels.max()) + 1
    for q0 in range(0, n, query_block):
        q = _unit(read(q0, min(query_block, n - q0)))
        top_s = np.full((len(q), k), -np.inf, np.float32)
        top_i = np.zeros((len(q), k), np.int64)
        for k0 in range(0, n, key_block):
            s = q @ _unit(read(k0, min(key_block, n - k0))).T
            rows = np.arange(len(q))
            own = rows + q0 - k0  # each query's own column in this key block
            inside = (own >= 0) & (own < s.shape[1])
            s[rows[inside], own[inside]] = -np.inf
            cand_s = np.concatenate([top_s, s], axis=1)
            cand_i = np.concatenate([top_i, np.broadcast_to(np.arange(k0, k0 + s.shape[1]), s.shape)], axis=1)
            keep = np.argpartition(-cand_s, k - 1, axis=1)[:, :k]
            top_s, top_i = np.take_along_axis(cand_s, keep, 1), np.take_along_axis(cand_i, keep, 1)
        sl = slice(q0, q0 + len(q))
        nearest[sl] = top_i[np.arange(len(q)), top_s.argmax(1)]
        if pred is not None:
            votes = np.zeros((len(q), classes), np.float64)
            np.add.at(votes, (np.arange(len(q))[:, None], labels[top_i]), np.exp(top_s.astype(np.float64) / t))
            pred[sl] = votes.argmax(1)
    return Neighbours(pred, nearest, k, t)


def knn_figures(ref: Neighbours, out: Neighbours, labels: np.ndarray | None) -> dict:
    """The ParityStats fields of a candidate's k-NN against the reference's, on the same images: accuracies with
    exact intervals, the paired drop (points) with its interval, nearest-neighbour agreement."""
    n = len(out.nearest)
    agree = int((out.nearest == ref.nearest).sum())
    d = {"knn_k": out.k, "knn_t": out.t, "neighbour_agree": agree / n,
         "neighbour_agree_ci": list(clopper_pearson(agree, n))}
    if labels is None or out.pred is None or ref.pred is None:
        return d
    r_ok, o_ok = ref.pred == labels, out.pred == labels
    down, up = int((r_ok & ~o_ok).sum()), int((~r_ok & o_ok).sum())
    drop, lo, hi = paired_drop(down, up, n)
    return {**d, "knn_acc_ref": float(r_ok.mean()), "knn_acc": float(o_ok.mean()),
            "knn_acc_ci": list(clopper_pearson(int(o_ok.sum()), n)), "knn_drop": drop * 100,
            "knn_drop_ci": [lo * 100, hi * 100], "knn_flips_down": down, "knn_flips_up": up}


def neighbour_changes(ref: Neighbours, out: Neighbours, limit: int = 12) -> list[dict]:
    """The first `limit` images whose nearest other image is not the reference's: [{index, reference_neighbour,
    output_neighbour}] (a report shows the three)."""
    changed = np.flatnonzero(out.nearest != ref.nearest)[:limit]
    return [{"index": int(i), "reference_neighbour": int(ref.nearest[i]), "output_neighbour": int(out.nearest[i])}
            for i in changed]
