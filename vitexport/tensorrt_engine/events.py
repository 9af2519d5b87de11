"""What TensorRT tells us while it builds or loads an engine, handled by plain classes (no tensorrt import).

`trt_build` holds the process's only `trt.ILogger` and a thin `trt.IProgressMonitor`; both forward here, so every
decision is testable without TensorRT:

- **One logger per process.** TensorRT keeps a single logger pointer at a time ("TensorRT maintains only a single
  logger pointer at any given time, so the existing value ... will be used instead", NVIDIA/TensorRT#1475): a
  build that made its own logger while a runner was loaded sent its errors to the runner's logger. `MESSAGES` is
  the one destination; each build or load opens a `Session` and reads only the errors logged since it began.
- **Callbacks that cannot raise.** TensorRT's Python binding catches whatever a progress callback raises and only
  prints it ("[ERROR] Exception caught in step_complete()", python/src/infer/pyCore.cpp, 10.12 and 11.1), so a
  Ctrl-C there would be swallowed. `BuildMonitor` catches BaseException in all three callbacks (as NVIDIA's
  samples/python/simple_progress_monitor does for KeyboardInterrupt), records it, makes step_complete return
  False (which cancels the build, NvInfer.h IProgressMonitor::stepComplete), and the build re-raises it.
- **Ctrl-C while TensorRT works.** The builder releases the GIL (pyCore.cpp: build_serialized_network has
  gil_scoped_release) and may call the monitor from its own threads, where Python never raises KeyboardInterrupt;
  `run_cancellable` therefore builds in a worker thread and keeps the main thread waiting where Ctrl-C lands.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, TextIO, TypeVar

from ..errors import VitexportError
from ..progress import Log
from .options import LogOptions, log_hint

# ILogger::Severity (NvInferRuntime.h): kINTERNAL_ERROR = 0, kERROR = 1, kWARNING = 2, kINFO = 3, kVERBOSE = 4
INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)
SEVERITY_TAGS = {INTERNAL_ERROR: "F", ERROR: "E", WARNING: "W", INFO: "I", VERBOSE: "V"}

HEARTBEAT_S = 30.0  # print "still building" at least this often, even when TensorRT reports no step
STEP_REPORT_S = 5.0  # at most one step line per phase this often
POLL_S = 0.2  # how often the waiting main thread looks up (and lets a Ctrl-C in)

T = TypeVar("T")


# -- the process's TensorRT log -------------------------------------------------------------------------------

@dataclass
class Session:
    """The messages of one build or load: errors for its failure message, warnings counted (and shown on `out`)."""

    out: Log | None  # None: warnings go to stderr
    on_failure: Callable[[BaseException], None] | None = None  # told when a log callback raised (Ctrl-C ...)
    errors: list[str] = field(default_factory=list)
    warnings: int = 0
    failure: BaseException | None = None  # what a log callback raised during the session (re-raise it after)


@dataclass(frozen=True)
class _Echo:
    stream: TextIO
    everything: bool  # all severities (a log file); else INFO and VERBOSE only (stderr: the rest is shown anyway)
    path: Path | None = None


class Messages:
    """Where every message of the process's one TensorRT logger goes. Thread-safe: TensorRT logs from its threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: list[Session] = []
        self._echoes: list[_Echo] = []

    def log(self, severity: int, msg: str) -> None:
        """ILogger::log. Never raises: the binding would swallow it (a Ctrl-C is handed to the open sessions)."""
        try:
            self._log(int(severity), str(msg))
        except BaseException as e:  # noqa: BLE001 -- KeyboardInterrupt included, on purpose
            with self._lock:
                sessions = list(self._sessions)
            for s in sessions:
                s.failure = s.failure or e
                if s.on_failure is not None:
                    s.on_failure(e)

    def _log(self, severity: int, msg: str) -> None:
        with self._lock:
            sessions, echoes = list(self._sessions), list(self._echoes)
            for s in sessions:
                if severity <= ERROR:
                    s.errors.append(msg)
                elif severity == WARNING:
                    s.warnings += 1
        if severity == WARNING:
            out = sessions[-1].out if sessions else None
            if out is not None:
                out.info(f"TensorRT warning: {msg}")
            else:
                print(f"TensorRT warning: {msg}", file=sys.stderr, flush=True)
        elif severity <= ERROR and not sessions:
            print(f"TensorRT error: {msg}", file=sys.stderr, flush=True)
        for e in echoes:
            if e.everything or severity >= INFO:
                print(f"[TensorRT {SEVERITY_TAGS.get(severity, '?')}] {msg}", file=e.stream, flush=True)

    @contextmanager
    def session(self, out: Log | None = None,
                on_failure: Callable[[BaseException], None] | None = None) -> Iterator[Session]:
        """Collect what TensorRT logs from now until the block ends (nested and concurrent sessions all see it)."""
        s = Session(out, on_failure)
        with self._lock:
            self._sessions.append(s)
        try:
            yield s
        finally:
            with self._lock:
                self._sessions.remove(s)

    @contextmanager
    def echo(self, opts: LogOptions) -> Iterator[None]:
        """`--verbose`: INFO/VERBOSE on stderr; `--verbose-log FILE`: every message to the file, for the block."""
        opts.validate()
        added: list[_Echo] = []
        files: list[TextIO] = []
        try:
            if opts.file is not None:
                try:
                    log_file: TextIO = open(opts.file, "w", encoding="utf-8")  # noqa: SIM115 -- closed below
                except OSError as err:
                    raise VitexportError(f"Could not open --verbose-log {opts.file}: {err.strerror or err}.") from None
                files.append(log_file)
                added.append(_Echo(log_file, True, Path(opts.file)))
            if opts.verbose:
                added.append(_Echo(sys.stderr, False))
            with self._lock:
                self._echoes.extend(added)
            yield
        finally:
            with self._lock:
                for echo in added:
                    if echo in self._echoes:
                        self._echoes.remove(echo)
            for stream in files:
                stream.close()

    def hint(self) -> str:
        """Where the full log is, for a failure message (options.log_hint with what is being written now)."""
        with self._lock:
            echoes = list(self._echoes)
        return log_hint(any(e.path is None for e in echoes), [e.path for e in echoes if e.path is not None])


MESSAGES = Messages()  # the one destination of the process's one TensorRT logger (trt_build.LOGGER)


# -- progress -------------------------------------------------------------------------------------------------

class BuildMonitor:
    """Build phases and steps on `out` with the elapsed time; whatever a callback raises cancels the build.

    Called from TensorRT's threads ("The implementation of IProgressMonitor must be thread-safe", NvInfer.h).
    """

    def __init__(self, out: Log, clock: Callable[[], float] = time.perf_counter) -> None:
        self._out = out
        self._clock = clock
        self._t0 = clock()
        self._lock = threading.Lock()
        self._phases: dict[str, tuple[int, int, float]] = {}  # name -> (depth, num_steps, last report time)
        self.failure: BaseException | None = None  # the first exception a callback (or the waiting thread) saw

    @property
    def cancelled(self) -> bool:
        return self.failure is not None

    def fail(self, exc: BaseException) -> None:
        """Record why the build must stop; step_complete returns False from now on."""
        with self._lock:
            if self.failure is None:
                self.failure = exc

    def _elapsed(self) -> str:
        return f"{self._clock() - self._t0:.0f}s into the build"

    def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
        try:
            with self._lock:
                depth = 0 if parent_phase is None else self._phases.get(parent_phase, (0, 0, 0.0))[0] + 1
                self._phases[phase_name] = (depth, num_steps, self._clock())
            if depth <= 1:
                self._out.info(f"  {'  ' * depth}{phase_name} ({num_steps} step{'s' if num_steps != 1 else ''}, "
                               f"{self._elapsed()})")
        except BaseException as e:  # noqa: BLE001 -- cannot cancel from here: step_complete returns False next
            self.fail(e)

    def step_complete(self, phase_name: str, step: int) -> bool:
        try:
            now = self._clock()
            with self._lock:
                depth, num_steps, last = self._phases.get(phase_name, (9, 0, now))
                due = depth <= 1 and now - last >= STEP_REPORT_S
                if due:
                    self._phases[phase_name] = (depth, num_steps, now)
            if due:
                self._out.info(f"  {'  ' * depth}{phase_name}: {step + 1}/{num_steps} ({self._elapsed()})")
        except BaseException as e:  # noqa: BLE001
            self.fail(e)
        return self.failure is None

    def phase_finish(self, phase_name: str) -> None:
        try:
            with self._lock:
                self._phases.pop(phase_name, None)
        except BaseException as e:  # noqa: BLE001
            self.fail(e)

    def raise_if_failed(self) -> None:
        """After the build: re-raise a Ctrl-C (the CLI exits 130) or explain any other failure in one sentence."""
        exc = self.failure
        if exc is None:
            return
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: as the user or the process asked
            raise exc
        raise VitexportError(f"The engine build was cancelled because reporting its progress failed "
                             f"({type(exc).__name__}: {exc}); nothing was written.") from exc


def run_cancellable(build: Callable[[], T], monitor: BuildMonitor, out: Log, heartbeat_s: float = HEARTBEAT_S,
                    poll_s: float = POLL_S) -> T | None:
    """`build()` in a worker thread while this thread prints a heartbeat and catches Ctrl-C.

    A first Ctrl-C goes to the monitor: TensorRT stops at its next step and the build returns; a second one
    propagates at once. The caller then calls monitor.raise_if_failed().
    """
    result: dict[str, object] = {}
    # the worker says it is done through an Event, not join(): on CPython 3.11 a join() interrupted by Ctrl-C
    # releases the running thread's state lock and marks it stopped, so the wait would end with TensorRT still busy
    done = threading.Event()

    def work() -> None:
        try:
            result["value"] = build()
        except BaseException as e:  # noqa: BLE001 -- handed to the waiting thread
            result["error"] = e
        finally:
            done.set()

    worker = threading.Thread(target=work, name="tensorrt-build", daemon=True)
    start = time.perf_counter()
    next_beat = start + heartbeat_s
    worker.start()
    while True:
        try:
            while not done.is_set():
                done.wait(poll_s)
                if time.perf_counter() >= next_beat:
                    next_beat += heartbeat_s
                    out.info(f"  still building ({time.perf_counter() - start:.0f}s so far)")
            break
        except KeyboardInterrupt as e:
            if isinstance(monitor.failure, KeyboardInterrupt):
                raise  # the second Ctrl-C: stop waiting
            monitor.fail(e)
            out.warn("Interrupted: the build stops at TensorRT's next step (Ctrl-C again to stop waiting).")
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return result.get("value")  # type: ignore[return-value]
