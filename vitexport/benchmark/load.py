"""Latency of a served model under load, measured the way Triton's perf_analyzer measures it.

At one concurrency level N, N requests are kept in flight (each worker sends its next request when the last one
answers) for the whole measurement. Time is cut into windows of at least `window_s` seconds and `min_requests`
answers; the measurement is stable when the last three windows agree within 10 % on throughput and on p50 latency
(perf_analyzer's --stability-percentage), and ends after `max_windows` windows otherwise, reported unstable. The
figures are those of the last three windows. The server's statistics extension, read before and after, gives its
own count of the requests and images, and the time each request spent queued and computing.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from ..backends.endpoint import EndpointRunner
from ..progress import QUIET, Log
from .latency import Latency, kept_samples

STABILITY = 0.10  # the last three windows within 10 % of their mean
STABLE_WINDOWS = 3
MIN_REQUESTS = 50  # answers per window, at least (perf_analyzer's count-windows default)
MAX_WINDOWS = 10  # perf_analyzer's --max-trials
SETTLE_S = 2.0  # the server counts a request just after answering it: its counters are read once they have caught up
QUIET_S = 0.05  # ... and stopped moving for this long


@dataclass
class Window:
    start: float
    end: float
    latencies: list[float]  # seconds, of the requests answered in the window
    batch: int

    @property
    def throughput(self) -> float:
        return len(self.latencies) * self.batch / max(self.end - self.start, 1e-9)

    @property
    def p50(self) -> float:
        return float(np.percentile(self.latencies, 50)) if self.latencies else float("nan")


def stable(windows: list[Window], within: float = STABILITY, count: int = STABLE_WINDOWS) -> bool:
    """Whether the last `count` windows each lie within `within` of their mean, on throughput and on p50."""
    if len(windows) < count:
        return False
    last = windows[-count:]
    for values in ([w.throughput for w in last], [w.p50 for w in last]):
        mean = sum(values) / count
        if not mean > 0 or any(abs(v - mean) > within * mean for v in values):
            return False
    return True


def summarise(windows: list[Window], concurrency: int, is_stable: bool) -> Latency:
    """The last three windows (all of them when fewer) as one Latency at this concurrency."""
    used = windows[-STABLE_WINDOWS:]
    ms = np.asarray([t for w in used for t in w.latencies]) * 1e3
    seconds = sum(w.end - w.start for w in used)
    b = used[0].batch
    return Latency(b, len(ms), float(ms.mean()), float(np.percentile(ms, 50)), float(np.percentile(ms, 90)),
                   float(np.percentile(ms, 99)), len(ms) * b / max(seconds, 1e-9), concurrency=concurrency,
                   stable=is_stable, windows=len(windows), p95_ms=float(np.percentile(ms, 95)),
                   samples_ms=kept_samples(list(ms)))


async def _measure(runner: EndpointRunner, staged, concurrency: int, window_s: float, min_requests: int,
                   max_windows: int) -> tuple[list[Window], int]:
    """(windows, requests answered in all): N workers in flight until the windows are stable or run out."""
    done: list[tuple[float, float]] = []  # (answered at, seconds)
    stop = asyncio.Event()

    async def worker() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            await asyncio.wait_for(runner.request(staged), runner.timeout)
            t1 = time.perf_counter()
            done.append((t1, t1 - t0))

    workers = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
    windows: list[Window] = []
    try:
        start, seen = time.perf_counter(), 0
        while len(windows) < max_windows:
            await asyncio.sleep(0.01)
            if failed := next((w for w in workers if w.done()), None):
                failed.result()  # a worker stopped: its error ends the measurement
            now = time.perf_counter()
            if now - start < window_s or len(done) - seen < min_requests:
                continue
            windows.append(Window(start, now, [d for _, d in done[seen:]], staged[1]))
            start, seen = now, len(done)
            if stable(windows):
                break
        stop.set()
        await asyncio.gather(*workers)  # each finishes its request in flight: the server's counts see them all
    finally:
        for w in workers:
            w.cancel()
    return windows, len(done)


def settled(runner: EndpointRunner, since: dict | None, sent: int) -> dict | None:
    """The server's counters once they count the `sent` requests answered since `since` and have stopped moving
    (two reads QUIET_S apart agree): a count that lags by one request would otherwise be taken early, and that
    request counted in the next measurement. A server that others use too may count more, and one that never
    settles is read as it is after SETTLE_S seconds."""
    deadline = time.monotonic() + SETTLE_S
    last = None
    while True:
        now = runner.statistics()
        if now is None:
            return None
        caught_up = since is None or now["requests"] - since["requests"] >= sent
        if (caught_up and now == last) or time.monotonic() > deadline:
            return now
        last = now if caught_up else None
        time.sleep(QUIET_S if caught_up else 0.01)


def measure_load(runner: EndpointRunner, x: np.ndarray, concurrency: int, window_s: float = 1.0,
                 min_requests: int = MIN_REQUESTS, max_windows: int = MAX_WINDOWS, warmup: int = 2,
                 log: Log = QUIET) -> Latency:
    """`runner` at `concurrency` requests in flight, each a batch `x` (see the module's docstring)."""
    staged = runner.stage(x)
    base = settled(runner, None, 0)  # the requests before (the parity pass, the last level) all counted
    for _ in range(warmup):
        runner.run(staged)
    before = settled(runner, base, warmup)
    windows, sent = runner.call(_measure(runner, staged, concurrency, window_s, min_requests, max_windows),
                                f"under a load of {concurrency}", bounded=False)
    after = settled(runner, before, sent)
    is_stable = stable(windows)
    lat = summarise(windows, concurrency, is_stable)
    lat.requests = sent
    if before is not None and after is not None:
        diff = {k: after[k] - before[k] for k in after}
        lat.server_requests, lat.server_inferences = diff["requests"], diff["inferences"]
        if diff["requests"]:
            lat.server_queue_ms = diff["queue_ns"] / diff["requests"] / 1e6
            lat.server_compute_ms = diff["compute_ns"] / diff["requests"] / 1e6
    if not is_stable:
        log.warn(f"{runner.name}: batch {len(x)} at concurrency {concurrency} did not stabilise in {len(windows)} "
                 f"windows (three within {STABILITY:.0%}); its figures are marked unstable.")
    return lat
