"""Accuracy with its uncertainty: the exact intervals against scipy's binomial test, the paired drop's coverage on
simulated pairs, the streamed figures against a hand computation, and verdicts a small set cannot decide."""

from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import ROOT
from scipy.stats import binomtest

from vitexport.cli import cli
from vitexport.model.variants import DIGITS_VARIANT
from vitexport.parity.accumulate import ParityAccumulator, compare
from vitexport.parity.compare import DEFAULT_THRESHOLDS, Thresholds, judge
from vitexport.parity.stats import EXACT_SEARCH_LIMIT, clopper_pearson, images_to_resolve, paired_drop


@pytest.mark.parametrize("k,n", [(0, 1), (1, 1), (0, 30), (1, 30), (15, 30), (29, 30), (30, 30), (356, 360),
                                 (7, 10_000), (9_012, 10_000), (3, 50_000)])
def test_clopper_pearson_is_scipys_exact_interval(k, n):
    ci = binomtest(k, n).proportion_ci(0.95, method="exact")
    assert clopper_pearson(k, n) == pytest.approx((ci.low, ci.high), abs=1e-9)


@pytest.mark.parametrize("k,n,confidence", [(3, 40, 0.975), (0, 12, 0.9), (12, 12, 0.99), (500, 1000, 0.5)])
def test_clopper_pearson_at_other_confidences(k, n, confidence):
    ci = binomtest(k, n).proportion_ci(confidence, method="exact")
    assert clopper_pearson(k, n, confidence) == pytest.approx((ci.low, ci.high), abs=1e-9)


def test_clopper_pearson_edges():
    assert clopper_pearson(0, 0) == (0.0, 1.0) and clopper_pearson(0, -3) == (0.0, 1.0)  # no trials: anything
    assert clopper_pearson(0, 25)[0] == 0.0 and clopper_pearson(25, 25)[1] == 1.0  # exactly, not nearly
    with pytest.raises(ValueError, match="^5 successes of 3 trials$"):
        clopper_pearson(5, 3)
    with pytest.raises(ValueError, match="^-1 successes of 3 trials$"):
        clopper_pearson(-1, 3)
    assert paired_drop(0, 0, 0) == (0.0, -1.0, 1.0)  # no images: any drop


@pytest.mark.parametrize("k,n,p", [(0, 10, 0.3), (-2, 10, 0.3), (3, 10, 0.0), (3, 10, 1.0), (4, 10, 0.25),
                                   (1, 1, 0.5), (10, 10, 0.9), (300, 1000, 0.31)])
def test_the_binomial_tail_is_scipys(k, n, p):
    from scipy.stats import binom

    from vitexport.parity.stats import _tail_ge

    assert _tail_ge(k, n, p) == pytest.approx(float(binom.sf(k - 1, n, p)), abs=1e-12)
    assert 0.0 <= _tail_ge(k, n, p) <= 1.0


def _scipy_paired(down, up, n):
    """The paired drop's interval built from scipy alone: exact intervals at 97.5 % for the flip rate and for the
    share of flips that went down (exact McNemar), combined as drop = rate * (2 share - 1)."""
    flips = down + up
    rate = binomtest(flips, n).proportion_ci(0.975, method="exact")
    share = binomtest(down, flips).proportion_ci(0.975, method="exact") if flips else None
    e_lo, e_hi = (2 * share.low - 1, 2 * share.high - 1) if share else (-1.0, 1.0)
    hi = rate.high * e_hi if e_hi >= 0 else rate.low * e_hi
    lo = rate.high * e_lo if e_lo < 0 else rate.low * e_lo
    return lo, hi


@pytest.mark.parametrize("down,up,n", [(1, 0, 1), (0, 1, 1), (0, 0, 1), (0, 0, 30), (1, 0, 30), (3, 1, 360), (0, 4, 360), (40, 12, 10_000),
                                       (12, 40, 10_000), (250, 250, 50_000)])
def test_paired_drop_against_scipys_binomial_tests(down, up, n):
    drop, lo, hi = paired_drop(down, up, n)
    assert drop == pytest.approx((down - up) / n)
    assert (lo, hi) == pytest.approx(_scipy_paired(down, up, n), abs=1e-9)
    assert lo <= drop <= hi


def test_the_paired_interval_covers_the_true_drop_in_simulations():
    """200 simulated validations: pairs (reference right?, candidate right?) drawn with known rates, so the true
    drop is known; its 95 % interval must hold it in at least 93 % of them."""
    rng = np.random.default_rng(17)
    covered = 0
    for sim in range(200):
        n = int(rng.choice([30, 100, 360, 2000]))
        p_down, p_up = rng.uniform(0, 0.06), rng.uniform(0, 0.03)  # the true flip rates of this candidate
        u = rng.random(n)
        down, up = int((u < p_down).sum()), int(((u >= p_down) & (u < p_down + p_up)).sum())
        _, lo, hi = paired_drop(down, up, n)
        covered += lo <= p_down - p_up <= hi
    assert covered >= 186, covered  # 93 % of 200


def test_streamed_figures_equal_a_hand_computation_in_any_batch_order():
    ref = np.array([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0], [1.0, 0.0, 4.0], [2.0, 1.0, 0.0]])
    out = np.array([[2.0, 1.5, 0.0], [0.0, 1.0, 2.0], [1.0, 0.0, 4.0], [0.0, 1.0, 0.5]])
    labels = np.array([0, 1, 2, 1])
    acc = ParityAccumulator(4, labels)
    acc.update(2, ref[2:], out[2:])  # the second half first
    acc.update(0, ref[:2], out[:2])
    s = acc.stats()
    # by hand: argmax ref [0, 1, 2, 0], out [0, 2, 2, 1]; labels [0, 1, 2, 1]
    assert s.top1_agree == 0.5 and s.disagree == 2
    assert s.acc_ref == 0.75 and s.acc == 0.75  # ref right on 0, 1, 2; out right on 0, 2, 3
    assert (s.flips_down, s.flips_up) == (1, 1) and s.acc_drop == 0.0
    assert s.max_abs == 2.0 and s.mean_abs == pytest.approx(np.abs(ref - out).mean())
    cos = (ref * out).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(out, axis=1)
    assert s.cos_min == pytest.approx(cos.min()) and s.cos_mean == pytest.approx(cos.mean())
    assert acc.per_class() == [{"class": 0, "n": 1, "acc_ref": 1.0, "acc": 1.0},
                               {"class": 1, "n": 2, "acc_ref": 0.5, "acc": 0.5},
                               {"class": 2, "n": 1, "acc_ref": 1.0, "acc": 1.0}]
    with pytest.raises(ValueError, match="never compared"):
        ParityAccumulator(5, None).stats()


def _pairs(n, down, up, classes=10):
    """Logits of n labelled images where the candidate loses `down` and gains `up` right answers."""
    labels = np.arange(n) % classes
    ref = np.eye(classes)[labels] * 5.0
    ref[:up, :] = np.eye(classes)[(labels[:up] + 1) % classes] * 5.0  # the reference is wrong on the first `up`
    out = np.eye(classes)[labels] * 5.0
    out[up:up + down, :] = np.eye(classes)[(labels[up:up + down] + 1) % classes] * 5.0
    return ref, out, labels


def test_a_point_drop_within_bounds_on_30_images_is_inconclusive_not_pass():
    ref, out, labels = _pairs(30, down=0, up=0)
    th = Thresholds(acc_drop=1.5)  # the INT8 default
    v = judge(compare(ref, out, labels), "int8", th)
    assert v.stats.acc_drop == 0.0 and not v.failed and not v.passed and v.status == "inconclusive"
    assert "inconclusive" in v.inconclusive[0] and "30 images" in v.inconclusive[0] and "about" in v.inconclusive[0]
    # the same rates on enough images decide it
    ref, out, labels = _pairs(3000, down=0, up=0)
    assert judge(compare(ref, out, labels), "int8", th).status == "pass"
    # and a drop far beyond the bound on enough images fails
    ref, out, labels = _pairs(3000, down=300, up=0)
    v = judge(compare(ref, out, labels), "int8", th)
    assert v.status == "fail" and "dropped 10.00 points" in v.failures[0]


def test_images_to_resolve_is_enough_for_the_interval():
    need = images_to_resolve(0.0, 0.0, 0.005, 360)
    _, lo, hi = paired_drop(0, 0, need)
    assert hi <= 0.005 < paired_drop(0, 0, need // 2)[2]


def test_an_override_of_the_bound_takes_effect():
    ref, out, labels = _pairs(360, down=3, up=0)  # one-hot logits: only the accuracy bound is under test
    accuracy_only = replace(DEFAULT_THRESHOLDS["int8"], cos_min=None, cos_mean=None)
    assert accuracy_only.acc_drop == 1.5
    assert judge(compare(ref, out, labels), "int8", accuracy_only).status == "inconclusive"
    assert judge(compare(ref, out, labels), "int8", replace(accuracy_only, acc_drop=None)).passed
    assert judge(compare(ref, out, labels), "int8", replace(accuracy_only, acc_drop=20.0)).passed


def test_bench_strict_exits_1_on_an_undecided_bound(tmp_path):
    folder = tmp_path / "digits"
    r = CliRunner().invoke(cli, ["onnx", "-m", DIGITS_VARIANT, "-o", str(folder), "-q"])
    assert r.exit_code == 0, r.output
    args = ["bench", str(folder), "--data", str(ROOT / "calibration" / "digits" / "heldout"), "--max-images", "30",
            "--backend", "onnxruntime cpu fp32", "--threshold", "fp32.acc_drop=0.5", "--batch", "1",
            "--iterations", "1", "--min-time", "0", "--warmup", "0", "--no-prepare", "--json", str(tmp_path / "r.json")]
    r = CliRunner().invoke(cli, args + ["--strict"])
    assert r.exit_code == 1, r.output
    assert "inconclusive" in r.output and "30 images" in r.output
    r = CliRunner().invoke(cli, args)  # without --strict: said, exit 0
    assert r.exit_code == 0 and "inconclusive" in r.output


@pytest.mark.parametrize("first", [31, 37, 1000, 50_000, 180_000])
@pytest.mark.parametrize("drop, flips, bound", [(0.0, 0.0, 0.001), (0.0, 0.0, 0.2), (0.01, 0.02, 0.015)])
def test_images_to_resolve_finds_the_first_deciding_size_from_any_estimate(first, drop, flips, bound):
    """The estimate only seeds the search: from above or below, the answer is the first size, to 10 %, at which
    `decided` holds."""
    asked = []

    def decided(m):
        asked.append(m)
        return m >= first

    need = images_to_resolve(drop, flips, bound, 30, decided=decided)
    if images_to_resolve(drop, flips, bound, 30) > EXACT_SEARCH_LIMIT:
        assert not asked  # a set that large: the approximation, without exact intervals
        return
    assert first <= need <= first * 1.1 + 1, need
    assert len(asked) < 60
    assert images_to_resolve(bound, flips, bound, 30, decided=lambda m: True) is None  # on the bound: never


def test_past_the_limit_the_search_gives_up_with_a_size_past_it():
    need = images_to_resolve(0.01, 0.02, 0.015, 30, decided=lambda m: False)
    assert need > EXACT_SEARCH_LIMIT


def test_drop_decided_reads_the_exact_interval_at_the_same_rates():
    from vitexport.parity.stats import drop_decided

    for down, up, n in ((0.02, 0.01, 1000), (0.003, 0.0, 4000), (0.05, 0.07, 250)):
        _, lo, hi = paired_drop(round(down * n), round(up * n), n)
        for bound in (lo - 1e-3, hi, hi + 1e-3, (lo + hi) / 2, lo):
            assert drop_decided(down, up, bound)(n) is (hi <= bound or lo > bound), (down, up, n, bound)
    _, lo, hi = paired_drop(20, 10, 1000)
    assert drop_decided(0.02, 0.01, hi)(1000) and not drop_decided(0.02, 0.01, lo)(1000)  # at the ends


def test_rate_decided_reads_the_exact_interval():
    from vitexport.parity.stats import rate_decided

    lo, hi = clopper_pearson(990, 1000)
    assert rate_decided(0.99, lo)(1000)  # the interval's low end at the bound: at or above it
    assert not rate_decided(0.99, hi)(1000) and rate_decided(0.99, hi + 1e-9)(1000)
    assert not rate_decided(0.99, (lo + hi) / 2)(1000)
    assert rate_decided(0.5, 0.9)(400) and not rate_decided(0.5, 0.9)(4)
