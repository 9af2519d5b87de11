"""The parity rules on their own: figures of small hand-computed arrays, each bound of Thresholds at and beyond its
edge, the defaults as docs/PARITY.md states them, and an override from the command line taking effect. No model:
each expected number is worked out by hand in the comments."""

import math
import re
from dataclasses import replace

import numpy as np
import pytest
from conftest import ROOT

from vitexport.parity.accumulate import compare
from vitexport.parity.compare import DEFAULT_THRESHOLDS, ParityStats, Thresholds, describe, judge
from vitexport.parity.stats import clopper_pearson


def _stats(**kw) -> ParityStats:
    base = dict(n=1000, max_abs=0.0, mean_abs=0.0, cos_min=1.0, cos_mean=1.0, top1_agree=1.0, top5_agree=1.0)
    return ParityStats(**{**base, **kw})


# -- figures ------------------------------------------------------------------------------------------------------

def test_cosine_of_a_3_4_5_triangle_and_of_zero_vectors():
    ref = np.array([[3.0, 4.0], [0.0, 0.0], [1.0, 0.0]])
    out = np.array([[4.0, 3.0], [0.0, 0.0], [0.0, 1.0]])
    s = compare(ref, out)
    # rows: (3*4 + 4*3) / (5 * 5) = 0.96; two zero vectors are identical (1); orthogonal (0)
    assert s.cos_min == 0.0 and s.cos_mean == pytest.approx((0.96 + 1.0 + 0.0) / 3)
    assert s.max_abs == 1.0 and s.mean_abs == pytest.approx((1 + 1 + 0 + 0 + 1 + 1) / 6)


def test_top1_and_top5_agreement_by_hand():
    ref = np.zeros((3, 7))
    ref[0, 0] = ref[1, 1] = ref[2, 2] = 1.0  # reference top-1: 0, 1, 2
    out = np.tile(np.arange(7, 0, -1, dtype=float), (3, 1))  # candidate ranks 0 > 1 > ... > 6 for every row
    out[2] = np.arange(1, 8)  # row 2 ranks 6 > 5 > 4 > 3 > 2 > 1 > 0: class 2 is 5th
    out[1] = [7, 6, 5, 4, 3, 2, 8]  # row 1: 6 > 0 > 1 > ...: class 1 is 3rd
    s = compare(ref, out)
    assert s.top1_agree == pytest.approx(1 / 3) and s.disagree == 2  # only row 0's argmax is 0
    assert s.top5_agree == 1.0  # 0, 1 and 2 are each within the candidate's top 5
    out[2] = [7, 6, 1, 5, 4, 3, 2]  # row 2: class 2 now last
    assert compare(ref, out).top5_agree == pytest.approx(2 / 3)


def test_labelled_figures_by_hand():
    ref = np.eye(4)[[0, 1, 2, 3]] * 3  # reference top-1: 0 1 2 3
    out = np.eye(4)[[0, 2, 2, 0]] * 3  # candidate top-1: 0 2 2 0
    labels = np.array([0, 1, 3, 0])  # reference right on 0, 1; candidate right on 0, 3
    s = compare(ref, out, labels)
    assert (s.acc_ref, s.acc) == (0.5, 0.5)
    assert (s.flips_down, s.flips_up) == (1, 1) and s.acc_drop == 0.0
    lo, hi = s.acc_drop_ci
    assert lo < 0 < hi  # 2 flips in 4 images decide nothing


def test_nan_in_the_candidate_fails_whatever_the_bounds():
    out = np.array([[1.0, np.nan], [0.0, 1.0]])
    s = compare(np.array([[1.0, 0.0], [0.0, 1.0]]), out)
    assert math.isnan(s.max_abs) and math.isnan(s.cos_min)
    assert Thresholds().check(s) == ["output has NaN/Inf"]


# -- bounds ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("field, bound, ok, bad, phrase", [
    ("max_abs", 1e-3, 1e-3, 1.1e-3, "max abs diff"),
    ("cos_min", 0.95, 0.95, 0.9499, "min cosine"),
    ("cos_mean", 0.99, 0.99, 0.9899, "mean cosine"),
])
def test_each_bound_passes_at_its_edge_and_fails_beyond_it(field, bound, ok, bad, phrase):
    th = Thresholds(**{field: bound})
    assert th.judge(_stats(**{field: ok})).passed
    v = th.judge(_stats(**{field: bad}))
    assert v.failed and v.status == "fail" and v.failures[0].startswith(phrase)
    assert Thresholds().judge(_stats(**{field: bad})).passed  # None: not checked


def test_top1_agreement_is_judged_on_its_interval():
    th = Thresholds(top1_agree=0.9)
    assert th.judge(_stats(top1_agree=0.95, top1_agree_ci=[0.92, 0.97])).passed  # the whole interval above
    v = th.judge(_stats(top1_agree=0.91, top1_agree_ci=[0.85, 0.95]))  # straddles the bound
    assert v.status == "inconclusive" and "top-1 agreement 91.0%" in v.inconclusive[0]
    v = th.judge(_stats(top1_agree=0.8, top1_agree_ci=[0.75, 0.85]))  # the whole interval below
    assert v.status == "fail" and "top-1 agreement 80.0% < 90%" in v.failures[0]
    assert th.judge(_stats(top1_agree=0.9)).passed  # no interval (an older record): the figure itself, at the edge


def test_accuracy_drop_is_judged_on_its_interval_and_only_with_labels():
    th = Thresholds(acc_drop=1.0)
    labelled = dict(acc_ref=0.8, acc=0.79, acc_drop=1.0, flips_down=10, flips_up=0)
    assert th.judge(_stats(**labelled, acc_drop_ci=[0.2, 0.9])).passed
    assert th.judge(_stats(**labelled, acc_drop_ci=[0.5, 1.6])).status == "inconclusive"
    v = th.judge(_stats(**labelled, acc_drop_ci=[1.1, 2.0]))
    assert v.status == "fail" and "dropped 1.00 points > 1" in v.failures[0]
    assert th.judge(_stats(acc_drop=5.0, acc_drop_ci=[4.0, 6.0])).passed  # unlabelled: acc is None, not judged
    # no interval: the drop computed from the accuracies, in points
    assert th.judge(_stats(acc_ref=0.8, acc=0.78)).failed and th.judge(_stats(acc_ref=0.8, acc=0.795)).passed


def test_judge_uses_the_precisions_defaults_unless_overridden():
    s = _stats(cos_min=0.96, cos_mean=0.995)
    assert judge(s, "int8").passed  # 0.96 >= 0.95
    assert judge(s, "fp16").failed  # 0.96 < 0.999
    assert judge(s, "int8", replace(DEFAULT_THRESHOLDS["int8"], cos_min=0.97)).failed
    assert "cosine min 0.96000" in describe(s)


def _docs_table(header: str) -> dict[str, list[str]]:
    """The rows of the PARITY.md table whose header row starts with `header`, by precision (a row naming two,
    'int8, fp8', stands for both)."""
    lines = (ROOT / "docs" / "PARITY.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        first, *cells = [c.strip() for c in line.strip("|").split("|")]
        for precision in re.findall(r"\b(fp32|bf16|fp16|int8|fp8)\b", first.split("(")[0]):
            rows[precision] = cells
    return rows


def _number(cell):
    m = re.search(r"([0-9.]+(?:e-?[0-9]+)?)", cell)
    return None if cell in ("–", "-") or m is None else float(m.group(1))


def test_the_defaults_are_the_ones_docs_parity_states():
    rows = _docs_table("| precision | max abs |")
    assert set(rows) == set(DEFAULT_THRESHOLDS)
    for precision, cells in rows.items():
        th = DEFAULT_THRESHOLDS[precision]
        assert [_number(c) for c in cells[:4]] == [th.max_abs, th.cos_min, th.cos_mean, th.acc_drop], precision


def test_the_dense_defaults_are_the_ones_docs_parity_states():
    rows = _docs_table("| precision | depth AbsRel")
    assert set(rows) == set(DEFAULT_THRESHOLDS)
    for precision, cells in rows.items():
        th = DEFAULT_THRESHOLDS[precision]
        assert [_number(c) for c in cells[:4]] == [th.absrel, th.delta1, th.pixel_agree, th.miou], precision


def test_the_failure_phrases_carry_the_figures():
    th = Thresholds(acc_drop=1.0)
    # a recorded drop is the one said (it may differ from the rounded accuracies' difference)
    v = th.judge(_stats(acc_ref=0.8, acc=0.8, acc_drop=2.0, acc_drop_ci=[1.5, 2.5]))
    assert v.failures == ["top-1 accuracy dropped 2.00 points > 1 (95% interval 1.50 to 2.50)"]
    v = th.judge(_stats(acc_ref=0.8, acc=0.78))  # no recorded drop: (0.80 - 0.78) * 100 points
    assert v.failures == ["top-1 accuracy dropped 2.00 points > 1 (95% interval 2.00 to 2.00)"]
    assert v.thresholds is th and v.stats.acc == 0.78


def test_an_interval_that_touches_the_bound_is_not_beyond_it():
    th = Thresholds(acc_drop=1.0)
    labelled = dict(acc_ref=0.8, acc=0.79, acc_drop=1.0)
    assert th.judge(_stats(**labelled, acc_drop_ci=[1.0, 1.4])).status == "inconclusive"  # lo == bound: not a fail
    assert th.judge(_stats(**labelled, acc_drop_ci=[0.4, 1.0])).status == "pass"  # hi == bound: within


def _with_rates(n, down, up, agree=None):
    """Labelled stats of n images where `down` flipped right to wrong and `up` wrong to right (intervals from
    compare() on one-hot logits that do exactly that)."""
    classes = 10
    labels = np.arange(n) % classes
    ref = np.eye(classes)[labels] * 5.0
    ref[:up] = np.eye(classes)[(labels[:up] + 1) % classes] * 5.0
    out = np.eye(classes)[labels] * 5.0
    out[up:up + down] = np.eye(classes)[(labels[up:up + down] + 1) % classes] * 5.0
    return compare(ref, out, labels)


def _need(text: str, bound: str) -> int:
    return int(re.search(rf"about ([\d,]+) would resolve {bound}$", text).group(1).replace(",", ""))


@pytest.mark.parametrize("n, down, up", [(200, 3, 1), (300, 3, 0), (150, 0, 0), (1, 1, 0), (400, 7, 2), (250, 1, 2)])
def test_an_undecided_drop_says_how_many_images_would_decide_it(n, down, up):
    from vitexport.parity.stats import paired_drop

    th = Thresholds(acc_drop=1.5)
    s = _with_rates(n, down=down, up=up)
    v = th.judge(s)
    assert v.status == "inconclusive", v
    text = v.inconclusive[0]
    drop, lo, hi = s.acc_drop, *s.acc_drop_ci
    assert text.startswith(f"inconclusive: top-1 accuracy drop {drop:.2f} points, 95% interval {lo:.2f} to {hi:.2f}, "
                           f"is not within 1.5 on {n:,} images ({down} flipped down, {up} up); about ")
    need = _need(text, "1.5 points")

    def decided(m):  # the same flip rates on m images: the exact interval on one side of the bound
        _, lo, hi = paired_drop(round(down / n * m), round(up / n * m), m)
        return hi <= 0.015 or lo > 0.015

    assert need > n and decided(need)
    assert int(need / 1.1) <= n or not decided(int(need / 1.1))  # the first such size, to 10 %


def test_a_drop_on_the_bound_cannot_be_decided_by_more_images():
    th = Thresholds(acc_drop=1.0)
    s = _stats(n=300, acc_ref=0.8, acc=0.79, acc_drop=1.0, acc_drop_ci=[-0.5, 2.5], flips_down=3, flips_up=0)
    text = th.judge(s).inconclusive[0]
    assert text.endswith("on 300 images (3 flipped down, 0 up)")  # no 'about N would resolve'


@pytest.mark.parametrize("n, agree, bound", [(100, 97, 0.95), (300, 290, 0.95), (50, 46, 0.9)])
def test_an_undecided_agreement_says_how_many_images_would_decide_it(n, agree, bound):
    th = Thresholds(top1_agree=bound)
    s = _stats(n=n, top1_agree=agree / n, top1_agree_ci=list(clopper_pearson(agree, n)))
    v = th.judge(s)
    assert v.status == "inconclusive", v
    text = v.inconclusive[0]
    lo, hi = s.top1_agree_ci
    assert text.startswith(f"inconclusive: top-1 agreement {agree / n:.1%}, 95% interval {lo:.1%}-{hi:.1%}, is not "
                           f"above {bound:.0%} on {n:,} images; about ")
    need = _need(text, f"{bound:.0%}")

    def decided(m):
        lo, hi = clopper_pearson(round(agree / n * m), m)
        return lo >= bound or hi < bound

    assert need > n and decided(need)
    assert int(need / 1.1) <= n or not decided(int(need / 1.1))


def test_an_agreement_on_the_bound_cannot_be_decided_by_more_images():
    s = _stats(n=100, top1_agree=0.95, top1_agree_ci=[0.89, 0.98])
    assert Thresholds(top1_agree=0.95).judge(s).inconclusive[0].endswith("is not above 95% on 100 images")


def test_describe_says_every_figure():
    s = _stats(max_abs=0.0123, mean_abs=0.000456, cos_min=0.99, cos_mean=0.995, top1_agree=0.95,
               top1_agree_ci=[0.92, 0.97], top5_agree=0.999)
    plain = ("max abs 0.0123, mean abs 0.000456, cosine min 0.99000 / mean 0.99500, top-1 agree 95.0% "
             "(95% 92.0%-97.0%), top-5 agree 99.9%")
    assert describe(s) == plain
    assert describe(replace(s, top1_agree_ci=None)) == plain.replace(" (95% 92.0%-97.0%)", "")
    labelled = replace(s, acc_ref=0.8, acc=0.79, acc_drop=1.0, acc_drop_ci=[0.2, 1.8], flips_down=12, flips_up=2)
    assert describe(labelled) == plain + (", top-1 accuracy 80.00% -> 79.00%, drop +1.00 points (95% +0.20 to "
                                          "+1.80; 12 flipped down, 2 up)")
    assert describe(replace(labelled, acc_drop_ci=None)) == plain + ", top-1 accuracy 80.00% -> 79.00%"
    assert describe(replace(labelled, acc=None)) == describe(replace(labelled, acc_ref=None)) == plain


def test_records_and_verdicts_as_reports_write_them():
    from vitexport.parity.compare import EXPORT_THRESHOLDS, ParityVerdict, export_thresholds

    s = _stats(top1_agree_ci=[0.99, 1.0])
    d = s.to_dict()
    assert d == {"n": 1000, "max_abs": 0.0, "mean_abs": 0.0, "cos_min": 1.0, "cos_mean": 1.0, "top1_agree": 1.0,
                 "top5_agree": 1.0, "acc_ref": None, "acc": None, "top1_agree_ci": [0.99, 1.0]}  # unknown: left out
    assert ParityStats(**d) == s
    v = ParityVerdict(s, Thresholds(), ["a bound missed"], ["an undecided one"])
    assert v.problems() == ["a bound missed", "an undecided one"] and v.failed and not v.passed
    assert v.to_dict() == {**d, "passed": False, "status": "fail", "failures": ["a bound missed"],
                           "inconclusive": ["an undecided one"]}
    assert ParityVerdict(s, Thresholds(), [], ["x"]).to_dict()["status"] == "inconclusive"
    assert Thresholds(cos_min=0.5).to_dict() == {"max_abs": None, "cos_min": 0.5, "cos_mean": None,
                                                 "top1_agree": None, "acc_drop": None, "absrel": None,
                                                 "delta1": None, "pixel_agree": None, "miou": None,
                                                 "mask_iou": None, "mask_iou_min": None, "map": None,
                                                 "map_50": None, "box_iou": None}
    assert export_thresholds() is EXPORT_THRESHOLDS and EXPORT_THRESHOLDS.max_abs == 1e-4
    assert export_thresholds(3e-4) == replace(EXPORT_THRESHOLDS, max_abs=3e-4)


def test_a_detector_is_judged_by_its_detections_not_its_tensors():
    """A detector's row passes on its mAP whatever its cosine and max abs (a swapped pair of queries moves them), fails
    on an mAP whose interval is below the bound, is undecided across it, and says so when the reference found
    nothing to score against."""
    th = Thresholds(max_abs=1e-3, cos_min=0.99999, map=0.99, map_50=0.995, box_iou=0.995)
    swapped = _stats(dense="detection", max_abs=1.97, cos_min=0.9999, map=1.0, map_ci=[1.0, 1.0], map_50=1.0,
                     map_50_ci=[1.0, 1.0], box_iou=0.999, box_iou_ci=[0.998, 1.0])
    assert th.judge(swapped).status == "pass"
    assert th.judge(replace(swapped, dense=None)).status == "fail"  # a classifier is held to its tensors
    low = replace(swapped, map=0.5, map_ci=[0.4, 0.6])
    assert th.judge(low).status == "fail" and "mAP 0.5 < 0.99" in th.judge(low).failures[0]
    across = replace(swapped, map=0.99, map_ci=[0.98, 1.0])
    assert th.judge(across).status == "inconclusive"
    nothing = replace(swapped, map=None, map_ci=None, map_50=None, map_50_ci=None)
    assert th.judge(nothing).status == "inconclusive" and "detects nothing" in th.judge(nothing).inconclusive[0]


# -- the streamed figures at their edges ------------------------------------------------------------------------

def test_cosine_of_small_logits_and_of_one_zero_vector():
    ref = np.array([[3e-4, 4e-4], [0.0, 0.0], [1.0, 2.0]])
    out = np.array([[4e-4, 3e-4], [1.0, 0.0], [0.0, 0.0]])
    s = compare(ref, out)
    # 0.96 whatever the scale; a zero vector against a non-zero one shares no direction: 0
    assert s.cos_mean == pytest.approx(0.96 / 3) and s.cos_min == 0.0
    assert compare(np.array([[1.0]]), np.array([[3.0]])).mean_abs == 2.0  # one value: its difference


@pytest.mark.parametrize("rank, inside", [(4, True), (5, False), (6, False)])
def test_top5_is_the_first_five_of_many_classes(rank, inside):
    classes = 12
    out = np.arange(classes, 0, -1, dtype=float)[None]  # class 0 first, class 11 last
    ref = np.zeros((1, classes))
    ref[0, rank] = 1.0  # the reference's top-1 is the candidate's (rank + 1)-th class
    labels = np.array([rank])
    s = compare(ref, out, labels)
    assert s.top5_agree == float(inside) and s.top5_acc == float(inside) and s.top5_acc_ref == 1.0
    assert s.top5_acc_ci == list(clopper_pearson(int(inside), 1))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_candidate_is_wrong_everywhere(bad):
    ref = np.eye(3) * 4
    out = np.eye(3) * 4
    out[1, 0] = bad
    labels = np.array([0, 1, 2])
    s = compare(ref, out, labels)
    assert math.isnan(s.max_abs) and math.isnan(s.mean_abs) and math.isnan(s.cos_min) and math.isnan(s.cos_mean)
    assert (s.top1_agree, s.top5_agree, s.acc) == (0.0, 0.0, 0.0)
    assert s.acc_ref == 1.0 and s.acc_drop == 100.0


def test_the_streamed_intervals_are_the_exact_ones():
    from vitexport.parity.accumulate import ParityAccumulator
    from vitexport.parity.stats import paired_drop

    rng = np.random.default_rng(3)
    labels = rng.integers(0, 8, 400)
    ref = rng.standard_normal((400, 8)) + np.eye(8)[labels] * 2
    out = ref + rng.standard_normal((400, 8)) * 0.8
    acc = ParityAccumulator(400, labels)
    for i in range(0, 400, 64):
        acc.update(i, ref[i:i + 64], out[i:i + 64])
    s = acc.stats()
    agree = int((ref.argmax(1) == out.argmax(1)).sum())
    right_ref, right_out = ref.argmax(1) == labels, out.argmax(1) == labels
    down, up = int((right_ref & ~right_out).sum()), int((~right_ref & right_out).sum())
    drop, lo, hi = paired_drop(down, up, 400)
    assert s.top1_agree_ci == list(clopper_pearson(agree, 400)) and s.disagree == 400 - agree
    assert s.acc_ref_ci == list(clopper_pearson(int(right_ref.sum()), 400))
    assert s.acc_ci == list(clopper_pearson(int(right_out.sum()), 400))
    assert (s.flips_down, s.flips_up) == (down, up) and down > 0 and up > 0
    assert s.acc_drop == pytest.approx(drop * 100) and s.acc_drop_ci == pytest.approx([lo * 100, hi * 100])
    top5 = lambda x: np.argsort(-x, axis=1)[:, :5]  # noqa: E731
    assert s.top5_acc_ref == pytest.approx((top5(ref) == labels[:, None]).any(1).mean())
    assert s.top5_acc == pytest.approx((top5(out) == labels[:, None]).any(1).mean())


def test_the_streamed_cosines_keep_their_sign():
    """An output pointing away from the reference is a cosine of -1, not +1: the per-image figure is signed."""
    from vitexport.parity.accumulate import ParityAccumulator

    rng = np.random.default_rng(5)
    ref = rng.standard_normal((40, 6))
    out = ref + rng.standard_normal((40, 6)) * 0.1
    out[[3, 17, 31]] *= -1  # three images answered with the opposite vector
    acc = ParityAccumulator(40)
    for i in range(0, 40, 16):
        acc.update(i, ref[i:i + 16], out[i:i + 16])
    s = acc.stats()
    cos = (ref * out).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(out, axis=1)
    assert cos.min() < -0.9
    assert s.cos_min == pytest.approx(cos.min()) and s.cos_mean == pytest.approx(cos.mean())


def test_what_was_not_compared_is_said():
    from vitexport.parity.accumulate import ParityAccumulator

    acc = ParityAccumulator(5)
    acc.update(0, np.ones((2, 3)), np.ones((2, 3)))
    with pytest.raises(ValueError, match="^3 of 5 images were never compared$"):
        acc.stats()
    with pytest.raises(ValueError, match=r"^shape mismatch: \(2, 3\) vs \(2, 4\)$"):
        acc.update(2, np.ones((2, 3)), np.ones((2, 4)))


@pytest.mark.parametrize("classes", [5, 6, 7, 12, 100])
def test_top5_agrees_with_a_full_sort_on_random_logits(classes):
    rng = np.random.default_rng(classes)
    ref, out = rng.standard_normal((300, classes)), rng.standard_normal((300, classes))
    labels = rng.integers(0, classes, 300)
    s = compare(ref, out, labels)
    top5 = np.argsort(-out, axis=1)[:, :5]
    assert s.top5_agree == pytest.approx((top5 == ref.argmax(1)[:, None]).any(1).mean())
    assert s.top5_acc == pytest.approx((top5 == labels[:, None]).any(1).mean())
    assert s.top5_acc_ref == pytest.approx((np.argsort(-ref, axis=1)[:, :5] == labels[:, None]).any(1).mean())
