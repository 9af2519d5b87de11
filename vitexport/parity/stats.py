"""Intervals for accuracy claims: exact binomial (Clopper-Pearson) intervals for a rate, and the paired top-1
drop between two backends run on the same images.

The paired drop is judged on the images whose top-1 correctness differs between the two ("flips"): of N images,
`down` were right for the reference and wrong for the candidate, `up` the other way round, and the drop is
(down - up) / N. It is the discordance rate d = (down + up) / N times (2p - 1), p = down / (down + up) the share of
the flips that went down (exact McNemar's p). Its 95 % interval takes p's and d's exact intervals at 97.5 % each
(their product holds with at least 95 %, by Bonferroni), so it stays honest where conditional intervals are not:
no flips among 30 images is not proof of no drop (d's upper end is then about 12 %, so the drop is within about
+-12 points).

Pure numpy and math: no scipy (the tests check these against scipy's own binomial test).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

Z95 = 1.959963984540054  # two-sided 95 % normal quantile


def _log_pmf(n: int, p: float) -> np.ndarray:
    """log P(X = k) for k = 0..n, X ~ Binomial(n, p), 0 < p < 1."""
    k = np.arange(n + 1, dtype=np.float64)
    log_choose = np.concatenate([[0.0], np.cumsum(np.log(np.arange(n, 0, -1.0)) - np.log(np.arange(1.0, n + 1)))])
    return log_choose + k * math.log(p) + (n - k) * math.log1p(-p)


def _tail_ge(k: int, n: int, p: float) -> float:
    """P(X >= k)."""
    if k <= 0:
        return 1.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    lp = _log_pmf(n, p)[k:]
    m = lp.max()
    return float(min(1.0, math.exp(m) * np.exp(lp - m).sum()))


def _bisect(f, lo: float = 0.0, hi: float = 1.0, iters: int = 60) -> float:
    """The root of an increasing f on [lo, hi]."""
    for _ in range(iters):
        mid = (lo + hi) / 2
        if f(mid) < 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact two-sided interval for a binomial rate: k successes of n trials. n = 0 gives (0, 1)."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= k <= n:
        raise ValueError(f"{k} successes of {n} trials")
    a = (1 - confidence) / 2
    lo = 0.0 if k == 0 else _bisect(lambda p: _tail_ge(k, n, p) - a)
    hi = 1.0 if k == n else _bisect(lambda p: a - (1.0 - _tail_ge(k + 1, n, p)))
    return lo, hi


def paired_drop(down: int, up: int, n: int, confidence: float = 0.95) -> tuple[float, float, float]:
    """(drop, low, high) of the top-1 accuracy drop, as fractions, from the flips of n paired images."""
    if n <= 0:
        return 0.0, -1.0, 1.0
    flips = down + up
    each = 1 - (1 - confidence) / 2  # two intervals at 97.5 % hold together with at least 95 %
    d_lo, d_hi = clopper_pearson(flips, n, each)
    p_lo, p_hi = clopper_pearson(down, flips, each) if flips else (0.0, 1.0)
    e_lo, e_hi = 2 * p_lo - 1, 2 * p_hi - 1  # drop = d * e, d in [d_lo, d_hi], e in [e_lo, e_hi]
    high = d_hi * e_hi if e_hi >= 0 else d_lo * e_hi
    low = d_hi * e_lo if e_lo < 0 else d_lo * e_lo
    return (down - up) / n, low, high


EXACT_SEARCH_LIMIT = 200_000  # images: past this the normal approximation is close, and exact intervals are slow


def images_to_resolve(drop: float, flip_rate: float, bound: float, n: int,
                      decided: Callable[[int], bool] | None = None) -> int | None:
    """About how many images a paired drop interval needs to fall on one side of `bound` (fractions), were the
    drop and the flip rate what they are now; None when they sit on the bound (no number of images decides).

    decided(N): whether the exact interval at the same rates on N images is decided; when given (and the answer is
    at most EXACT_SEARCH_LIMIT), the normal approximation only seeds a search for the first size, to 10 %, where
    the exact interval is decided (the approximation can fall short of, or overshoot, it).
    """
    margin = abs(bound - drop)
    if margin < 1e-12:
        return None
    rate = max(flip_rate, 1.0 / max(n, 1))  # no flip seen yet: at least one in n
    variance = max(rate - drop * drop, rate / 2)
    need = Z95 * Z95 * variance / (margin * margin)
    zero_flips = -math.log(0.0125) / max(bound, 1e-12) if drop <= 0 <= bound else 0  # d's upper end below bound
    estimate = int(math.ceil(max(need, zero_flips, n + 1)))
    if decided is None or estimate > EXACT_SEARCH_LIMIT:
        return estimate
    return _first_decided(decided, n, estimate)


def _first_decided(decided: Callable[[int], bool], n: int, start: int) -> int:
    """The first size above n, to 10 %, where decided() holds: bracketed from `start` by doubling or halving, then
    narrowed geometrically. Past EXACT_SEARCH_LIMIT without a bracket: the limit's doubling, as the estimate."""
    lo, hi = n, start  # lo: not decided (n is not: the set at hand is undecided); hi: decided, once known
    if decided(start):
        while (half := hi // 2) > n and decided(half):
            hi = half
        lo = max(lo, hi // 2)
    else:
        lo = start
        while not decided(hi := lo * 2):
            lo = hi
            if hi > EXACT_SEARCH_LIMIT:
                return hi
    while hi > lo * 1.1 + 1:
        mid = max(lo + 1, min(hi - 1, int(math.sqrt(lo * hi))))
        if decided(mid):
            hi = mid
        else:
            lo = mid
    return hi


def drop_decided(down_rate: float, up_rate: float, bound: float) -> Callable[[int], bool]:
    """Whether the paired drop interval of N images with these flip rates lies on one side of `bound`."""
    def decided(n: int) -> bool:
        _, lo, hi = paired_drop(round(down_rate * n), round(up_rate * n), n)
        return hi <= bound or lo > bound
    return decided


def rate_decided(rate: float, bound: float) -> Callable[[int], bool]:
    """Whether the exact interval of a rate on N trials lies on one side of `bound` (at or above counts above)."""
    def decided(n: int) -> bool:
        lo, hi = clopper_pearson(round(rate * n), n)
        return lo >= bound or hi < bound
    return decided


# Student's t 97.5 % quantiles for 1..30 degrees of freedom; past 30 the Cornish-Fisher expansion below is exact to
# the third decimal
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """The two-sided 95 % quantile of Student's t with `df` degrees of freedom."""
    if df < 1:
        return math.inf
    if df <= len(_T975):
        return _T975[df - 1]
    z = Z95
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def mean_interval(values: np.ndarray) -> tuple[float, float, float]:
    """(mean, low, high): the mean of per-image figures and its 95 % t-interval (one image: no interval, the
    whole real line; every image equal: a point)."""
    v = np.asarray(values, dtype=np.float64)
    n = len(v)
    if n == 0:
        return math.nan, -math.inf, math.inf
    m = float(v.mean())
    if n == 1:
        return m, -math.inf, math.inf
    half = t975(n - 1) * float(v.std(ddof=1)) / math.sqrt(n)
    return m, m - half, m + half
