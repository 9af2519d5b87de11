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


def _tail_batches(rng, kind, n):
    for i in range(n):
        x = rng.standard_normal((4, 60, 48)).astype(np.float32)
        if kind == "growing":
            x *= 1 + i
        elif kind == "outliers":  # ranges hundreds of times the first batch's: bins are merged on the way
            x.flat[rng.integers(0, x.size, 5)] *= 400 * (i + 1)
        elif kind == "loud_first" and i == 0:
            x *= 10  # the batch that sets the floor is unlike the rest
        yield x


@pytest.mark.parametrize("kind", ["plain", "growing", "outliers", "loud_first"])
def test_a_percentile_from_the_top_values_is_the_one_from_every_value(kind):
    """Told the first batch's share of the run, a percentile bins only the values above a floor (and counts the
    rest): it finds the same bin as binning every value, and the value at its rank lies in that bin."""
    rng = np.random.default_rng(11)
    n = 9
    batches = list(_tail_batches(rng, kind, n))
    everything = np.sort(np.abs(np.concatenate([b.ravel() for b in batches])))
    for p in (99.999, 99.99, 99.9, 99.0, 90.0, 100.0):
        full, top = _Collector("percentile", p), _Collector("percentile", p)
        for b in batches:
            full.update(b)
            top.update(b, 1 / n)
        if p >= 99:  # the first batch holds twice the run's top share well above its second bin
            most = 0 if kind == "growing" else everything.size / 2  # (later batches nine times wider pass the floor)
            assert top.hist.floor is not None and top.hist.below > most, p  # only counted
        else:  # a ninth of the run can hold twice its top 10 % nowhere: every value is binned
            assert top.hist.floor is None and top.hist.below == 0, p
        assert top.hist.below + top.hist.counts.sum() == everything.size
        assert top.result() == full.result(), p
        want = float(everything[math.ceil(everything.size * p / 100) - 1])
        assert want - 1e-6 <= top.result() <= want + top.hist.width * (1 + 1e-6), p
    if kind == "outliers":
        assert top.hist.width > full.hist.width / 2 > 0 and len(top.hist.counts) > 2049  # bins were grown, merged


def test_the_floor_has_the_first_batchs_share_above_it():
    """keep_top's record of the values above its floor never overstates them (it is the guarantee's count), and
    holds at least twice the run's top share."""
    rng = np.random.default_rng(5)
    for scale in (1.0, 40.0):
        x = (rng.standard_normal(20_000) * scale).astype(np.float32)
        h = AbsHistogram()
        h.update(x)
        h.keep_top(25.0)
        assert h.floor is not None
        assert 2 * 25 + 2 <= h.above <= int(np.count_nonzero(np.abs(x) >= h.floor)), scale


TOO_FEW = ("Calibration saw more values than it was told to expect; its percentile cannot be read from the values "
           "it kept.")


def test_a_percentile_told_too_few_values_says_so_rather_than_guess():
    h = _Collector("percentile", 99.9)
    h.update(np.linspace(0, 1, 1000, dtype=np.float32), 0.5)  # announced: one batch more of the same
    for _ in range(100):
        h.update(np.zeros(1000, np.float32))  # a hundred more, all below the floor
    with pytest.raises(VitexportError) as e:
        h.result()
    assert str(e.value) == TOO_FEW
    for zeros, refused in ((1003, False), (1004, True)):  # 502 values above the floor: enough while 25 % + 1 < 502
        h = _Collector("percentile", 75.0)
        h.update(np.linspace(0, 1, 1000, dtype=np.float32), 1.0)  # announced: the whole run (a top of 250)
        h.update(np.zeros(zeros, np.float32))
        assert h.hist.above == 502
        if refused:
            with pytest.raises(VitexportError, match="more values than it was told"):
                h.result()
        else:
            ranked = np.sort(np.concatenate([np.linspace(0, 1, 1000, dtype=np.float32), np.zeros(zeros)]))
            want = ranked[math.ceil(ranked.size * 0.75) - 1]
            assert want <= h.result() <= want + h.hist.width * (1 + 1e-6)
    h, full = _Collector("percentile", 99.9), _Collector("percentile", 99.9)
    for i in range(101):  # as many more, but like the first: the values above the floor still decide the rank
        h.update(np.linspace(0, 1, 1000, dtype=np.float32), 0.5)
        full.update(np.linspace(0, 1, 1000, dtype=np.float32))
    assert h.hist.floor is not None and h.result() == full.result()
    assert _Collector("percentile", 99.9).hist.floor is None  # no share given: every value is binned
    for method in ("entropy", "minmax"):
        c = _Collector(method, 99.9)
        c.update(np.linspace(0, 1, 1000, dtype=np.float32), 0.001)
        assert c.hist is None or c.hist.floor is None, method  # entropy needs the whole histogram


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


# -- calibrate(): a tiny graph run by ONNX Runtime, its ranges against numpy on the same values ---------------------

def _graph(tmp_path, value_info_type=None):
    """y = relu(x * w): the tensors 'h' (x * w, negative values too) and 'y' are calibrated."""
    from onnx import TensorProto, helper, numpy_helper, save

    w = numpy_helper.from_array(np.linspace(-2, 2, 8, dtype=np.float32).reshape(1, 8), "w")
    nodes = [helper.make_node("Mul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    vi = [helper.make_tensor_value_info("h", value_info_type, [None, 8])] if value_info_type else []
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 8])], [w],
                              value_info=vi)
    path = tmp_path / "g.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path, numpy_helper.to_array(w)


def test_calibrate_gives_each_tensors_range_by_each_method(tmp_path, monkeypatch):
    from vitexport.precision.calibrate import calibrate

    path, w = _graph(tmp_path)
    rng = np.random.default_rng(3)
    batches = [rng.standard_normal((n, 8)).astype(np.float64) for n in (5, 3, 7)]  # float64: converted to float32
    h = np.concatenate([b.astype(np.float32) * w for b in batches])
    y = np.maximum(h, 0)
    ticks = []
    stats = calibrate(path, ["h", "y"], iter(batches), "x", method="minmax", tick=ticks.append)
    assert ticks == [5, 3, 7] and stats.samples == 15
    assert stats.amax == {"h": pytest.approx(float(np.abs(h).max())), "y": pytest.approx(float(y.max()))}
    for p in (50.0, 90.0):
        got = calibrate(path, ["h"], iter(batches), "x", method="percentile", percentile=p).amax["h"]
        want = float(np.sort(np.abs(h).ravel())[math.ceil(h.size * p / 100) - 1])
        assert want - 1e-6 <= got <= want + float(np.abs(h).max()) / 2048 * 2 + 1e-6, p  # the upper edge of a bin
        told = calibrate(path, ["h"], iter(batches), "x", method="percentile", percentile=p, inputs=15)
        assert told.amax["h"] == got, p  # binning only the top values finds the same bin
    tops = []
    monkeypatch.setattr(AbsHistogram, "keep_top", lambda self, top: tops.append(top))
    calibrate(path, ["h"], iter(batches), "x", method="percentile", percentile=99.0, inputs=30)
    assert tops == [pytest.approx(40 * 30 / 5 * 0.01)]  # the first batch: 5 of 30 inputs, 40 values of 'h'
    calibrate(path, ["h"], iter(batches), "x", method="percentile", percentile=99.0)
    assert len(tops) == 1  # not told the run's size: every value is binned
    entropy = calibrate(path, ["h"], iter(batches), "x", method="entropy").amax["h"]
    assert 0 < entropy <= float(np.abs(h).max()) + 1e-6
    assert list(calibrate(path, ["y", "h"], iter(batches), "x", method="minmax").amax) == ["y", "h"]


def test_calibrate_refuses_what_it_cannot_do_in_one_sentence(tmp_path):
    from vitexport.precision.calibrate import calibrate

    path, _ = _graph(tmp_path)
    one = [np.ones((2, 8), np.float32)]
    with pytest.raises(VitexportError) as e:
        calibrate(path, ["h"], one, "x", method="kl")
    assert str(e.value) == "Unknown calibration method 'kl'; choose one of: minmax, entropy, percentile."
    for p in (0, -1, 100.5):
        with pytest.raises(VitexportError) as e:
            calibrate(path, ["h"], one, "x", percentile=p)
        assert str(e.value) == f"The calibration percentile must be in (0, 100], got {p}."
    assert calibrate(path, ["h"], one, "x", percentile=100).amax["h"] == pytest.approx(2.0)  # 100 is allowed
    with pytest.raises(VitexportError) as e:
        calibrate(path, ["h"], [], "x")
    assert str(e.value) == "No calibration inputs were given."
    with pytest.raises(VitexportError) as e:
        calibrate(path, ["h", "missing"], one, "x")
    assert str(e.value) == "The graph has no tensor 'missing' to calibrate."


def test_the_observed_graph_adds_each_tensor_once_with_its_type(tmp_path):
    import onnx

    from vitexport.precision.calibrate import observed_model_bytes

    path, _ = _graph(tmp_path, value_info_type=onnx.TensorProto.DOUBLE)  # a type that shows where it came from
    model = onnx.load_from_string(observed_model_bytes(path, ["h", "y", "x"]))
    outputs = {o.name: o.type.tensor_type.elem_type for o in model.graph.output}
    assert list(outputs) == ["y", "h", "x"]  # 'y' was an output already: not added twice
    assert outputs["h"] == onnx.TensorProto.DOUBLE and outputs["x"] == onnx.TensorProto.FLOAT
    plain, _ = _graph(tmp_path)
    model = onnx.load_from_string(observed_model_bytes(plain, ["h"]))
    assert {o.name: o.type.tensor_type.elem_type for o in model.graph.output}["h"] == onnx.TensorProto.FLOAT


def test_a_collector_that_saw_nothing_gives_zero_and_a_histogram_ignores_empty_batches():
    for method in ("minmax", "percentile", "entropy"):
        c = _Collector(method, 99.0)
        c.update(np.zeros((0, 4), np.float32))
        assert c.result() == 0.0, method
    c = _Collector("percentile", 100.0)
    c.update(np.zeros((0,), np.float32))
    c.update(np.array([0.5, -3.0], np.float32))
    assert c.hist.counts.sum() == 2 and c.result() == pytest.approx(3.0)


def test_an_all_zero_tensor_has_a_zero_range():
    for method in ("minmax", "percentile", "entropy"):
        c = _Collector(method, 99.9)
        c.update(np.zeros((4, 4), np.float32))
        assert c.result() == 0.0, method


# -- the histogram and the KL threshold, exactly ----------------------------------------------------------------

def _exact_reference_bins(bins, stride=1, nbins=128):
    """The port above with integer digitization (kept bin j -> level floor(j * 128 / i), what linspace/digitize
    compute up to float rounding at the edges): our threshold must equal it exactly, ties included."""
    bins = np.asarray(bins, np.float64).copy()
    if len(bins) <= nbins:
        return len(bins)
    bins[0] = bins[1]
    best, best_i = math.inf, None
    for i in range(nbins, len(bins) + 1, stride):
        level = [(j * nbins) // i for j in range(i)]
        sums, used = [0.0] * nbins, [0] * nbins
        for j in range(i):
            if bins[j] != 0:
                sums[level[j]] += bins[j]
                used[level[j]] += 1
        q = np.array([sums[level[j]] / used[level[j]] if bins[j] != 0 else 0.0 for j in range(i)])
        ref = bins[:i].copy()
        ref[-1] += bins[i:].sum()
        p, q = ref / ref.sum(), q / q.sum()
        mask = p > 0
        ent = math.inf if np.any(q[mask] == 0) else float(np.sum(p[mask] * np.log(p[mask] / q[mask])))
        if ent <= best:  # the last minimum
            best, best_i = ent, i
    return best_i


def _histograms():
    rng = np.random.default_rng(7)
    gauss = np.histogram(np.abs(rng.standard_normal(50_000)), bins=400)[0]
    sparse = gauss.copy()
    sparse[rng.random(len(sparse)) < 0.3] = 0  # empty bins among full ones
    spiky = np.histogram(np.abs(np.concatenate([rng.laplace(size=30_000), rng.uniform(8, 9, 500)])), bins=300)[0]
    spiky[0] = 100_000  # a zero bin swollen by exact zeros
    return {"gauss": gauss, "sparse": sparse, "spiky": spiky, "flat": np.full(256, 10),  # ties at 128 and 256
            "short": gauss[:128], "one_more": gauss[:129]}


@pytest.mark.parametrize("name", sorted(_histograms()))
@pytest.mark.parametrize("stride", [1, 4])
def test_the_kl_threshold_is_the_exact_references(name, stride):
    hist = _histograms()[name].astype(np.float64)
    assert _kl_threshold(hist, stride=stride) == _exact_reference_bins(hist, stride)
    if name == "flat":
        assert _kl_threshold(hist, stride=stride) == 256  # a tie goes to the larger threshold


def _numpy_counts(values, width, bins):
    idx = np.minimum((np.asarray(values, np.float64) / width).astype(np.int64), bins - 1)
    return np.bincount(idx, minlength=bins)


def test_the_histogram_counts_every_value_in_its_bin_as_it_grows():
    rng = np.random.default_rng(4)
    first = (rng.integers(0, 2048, 5000) + 0.5).astype(np.float32)  # off every bin edge
    first[0] = 2048.0  # amax 2048 over 2048 bins: width 1
    h = AbsHistogram()
    h.update(-first)  # magnitudes
    assert h.width == 1.0 and h.counts.dtype == np.int64 and len(h.counts) == 2049
    later = np.array([3000.5, 12.5, 2500.5], np.float32)
    h.update(later)
    seen = np.concatenate([first, later])
    assert len(h.counts) == 3001 and h.amax == 3000.5  # grown to the bin of the new largest value, no further
    np.testing.assert_array_equal(h.counts, _numpy_counts(seen, 1.0, 3001))
    h.update(np.array([65535.5], np.float32))  # needs 65536 bins: twice MAX_BINS exactly, so bins are paired
    seen = np.append(seen, 65535.5)
    assert (h.width, len(h.counts)) == (2.0, 32768)
    np.testing.assert_array_equal(h.counts, _numpy_counts(seen, 2.0, 32768))
    h.update(np.array([300_001.0], np.float32))  # 150001 bins of 2: merged by eight, into 18751 bins of 16
    seen = np.append(seen, 300_001.0)
    assert (h.width, len(h.counts)) == (16.0, 18751) and h.counts.dtype == np.int64
    np.testing.assert_array_equal(h.counts, _numpy_counts(seen, 16.0, 18751))


def test_a_first_batch_below_one_or_of_zeros_sets_a_fine_width():
    h = AbsHistogram()
    h.update(np.array([0.5, 0.25], np.float32))
    assert h.width == 0.5 / 2048
    z = AbsHistogram()
    z.update(np.zeros(10, np.float32))  # no range yet: a tiny width, grown as values arrive
    z.update(np.random.default_rng(5).uniform(0, 1e-3, 10_000).astype(np.float32))
    assert z.width < 1e-6 and abs(z.percentile_amax(50.0) - 5e-4) < 2e-5


def test_coarse_sums_runs_of_bins():
    h = AbsHistogram()
    h.update(np.array([2048.0], np.float32))  # width 1
    h.update((np.random.default_rng(8).integers(0, 3001, 20_000) + 0.5).astype(np.float32))  # 3001 bins
    assert len(h.counts) == 3001
    counts, width = h.coarse(4096)  # few enough already
    np.testing.assert_array_equal(counts, h.counts)
    assert width == h.width and counts.dtype == np.float64
    for max_bins, factor in ((1501, 2), (1001, 3), (100, 31)):
        counts, width = h.coarse(max_bins)
        padded = np.concatenate([h.counts, np.zeros((-len(h.counts)) % factor, np.int64)])
        np.testing.assert_array_equal(counts, padded.reshape(-1, factor).sum(1))
        assert width == h.width * factor and len(counts) <= max_bins


def test_entropy_and_percentile_ranges_in_value_units():
    rng = np.random.default_rng(6)
    x = np.abs(rng.standard_normal(100_000)).astype(np.float32)
    x[0] = 1.0 if x.max() < 1 else x[0]
    h = AbsHistogram()
    h.update(x)
    counts, width = h.coarse(2048)
    assert h.entropy_amax() == pytest.approx(min(h.amax, _exact_reference_bins(counts, 4) * width))
    one = AbsHistogram()
    one.update(np.array([1.0, 0.5, 0.25], np.float32))  # amax exactly 1
    assert one.entropy_amax() > 0
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no 0 / 0 on a tensor of zeros
        zeros = AbsHistogram()
        zeros.update(np.zeros(100, np.float32))
        assert zeros.entropy_amax() == 0.0


def test_the_nan_sentence_word_for_word():
    from vitexport.precision.calibrate import ChannelMax

    for collector in (_Collector("percentile", 99.0), _Collector("minmax", 99.0), ChannelMax()):
        with pytest.raises(VitexportError) as e:
            collector.update(np.array([[1.0, np.nan]], np.float32))
        assert str(e.value) == "Calibration saw NaN or Inf activations; check the calibration inputs."


def test_per_channel_maxima_that_saw_nothing_are_none_and_ignore_empty_batches():
    from vitexport.precision.calibrate import ChannelMax

    c = ChannelMax()
    assert c.result() == []
    c.update(np.zeros((0, 3), np.float32))
    assert c.result() == []
    c.update(np.array([[[1.0, -5.0, 0.5]], [[-2.0, 1.0, 0.25]]], np.float32))
    assert c.result() == [2.0, 5.0, 0.5]


def test_calibrate_reports_its_own_duration_and_takes_small_percentiles(tmp_path, monkeypatch):
    import types

    import vitexport.precision.calibrate as module

    ticks = iter([100.0, 102.5])  # a clock the test sets: the call's start, then its end
    monkeypatch.setattr(module, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    path, _ = _graph(tmp_path)
    stats = module.calibrate(path, ["h"], [np.ones((2, 8), np.float32)], "x", percentile=0.5)
    assert stats.seconds == 2.5  # the end minus the start, not a clock reading


def test_weights_split_off_the_graph_give_the_files_outputs(tmp_path, digits_export):
    """calibrate's session: the graph serialized without its inline weights, the weights handed over as arrays. It
    answers as a session on the file does; a model whose weights are in external data keeps reading them there."""
    import onnx

    from vitexport.backends.ort_session import LIFTED, create_session, split_weights

    src = digits_export / "model.onnx"
    x = np.random.default_rng(0).standard_normal((3, 3, 32, 32)).astype(np.float32)
    want = create_session(src).run(None, {"pixel_values": x})[0]
    model = onnx.load(str(src))
    before = model.SerializeToString()
    extra = onnx.helper.make_tensor_value_info(model.graph.node[3].output[0], onnx.TensorProto.FLOAT, None)
    graph, weights = split_weights(model, outputs=[extra])
    assert model.SerializeToString() == before  # the model is not changed: the session gets a copy
    assert len(graph) < 0.1 * src.stat().st_size and weights  # the weights (all but those under 1 KB) are not in it
    copy = onnx.load_from_string(graph)
    lifted = [t for t in copy.graph.initializer if t.external_data and t.external_data[0].value == LIFTED]
    assert {t.name for t in lifted} == set(weights) and all(not t.raw_data for t in lifted)
    assert [o.name for o in copy.graph.output] == [o.name for o in model.graph.output] + [extra.name]
    assert [n.name for n in copy.graph.node] == [n.name for n in model.graph.node]
    assert copy.opset_import == model.opset_import and copy.ir_version == model.ir_version
    inline = {t.name: t for t in model.graph.initializer}
    for name, array in weights.items():
        np.testing.assert_array_equal(array, onnx.numpy_helper.to_array(inline[name]))
    got = create_session(graph, weights=weights)
    outs = got.run(None, {"pixel_values": x})
    np.testing.assert_array_equal(outs[0], want)
    assert len(outs) == 2
    ext = tmp_path / "ext" / "model.onnx"
    ext.parent.mkdir()
    onnx.save(onnx.load(str(src)), str(ext), save_as_external_data=True, location="w.bin")
    graph, weights = split_weights(onnx.load(str(ext), load_external_data=False))
    assert not weights  # nothing inline to split
    got = create_session(graph, external_folder=ext.parent, weights=weights).run(None, {"pixel_values": x})[0]
    np.testing.assert_array_equal(got, want)


def _wide_graph(tmp_path, dims=(6, 300)):
    """h = x @ w (w of 300 x 300 floats: 360 KB, split off the graph as calibrate's session takes it), y = relu(h)."""
    from onnx import TensorProto, helper, numpy_helper, save

    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.standard_normal((300, 300)).astype(np.float32) / 10, "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, *dims])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, *dims])], [w],
                              value_info=[helper.make_tensor_value_info("h", TensorProto.FLOAT, [None, *dims])])
    path = tmp_path / "wide.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path, numpy_helper.to_array(w)


def test_calibrate_on_a_graph_with_large_weights_by_tensor_and_per_channel(tmp_path):
    """The weights go to the session as arrays; the ranges are numpy's, per tensor (minmax) and per channel
    (SmoothQuant's maxima: a list per tensor); a model already read is used, not read again."""
    import onnx

    from vitexport.precision.calibrate import calibrate

    path, w = _wide_graph(tmp_path)
    rng = np.random.default_rng(8)
    batches = [rng.standard_normal((n, 6, 300)).astype(np.float32) for n in (3, 2, 4)]
    h = np.concatenate(batches) @ w
    stats = calibrate(path, ["h", "y"], iter(batches), "x", method="minmax")
    assert stats.amax["h"] == pytest.approx(float(np.abs(h).max()), rel=1e-5)
    assert stats.amax["y"] == pytest.approx(float(np.maximum(h, 0).max()), rel=1e-5)
    assert all(type(v) is float for v in stats.amax.values())
    per = calibrate(path, ["h"], iter(batches), "x", per_channel=True)
    assert isinstance(per.amax["h"], list) and len(per.amax["h"]) == 300
    np.testing.assert_allclose(per.amax["h"], np.abs(h).max(axis=(0, 1)), rtol=1e-5)
    model = onnx.load(str(path))
    moved = tmp_path / "gone.onnx"
    path.rename(moved)  # only the model handed over can be used now
    again = calibrate(path, ["h"], iter(batches), "x", method="minmax", model=model)
    assert again.amax["h"] == stats.amax["h"]


def test_calibrate_reads_external_weights_from_the_models_folder(tmp_path):
    import onnx

    from vitexport.precision.calibrate import calibrate

    path, w = _wide_graph(tmp_path)
    ext = tmp_path / "ext"
    ext.mkdir()
    onnx.save(onnx.load(str(path)), str(ext / "m.onnx"), save_as_external_data=True, location="w.bin")
    rng = np.random.default_rng(9)
    batches = [rng.standard_normal((2, 6, 300)).astype(np.float32)]
    stats = calibrate(ext / "m.onnx", ["h"], iter(batches), "x", method="minmax")
    assert stats.amax["h"] == pytest.approx(float(np.abs(batches[0] @ w).max()), rel=1e-5)


@pytest.mark.parametrize("budget,largest,want", [(10**9, 8, 8), (2 * 6 * 300 * 4 * 2, 8, 2),
                                                 (6 * 300 * 4 * 2, 8, 1), (5 * 6 * 300 * 4 * 2, 3, 3), (1, 8, 1),
                                                 (5 * 6 * 300 * 4 - 1, 8, 2)])  # 2.5 images: 2
def test_the_calibration_batch_keeps_two_tensors_of_a_batch_within_the_budget(tmp_path, budget, largest, want):
    """h and y: 6 x 300 float32 each an image (14,400 bytes for both): a batch is as many images as fit."""
    import onnx

    from vitexport.precision.calibrate import calibration_batch

    path, _ = _wide_graph(tmp_path)
    got = calibration_batch(path, ["h", "y"], largest, budget)
    assert got == want and type(got) is int
    model = onnx.load(str(path))
    path.unlink()  # the model handed over is the one read
    assert calibration_batch(path, ["h", "y"], largest, budget, model=model) == want


def test_the_calibration_batch_of_tensors_of_unknown_size_is_the_largest(tmp_path):
    from vitexport.precision.calibrate import calibration_batch

    path, _ = _graph(tmp_path)  # no value_info: shapes inferred, (None, 8): 8 floats an image
    assert calibration_batch(path, ["h"], 8, budget=64) == 2
    assert calibration_batch(path, ["x", "h"], 8, budget=64) == 1
    wide, _ = _wide_graph(tmp_path, dims=("tokens", 300))  # a size known only when it runs
    assert calibration_batch(wide, ["h"], 5, budget=1) == 5
    assert calibration_batch(wide, ["nowhere"], 5, budget=1) == 5
