"""The only code that builds with TensorRT: ONNX -> strongly typed network -> serialized plan.

Precision is in the ONNX (FP16 weights/ops, or Q/DQ nodes for INT8), so the network is strongly typed and no
precision builder flag or calibrator is set: both are gone in TensorRT 11. FP32 clears TF32 to give a true
FP32 reference engine. Needs TensorRT 10.12+ (options.MIN_TENSORRT); 11.x works too. Every decision comes from
`options` and `events`; the classes here only forward TensorRT's callbacks to them.

Also holds `LOGGER`, the process's one TensorRT logger, which the runner uses too (events.MESSAGES explains why).
Imported lazily (by compiler.run_trt and the runner) so that a missing TensorRT never breaks `import vitexport`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import tensorrt as trt

from ..errors import VitexportError
from ..paths import atomic_path
from ..progress import QUIET, Log
from .events import MESSAGES, BuildMonitor, Session, run_cancellable
from .options import BuildOptions, build_failure_message, input_chw, parse_failure_message, profile_shapes


class _Logger(trt.ILogger):
    """Every TensorRT message of this process, handed to events.MESSAGES (which never raises)."""

    def __init__(self) -> None:
        trt.ILogger.__init__(self)

    def log(self, severity: trt.ILogger.Severity, msg: str) -> None:
        MESSAGES.log(int(severity), msg)


# Created once, at import: every Builder, OnnxParser and Runtime of the process gets this one (NVIDIA/TensorRT#1475).
LOGGER = _Logger()


class _ProgressMonitor(trt.IProgressMonitor):
    """TensorRT's progress callbacks, handed to an events.BuildMonitor (which catches everything, Ctrl-C included)."""

    def __init__(self, monitor: BuildMonitor) -> None:
        trt.IProgressMonitor.__init__(self)
        self._monitor = monitor

    def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
        try:
            self._monitor.phase_start(phase_name, parent_phase, num_steps)
        except BaseException as e:  # noqa: BLE001 -- a Ctrl-C between two bytecodes lands here, not in the binding
            self._monitor.fail(e)

    def step_complete(self, phase_name: str, step: int) -> bool:
        try:
            return self._monitor.step_complete(phase_name, step)
        except BaseException as e:  # noqa: BLE001
            self._monitor.fail(e)
            return False

    def phase_finish(self, phase_name: str) -> None:
        try:
            self._monitor.phase_finish(phase_name)
        except BaseException as e:  # noqa: BLE001
            self._monitor.fail(e)


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
    output names, TensorRT's own version, whether the timing cache was loaded/saved. A failure names only the
    errors TensorRT logged during this build. Ctrl-C cancels the build and is re-raised (the CLI exits 130).
    """
    opts.validate()
    onnx_path = Path(onnx_path)
    monitor = BuildMonitor(log)
    with MESSAGES.session(log, on_failure=monitor.fail) as messages:
        builder = trt.Builder(LOGGER)
        network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        parser = trt.OnnxParser(network, LOGGER)
        with log.step(f"Parsing {onnx_path.name} into a strongly typed TensorRT network"):
            parsed = parser.parse_from_file(os.fspath(onnx_path))  # reads external data beside the file too
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        if not parsed or errors:
            raise VitexportError(parse_failure_message(onnx_path, errors or messages.errors, MESSAGES.hint()))
        config, facts = _configure(builder, network, onnx_path, opts, log)
        config.progress_monitor = _ProgressMonitor(monitor)
        plan = _build(builder, network, config, onnx_path, opts, facts, monitor, messages, log)
    facts["timing_cache_saved"] = _save_timing_cache(config, opts, log)
    facts.update(tensorrt_version=trt.__version__, tensorrt_warnings=messages.warnings)
    return plan, facts


def _configure(builder: trt.Builder, network: trt.INetworkDefinition, onnx_path: Path, opts: BuildOptions,
               log: Log) -> tuple[trt.IBuilderConfig, dict[str, Any]]:
    """The builder config for the options (profile, workspace, TF32, level, timing cache, layer details)."""
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
    # each layer's types and tactic, readable later with the engine inspector (engine_info.py; the GPU tests)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    profile = builder.create_optimization_profile()
    profile.set_shape(inp.name, trt.Dims(list(mn)), trt.Dims(list(op)), trt.Dims(list(mx)))
    if config.add_optimization_profile(profile) < 0:
        raise VitexportError(f"TensorRT rejected the batch profile {mn[0]}/{op[0]}/{mx[0]} for {inp.name!r}.")
    cache_path = Path(opts.timing_cache) if opts.timing_cache is not None else None
    cache_loaded = _use_timing_cache(config, cache_path, log) if cache_path is not None else False
    facts = {"input_name": inp.name, "chw": list(chw), "output_names": outputs, "timing_cache_loaded": cache_loaded}
    return config, facts


def _build(builder: trt.Builder, network: trt.INetworkDefinition, config: trt.IBuilderConfig, onnx_path: Path,
           opts: BuildOptions, facts: dict[str, Any], monitor: BuildMonitor, messages: Session, log: Log) -> bytes:
    """build_serialized_network in a worker thread (events.run_cancellable); the plan's bytes or one sentence."""
    c, h, w = facts["chw"]
    with log.step(f"Building the {opts.precision} engine (batch {opts.min_batch}/{opts.opt_batch}/{opts.max_batch}, "
                  f"image {c}x{h}x{w}; this can take minutes)"):
        plan = run_cancellable(lambda: builder.build_serialized_network(network, config), monitor, log)
    monitor.raise_if_failed()  # Ctrl-C (re-raised) or a callback that failed: before "logged no error"
    if plan is None or plan.nbytes == 0:
        raise VitexportError(build_failure_message(onnx_path, messages.errors, MESSAGES.hint()))
    return bytes(plan)


def _save_timing_cache(config: trt.IBuilderConfig, opts: BuildOptions, log: Log) -> bool:
    if opts.timing_cache is None:
        return False
    serialized = config.get_timing_cache().serialize()
    with atomic_path(Path(opts.timing_cache)) as tmp:
        tmp.write_bytes(bytes(serialized))
    log.info(f"Saved the timing cache to {opts.timing_cache}.")
    return True
