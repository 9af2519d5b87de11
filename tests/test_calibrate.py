"""Streaming calibration: histograms merged across batches agree with numpy on all the data at once,
TensorRT's entropy threshold agrees with a literal port of NVIDIA's reference, memory does not grow."""

import math
import tracemalloc
from collections import Counter

import numpy as np
import pytest

from vitexport.errors import VitexportError
from vitexport.precision.calibrate import MAX_BINS, AbsHistogram, _Collector, _kl_threshold


def _batches(rng, n, scale_growth=False):
    for i in range(n):
        s = 1.0 + (i * 0.5 if scale_growth else 0.0)
        yield rng.standard_normal((4, 50, 30)).astype(np.float32) * s


@pytest.mark.parametrize("growth", [False, True])
def test_merged_histogram_matches_numpy_percentile(growth):
    rng = np.random.default_rng(0)
    batches = list(_batches(rng, 12, growth))
    h = AbsHistogram()
    for b in batches:
        h.update(b)
    everything = np.abs(np.concatenate([b.ravel() for b in batches]))
    assert h.counts.sum() == everything.size  # every value counted exactly once
    assert h.amax == pytest.approx(float(everything.max()))
    ranked = np.sort(everything)
    for p in (50.0, 99.0, 99.9, 99.99):
        want = float(ranked[math.ceil(everything.size * p / 100) - 1])  # the value at that rank
        got = h.percentile_amax(p)
        assert want - 1e-6 <= got <= want + h.width + 1e-6, p  # the upper edge of its bin


def test_histogram_coarsens_when_range_explodes():
    h = AbsHistogram()
    h.update(np.full(100, 1e-3, np.float32))
    h.update(np.array([1e3], np.float32))  # a million times the first range: bins are merged, not lost
    assert len(h.counts) <= (1 << 15) + 1
    assert h.counts.sum() == 101
    assert h.percentile_amax(50.0) < 1.0  # the bulk is still resolved below 1
    assert h.percentile_amax(100.0) == pytest.approx(1e3, rel=1e-3)


def test_nan_activations_are_one_sentence():
    h = AbsHistogram()
    with pytest.raises(VitexportError, match="NaN or Inf"):
        h.update(np.array([1.0, np.nan], np.float32))
    c = _Collector("minmax", 99.9)
    with pytest.raises(VitexportError, match="NaN or Inf"):
        c.update(np.array([np.inf], np.float32))


def test_minmax_is_the_largest_magnitude():
    rng = np.random.default_rng(1)
    c = _Collector("minmax", 0)
    batches = list(_batches(rng, 5))
    for b in batches:
        c.update(b)
    assert c.result() == pytest.approx(max(float(np.abs(b).max()) for b in batches))


def _reference_entropy_bins(bins, num_bits=8, start_bin=128, stride=1):
    """A literal port of pytorch-quantization's _compute_amax_entropy (NVIDIA), returning the threshold bin."""
    bins = bins.copy()
    bins[0] = bins[1]
    divergences, arguments = [], []
    nbins = 1 << (num_bits - 1)
    stop = len(bins)
    new_density_counts = np.zeros(nbins, dtype=np.float64)
    for i in range(start_bin, stop + 1, stride):
        new_density_counts.fill(0)
        space = np.linspace(0, i, num=nbins + 1)
        digitized_space = np.digitize(range(i), space) - 1
        digitized_space[bins[:i] == 0] = -1
        for idx, digitized in enumerate(digitized_space):
            if digitized != -1:
                new_density_counts[digitized] += bins[idx]
        counter = Counter(digitized_space)
        for key, val in counter.items():
            if key != -1:
                new_density_counts[key] = new_density_counts[key] / val
        new_density = np.zeros(i, dtype=np.float64)
        for idx, digitized in enumerate(digitized_space):
            if digitized != -1:
                new_density[idx] = new_density_counts[digitized]
        reference = np.array(bins[:len(digitized_space)], dtype=np.float64)
        reference[-1] += np.sum(bins[i:])
        p, q = reference / reference.sum(), new_density / new_density.sum()
        mask = p > 0
        ent = math.inf if np.any(q[mask] == 0) else float(np.sum(p[mask] * np.log(p[mask] / q[mask])))
        divergences.append(ent)
        arguments.append(i)
    last_argmin = len(divergences) - 1 - int(np.argmin(divergences[::-1]))
    return arguments[last_argmin]


@pytest.mark.parametrize("kind", ["gauss_outliers", "laplace"])
def test_entropy_threshold_matches_nvidia_reference(kind):
    rng = np.random.default_rng(2)
    if kind == "gauss_outliers":
        x = np.concatenate([rng.standard_normal(200_000), rng.uniform(20, 40, 30)])
    else:
        x = rng.laplace(size=200_000)
    hist, _ = np.histogram(np.abs(x), bins=512, range=(0, np.abs(x).max()))
    ref = _reference_entropy_bins(hist.astype(np.float64))
    ours = _kl_threshold(hist.astype(np.float64), stride=1)
    assert abs(ours - ref) <= 2, (ours, ref)  # within two bins of NVIDIA's choice (digitize's edge rounding)
    if kind == "gauss_outliers":
        assert ours < 0.6 * len(hist)  # the outliers are clipped, not stretched over


def test_collector_memory_does_not_grow_with_batches():
    """The state kept between batches is bounded (by the range, never by the batch count), and the peak of
    Python-visible allocations is the same after 5 and after 50 batches."""
    rng = np.random.default_rng(3)

    def peak(n):
        c = _Collector("percentile", 99.99)
        tracemalloc.start()
        for b in _batches(rng, n):
            c.update(b)
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top, c.hist.counts.nbytes

    p5, s5 = peak(5)
    p50, s50 = peak(50)
    assert s5 <= s50 <= (MAX_BINS + 1) * 8
    assert p50 < p5 * 1.5 + 200_000
