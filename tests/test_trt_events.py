"""TensorRT's callbacks without TensorRT: the progress monitor's Ctrl-C handling, the process's one logger, errors
read since a build began, the verbose log; and trt_build run end to end against a stand-in `tensorrt` module."""

from __future__ import annotations

import _thread
import functools
import io
import re
import time

import fake_tensorrt
import pytest

from vitexport.errors import VitexportError
from vitexport.progress import Log
from vitexport.tensorrt_engine.events import (
    ERROR,
    INFO,
    MESSAGES,
    VERBOSE,
    WARNING,
    BuildMonitor,
    Messages,
    run_cancellable,
)
from vitexport.tensorrt_engine.options import BuildOptions, LogOptions, build_failure_message, log_hint


def _wait_for(condition, limit_s=60.0):
    """Poll until condition() holds, giving up after limit_s (the test's own assertions then fail)."""
    deadline = time.monotonic() + limit_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.001)


class _Raising(Log):
    """A progress log whose output raises (as Ctrl-C does, arriving while the callback prints)."""

    def __init__(self, exc: BaseException, only_progress: bool = False) -> None:
        super().__init__(stream=io.StringIO())
        self.exc, self.only_progress = exc, only_progress

    def info(self, text: str) -> None:
        if not self.only_progress or text.startswith("  "):  # progress lines are indented
            raise self.exc


class _RecordingLog(Log):
    """A progress log that keeps its warnings."""

    def __init__(self) -> None:
        super().__init__(stream=io.StringIO())
        self.warnings: list[str] = []

    def warn(self, text: str) -> None:
        self.warnings.append(text)


class _ExplodingPhases(dict):
    def pop(self, *a, **k):
        raise KeyboardInterrupt

    def get(self, *a, **k):
        raise KeyboardInterrupt


# -- the progress monitor -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("callback", ["phase_start", "step_complete", "phase_finish"])
def test_ctrl_c_in_any_callback_is_recorded_and_cancels_the_build(callback):
    monitor = BuildMonitor(_Raising(KeyboardInterrupt()), clock=iter(range(0, 10**6, 100)).__next__)
    monitor._phases = _ExplodingPhases()
    if callback == "phase_start":
        monitor.phase_start("Building", None, 3)  # the binding would swallow it: nothing may escape
    elif callback == "step_complete":
        assert monitor.step_complete("Building", 0) is False
    else:
        monitor.phase_finish("Building")
    assert monitor.cancelled and isinstance(monitor.failure, KeyboardInterrupt)
    assert monitor.step_complete("Building", 1) is False  # TensorRT cancels the build at its next step
    with pytest.raises(KeyboardInterrupt):
        monitor.raise_if_failed()


def test_the_first_failure_is_kept():
    monitor = BuildMonitor(Log(quiet=True))
    monitor.fail(KeyboardInterrupt())
    monitor.fail(ValueError("later"))
    assert isinstance(monitor.failure, KeyboardInterrupt)


def test_another_exception_in_a_callback_becomes_one_sentence():
    monitor = BuildMonitor(_Raising(BrokenPipeError("stderr closed")))
    monitor.phase_start("Building", None, 3)
    assert monitor.step_complete("Building", 0) is False
    with pytest.raises(VitexportError, match=r"cancelled because reporting its progress failed "
                                             r"\(BrokenPipeError: stderr closed\); nothing was written") as e:
        monitor.raise_if_failed()
    assert isinstance(e.value.__cause__, BrokenPipeError)


def test_a_healthy_monitor_prints_phases_and_continues():
    out = io.StringIO()
    ticks = iter([0.0, 0.0, 6.0, 6.0])
    monitor = BuildMonitor(Log(stream=out), clock=lambda: next(ticks, 7.0))
    monitor.phase_start("Building engine", None, 4)
    assert monitor.step_complete("Building engine", 0) is True
    monitor.phase_finish("Building engine")
    monitor.raise_if_failed()
    assert "Building engine (4 steps" in out.getvalue() and "Building engine: 1/4" in out.getvalue()


def test_ctrl_c_in_the_waiting_thread_stops_the_worker_at_its_next_step(ctrl_c):
    monitor = BuildMonitor(Log(quiet=True))
    steps, out = [], io.StringIO()

    def build():
        for step in range(500):
            if not monitor.step_complete("Building", step):
                return None
            steps.append(step)
            if step == 3:
                _wait_for(lambda: "still building" in out.getvalue())  # the main thread waits in join()
                _thread.interrupt_main()  # Ctrl-C: Python raises it in the main thread
                _wait_for(lambda: monitor.cancelled)  # until the waiting thread has taken it
        return b"plan"

    assert run_cancellable(build, monitor, Log(stream=out), heartbeat_s=0.005, poll_s=0.001) is None
    assert isinstance(monitor.failure, KeyboardInterrupt) and steps == [0, 1, 2, 3]  # not one step more
    with pytest.raises(KeyboardInterrupt):
        monitor.raise_if_failed()


def test_run_cancellable_returns_the_value_and_reraises_the_workers_error():
    monitor = BuildMonitor(Log(quiet=True))
    assert run_cancellable(lambda: 42, monitor, Log(quiet=True), poll_s=0.01) == 42

    def boom():
        raise RuntimeError("inside TensorRT")

    with pytest.raises(RuntimeError, match="inside TensorRT"):
        run_cancellable(boom, monitor, Log(quiet=True), poll_s=0.01)


def test_heartbeat_while_building():
    out = io.StringIO()
    run_cancellable(lambda: time.sleep(0.25), BuildMonitor(Log(quiet=True)), Log(stream=out), heartbeat_s=0.05,
                    poll_s=0.01)
    assert "still building" in out.getvalue()


# -- the log ---------------------------------------------------------------------------------------------------------

def test_sessions_see_only_what_is_logged_while_they_are_open():
    messages = Messages()
    messages.log(ERROR, "from an earlier runner")
    with messages.session(Log(quiet=True)) as build:
        messages.log(ERROR, "this build's error")
        messages.log(WARNING, "a warning")
        messages.log(INFO, "info")
    messages.log(ERROR, "after the build")
    assert build.errors == ["this build's error"] and build.warnings == 1


def test_warnings_go_to_the_session_log_errors_without_a_session_to_stderr(capsys):
    messages, out = Messages(), io.StringIO()
    with messages.session(Log(stream=out)):
        messages.log(WARNING, "TF32 is off")
    messages.log(ERROR, "nobody listens")
    assert "TensorRT warning: TF32 is off" in out.getvalue()
    assert "TensorRT error: nobody listens" in capsys.readouterr().err


def test_the_log_callback_never_raises_and_hands_ctrl_c_to_the_open_sessions():
    messages, seen = Messages(), []
    with messages.session(_Raising(KeyboardInterrupt()), on_failure=seen.append) as s:
        messages.log(WARNING, "printing this raises")  # must return normally: the binding would swallow it
    assert isinstance(s.failure, KeyboardInterrupt) and len(seen) == 1


def test_verbose_echo_to_stderr_and_to_a_file(tmp_path, capsys):
    messages, path = Messages(), tmp_path / "trt.log"
    with messages.echo(LogOptions(verbose=True, file=path)):
        assert messages.hint() == f"TensorRT's full log is in {path}"
        for sev, text in ((ERROR, "e"), (WARNING, "w"), (INFO, "i"), (VERBOSE, "v")):
            messages.log(sev, text)
    messages.log(VERBOSE, "after")
    assert path.read_text().splitlines() == ["[TensorRT E] e", "[TensorRT W] w", "[TensorRT I] i", "[TensorRT V] v"]
    err = capsys.readouterr().err
    assert "[TensorRT I] i" in err and "[TensorRT V] v" in err and "[TensorRT E]" not in err and "after" not in err
    assert messages.hint() == log_hint()


def test_verbose_log_options_are_checked(tmp_path):
    with pytest.raises(VitexportError, match="is a folder"):
        LogOptions(file=tmp_path).validate()
    with pytest.raises(VitexportError, match="does not exist"):
        LogOptions(file=tmp_path / "no" / "trt.log").validate()
    LogOptions(verbose=True, file=tmp_path / "trt.log").validate()


def test_failure_messages_point_at_the_verbose_log():
    assert "--verbose (or --verbose-log FILE)" in build_failure_message("m/model.onnx", [])
    msg = build_failure_message("m/model.onnx", ["out of memory"], hint=log_hint(True))
    assert msg.splitlines() == ["TensorRT could not build an engine from model.onnx:", "  out of memory",
                                "TensorRT's verbose log above has the details."]


# -- trt_build against a stand-in tensorrt ----------------------------------------------------------------------------

def _onnx(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"onnx")
    return path


def test_every_build_uses_the_one_process_logger(tmp_path, monkeypatch):
    trt_build = fake_tensorrt.install(monkeypatch)
    assert isinstance(trt_build.LOGGER, fake_tensorrt.ILogger)
    for precision in ("fp16", "fp32"):
        plan, facts = trt_build.build_engine(_onnx(tmp_path), BuildOptions(precision=precision))
        assert plan == b"fake-plan" and facts["input_name"] == "pixel_values" and facts["chw"] == [3, 32, 32]
    built = fake_tensorrt.created["builders"] + fake_tensorrt.created["parsers"]
    assert len(built) == 4 and all(b.logger is trt_build.LOGGER for b in built)
    b16, b32 = fake_tensorrt.created["builders"]
    assert b16.config.profiling_verbosity == fake_tensorrt.ProfilingVerbosity.DETAILED
    assert b32.config.cleared == [fake_tensorrt.BuilderFlag.TF32] and b16.config.cleared == []


def test_a_failed_build_names_only_the_errors_logged_during_it(tmp_path, monkeypatch):
    trt_build = fake_tensorrt.install(monkeypatch)
    Severity = fake_tensorrt.ILogger.Severity
    trt_build.LOGGER.log(Severity.ERROR, "an earlier runner's error")

    def failing(logger, monitor):
        logger.log(Severity.WARNING, "slow tactic")
        logger.log(Severity.ERROR, "Internal Error: out of device memory")
        return None

    fake_tensorrt.on_build = failing
    with pytest.raises(VitexportError) as e:
        trt_build.build_engine(_onnx(tmp_path), BuildOptions())
    msg = str(e.value)
    assert "out of device memory" in msg and "earlier runner" not in msg and "--verbose" in msg


def test_ctrl_c_in_a_callback_cancels_the_build_and_reraises(tmp_path, monkeypatch):
    trt_build = fake_tensorrt.install(monkeypatch)
    steps = []
    fake_tensorrt.on_step = steps.append
    with pytest.raises(KeyboardInterrupt):  # not "TensorRT ... logged no error"
        trt_build.build_engine(_onnx(tmp_path), BuildOptions(), _Raising(KeyboardInterrupt(), only_progress=True))
    assert steps == [0]  # phase_start recorded it; the first step_complete returned False


def test_ctrl_c_while_tensorrt_works_cancels_the_build(tmp_path, monkeypatch, ctrl_c):
    trt_build = fake_tensorrt.install(monkeypatch)
    fake_tensorrt.STEPS = 400
    monkeypatch.setattr(trt_build, "run_cancellable", functools.partial(run_cancellable, heartbeat_s=0.005))
    steps, out = [], io.StringIO()

    def step(i):
        steps.append(i)
        if i == 2:
            _wait_for(lambda: "still building" in out.getvalue())  # the main thread waits for the build
            _thread.interrupt_main()
            _wait_for(lambda: "Interrupted" in out.getvalue())  # until the waiting thread has taken it

    fake_tensorrt.on_step = step
    with pytest.raises(KeyboardInterrupt):
        trt_build.build_engine(_onnx(tmp_path), BuildOptions(), Log(stream=out))
    assert steps == [0, 1, 2]  # TensorRT was told to stop at the step it was on: not one step more


def test_warnings_are_counted_for_the_sidecar(tmp_path, monkeypatch):
    trt_build = fake_tensorrt.install(monkeypatch)

    def warn(logger, monitor):
        logger.log(fake_tensorrt.ILogger.Severity.WARNING, "weights converted")
        return b"plan"

    fake_tensorrt.on_build = warn
    out = io.StringIO()
    _, facts = trt_build.build_engine(_onnx(tmp_path), BuildOptions(timing_cache=tmp_path / "t.cache"),
                                      Log(stream=out))
    assert facts["tensorrt_warnings"] == 1 and "TensorRT warning: weights converted" in out.getvalue()
    assert facts["timing_cache_saved"] and (tmp_path / "t.cache").read_bytes() == b"timing-cache"
    assert MESSAGES.hint() == log_hint()  # nothing left echoing


# -- what the builder is given: the stand-in checks and records it --------------------------------------------------

def test_the_profile_covers_the_options_batch_range(tmp_path, monkeypatch):
    trt_build = fake_tensorrt.install(monkeypatch)
    trt_build.build_engine(_onnx(tmp_path), BuildOptions(min_batch=2, opt_batch=8, max_batch=48))
    assert fake_tensorrt.builds[-1]["profile"] == ("pixel_values", (2, 3, 32, 32), (8, 3, 32, 32), (48, 3, 32, 32))


def test_the_builders_knobs_reach_the_config(tmp_path, monkeypatch):
    trt_build = fake_tensorrt.install(monkeypatch)
    trt_build.build_engine(_onnx(tmp_path), BuildOptions(workspace_gib=1.5, opt_level=5))
    trt_build.build_engine(_onnx(tmp_path), BuildOptions())
    given, default = fake_tensorrt.builds
    assert given["workspace"] == int(1.5 * 2**30) and given["opt_level"] == 5
    assert default["workspace"] is None and default["opt_level"] == 3  # TensorRT's own defaults left alone


def test_a_parse_failure_names_the_parsers_errors_and_builds_nothing(tmp_path, monkeypatch):
    trt_build = fake_tensorrt.install(monkeypatch)
    fake_tensorrt.PARSE_ERRORS = ["In node 12 (Resize): antialiasing is not supported currently"]
    with pytest.raises(VitexportError) as e:
        trt_build.build_engine(_onnx(tmp_path), BuildOptions())
    assert "antialiasing is not supported currently" in str(e.value) and "model.onnx" in str(e.value)
    assert fake_tensorrt.builds == []


@pytest.mark.parametrize("state, warning", [("corrupt", "could not be read"),
                                            ("foreign", "made by another GPU or TensorRT version")])
def test_a_timing_cache_tensorrt_will_not_take_is_replaced_by_an_empty_one(tmp_path, monkeypatch, state, warning):
    trt_build = fake_tensorrt.install(monkeypatch)
    cache = tmp_path / "trt.cache"
    cache.write_bytes(b"a cache of another machine")
    fake_tensorrt.TIMING_CACHE = state
    log = _RecordingLog()
    _, facts = trt_build.build_engine(_onnx(tmp_path), BuildOptions(timing_cache=cache), log)
    assert any(warning in w for w in log.warnings), log.warnings
    assert fake_tensorrt.builds[-1]["timing_cache"].data == b""  # built with an empty cache, not the file's
    assert facts["timing_cache_loaded"] is False and facts["timing_cache_saved"] is True
    assert cache.read_bytes() == b"timing-cache"  # the build's own cache replaced it


def test_a_timing_cache_it_takes_is_used_and_saved(tmp_path, monkeypatch):
    trt_build = fake_tensorrt.install(monkeypatch)
    cache = tmp_path / "trt.cache"
    cache.write_bytes(b"tactics of this GPU")
    _, facts = trt_build.build_engine(_onnx(tmp_path), BuildOptions(timing_cache=cache))
    assert fake_tensorrt.builds[-1]["timing_cache"].data == b"tactics of this GPU"
    assert facts["timing_cache_loaded"] is True and facts["timing_cache_saved"] is True


def test_after_a_ctrl_c_the_wait_lasts_until_tensorrt_has_stopped(ctrl_c):
    """The first Ctrl-C asks TensorRT to stop at its next step; the waiting thread must wait for that step (a join()
    interrupted by Ctrl-C on CPython 3.11 would mark the running worker as stopped and return at once)."""
    import threading

    monitor, out = BuildMonitor(Log(stream=io.StringIO())), Log(stream=io.StringIO())
    asked, stopped = threading.Event(), threading.Event()

    def build():
        asked.set()
        while monitor.failure is None:  # TensorRT at work until the monitor says stop
            time.sleep(0.005)
        time.sleep(0.3)  # its next step, where it stops
        stopped.set()

    def press_ctrl_c():
        asked.wait(10)
        time.sleep(0.05)
        _thread.interrupt_main()

    threading.Thread(target=press_ctrl_c, daemon=True).start()
    run_cancellable(build, monitor, out, poll_s=0.01)
    assert stopped.is_set()  # returned only once the build had stopped
    assert isinstance(monitor.failure, KeyboardInterrupt)


# -- the build's own decisions, each seen from outside --------------------------------------------------------------

def test_a_healthy_build_reports_its_steps_facts_and_saved_cache(tmp_path, monkeypatch):
    trt_build = fake_tensorrt.install(monkeypatch)
    monkeypatch.setattr("vitexport.tensorrt_engine.events.STEP_REPORT_S", 0.0)  # every step line is due

    def phases(logger, monitor):  # a phase inside a phase, as TensorRT reports them
        monitor.phase_start("Building engine", None, 2)
        monitor.phase_start("Tactic selection", "Building engine", 3)
        for step in range(3):
            assert monitor.step_complete("Tactic selection", step)
        monitor.phase_finish("Tactic selection")
        assert monitor.step_complete("Building engine", 0)
        monitor.phase_finish("Building engine")
        return b"plan"

    fake_tensorrt.on_build = phases
    out = io.StringIO()
    cache = tmp_path / "new" / "trt.cache"  # no cache yet: nothing is loaded, nothing is warned about
    cache.parent.mkdir()
    log = _RecordingLog()
    log.stream = out
    plan, facts = trt_build.build_engine(_onnx(tmp_path), BuildOptions(timing_cache=cache), log)
    lines = [re.sub(r"^\[ *[0-9.]+s\] ", "", line) for line in out.getvalue().splitlines()]  # no clock prefix
    assert plan == b"plan" and log.warnings == []
    assert any(line.startswith("Parsing model.onnx into a strongly typed TensorRT network") for line in lines), lines
    assert any(line.startswith("Building the fp16 engine (batch 1/8/32, image 3x32x32; this can take minutes)")
               for line in lines), lines
    assert any(line.startswith("  Building engine (2 steps,") for line in lines), lines
    assert any(line.startswith("    Tactic selection (3 steps,") for line in lines), lines  # one level deeper
    assert any(line.startswith("    Tactic selection: 3/3 (") for line in lines), lines
    assert any(line.startswith("  Building engine: 1/2 (") for line in lines), lines
    assert f"Saved the timing cache to {cache}." in lines
    assert facts == {"input_name": "pixel_values", "chw": [3, 32, 32], "output_names": ["logits"],
                     "timing_cache_loaded": False, "timing_cache_saved": True,
                     "tensorrt_version": fake_tensorrt.__version__, "tensorrt_warnings": 0}
    assert fake_tensorrt.created["parsers"][-1].parsed == [str(tmp_path / "model.onnx")]


def test_without_a_timing_cache_none_is_given_loaded_or_saved(tmp_path, monkeypatch):
    trt_build = fake_tensorrt.install(monkeypatch)
    _, facts = trt_build.build_engine(_onnx(tmp_path), BuildOptions())
    assert fake_tensorrt.builds[-1]["timing_cache"] is None  # TensorRT's own in-memory cache
    assert facts["timing_cache_loaded"] is False and facts["timing_cache_saved"] is False


def test_an_empty_plan_is_a_failed_build(tmp_path, monkeypatch):
    trt_build = fake_tensorrt.install(monkeypatch)
    fake_tensorrt.on_build = lambda logger, monitor: b""
    with pytest.raises(VitexportError, match="could not build an engine from model.onnx and logged no error"):
        trt_build.build_engine(_onnx(tmp_path), BuildOptions())
    fake_tensorrt.on_build = lambda logger, monitor: b"p"  # a plan of one byte is still a plan
    assert trt_build.build_engine(_onnx(tmp_path), BuildOptions())[0] == b"p"


@pytest.mark.parametrize("result,errors,first_line", [
    (False, [], "TensorRT could not parse model.onnx and gave no reason; TensorRT's full log is in "),
    (True, ["While parsing node 3: unsupported op"], "TensorRT could not parse model.onnx (1 error):"),
])
def test_a_parse_that_fails_or_reports_errors_stops_before_building_and_names_the_log(tmp_path, monkeypatch, result,
                                                                                      errors, first_line):
    trt_build = fake_tensorrt.install(monkeypatch)
    fake_tensorrt.PARSE_RESULT, fake_tensorrt.PARSE_ERRORS = result, errors
    log_file = tmp_path / "trt.log"
    with MESSAGES.echo(LogOptions(file=log_file)), pytest.raises(VitexportError) as e:
        trt_build.build_engine(_onnx(tmp_path), BuildOptions())
    msg = str(e.value)
    assert msg.startswith(first_line) and f"TensorRT's full log is in {log_file}" in msg
    assert fake_tensorrt.builds == []


def test_a_failed_build_names_the_log_being_written(tmp_path, monkeypatch):
    trt_build = fake_tensorrt.install(monkeypatch)
    fake_tensorrt.on_build = lambda logger, monitor: None
    log_file = tmp_path / "trt.log"
    with MESSAGES.echo(LogOptions(file=log_file)), pytest.raises(VitexportError) as e:
        trt_build.build_engine(_onnx(tmp_path), BuildOptions())
    assert str(e.value) == ("TensorRT could not build an engine from model.onnx and logged no error; "
                            f"TensorRT's full log is in {log_file}.")


def test_ctrl_c_in_tensorrts_log_callback_cancels_the_build(tmp_path, monkeypatch):
    trt_build = fake_tensorrt.install(monkeypatch)
    steps = []

    def step(i):
        steps.append(i)
        if i == 1:  # a warning whose printing is interrupted by Ctrl-C, inside TensorRT's logger callback
            trt_build.LOGGER.log(fake_tensorrt.ILogger.Severity.WARNING, "slow tactic")

    fake_tensorrt.on_step = step
    with pytest.raises(KeyboardInterrupt):
        trt_build.build_engine(_onnx(tmp_path), BuildOptions(), _WarningRaises(KeyboardInterrupt()))
    assert steps == [0, 1]  # the step after the interrupted callback told TensorRT to stop


class _WarningRaises(Log):
    """A progress log that raises when it is handed one of TensorRT's warnings (a Ctrl-C arriving then)."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(stream=io.StringIO())
        self.exc = exc

    def info(self, text: str) -> None:
        if text.startswith("TensorRT warning:"):
            raise self.exc


@pytest.mark.parametrize("inputs,sentence", [
    ([("pixel_values", (-1, 3, 32, 32)), ("mask", (-1, 197))],
     "model.onnx has 2 inputs; a ViT engine takes one image batch."),
    ([("images", (-1, 3, -1, -1))],
     "The ONNX input 'images' has a symbolic image size [3, -1, -1], but no image size range was given; build it "
     "from its model folder (whose manifest records the range of `vitexport onnx --dynamic-img-size`)."),
    ([("images", (4, 3, 32, 32))],
     "The ONNX input 'images' has a fixed batch of 4, so the batch profile 2/8/48 cannot apply; re-export it with "
     "`vitexport onnx` (symbolic batch)."),
])
def test_a_network_the_options_cannot_apply_to_is_one_sentence(tmp_path, monkeypatch, inputs, sentence):
    trt_build = fake_tensorrt.install(monkeypatch)
    fake_tensorrt.NETWORK_INPUTS = inputs
    with pytest.raises(VitexportError) as e:
        trt_build.build_engine(_onnx(tmp_path), BuildOptions(min_batch=2, opt_batch=8, max_batch=48))
    assert str(e.value) == sentence and fake_tensorrt.builds == []


def test_a_profile_tensorrt_rejects_is_named(tmp_path, monkeypatch):
    trt_build = fake_tensorrt.install(monkeypatch)
    fake_tensorrt.PROFILE_REJECTED = True
    with pytest.raises(VitexportError) as e:
        trt_build.build_engine(_onnx(tmp_path), BuildOptions(min_batch=2, opt_batch=8, max_batch=48))
    assert str(e.value) == "TensorRT rejected the batch profile 2/8/48 for 'pixel_values'."


class _Failing:
    """A BuildMonitor stand-in whose callbacks raise: the adaptor must record the exception and stop the build."""

    def __init__(self, exc):
        self.exc, self.failures = exc, []

    def phase_start(self, *a):
        raise self.exc

    step_complete = phase_finish = phase_start

    def fail(self, e):
        self.failures.append(e)


def test_the_progress_adaptor_records_what_its_monitor_raises_and_stops_the_build(monkeypatch):
    trt_build = fake_tensorrt.install(monkeypatch)
    exc = KeyboardInterrupt()
    monitor = _Failing(exc)
    adaptor = trt_build._ProgressMonitor(monitor)
    adaptor.phase_start("Building engine", None, 3)
    assert adaptor.step_complete("Building engine", 0) is False
    adaptor.phase_finish("Building engine")
    assert monitor.failures == [exc, exc, exc]


def test_a_dynamic_size_network_gets_a_profile_over_batch_height_and_width(tmp_path, monkeypatch):
    trt_build = fake_tensorrt.install(monkeypatch)
    fake_tensorrt.NETWORK_INPUTS = [("pixel_values", (-1, 3, -1, -1))]
    opts = BuildOptions(min_batch=1, opt_batch=8, max_batch=16, img_size=(48, 48),
                        img_size_range=((16, 16), (64, 80)))
    _, facts = trt_build.build_engine(_onnx(tmp_path), opts)
    assert fake_tensorrt.builds[-1]["profile"] == ("pixel_values", (1, 3, 16, 16), (8, 3, 48, 48), (16, 3, 64, 80))
    assert facts["chw"] == [3, 48, 48]
    fake_tensorrt.NETWORK_INPUTS = [("pixel_values", (-1, 3, 32, 32))]  # a fixed-size graph: no range applies
    with pytest.raises(VitexportError, match="has a fixed image size \\[32, 32\\], so an image size range cannot"):
        trt_build.build_engine(_onnx(tmp_path), opts)
    fake_tensorrt.NETWORK_INPUTS = [("pixel_values", (-1, 3, -1, 32))]
    with pytest.raises(VitexportError, match="symbolic image size on one side only"):
        trt_build.build_engine(_onnx(tmp_path), opts)

