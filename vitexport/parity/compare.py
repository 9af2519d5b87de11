"""Parity between two sets of logits: the numbers users need to trust a converted model (`ParityStats`; gathered by
`accumulate.py`), and the bounds that judge them.

Thresholds are per precision, documented in docs/PARITY.md, and overridable. Each was chosen to pass an
honest conversion and fail a broken one (tests show both).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

_ALWAYS = ("n", "max_abs", "mean_abs", "cos_min", "cos_mean", "top1_agree", "top5_agree", "acc_ref", "acc")


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
    # the uncertainty of the figures above (95 %, docs/PARITY.md); None in records made before they existed
    top1_agree_ci: list[float] | None = None  # exact binomial interval of top1_agree
    disagree: int | None = None  # images whose top-1 differs from the reference's
    acc_ref_ci: list[float] | None = None
    acc_ci: list[float] | None = None
    top5_acc_ref: float | None = None
    top5_acc: float | None = None
    top5_acc_ci: list[float] | None = None
    acc_drop: float | None = None  # (acc_ref - acc) in points, on the same images
    acc_drop_ci: list[float] | None = None  # its paired interval, points (parity.stats.paired_drop)
    flips_down: int | None = None  # right for the reference, wrong for the candidate
    flips_up: int | None = None  # wrong for the reference, right for the candidate
    # a set that covers a subset of the head's classes: top-1 with the logits restricted to those (timm's
    # ImageNet-A/-R figure), and its paired drop interval in points
    subset_classes: int | None = None
    acc_subset_ref: float | None = None
    acc_subset: float | None = None
    acc_subset_ci: list[float] | None = None
    acc_subset_drop_ci: list[float] | None = None
    # ImageNet-ReaL labels: top-1 right when it is any of the image's ReaL classes, over the real_n images with one
    real_n: int | None = None
    real_acc_ref: float | None = None
    real_acc: float | None = None
    real_acc_ci: list[float] | None = None
    real_acc_drop_ci: list[float] | None = None
    # an embedding model (parity.knn): k-NN top-1 on the set's labels, leave-one-out, and nearest-neighbour
    # agreement with the reference; its argmax "top-1 agreement" means nothing and is not given
    knn_k: int | None = None
    knn_t: float | None = None
    knn_acc_ref: float | None = None
    knn_acc: float | None = None
    knn_acc_ci: list[float] | None = None
    knn_drop: float | None = None  # points, paired against the reference's k-NN on the same images
    knn_drop_ci: list[float] | None = None
    knn_flips_down: int | None = None
    knn_flips_up: int | None = None
    neighbour_agree: float | None = None
    neighbour_agree_ci: list[float] | None = None
    # a dense output (parity.dense): its kind, and the per-image task figures against the reference, each a mean
    # over the images with its 95 % interval; its argmax "top-1 agreement" means nothing and is not given
    dense: str | None = None
    absrel: float | None = None  # depth: mean |d - d_ref| / d_ref
    absrel_ci: list[float] | None = None
    delta1: float | None = None  # depth: share of pixels within 1.25x of the reference
    delta1_ci: list[float] | None = None
    pixel_agree: float | None = None  # segmentation: share of pixels of the reference's class
    pixel_agree_ci: list[float] | None = None
    miou: float | None = None  # segmentation: mIoU against the reference's map
    miou_ci: list[float] | None = None
    # SAM (parity.masks): the IoU of the masks the candidate's embeddings give through the FP32 decoder with the
    # reference's, for fixed prompts: the mean over images of each image's mean, its 95 % interval, the worst prompt
    mask_iou: float | None = None
    mask_iou_ci: list[float] | None = None
    mask_iou_min: float | None = None
    # a detector (parity.detections): its detections scored with COCO's mAP@[.5:.95] and AP50 against the
    # reference's above its threshold (95 % bootstrap intervals over the images), each reference box's best IoU with
    # a candidate box of its class and their score difference (means over the images, t-intervals)
    map: float | None = None
    map_ci: list[float] | None = None
    map_50: float | None = None
    map_50_ci: list[float] | None = None
    box_iou: float | None = None
    box_iou_ci: list[float] | None = None
    score_diff: float | None = None
    score_diff_ci: list[float] | None = None
    # against the data set's ground truth (data.dense_truth), over the images that have it: {"n": images, figure:
    # {"reference", "value", "ci", "diff", "diff_ci"}} (depth: absrel, delta1; segmentation: miou, pixel_acc)
    truth: dict | None = None

    @property
    def embedding(self) -> bool:
        return self.knn_k is not None

    @property
    def argmax_meaningless(self) -> bool:
        """An embedding's or a dense map's argmax is no prediction: no top-1/top-5 agreement for it."""
        return self.embedding or self.dense is not None

    def to_dict(self) -> dict:
        """Its fields; the uncertainty fields only when known (a record read from an older file round-trips)."""
        d = asdict(self)
        hidden = ("top1_agree", "top5_agree", "top1_agree_ci", "disagree") if self.argmax_meaningless else ()
        return {k: v for k, v in d.items() if (v is not None or k in _ALWAYS) and k not in hidden}


@dataclass
class Thresholds:
    """A candidate passes when every set bound holds. None = not checked."""

    max_abs: float | None = None
    cos_min: float | None = None
    cos_mean: float | None = None
    top1_agree: float | None = None
    acc_drop: float | None = None  # max allowed drop of top-1 accuracy in points (percent), when labelled
    # a dense output's task figures against the reference (parity.dense), judged on their 95 % intervals
    absrel: float | None = None  # depth: max mean AbsRel
    delta1: float | None = None  # depth: min mean delta1
    pixel_agree: float | None = None  # segmentation: min mean pixel agreement
    miou: float | None = None  # segmentation: min mean mIoU
    mask_iou: float | None = None  # SAM: min mean mask IoU against the reference's masks
    mask_iou_min: float | None = None  # SAM: min IoU of the worst prompt of any image
    map: float | None = None  # a detector: min mAP@[.5:.95] against the reference's detections
    map_50: float | None = None  # a detector: min AP50 against them
    box_iou: float | None = None  # a detector: min mean IoU of the reference's boxes with the candidate's

    def check(self, s: ParityStats) -> list[str]:
        """The failed bounds, as readable phrases (empty: none failed)."""
        return self.assess(s)[0]

    def assess(self, s: ParityStats) -> tuple[list[str], list[str]]:
        """(failed bounds, undecided bounds), as readable phrases. A bound judged on a sample (acc_drop, top1_agree)
        passes when its whole 95 % interval is within it, fails when the whole interval is beyond it, and is
        undecided otherwise: the set is too small to tell."""
        fails: list[str] = []
        undecided: list[str] = []
        if any(math.isnan(v) for v in (s.max_abs, s.cos_min)):
            return ["output has NaN/Inf"], []
        # a detector is judged by its detections: its logits and boxes side by side have no meaningful cosine, and
        # two proposals within rounding of each other swap in its two-stage TopK (the queries that take them change
        # wholesale: a max abs of the logits' size between two FP32 runtimes)
        task = s.dense == "detection"
        if self.max_abs is not None and s.max_abs > self.max_abs and not task:
            fails.append(f"max abs diff {s.max_abs:.3g} > {self.max_abs:g}")
        if self.cos_min is not None and s.cos_min < self.cos_min and not task:
            fails.append(f"min cosine {s.cos_min:.5f} < {self.cos_min:g}")
        if self.cos_mean is not None and s.cos_mean < self.cos_mean and not task:
            fails.append(f"mean cosine {s.cos_mean:.5f} < {self.cos_mean:g}")
        self._assess_dense(s, fails, undecided)
        if self.top1_agree is not None and not s.argmax_meaningless:  # an embedding's argmax means nothing
            lo, hi = s.top1_agree_ci or (s.top1_agree, s.top1_agree)
            if hi < self.top1_agree:
                fails.append(f"top-1 agreement {s.top1_agree:.1%} < {self.top1_agree:.0%} (95% interval "
                             f"{lo:.1%}-{hi:.1%})")
            elif lo < self.top1_agree:
                undecided.append(_undecided_agreement(s, self.top1_agree))
        if self.acc_drop is not None and s.acc is not None and s.acc_ref is not None:
            drop = s.acc_drop if s.acc_drop is not None else (s.acc_ref - s.acc) * 100
            lo, hi = s.acc_drop_ci or (drop, drop)
            if lo > self.acc_drop:
                fails.append(f"top-1 accuracy dropped {drop:.2f} points > {self.acc_drop:g} (95% interval "
                             f"{lo:.2f} to {hi:.2f})")
            elif hi > self.acc_drop:
                undecided.append(_undecided_drop(s, drop, lo, hi, self.acc_drop))
        if self.acc_drop is not None and s.knn_drop is not None:
            lo, hi = s.knn_drop_ci or (s.knn_drop, s.knn_drop)
            if lo > self.acc_drop:
                fails.append(f"k-NN top-1 dropped {s.knn_drop:.2f} points > {self.acc_drop:g} (95% interval "
                             f"{lo:.2f} to {hi:.2f})")
            elif hi > self.acc_drop:
                undecided.append(_undecided_drop(s, s.knn_drop, lo, hi, self.acc_drop, "k-NN top-1",
                                                 (s.knn_flips_down or 0, s.knn_flips_up or 0)))
        return fails, undecided

    def _assess_dense(self, s: ParityStats, fails: list[str], undecided: list[str]) -> None:
        """A dense output's task bounds: passed when the whole 95 % interval of the mean is within the bound,
        failed when the whole of it is beyond, else undecided on this many images."""
        for name, upper, what in (("absrel", True, "AbsRel"), ("delta1", False, "delta1"),
                                  ("pixel_agree", False, "pixel agreement"), ("miou", False, "mIoU"),
                                  ("mask_iou", False, "mask IoU"), ("map", False, "mAP"), ("map_50", False, "AP50"),
                                  ("box_iou", False, "matched box IoU")):
            bound, value = getattr(self, name), getattr(s, name)
            if bound is None or value is None:
                continue
            lo, hi = getattr(s, f"{name}_ci") or (value, value)
            if math.isnan(value):
                fails.append(f"{what} is NaN")
            elif (lo > bound) if upper else (hi < bound):
                fails.append(f"{what} {value:.4g} {'>' if upper else '<'} {bound:g} (95% interval {lo:.4g} to "
                             f"{hi:.4g})")
            elif (hi > bound) if upper else (lo < bound):
                undecided.append(f"inconclusive: {what} {value:.4g}, 95% interval {lo:.4g} to {hi:.4g}, is not "
                                 f"{'below' if upper else 'above'} {bound:g} on {s.n:,} images")
        if s.dense == "detection" and s.map is None and self.map is not None:
            undecided.append(f"inconclusive: the reference detects nothing above its threshold on these {s.n:,} "
                             f"images, so no mAP against it")
        if self.mask_iou_min is not None and s.mask_iou_min is not None and not s.mask_iou_min >= self.mask_iou_min:
            fails.append(f"worst mask IoU {s.mask_iou_min:.4g} < {self.mask_iou_min:g}")

    def judge(self, s: ParityStats) -> "ParityVerdict":
        fails, undecided = self.assess(s)
        return ParityVerdict(s, self, fails, undecided)

    def to_dict(self) -> dict:
        return asdict(self)


# Defaults per precision. Why these numbers: docs/PARITY.md.
DEFAULT_THRESHOLDS: dict[str, Thresholds] = {
    "fp32": Thresholds(max_abs=1e-3, cos_min=0.99999, absrel=1e-4, delta1=0.9999, pixel_agree=0.9995, miou=0.995,
                       mask_iou=0.995, mask_iou_min=0.9, map=0.99, map_50=0.995, box_iou=0.995),
    "bf16": Thresholds(cos_min=0.99, cos_mean=0.995, acc_drop=1.0, absrel=0.02, delta1=0.99, pixel_agree=0.98,
                       miou=0.9, mask_iou=0.95, mask_iou_min=0.6, map=0.8, map_50=0.9, box_iou=0.9),
    "fp16": Thresholds(cos_min=0.999, cos_mean=0.9995, acc_drop=0.5, absrel=0.005, delta1=0.999, pixel_agree=0.995,
                       miou=0.97, mask_iou=0.98, mask_iou_min=0.7, map=0.9, map_50=0.95, box_iou=0.95),
    "int8": Thresholds(cos_min=0.95, cos_mean=0.99, acc_drop=1.5, absrel=0.05, delta1=0.95, pixel_agree=0.95,
                       miou=0.85, mask_iou=0.93, mask_iou_min=0.5, map=0.7, map_50=0.8, box_iou=0.85),
    "fp8": Thresholds(cos_min=0.95, cos_mean=0.99, acc_drop=1.5, absrel=0.05, delta1=0.95, pixel_agree=0.95,
                      miou=0.85, mask_iou=0.93, mask_iou_min=0.5, map=0.7, map_50=0.8,
                      box_iou=0.85),  # 8 bits too: INT8's bounds
}


# The export check: ONNX Runtime against PyTorch, both FP32, on the same random inputs. max_abs is --atol.
EXPORT_THRESHOLDS = Thresholds(max_abs=1e-4, cos_min=0.99999)


def _undecided_drop(s: ParityStats, drop: float, lo: float, hi: float, bound: float, what: str = "top-1 accuracy",
                    flips: tuple[int, int] | None = None) -> str:
    from .stats import drop_decided, images_to_resolve

    down, up = flips or (s.flips_down or 0, s.flips_up or 0)
    n = max(s.n, 1)
    need = images_to_resolve(drop / 100, (down + up) / n, bound / 100, s.n,
                             decided=drop_decided(down / n, up / n, bound / 100))
    more = f"; about {need:,} would resolve {bound:g} points" if need else ""
    return (f"inconclusive: {what} drop {drop:.2f} points, 95% interval {lo:.2f} to {hi:.2f}, is not within "
            f"{bound:g} on {s.n:,} images ({down} flipped down, {up} up){more}")


def _undecided_agreement(s: ParityStats, bound: float) -> str:
    from .stats import images_to_resolve, rate_decided

    lo, hi = s.top1_agree_ci or (s.top1_agree, s.top1_agree)
    dis = 1 - s.top1_agree
    need = images_to_resolve(dis, dis, 1 - bound, s.n, decided=rate_decided(s.top1_agree, bound))
    more = f"; about {need:,} would resolve {bound:.0%}" if need else ""
    return (f"inconclusive: top-1 agreement {s.top1_agree:.1%}, 95% interval {lo:.1%}-{hi:.1%}, is not above "
            f"{bound:.0%} on {s.n:,} images{more}")


def export_thresholds(atol: float | None = None) -> Thresholds:
    return EXPORT_THRESHOLDS if atol is None else replace(EXPORT_THRESHOLDS, max_abs=atol)


@dataclass
class ParityVerdict:
    """Whether a candidate's outputs match the reference's closely enough: 'pass', 'fail' (a bound missed) or
    'inconclusive' (no bound missed, but a bound judged on a sample could not be decided on this many images)."""

    stats: ParityStats
    thresholds: Thresholds
    failures: list[str] = field(default_factory=list)
    inconclusive: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures and not self.inconclusive

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    @property
    def status(self) -> str:
        return "fail" if self.failures else "inconclusive" if self.inconclusive else "pass"

    def problems(self) -> list[str]:
        """What keeps it from passing, failures first."""
        return list(self.failures) + list(self.inconclusive)

    def to_dict(self) -> dict:
        """The figures with the verdict, as reports write them."""
        return {**self.stats.to_dict(), "passed": self.passed, "status": self.status, "failures": list(self.failures),
                "inconclusive": list(self.inconclusive)}


def describe(s: ParityStats) -> str:
    """The figures of a check in one line, intervals included."""
    agree = f"top-1 agree {s.top1_agree:.1%}" + (f" (95% {s.top1_agree_ci[0]:.1%}-{s.top1_agree_ci[1]:.1%})"
                                                 if s.top1_agree_ci else "")
    text = (f"max abs {s.max_abs:.3g}, mean abs {s.mean_abs:.3g}, cosine min {s.cos_min:.5f} / mean {s.cos_mean:.5f}, "
            f"{agree}, top-5 agree {s.top5_agree:.1%}")
    if s.dense is not None:
        return text.split(", top-1 agree")[0] + "".join(
            f", {what} {getattr(s, k):.4g} (95% {getattr(s, k + '_ci')[0]:.4g} to {getattr(s, k + '_ci')[1]:.4g})"
            for k, what in (("absrel", "AbsRel"), ("delta1", "delta1"), ("pixel_agree", "pixel agreement"),
                            ("miou", "mIoU"), ("mask_iou", "mask IoU"), ("map", "mAP"), ("map_50", "AP50"),
                            ("box_iou", "matched box IoU")) if getattr(s, k) is not None and
            getattr(s, k + "_ci")) + (f", worst mask IoU {s.mask_iou_min:.4g}" if s.mask_iou_min is not None else "")
    if s.embedding:
        text = text.split(", top-1 agree")[0] + f", nearest neighbour the same for {s.neighbour_agree:.1%}"
        if s.knn_acc is not None and s.knn_acc_ref is not None and s.knn_drop_ci is not None:
            text += (f", k-NN top-1 {s.knn_acc_ref:.2%} -> {s.knn_acc:.2%}, drop {s.knn_drop:+.2f} points (95% "
                     f"{s.knn_drop_ci[0]:+.2f} to {s.knn_drop_ci[1]:+.2f})")
        return text
    if s.acc is None or s.acc_ref is None:
        return text
    drop = "" if s.acc_drop_ci is None else (f", drop {s.acc_drop:+.2f} points (95% {s.acc_drop_ci[0]:+.2f} to "
                                             f"{s.acc_drop_ci[1]:+.2f}; {s.flips_down} flipped down, {s.flips_up} up)")
    return f"{text}, top-1 accuracy {s.acc_ref:.2%} -> {s.acc:.2%}{drop}"


def judge(stats: ParityStats, precision: str, overrides: Thresholds | None = None) -> ParityVerdict:
    return (overrides or DEFAULT_THRESHOLDS[precision]).judge(stats)

