"""Parity between two sets of logits: the numbers users need to trust a converted model.

Thresholds are per precision, documented in docs/PARITY.md, and overridable. Each was chosen to pass an
honest conversion and fail a broken one (tests show both).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


@dataclass
class ParityStats:
    n: int
    max_abs: float
    mean_abs: float
    cos_min: float
    cos_mean: float
    top1_agree: float  # fraction of samples whose argmax matches the reference
    top5_agree: float  # fraction whose reference top-1 is in the candidate's top-5
    acc_ref: float | None = None  # top-1 accuracy against labels, when labels exist
    acc: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _cosine(a: "np.ndarray", b: "np.ndarray") -> "np.ndarray":
    import numpy as np

    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    denom = np.maximum(na * nb, 1e-30)
    cos = (a * b).sum(axis=1) / denom
    # two all-zero vectors are identical
    cos[(na == 0) & (nb == 0)] = 1.0
    return cos


def compare(ref: "np.ndarray", out: "np.ndarray", labels: "np.ndarray | None" = None) -> ParityStats:
    """ref, out: (N, C) logits (or (N, ...) features, flattened per sample)."""
    import numpy as np  # here: the CLI reads the thresholds of this module without loading numpy

    ref = np.asarray(ref, dtype=np.float64).reshape(len(ref), -1)
    out = np.asarray(out, dtype=np.float64).reshape(len(out), -1)
    if ref.shape != out.shape:
        raise ValueError(f"shape mismatch: {ref.shape} vs {out.shape}")
    if not np.all(np.isfinite(out)):
        nan = float("nan")
        return ParityStats(len(ref), nan, nan, nan, nan, 0.0, 0.0,
                           _acc(ref, labels), 0.0 if labels is not None else None)
    diff = np.abs(ref - out)
    cos = _cosine(ref, out)
    k = min(5, ref.shape[1])
    ref_top1 = ref.argmax(1)
    top5 = np.argsort(-out, axis=1)[:, :k]
    return ParityStats(
        n=len(ref),
        max_abs=float(diff.max()),
        mean_abs=float(diff.mean()),
        cos_min=float(cos.min()),
        cos_mean=float(cos.mean()),
        top1_agree=float((out.argmax(1) == ref_top1).mean()),
        top5_agree=float((top5 == ref_top1[:, None]).any(1).mean()),
        acc_ref=_acc(ref, labels),
        acc=_acc(out, labels),
    )


def _acc(logits: "np.ndarray", labels: "np.ndarray | None") -> float | None:
    import numpy as np

    if labels is None:
        return None
    return float((logits.argmax(1) == np.asarray(labels)).mean())


@dataclass
class Thresholds:
    """A candidate passes when every set bound holds. None = not checked."""

    max_abs: float | None = None
    cos_min: float | None = None
    cos_mean: float | None = None
    top1_agree: float | None = None
    acc_drop: float | None = None  # max allowed drop of top-1 accuracy in points (percent), when labelled

    def check(self, s: ParityStats) -> list[str]:
        """The failed bounds, as readable phrases (empty: pass)."""
        fails = []
        if any(math.isnan(v) for v in (s.max_abs, s.cos_min)):
            return ["output has NaN/Inf"]
        if self.max_abs is not None and s.max_abs > self.max_abs:
            fails.append(f"max abs diff {s.max_abs:.3g} > {self.max_abs:g}")
        if self.cos_min is not None and s.cos_min < self.cos_min:
            fails.append(f"min cosine {s.cos_min:.5f} < {self.cos_min:g}")
        if self.cos_mean is not None and s.cos_mean < self.cos_mean:
            fails.append(f"mean cosine {s.cos_mean:.5f} < {self.cos_mean:g}")
        if self.top1_agree is not None and s.top1_agree < self.top1_agree:
            fails.append(f"top-1 agreement {s.top1_agree:.1%} < {self.top1_agree:.0%}")
        if self.acc_drop is not None and s.acc is not None and s.acc_ref is not None:
            drop = (s.acc_ref - s.acc) * 100
            if drop > self.acc_drop:
                fails.append(f"top-1 accuracy dropped {drop:.2f} points > {self.acc_drop:g}")
        return fails

    def judge(self, s: ParityStats) -> "ParityVerdict":
        return ParityVerdict(s, self, self.check(s))

    def to_dict(self) -> dict:
        return asdict(self)


# Defaults per precision. Why these numbers: docs/PARITY.md.
DEFAULT_THRESHOLDS: dict[str, Thresholds] = {
    "fp32": Thresholds(max_abs=1e-3, cos_min=0.99999),
    "bf16": Thresholds(cos_min=0.99, cos_mean=0.995, acc_drop=1.0),
    "fp16": Thresholds(cos_min=0.999, cos_mean=0.9995, acc_drop=0.5),
    "int8": Thresholds(cos_min=0.95, cos_mean=0.99, acc_drop=1.5),
}


# The export check: ONNX Runtime against PyTorch, both FP32, on the same random inputs. max_abs is --atol.
EXPORT_THRESHOLDS = Thresholds(max_abs=1e-4, cos_min=0.99999)


def export_thresholds(atol: float | None = None) -> Thresholds:
    return EXPORT_THRESHOLDS if atol is None else replace(EXPORT_THRESHOLDS, max_abs=atol)


@dataclass
class ParityVerdict:
    """Whether a candidate's outputs match the reference's closely enough, and if not, which bounds it missed."""

    stats: ParityStats
    thresholds: Thresholds
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict:
        """The figures with the verdict, as reports write them."""
        return {**self.stats.to_dict(), "passed": self.passed, "failures": list(self.failures)}


def judge(stats: ParityStats, precision: str, overrides: Thresholds | None = None) -> ParityVerdict:
    return (overrides or DEFAULT_THRESHOLDS[precision]).judge(stats)

