"""`vitexport bench`: every available backend on the same real inputs, parity against PyTorch FP32, latency.

Backends run one after another in one process, so their latency ratios are comparable. Parity is computed
on the whole data set against PyTorch FP32 eager; latency on batches drawn from the same data.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from . import __version__
from .backends.base import Runner
from .checkpoints import sha256_file
from .compare import DEFAULT_THRESHOLDS, ParityStats, Thresholds, compare, judge
from .data import Dataset, labels_for_model, load_folder
from .errors import BackendUnavailable, VitexportError
from .manifest import preprocess_of
from .paths import display_path
from .progress import QUIET, Log

PRECISIONS = ("fp32", "bf16", "fp16", "int8")


@dataclass
class BenchOptions:
    data: Path | None = None  # default: the shipped held-out set for the model
    batches: tuple[int, ...] | None = None  # default: (1, 8) on CPU, (1, 8, 32) with a GPU
    iterations: int = 10  # at least this many timed runs per backend and batch ...
    min_time: float = 1.0  # ... and at least this many seconds
    warmup: int = 2
    threads: int | None = None  # default: all cores
    backends: tuple[str, ...] = ()  # substrings of runner names to keep; empty: all
    thresholds: dict[str, Thresholds] = field(default_factory=dict)  # per-precision overrides
    strict: bool = False
    parity_limit: int | None = None  # at most this many inputs for parity (None: all)


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


@dataclass
class BackendResult:
    name: str
    backend: str
    precision: str
    device: str
    provider: str
    available: bool
    reason: str = ""
    info: dict = field(default_factory=dict)
    parity: dict | None = None  # stats + passed + failures
    latency: list[Latency] = field(default_factory=list)


@dataclass
class BenchReport:
    vitexport_version: str
    created: str
    environment: dict
    model: dict
    artifacts: list[dict]
    data: dict
    reference: str
    thresholds: dict
    options: dict
    results: list[BackendResult]
    wall_s: float = 0.0

    @property
    def passed(self) -> bool:
        return all(r.parity is None or r.parity["passed"] for r in self.results if r.available)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["passed"] = self.passed
        return d


# -- environment --------------------------------------------------------------------------------------------

def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(threads: int) -> dict:
    import onnx
    import onnxruntime
    import torch

    from .tensorrt_engine.probe import tensorrt_version

    env = {
        "cpu": cpu_model(), "cores": os.cpu_count(), "threads": threads, "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {"vitexport": __version__, "torch": torch.__version__, "onnx": onnx.__version__,
                     "onnxruntime": onnxruntime.__version__, "tensorrt": tensorrt_version()},
        "onnxruntime_providers": onnxruntime.get_available_providers(),
        "gpu": None,
    }
    if torch.cuda.is_available():
        from .tensorrt_engine.probe import cuda_driver_version

        env["gpu"] = {"name": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
                      "cuda_runtime": torch.version.cuda, "driver": cuda_driver_version()}
    return env


# -- runners ------------------------------------------------------------------------------------------------

def discover(folder: Path, manifest: dict, model, threads: int, gpu: bool) -> list[Runner]:
    """Every backend x precision worth trying for this model, available or not (load() decides)."""
    from .backends.ort_backend import OrtRunner
    from .backends.tensorrt import TensorRTRunner
    from .backends.torch_backend import TorchRunner

    io = {"input_name": manifest["input_name"], "output_name": manifest["output_name"]}
    runners: list[Runner] = [TorchRunner(model, "fp32", "cpu"), TorchRunner(model, "bf16", "cpu"),
                             TorchRunner(model, "fp16", "cuda")]
    if gpu:
        runners.append(TorchRunner(model, "fp32", "cuda"))
    files = {"fp32": folder / manifest["onnx"], "fp16": folder / "model.fp16.onnx", "int8": folder / "model.int8.onnx"}
    for ep in ("cpu", "cuda", "tensorrt"):
        for prec, path in files.items():
            runners.append(OrtRunner(path, prec, ep, threads if ep == "cpu" else None, **io))
    for prec in ("fp16", "int8", "fp32"):
        runners.append(TensorRTRunner(folder / f"model.{prec}.plan"))
    return runners


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def measure_latency(runner: Runner, x: np.ndarray, opts: BenchOptions) -> Latency:
    b = len(x)
    h2d = d2h = None
    staged = runner.stage(x)
    if runner.device == "cuda":
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
        h2d, d2h = statistics.median(up) * 1e3, statistics.median(down) * 1e3
    for _ in range(opts.warmup):
        runner.run(staged)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < opts.iterations or (time.perf_counter() - start) < opts.min_time:
        t0 = time.perf_counter()
        runner.run(staged)  # returns when the result is complete (GPU runners synchronize)
        times.append(time.perf_counter() - t0)
        if len(times) >= 10_000:
            break
    ms = [t * 1e3 for t in times]
    mean = statistics.fmean(ms)
    return Latency(b, len(ms), mean, _percentile(ms, 50), _percentile(ms, 90), _percentile(ms, 99),
                   b / (mean / 1e3), h2d, d2h)


def batch_of(data: np.ndarray, b: int) -> np.ndarray:
    """b inputs from the data set (repeated when it is smaller than b)."""
    reps = -(-b // len(data))
    return np.ascontiguousarray(np.concatenate([data] * reps)[:b])


def infer_all(runner: Runner, x: np.ndarray, chunk: int = 8) -> np.ndarray:
    """Outputs for every input, in chunks the runner accepts (an engine's batch range included)."""
    lo, hi = runner.batch_range or (1, chunk)
    chunk = max(lo, min(chunk, hi))
    if len(x) < lo:
        raise VitexportError(f"{runner.name} needs batches of at least {lo}, the data has {len(x)} inputs")
    outs = []
    for i in range(0, len(x), chunk):
        piece = x[i:i + chunk]
        if len(piece) < lo:  # a short last piece: run the last `lo` inputs and keep the new ones
            outs.append(runner.infer(x[len(x) - lo:])[lo - len(piece):])
        else:
            outs.append(runner.infer(piece))
    return np.concatenate(outs)


# -- the whole job ------------------------------------------------------------------------------------------

def run_bench(folder: Path, manifest: dict, opts: BenchOptions, log: Log = QUIET) -> BenchReport:
    import torch

    from .export import model_from_manifest
    from .precision.prepare import default_heldout_dir

    t_start = time.perf_counter()
    threads = opts.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    gpu = torch.cuda.is_available()
    batches = opts.batches or ((1, 8, 32) if gpu else (1, 8))
    if any(b < 1 for b in batches):
        raise VitexportError("Batch sizes must be at least 1.")

    data_dir = Path(opts.data) if opts.data else default_heldout_dir(manifest)
    calib_dir = ((manifest.get("precisions") or {}).get("int8") or {}).get("calibration", {}).get("data")
    if calib_dir and Path(calib_dir).resolve() == data_dir.resolve():
        log.warn(f"{data_dir} is the data the INT8 model was calibrated on: its INT8 parity will look better "
                 "than on unseen images.")
    with log.step(f"Loading inputs from {data_dir}"):
        data: Dataset = load_folder(data_dir, preprocess_of(manifest))
    x_parity = data.x if opts.parity_limit is None else data.x[:opts.parity_limit]
    all_labels, why = labels_for_model(data, int(manifest["num_classes"]))
    if why:
        log.warn(f"Class folders of {data_dir} not used as labels: {why}.")
    labels = None if all_labels is None else all_labels[:len(x_parity)]
    log.info(f"{len(data)} inputs{' with labels (' + str(len(data.classes or [])) + ' classes)' if labels is not None else ''}")

    try:
        model = model_from_manifest(manifest)
    except VitexportError as e:
        model = None
        log.warn(f"PyTorch backends unavailable: {e}.")
    runners = discover(folder, manifest, model, threads, gpu)
    if opts.backends:
        runners = [r for r in runners if any(s.lower() in r.name.lower() for s in opts.backends)
                   or (r.backend == "pytorch" and r.precision == "fp32" and r.device == "cpu")]

    results: list[BackendResult] = []
    reference_out: np.ndarray | None = None
    reference_name = "none"
    ref_tput: dict[int, float] = {}
    for runner in runners:
        res = BackendResult(runner.name, runner.backend, runner.precision, runner.device, runner.provider, False)
        results.append(res)
        try:
            runner.load()
            runner.loaded = True
        except BackendUnavailable as e:
            res.reason = str(e)
            log.info(f"{runner.name}: unavailable: {e}")
            continue
        res.available, res.info = True, dict(runner.info)
        try:
            with log.step(f"{runner.name}"):
                out = infer_all(runner, x_parity)
                # the reference: PyTorch FP32 eager on the CPU (first in the list); if it cannot run, the
                # next FP32 backend stands in and the report says so
                is_reference = reference_out is None and runner.precision == "fp32"
                if is_reference:
                    reference_out, reference_name = out, runner.name
                if reference_out is None:
                    raise VitexportError("the PyTorch FP32 reference is unavailable")
                stats: ParityStats = compare(reference_out, out, labels)
                th = opts.thresholds.get(runner.precision)
                verdict = judge(stats, runner.precision, th)
                res.parity = {**stats.to_dict(), "passed": verdict.passed, "failures": verdict.failures}
                for b in batches:
                    lo, hi = runner.batch_range or (1, b)
                    if not lo <= b <= hi:
                        res.info.setdefault("skipped_batches", []).append(b)
                        log.info(f"{runner.name}: batch {b} is outside its range {lo}-{hi}; not timed")
                        continue
                    lat = measure_latency(runner, batch_of(data.x, b), opts)
                    if is_reference:
                        ref_tput[b] = lat.throughput
                    if b in ref_tput:
                        lat.relative_to_reference = lat.throughput / ref_tput[b]
                    res.latency.append(lat)
        except BackendUnavailable as e:
            res.available, res.reason = False, str(e)
        except (VitexportError, ValueError) as e:  # ValueError: an output of another shape than the reference
            res.available, res.reason = False, f"failed: {e}"
        finally:
            runner.close()

    artifacts = []
    for name in (manifest["onnx"], "model.fp16.onnx", "model.int8.onnx", "model.fp16.plan", "model.int8.plan",
                 "model.fp32.plan"):
        p = folder / name
        if p.is_file():
            artifacts.append({"file": display_path(p), "bytes": p.stat().st_size, "sha256": sha256_file(p)})
    used = {p: (opts.thresholds.get(p) or DEFAULT_THRESHOLDS[p]).to_dict() for p in PRECISIONS}
    return BenchReport(
        vitexport_version=__version__,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        environment=environment(threads),
        model={"folder": display_path(folder), "variant": manifest["variant"], "img_size": manifest["img_size"],
               "num_classes": manifest["num_classes"], "checkpoint": manifest.get("checkpoint"),
               "random_weights": not manifest.get("checkpoint")},
        artifacts=artifacts,
        data={"source": display_path(data.source), "n": len(data), "n_parity": len(x_parity), "labelled": labels is not None,
              "classes": data.classes},
        reference=reference_name,
        thresholds=used,
        options={"batches": list(batches), "iterations": opts.iterations, "min_time": opts.min_time,
                 "warmup": opts.warmup, "threads": threads, "strict": opts.strict},
        results=results,
        wall_s=time.perf_counter() - t_start,
    )
