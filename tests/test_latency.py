"""bench's timing loop on a scripted runner and clock: when it stops, what it reports, the copies it times apart."""

import statistics

import numpy as np
import pytest

from vitexport.backends.base import Runner
from vitexport.benchmark import latency
from vitexport.benchmark.latency import Latency, enough, measure_latency, median_stable, takes_batch


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class _Scripted(Runner):
    """Times from a script; stage and fetch advance the clock by set amounts, so copy times are known."""

    def __init__(self, times, device="cpu", clock=None, up=0.0, down=0.0, batch_range=None):
        super().__init__()
        self.times, self.device, self.clock, self.up, self.down = list(times), device, clock, up, down
        self.batch_range = batch_range
        self.calls = []

    def _load(self):
        pass

    def stage(self, x):
        assert isinstance(x, np.ndarray)
        self.calls.append(("stage", x.shape))
        if self.clock:
            self.clock.now += self.up
        return ("staged", x.shape)

    def run(self, staged):
        assert staged[0] == "staged", staged
        self.calls.append(("run", staged[1]))
        return "out"

    def timed_run(self, staged):
        assert staged[0] == "staged", staged
        self.calls.append(("timed", staged[1]))
        return self.times.pop(0)

    def fetch(self, out):
        assert out == "out"
        self.calls.append(("fetch",))
        if self.clock:
            self.clock.now += self.down
        return np.zeros(1)

    def synchronize(self):
        self.calls.append(("sync",))


def test_median_stable_at_its_edges():
    assert not median_stable([100.0, 100.0])  # two runs: no median before the last two
    assert median_stable([100.0, 100.0, 100.0])
    # the median of all (100) against that of all but the last two (102): 2 % of 100 exactly is stable ...
    assert median_stable([102.0, 102.0, 102.0, 100.0, 100.0, 100.0, 100.0])
    assert not median_stable([102.0, 102.0, 102.0, 100.0, 100.0, 100.0, 100.0], within=0.019)
    # ... judged on all but the last two runs, not the first two or all but the last three
    assert median_stable([100.0, 130.0, 100.0, 100.0, 100.0])  # 100 and 100 (the first two runs alone: 115)
    assert median_stable([100.0, 100.0, 130.0, 130.0, 130.0, 100.0])  # 115 and 115
    assert not median_stable([100.0, 100.0, 130.0, 130.0, 100.0, 100.0])  # 100 against 115


def test_enough_stops_at_max_runs_even_before_min_time():
    assert enough([1.0] * latency.MAX_RUNS, None, 0.0, 60.0)
    assert not enough([1.0] * (latency.MAX_RUNS - 1), None, 0.0, 60.0)
    assert not enough([1.0] * (latency.MAX_RUNS - 1), 5, 0.0, 60.0)


def test_a_slow_configuration_stops_after_its_time_once_the_median_is_stable():
    """Runs of 1.5 s: 4 s of them (3 runs, counted by their own times) are enough once the median is stable and
    every run is within 5 % of it; before 4 s, with an unstable median or with runs further apart, timing goes on to
    MIN_RUNS runs, and a fast configuration still makes MIN_RUNS runs."""
    t = latency.MIN_TIMED_S
    assert enough([1500.0] * 3, None, t, 1.0) and enough([1500.0, 1575.0, 1500.0], None, t + 0.6, 1.0)
    assert not enough([1330.0] * 3, None, t + 10, 1.0)  # 3.99 s of runs, however long the loop took
    assert enough([1333.0, 1334.0, 1333.0], None, t, 0.0) and not enough([1333.0, 1333.0, 1333.0], None, t, 0.0)
    assert not enough([1600.0, 1500.0, 1500.0], None, t + 0.6, 1.0)  # 1500 against the first run's 1600
    assert not enough([1500.0, 1576.0, 1500.0], None, t + 0.6, 1.0)  # stable median, runs 5.07 % apart
    assert not enough([1200.0, 1600.0, 1200.0, 1200.0], None, t + 3, 1.0)  # a third apart: on to MIN_RUNS
    assert enough([1200.0, 1600.0, 1200.0, 1200.0, 1200.0], None, t + 3, 1.0)
    assert not enough([1500.0] * 2, None, t + 10, 1.0)  # two runs have no median to compare
    assert not enough([10.0] * (latency.MIN_RUNS - 1), None, 0.04, 0.0) and enough([10.0] * latency.MIN_RUNS, None,
                                                                                    0.05, 0.0)


def test_measure_latency_times_until_the_median_is_stable_and_reports_the_runs():
    times = [10.0, 30.0, 11.0, 12.0, 10.0, 10.5, 11.0, 10.0, 99.0, 99.0, 99.0]
    stop = next(n for n in range(latency.MIN_RUNS, len(times) + 1) if median_stable(times[:n]))
    runner = _Scripted(times)
    x = np.zeros((4, 3, 8, 8), np.float32)
    lat = measure_latency(runner, x, iterations=None, min_time=0.0, warmup=2)
    ran = times[:stop]
    assert lat.iterations == stop and lat.batch == 4
    assert lat.mean_ms == pytest.approx(statistics.fmean(ran))
    for q, got in ((50, lat.p50_ms), (90, lat.p90_ms), (99, lat.p99_ms)):
        assert got == pytest.approx(np.percentile(ran, q))
    assert lat.throughput == pytest.approx(4 / (statistics.fmean(ran) / 1e3))
    assert lat.h2d_ms is None and lat.d2h_ms is None
    assert runner.calls == [("stage", x.shape)] + [("run", x.shape)] * 2 + [("timed", x.shape)] * stop


def test_a_gpu_runner_has_its_copies_timed_apart(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(latency.time, "perf_counter", clock)
    runner = _Scripted([5.0] * 3, device="cuda", clock=clock, up=0.004, down=0.002)
    lat = measure_latency(runner, np.zeros((2, 3, 8, 8), np.float32), iterations=3, min_time=0.0, warmup=0)
    assert lat.h2d_ms == pytest.approx(4.0) and lat.d2h_ms == pytest.approx(2.0)
    assert lat.iterations == 3 and lat.mean_ms == 5.0
    assert runner.calls.count(("stage", (2, 3, 8, 8))) == 4 and runner.calls.count(("fetch",)) == 3


def test_min_time_is_counted_from_the_first_timed_run(monkeypatch):
    clock = _Clock()
    clock.now = 1000.0
    monkeypatch.setattr(latency.time, "perf_counter", clock)

    class Slow(_Scripted):
        def timed_run(self, staged):
            clock.now += 0.1
            return super().timed_run(staged)

    lat = measure_latency(Slow([100.0] * 20), np.zeros((1, 3, 8, 8), np.float32), iterations=2, min_time=0.45,
                          warmup=0)
    assert lat.iterations == 5  # 0.5 s of runs: two were asked for, the time was not yet reached


def test_takes_batch_notes_and_says_a_batch_outside_the_engines_range():
    class Log:
        lines = []

        def info(self, s):
            self.lines.append(s)

    info, log = {}, Log()
    runner = _Scripted([], batch_range=(2, 8))
    assert takes_batch(runner, 2, info, log) and takes_batch(runner, 8, info, log) and info == {} and not log.lines
    assert not takes_batch(runner, 16, info, log) and not takes_batch(runner, 1, info, log)
    assert info == {"skipped_batches": [16, 1]}
    assert log.lines[0] == f"{runner.name}: batch 16 is outside its range 2-8; not timed"
    assert takes_batch(_Scripted([]), 64, {}, log) and takes_batch(_Scripted([]), 1, {}, log)  # no range: any


def test_latency_keeps_what_it_is_given():
    lat = Latency(8, 10, 2.0, 2.0, 3.0, 4.0, 4000.0)
    assert (lat.concurrency, lat.stable, lat.requests) == (None, None, None)


def test_a_configuration_stops_at_its_time_budget_even_if_the_median_still_moves():
    """Runs far apart: the median never settles, and after BUDGET_S seconds of runs (3 at least, counted by their
    own times) timing stops anyway; before it, or with two runs, it goes on."""
    b = latency.BUDGET_S * 1e3
    assert enough([b / 6, b / 3, b / 2], None, 100.0, 0.0)  # the budget exactly; median b/3 against b/6
    assert not enough([b / 6, b / 3, b / 2 - 1], None, 100.0, 0.0)
    four = [b / 6, b / 3, b / 4, 5 * b / 12]  # three: 3/4 of the budget; four: 7/6 of it, the median moving 17 %
    assert not median_stable(four) and not enough(four[:3], None, 100.0, 0.0) and enough(four, None, 100.0, 0.0)
    assert not enough([b, b], None, 100.0, 0.0)  # two runs, however long
    assert not enough([b / 4, b / 4 * 1.1, b / 4], None, 100.0, 0.0)  # a stable median, runs 10 % apart: on
    assert enough([b / 4, b / 4 * 1.04, b / 4], None, 100.0, 0.0)  # within 5 % (and over 4 s): enough, as before
    assert not enough(four + [b / 6], 8, 100.0, 0.0)  # --iterations 8: no budget


B = latency.BUDGET_S * 1e3


@pytest.mark.parametrize("times, runs, settled", [
    ([B / 6, B / 3, B / 4, 5 * B / 12, 9.0], 4, False),  # cut by the budget, the median still moving
    ([B / 4, B / 4, B / 4 * 1.1, B / 4, 9.0], 4, True),  # the budget; the median settled, the runs 10 % apart
    ([100.0 + 10 * i for i in range(10)] + [9.0], 10, False),  # ten runs, each pair moving the median by 5-8 %
    ([10.0, 11.0, 10.0, 11.0, 10.0, 9.0], 5, True),
])
def test_a_timing_says_whether_its_median_had_settled(times, runs, settled):
    lat = measure_latency(_Scripted(times), np.zeros((8, 3, 8, 8), np.float32), iterations=None, min_time=0.0,
                          warmup=0)
    assert lat.iterations == runs and lat.stable is settled
    fixed = measure_latency(_Scripted(times), np.zeros((8, 3, 8, 8), np.float32), iterations=3, min_time=0.0,
                            warmup=0)
    assert fixed.iterations == 3 and fixed.stable is None  # a count asked for: not judged
