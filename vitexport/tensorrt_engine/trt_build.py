"""The only code that builds with TensorRT: ONNX -> strongly typed network -> serialized plan.

Precision is in the ONNX (FP16 weights/ops, or Q/DQ nodes for INT8), so the network is strongly typed and no
precision builder flag or calibrator is set: both are gone in TensorRT 11. FP32 clears TF32 to give a true
FP32 reference engine. Works on TensorRT 10.1+ and 11.x. Every decision comes from `options`.

Imported lazily (by compiler.run_trt) so that a missing TensorRT never breaks `import vitexport`.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import tensorrt as trt

from ..errors import VitexportError
from ..paths import atomic_path
from ..progress import QUIET, Log
from .options import BuildOptions, build_failure_message, input_chw, parse_failure_message, profile_shapes

HEARTBEAT_S = 30.0  # print "still building" at least this often, even when TensorRT reports no step
STEP_REPORT_S = 5.0  # at most one step line per phase this often


class _Logger(trt.ILogger):
    """TensorRT's messages: errors kept for the failure message, warnings shown (unless --quiet)."""

    def __init__(self, out: Log) -> None:
        trt.ILogger.__init__(self)
        self._out = out
        self.errors: list[str] = []
        self.warnings = 0

    def log(self, severity: trt.ILogger.Severity, msg: str) -> None:
        if severity in (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR):
            self.errors.append(msg)
        elif severity == trt.ILogger.Severity.WARNING:
            self.warnings += 1
            self._out.info(f"TensorRT warning: {msg}")


class _ProgressMonitor(trt.IProgressMonitor):
    """Build phases and steps on stderr with the elapsed build time. Called from TensorRT's threads."""

    def __init__(self, out: Log) -> None:
        trt.IProgressMonitor.__init__(self)
        self._out = out
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()
        self._phases: dict[str, tuple[int, int, float]] = {}  # name -> (depth, num_steps, last report time)
        self.cancelled = False

    def _elapsed(self) -> str:
        return f"{time.perf_counter() - self._t0:.0f}s into the build"

    def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
        try:
            with self._lock:
                depth = 0 if parent_phase is None else self._phases.get(parent_phase, (0, 0, 0.0))[0] + 1
                self._phases[phase_name] = (depth, num_steps, time.perf_counter())
            if depth <= 1:
                self._out.info(f"  {'  ' * depth}{phase_name} ({num_steps} step{'s' if num_steps != 1 else ''}, "
                               f"{self._elapsed()})")
        except KeyboardInterrupt:  # cannot cancel from here: step_complete returns False next
            self.cancelled = True

    def step_complete(self, phase_name: str, step: int) -> bool:
        try:
            now = time.perf_counter()
            with self._lock:
                depth, num_steps, last = self._phases.get(phase_name, (9, 0, now))
                due = depth <= 1 and now - last >= STEP_REPORT_S
                if due:
                    self._phases[phase_name] = (depth, num_steps, now)
            if due:
                self._out.info(f"  {'  ' * depth}{phase_name}: {step + 1}/{num_steps} ({self._elapsed()})")
            return not self.cancelled
        except KeyboardInterrupt:
            self.cancelled = True
            return False

    def phase_finish(self, phase_name: str) -> None:
        with self._lock:
            self._phases.pop(phase_name, None)


@contextmanager
def _heartbeat(out: Log, every: float = HEARTBEAT_S) -> Iterator[None]:
    """A line every `every` seconds while the builder runs (it releases the GIL, so this thread gets to speak)."""
    stop = threading.Event()
    t0 = time.perf_counter()

    def beat() -> None:
        while not stop.wait(every):
            out.info(f"  still building ({time.perf_counter() - t0:.0f}s so far)")

    thread = threading.Thread(target=beat, name="trt-build-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=1.0)


def _use_timing_cache(config: trt.IBuilderConfig, path: Path | None, out: Log) -> bool:
    """Give the builder the cache file's contents (or an empty cache); True when the file's cache was used."""
    data = b""
    if path is not None and path.is_file():
        data = path.read_bytes()
    try:
        cache = config.create_timing_cache(data)
        if config.set_timing_cache(cache, ignore_mismatch=False):
            return bool(data)
    except Exception as e:  # a truncated or foreign file
        out.warn(f"The timing cache {path} could not be read ({e.__class__.__name__}); starting an empty one.")
    else:
        out.warn(f"The timing cache {path} was made by another GPU or TensorRT version; starting an empty one.")
    config.set_timing_cache(config.create_timing_cache(b""), ignore_mismatch=False)
    return False


def build_engine(onnx_path: Path, opts: BuildOptions, log: Log = QUIET) -> tuple[bytes, dict[str, Any]]:
    """Parse the ONNX into a strongly typed network and build a plan for the options' batch profile.

    Returns the serialized plan (a standard TensorRT plan) and facts for the sidecar: input name, (C, H, W),
    output names, TensorRT's own version, whether the timing cache was loaded/saved.
    """
    opts.validate()
    onnx_path = Path(onnx_path)
    logger = _Logger(log)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    with log.step(f"Parsing {onnx_path.name} into a strongly typed TensorRT network"):
        parsed = parser.parse_from_file(os.fspath(onnx_path))  # reads external data beside the file too
    errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
    if not parsed or errors:
        raise VitexportError(parse_failure_message(onnx_path, errors or logger.errors))

    if network.num_inputs != 1:
        raise VitexportError(f"{onnx_path.name} has {network.num_inputs} inputs; a ViT engine takes one image batch.")
    inp = network.get_input(0)
    shape = [inp.shape[i] for i in range(len(inp.shape))]
    chw = input_chw(shape, inp.name, opts)
    mn, op, mx = profile_shapes(opts, chw)
    outputs = [network.get_output(i).name for i in range(network.num_outputs)]

    config = builder.create_builder_config()
    if opts.workspace_bytes is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, opts.workspace_bytes)
    if opts.precision == "fp32":
        config.clear_flag(trt.BuilderFlag.TF32)  # on by default: FP32 matmuls would round to 10-bit mantissas
    if opts.opt_level is not None:
        config.builder_optimization_level = opts.opt_level
    profile = builder.create_optimization_profile()
    profile.set_shape(inp.name, trt.Dims(list(mn)), trt.Dims(list(op)), trt.Dims(list(mx)))
    if config.add_optimization_profile(profile) < 0:
        raise VitexportError(f"TensorRT rejected the batch profile {mn[0]}/{op[0]}/{mx[0]} for {inp.name!r}.")
    cache_path = Path(opts.timing_cache) if opts.timing_cache is not None else None
    cache_loaded = _use_timing_cache(config, cache_path, log) if cache_path is not None else False
    monitor = _ProgressMonitor(log)
    config.progress_monitor = monitor

    with log.step(f"Building the {opts.precision} engine (batch {mn[0]}/{op[0]}/{mx[0]}, image "
                  f"{chw[0]}x{chw[1]}x{chw[2]}; this can take minutes)"), _heartbeat(log):
        plan = builder.build_serialized_network(network, config)
    if monitor.cancelled:
        raise VitexportError("The engine build was cancelled; nothing was written.")
    if plan is None or plan.nbytes == 0:
        raise VitexportError(build_failure_message(onnx_path, logger.errors))
    plan_bytes = bytes(plan)

    cache_saved = False
    if cache_path is not None:
        serialized = config.get_timing_cache().serialize()
        with atomic_path(cache_path) as tmp:
            tmp.write_bytes(bytes(serialized))
        cache_saved = True
        log.info(f"Saved the timing cache to {cache_path}.")
    info = {
        "input_name": inp.name,
        "chw": list(chw),
        "output_names": outputs,
        "tensorrt_version": trt.__version__,
        "timing_cache_loaded": cache_loaded,
        "timing_cache_saved": cache_saved,
        "tensorrt_warnings": logger.warnings,
    }
    return plan_bytes, info
