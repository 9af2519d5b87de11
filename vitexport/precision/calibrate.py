"""Activation ranges for INT8, collected batch by batch in bounded memory.

The FP32 model is run with the tensors to calibrate added as graph outputs; each batch updates one small
collector per tensor and is then dropped, so peak memory depends on the batch size, never on the number of
calibration images. Three methods, all symmetric (|x|), as TensorRT needs:

- ``minmax``: the largest |x| seen;
- ``percentile``: the given percentile of |x| (a histogram merged across batches; told how many inputs the run
  has, it bins after the first batch only the values at the top the percentile can depend on);
- ``entropy``: TensorRT's KL-divergence threshold on the same histogram (as NVIDIA's calibrators pick it).
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import Future, ThreadPoolExecutor
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from ..backends.ort_session import create_session, split_weights
from ..errors import VitexportError

CALIBRATION_METHODS = ("minmax", "entropy", "percentile")
HIST_BINS = 2048  # bins of the first batch's range; later batches extend the range with the same bin width
MAX_BINS = 1 << 15  # beyond this many bins, adjacent bins are merged (the width doubles)
ENTROPY_QUANT_BINS = 128  # int8, symmetric: 128 levels on each side
ENTROPY_STRIDE = 4  # thresholds tried every this many bins (1 is exhaustive; 4 is within a bin width of it)

CHUNK = 1 << 16  # values per step of a histogram update (256 KB of float32, 512 KB of indices)

Tick = Callable[[int], None]
_buffers = threading.local()


def _scratch(n: int) -> tuple[np.ndarray, np.ndarray]:
    """This thread's float32 and index buffers of at least CHUNK values, first n of each."""
    if getattr(_buffers, "a", None) is None:
        _buffers.a, _buffers.idx = np.empty(CHUNK, np.float32), np.empty(CHUNK, np.intp)
    return _buffers.a[:n], _buffers.idx[:n]


class AbsHistogram:
    """A histogram of |x| with a fixed bin width, grown as larger values arrive; merging batches is exact.

    After `keep_top`, only values at or above a floor are put in bins; the others are only counted (`below`), which
    is all a percentile far enough up needs of them (percentile_amax), for a fraction of the work."""

    def __init__(self, bins: int = HIST_BINS) -> None:
        self.first_bins = bins
        self.width = 0.0
        self.counts: np.ndarray | None = None  # int64 counts; bin i covers [i * width, (i + 1) * width)
        self.amax = 0.0
        self.floor: np.float32 | None = None  # keep_top's floor: values below it are counted in `below` only
        self.below = 0
        self.above = 0  # values known to be at or above the floor (a lower bound for the first batch)

    def update(self, x: np.ndarray) -> None:
        """Count |x|: each value's bin is floor(|x| * (1 / width)) in float32, cast straight into the index buffer.
        Multiplying by a positive number keeps the order of float32 values, so no index exceeds that of the
        largest |x|: the bins are grown to hold each chunk's largest first, and no index needs clipping."""
        flat = np.asarray(x, dtype=np.float32).ravel()
        if not flat.size:
            return
        if self.counts is None:  # the first batch's range sets the bin width
            amax = float(max(flat.max(), -flat.min()))
            _finite(amax)
            self.width = (amax / self.first_bins) if amax > 0 else 1e-8
            self.counts = np.zeros(self.first_bins, dtype=np.int64)
        for start in range(0, flat.size, CHUNK):  # a chunk at a time, in buffers that stay in cache
            part = flat[start:start + CHUNK]
            a, idx = _scratch(len(part))
            np.abs(part, out=a)
            amax = float(a.max())
            _finite(amax)
            if amax > self.amax:
                self.amax = amax
                needed = int(np.float32(amax) * np.float32(1.0 / self.width)) + 1
                if needed > len(self.counts):
                    self._grow(needed)
            if self.floor is not None:  # only the values at or above the floor are binned
                a = a[a >= self.floor]
                self.below += len(part) - len(a)
                self.above += len(a)
                idx = idx[:len(a)]
            np.multiply(a, np.float32(1.0 / self.width), out=idx, casting="unsafe")  # truncated: floor for x >= 0
            counted = np.bincount(idx)
            self.counts[:len(counted)] += counted

    def keep_top(self, top: float) -> None:
        """From now on, bin only what a percentile that depends on the `top` largest values of everything this
        histogram will see needs: the values at or above a floor under which this first batch alone holds more than
        twice `top` values (no later batch can then move the percentile below it); the rest are counted. A floor
        too low to save work (the second bin or less) is not set."""
        assert self.counts is not None and self.floor is None
        need = 2 * top + 2
        above = np.cumsum(self.counts[::-1])[::-1]  # above[e]: values in bins e and up
        e = int(np.searchsorted(-above, -need, side="right")) - 1  # the last bin with above[e] >= need
        if e >= 2:
            self.floor = np.float32((e - 1) * self.width)  # a bin lower: every value of bin e or up is above it
            self.above = int(above[e])

    def _grow(self, needed: int) -> None:
        assert self.counts is not None
        factor = 1
        while needed > MAX_BINS * factor:
            factor *= 2
        counts = self.counts
        if factor > 1:  # merge runs of `factor` bins: the width grows, no count moves to a wrong bin
            pad = (-len(counts)) % factor
            counts = np.concatenate([counts, np.zeros(pad, dtype=np.int64)]).reshape(-1, factor).sum(1)
            self.width *= factor
            needed = -(-needed // factor)
        self.counts = np.concatenate([counts, np.zeros(max(0, needed - len(counts)), dtype=np.int64)])

    def coarse(self, max_bins: int) -> tuple[np.ndarray, float]:
        """(counts, width) with at most max_bins bins, adjacent bins summed."""
        assert self.counts is not None
        factor = -(-len(self.counts) // max_bins)
        if factor <= 1:
            return self.counts.astype(np.float64), self.width
        pad = (-len(self.counts)) % factor
        counts = np.concatenate([self.counts, np.zeros(pad, dtype=np.int64)]).reshape(-1, factor).sum(1)
        return counts.astype(np.float64), self.width * factor

    def percentile_amax(self, percentile: float) -> float:
        """The upper edge of the bin that holds the value at `percentile`, capped at the largest |x|. After
        keep_top, the values counted below the floor are put in the first bin: more than (100 - percentile) % of all
        values are above the floor, so the cumulative count stays under the percentile's rank in every bin below the
        floor's, and from the floor's bin up it is that of binning every value: the bin found is the same."""
        assert self.counts is not None
        counts = self.counts
        if self.floor is not None:
            total = int(counts.sum()) + self.below
            if self.above <= total * (1 - percentile / 100.0) + 1:
                raise VitexportError("Calibration saw more values than it was told to expect; its percentile "
                                     "cannot be read from the values it kept.")
            counts = counts.copy()
            counts[0] += self.below
        cdf = np.cumsum(counts, dtype=np.float64)
        i = int(np.searchsorted(cdf, cdf[-1] * percentile / 100.0))
        return min(self.amax, (i + 1) * self.width)

    def entropy_amax(self) -> float:
        """The threshold whose 128-level quantization loses least information (KL divergence), as TensorRT."""
        if self.amax == 0:  # only zeros: no distribution to compare (and 0 / 0 below)
            return 0.0
        counts, width = self.coarse(HIST_BINS)
        return min(self.amax, _kl_threshold(counts) * width)


def _finite(amax: float) -> None:
    if not math.isfinite(amax):
        raise VitexportError("Calibration saw NaN or Inf activations; check the calibration inputs.")


def _kl_threshold(hist: np.ndarray, nq: int = ENTROPY_QUANT_BINS, stride: int = ENTROPY_STRIDE) -> int:
    """Bins kept (the threshold in bins) minimising KL(reference || quantized); TensorRT's entropy calibration."""
    hist = hist.copy()
    if len(hist) > 1:
        hist[0] = hist[1]  # the zero bin is dominated by exact zeros (padding, ReLU-like ops): TensorRT drops it
    n = len(hist)
    if n <= nq:
        return n
    best, best_i = math.inf, n
    for i in range(nq, n + 1, stride):
        ref = hist[:i].copy()
        ref[-1] += hist[i:].sum()  # outliers clipped into the last kept bin
        level = (np.arange(i) * nq) // i  # which of the nq quantized bins each kept bin falls in
        nonzero = hist[:i] > 0
        sums = np.bincount(level, weights=hist[:i], minlength=nq)
        used = np.bincount(level, weights=nonzero.astype(np.float64), minlength=nq)
        expanded = np.where(nonzero, (sums / np.maximum(used, 1))[level], 0.0)
        p, q = ref / ref.sum(), expanded / max(expanded.sum(), 1e-30)
        mask = p > 0
        if np.any(mask & (q == 0)):
            div = math.inf
        else:
            div = float(np.sum(p[mask] * np.log(p[mask] / q[mask])))
        if div <= best:  # ties: the larger threshold (fewer clipped values), as TensorRT takes the last minimum
            best, best_i = div, i
    return best_i


class ChannelMax:
    """The per-channel mode: the largest |x| of each channel (the last axis) over every batch, token and image, as
    SmoothQuant needs it."""

    def __init__(self) -> None:
        self.amax: np.ndarray | None = None

    def update(self, x: np.ndarray, share: float | None = None) -> None:  # share: unused (every value counts)
        a = np.abs(np.asarray(x, dtype=np.float32))
        m = a.reshape(-1, a.shape[-1]).max(axis=0) if a.size else None
        if m is None:
            return
        if not np.all(np.isfinite(m)):
            raise VitexportError("Calibration saw NaN or Inf activations; check the calibration inputs.")
        self.amax = m if self.amax is None else np.maximum(self.amax, m)

    def result(self) -> list[float]:
        return [] if self.amax is None else [float(v) for v in self.amax]


class _Collector:
    def __init__(self, method: str, percentile: float) -> None:
        self.method, self.percentile = method, percentile
        self.amax = 0.0
        self.hist = AbsHistogram() if method != "minmax" else None

    def update(self, x: np.ndarray, share: float | None = None) -> None:
        """share: the fraction of all the inputs of the run that x's batch holds, when known; given with the first
        batch, a percentile then bins only the values it can depend on (AbsHistogram.keep_top)."""
        if self.hist is not None:
            first = self.hist.counts is None
            self.hist.update(x)
            if first and share and self.method == "percentile" and self.hist.counts is not None:
                self.hist.keep_top(x.size / share * (1 - self.percentile / 100.0))
        else:
            m = float(np.abs(x).max()) if x.size else 0.0
            _finite(m)
            self.amax = max(self.amax, m)

    def result(self) -> float:
        if self.hist is None:
            return self.amax
        if self.hist.counts is None:
            return 0.0
        if self.method == "percentile":
            return self.hist.percentile_amax(self.percentile)
        return self.hist.entropy_amax()


ACTIVATION_BUDGET = 256 * 2**20  # bytes of calibrated activations one run may return (a ViT-B/16 batch of 4: 0.2
# GB); two runs' are alive at once (one counted while the next runs), so calibration holds at most 512 MB of them


def calibration_batch(model_path: Path, tensors: list[str], largest: int, budget: int = ACTIVATION_BUDGET,
                      model=None) -> int:
    """Images per calibration run: `largest`, or fewer when one image's calibrated activations are so large that
    a batch would exceed `budget` (ViT-H/14: about 290 MB an image), so memory stays bounded by the model's size.
    model: model_path's ModelProto when the caller has read it (it is not changed)."""
    import onnx

    model = model if model is not None else onnx.load(str(model_path), load_external_data=False)
    graph = model.graph if model.graph.value_info else onnx.shape_inference.infer_shapes(model).graph
    shapes = {v.name: v.type.tensor_type.shape for v in [*graph.value_info, *graph.input, *graph.output]}
    per_image = 0
    for name in tensors:
        shape = shapes.get(name)
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in shape.dim[1:]] if shape is not None else []
        if not dims or 0 in dims:
            return largest  # a size not known before running: the default
        per_image += 4 * math.prod(dims)
    return max(1, min(largest, budget // max(per_image, 1)))


@dataclass
class CalibrationStats:
    amax: dict[str, float]  # tensor name -> symmetric range (scale = amax / 127); per_channel: a list per channel
    samples: int
    seconds: float


def observed_model_bytes(model_path: Path, tensors: list[str]) -> bytes:
    """The FP32 model with `tensors` added as graph outputs, serialized (ONNX Runtime loads it from memory). Weights
    in external data stay there: ONNX Runtime reads them from the model's folder (create_session's external_folder),
    so the bytes are the graph alone, whatever the model's size."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    model.graph.output.extend(observed_outputs(model, tensors))
    return model.SerializeToString()


def observed_outputs(model, tensors: list[str]) -> list:
    """The graph outputs (ValueInfoProtos) that `tensors` need beyond the model's own, typed as the graph says."""
    import onnx

    known = {o.name for o in model.graph.output}
    types = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.value_info}
    produced = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input}
    outputs = []
    for name in tensors:
        if name not in produced:
            raise VitexportError(f"The graph has no tensor {name!r} to calibrate.")
        if name not in known:
            known.add(name)
            outputs.append(onnx.helper.make_tensor_value_info(name, types.get(name, onnx.TensorProto.FLOAT), None))
    return outputs


def calibrate(model_path: Path, tensors: list[str], batches: Iterable[np.ndarray], input_name: str,
              method: str = "percentile", percentile: float = 99.999, threads: int | None = None,
              tick: Tick | None = None, per_channel: bool = False, model=None,
              inputs: int | None = None) -> CalibrationStats:
    """Run `batches` through the FP32 model and return each tensor's symmetric range; memory stays flat.
    inputs: how many inputs `batches` holds at most, when known: a percentile then bins, after the first batch,
    only the largest values it can depend on (the same range, for about a third of the counting work).
    per_channel: each tensor's largest |x| per channel of its last axis instead (ChannelMax; `method` unused).
    model: model_path's ModelProto when the caller has read it (it is not changed: one read of a large graph serves
    the batch size, the session, and whoever needs the graph afterwards)."""
    if method not in CALIBRATION_METHODS:
        raise VitexportError(f"Unknown calibration method {method!r}; choose one of: {', '.join(CALIBRATION_METHODS)}.")
    if not 0 < percentile <= 100:
        raise VitexportError(f"The calibration percentile must be in (0, 100], got {percentile}.")
    import onnx

    t0 = time.perf_counter()
    model = model if model is not None else onnx.load(str(model_path), load_external_data=False)
    graph, weights = split_weights(model, outputs=observed_outputs(model, tensors))
    sess = create_session(graph, threads=threads, external_folder=Path(model_path).parent, weights=weights)
    collectors = {t: ChannelMax() if per_channel else _Collector(method, percentile) for t in tensors}

    def count(outs: list[np.ndarray], size: int) -> None:
        share = size / inputs if inputs else None
        for name, out in zip(tensors, outs):
            collectors[name].update(out, share)
        if tick is not None:
            tick(size)

    n = 0
    # each batch's activations are counted on a thread of their own while ONNX Runtime runs the next batch (it
    # releases the GIL): numpy's counting uses one core, and the cores ONNX Runtime leaves idle between its
    # operators do it. Batches are counted in order; at most two batches' activations are alive.
    with ThreadPoolExecutor(1, thread_name_prefix="calibrate") as pool:
        counting: Future | None = None
        for x in batches:
            outs = sess.run(tensors, {input_name: np.ascontiguousarray(x, dtype=np.float32)})
            if counting is not None:
                counting.result()
            counting = pool.submit(count, outs, len(x))
            del outs
            n += len(x)
        if counting is not None:
            counting.result()
    if n == 0:
        raise VitexportError("No calibration inputs were given.")
    amax = {t: c.result() if per_channel else float(c.result()) for t, c in collectors.items()}
    return CalibrationStats(amax, n, time.perf_counter() - t0)

