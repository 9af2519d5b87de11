"""Latency of one runner at one batch size: warm-up, then timed runs until both a count and a time are reached."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from ..backends.base import Runner

MAX_RUNS = 10_000  # a very fast backend stops here even if min_time is not reached
# without --iterations: at least MIN_RUNS timed runs, or MIN_TIMED_S seconds of them that agree within TIGHT (a
# slow configuration: 3 runs at least), then stop once the median is stable (the median of every run and that of
# all but the last two within STABLE of each other), at DEFAULT_RUNS at most once min_time is reached, and after
# BUDGET_S seconds of runs (3 at least) whether or not the median settled: such a figure is marked (Latency.stable
# False). A ViT-B/16 batch of 8 takes 1.6-2.3 s a run on 2 cores: ten runs of each of eight rows were two minutes of
# the first run, five runs still one, and on a busy machine (runs 10-20 % apart) most rows went on to ten runs;
# with the budget such a row makes 3 runs, one of 1 s six.
MIN_RUNS = 5
MIN_TIMED_S = 4.0
TIGHT = 0.05  # ... and stopping before MIN_RUNS runs takes every run within 5 % of their median, too
DEFAULT_RUNS = 10
STABLE = 0.02
SAMPLES = 200  # runs kept for a report's latency distribution; more are summarised by this many quantiles
BUDGET_S = 6.0  # hyperfine's rule for a slow command is 3 runs and 3 s at least


@dataclass
class Latency:
    batch: int
    iterations: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    throughput: float  # images per second
    h2d_ms: float | None = None  # host -> device copy of the input, measured apart
    d2h_ms: float | None = None  # device -> host copy of the output, measured apart
    relative_to_reference: float | None = None  # throughput / PyTorch FP32 eager throughput, same batch
    # a served model under load (bench/load.py): requests in flight, and what the server says of them
    concurrency: int | None = None
    stable: bool | None = None  # the last three measurement windows agreed within 10 % (a served model), or the
    # median had settled (median_stable) when timing stopped (None: a number of runs was asked for)
    windows: int | None = None
    p95_ms: float | None = None
    requests: int | None = None  # sent during the measurement
    server_requests: int | None = None  # the server's statistics: requests it answered in that time ...
    server_inferences: int | None = None  # ... and images
    server_queue_ms: float | None = None  # per request, queued in the server
    server_compute_ms: float | None = None  # per request, computing (input, inference, output)
    samples_ms: list[float] | None = None  # the timed runs (at most SAMPLES, then that many quantiles of them)


def takes_batch(runner: Runner, b: int, info: dict, log) -> bool:
    """Whether `runner` takes batches of b; if not, b is noted under info['skipped_batches'] and said."""
    lo, hi = runner.batch_range or (1, b)
    if lo <= b <= hi:
        return True
    info.setdefault("skipped_batches", []).append(b)
    log.info(f"{runner.name}: batch {b} is outside its range {lo}-{hi}; not timed")
    return False


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def kept_samples(ms: list[float], limit: int = SAMPLES) -> list[float]:
    """The runs as a report keeps them: all of them up to `limit`, else `limit` evenly spaced quantiles."""
    values = np.asarray(ms, np.float64) if len(ms) <= limit else np.quantile(ms, np.linspace(0, 1, limit))
    return [round(float(v), 4) for v in values]


def _copy_times(runner: Runner, x: np.ndarray, staged: object) -> tuple[float, float]:
    """Median host->device and device->host copy times in ms (GPU runners)."""
    up, down = [], []
    out = runner.run(staged)
    for _ in range(3):
        t0 = time.perf_counter()
        runner.stage(x)
        runner.synchronize()
        up.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        runner.fetch(out)
        down.append(time.perf_counter() - t0)
    return statistics.median(up) * 1e3, statistics.median(down) * 1e3


def median_stable(ms: list[float], within: float = STABLE) -> bool:
    """Whether the last two runs moved the median by at most `within` of it."""
    if len(ms) < 3:
        return False
    now, before = statistics.median(ms), statistics.median(ms[:-2])
    return abs(now - before) <= within * now


def enough(ms: list[float], iterations: int | None, elapsed: float, min_time: float) -> bool:
    """Whether timing can stop: `iterations` runs and `min_time` seconds; without `iterations`, min_time and MIN_RUNS
    runs, then a stable median (median_stable) or DEFAULT_RUNS runs; a slow configuration may stop after
    MIN_TIMED_S seconds of runs (3 at least: median_stable) when every run is within TIGHT of their median, and
    stops after BUDGET_S seconds of runs (3 at least) in any case."""
    if elapsed < min_time:
        return len(ms) >= MAX_RUNS
    if iterations is not None:
        return len(ms) >= iterations
    timed = sum(ms) / 1e3  # the runs' own time (s), not the loop's
    if len(ms) >= DEFAULT_RUNS or (len(ms) >= 3 and timed >= BUDGET_S):
        return True
    if not median_stable(ms):
        return False
    return len(ms) >= MIN_RUNS or (timed >= MIN_TIMED_S and max(ms) - min(ms) <= TIGHT * statistics.median(ms))


def measure_latency(runner: Runner, x: np.ndarray, iterations: int | None, min_time: float, warmup: int) -> Latency:
    """At least `iterations` timed runs (None: until the median is stable, see MIN_RUNS, and `stable` says whether it
    was when timing stopped) and at least `min_time` seconds of them, after `warmup` untimed runs."""
    b = len(x)
    staged = runner.stage(x)
    h2d, d2h = _copy_times(runner, x, staged) if runner.device == "cuda" else (None, None)
    for _ in range(warmup):
        runner.run(staged)
    ms: list[float] = []
    start = time.perf_counter()
    while not ms or not enough(ms, iterations, time.perf_counter() - start, min_time):
        # one complete run in ms: wall clock, or CUDA events on the runner's own stream (TensorRT)
        ms.append(runner.timed_run(staged))
    mean = statistics.fmean(ms)
    return Latency(b, len(ms), mean, _percentile(ms, 50), _percentile(ms, 90), _percentile(ms, 99),
                   b / (mean / 1e3), h2d, d2h, stable=None if iterations is not None else median_stable(ms),
                   samples_ms=kept_samples(ms))
