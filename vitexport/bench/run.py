"""`vitexport bench`: every available backend on the same real inputs, parity against PyTorch FP32, latency.

Backends run one after another in one process, so their latency ratios are comparable. Parity is computed
on the whole data set against PyTorch FP32 eager; latency on batches drawn from the same data.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..artifacts.folder import ModelFolder, artifact_kind
from ..artifacts.manifest import Manifest
from ..artifacts.verify import MISSING, FileCheck, check_folder
from ..artifacts.workspace import reading
from ..backends.base import Runner
from ..data.images import Dataset, labels_for_model, load_folder
from ..ensure import ensure_artifact, open_model
from ..environment import cuda_gpu, environment
from ..errors import BackendUnavailable, ParityError, VitexportError
from ..export.torch_model import model_from_manifest
from ..model.spec import ModelSpec
from ..parity.compare import DEFAULT_THRESHOLDS, ParityVerdict, Thresholds, compare, judge
from ..paths import default_heldout_dir, display_path
from ..precision.settings import CalibOptions
from ..preflight import check_batches
from ..progress import QUIET, Log
from .latency import Latency, batch_of, measure_latency

PREPARED_KINDS = ("fp16", "int8", "int8-trt")  # ONNX kinds the bench makes when missing (unless --no-prepare)
# ONNX kinds each ONNX Runtime provider runs: each INT8 graph where it belongs (the TensorRT-shaped one on the CPU
# for its accuracy only: FP16 is emulated there, so that row is not timed)
ORT_KINDS = {"cpu": ("fp32", "fp16", "int8", "int8-trt"), "cuda": ("fp32", "fp16", "int8"),
             "tensorrt": ("fp32", "fp16", "int8-trt")}
PLAN_ORDER = ("fp16", "int8", "fp32")  # TensorRT plans, in the order they are run and listed
# OpenVINO CPU rows: row precision -> the ONNX kind it reads (bf16: the FP32 graph, OpenVINO's bf16 inference precision)
OPENVINO_ROWS = {"fp32": "fp32", "bf16": "fp32", "int8": "int8"}


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
class BackendResult:
    name: str  # 'onnxruntime cpu int8'
    backend: str  # 'pytorch' | 'onnxruntime' | 'tensorrt'
    precision: str
    device: str
    provider: str
    available: bool  # it loaded and ran
    reason: str = ""  # why not
    info: dict = field(default_factory=dict)  # what the runner recorded: threads, providers, plan, ...
    parity: ParityVerdict | None = None  # against the reference, on every parity input
    latency: list[Latency] = field(default_factory=list)  # one per timed batch size

    @property
    def missed_parity(self) -> bool:
        return self.available and self.parity is not None and not self.parity.passed

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "backend": self.backend, "precision": self.precision, "device": self.device,
                "provider": self.provider, "available": self.available, "reason": self.reason, "info": self.info,
                "parity": None if self.parity is None else self.parity.to_dict(),
                "latency": [asdict(lt) for lt in self.latency]}


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
        """No parity miss, and every artifact present verified (a wrong file is a failure, not 'unavailable')."""
        return not self.failures()

    def failures(self) -> list[str]:
        """What failed, one phrase each: parity misses, then artifacts that did not verify."""
        missed = [r.name for r in self.results if r.missed_parity]
        return ([f"parity missed by {', '.join(missed)}"] if missed else []) + \
            [f"{Path(a['file']).name} {a['reason']}" for a in self.artifacts if a.get("status", "ok") != "ok"]

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["results"] = [r.to_dict() for r in self.results]
        d["passed"] = self.passed
        return d


def prepare_bench(target: Path | ModelFolder | None, spec: ModelSpec | None = None, *, prepare: bool = True,
                  log: Log = QUIET) -> ModelFolder:
    """The folder to bench, with its FP16/INT8 ONNX made when missing (default options; the bench checks parity
    itself). A kind that cannot be made is warned about and then listed as unavailable."""
    folder = open_model(target, spec, export=prepare, verify=False, log=log)  # a wrong file: a FAIL in the table
    if prepare:
        for kind in PREPARED_KINDS:
            try:
                ensure_artifact(folder, kind, calib=CalibOptions(check=False), log=log)
            except ParityError:
                raise
            except VitexportError as e:
                log.warn(f"Could not prepare the {kind.upper()} model: {e}")
    return folder


def discover(folder: ModelFolder, model, threads: int, gpu: bool,
             io: tuple[str, str] | None = None) -> list[Runner]:
    """Every backend x precision worth trying for this model, available or not (load() decides)."""
    from ..backends.openvino_backend import OpenVinoRunner
    from ..backends.ort_backend import OrtRunner
    from ..backends.tensorrt import TensorRTRunner
    from ..backends.torch_backend import TorchRunner

    names = {} if io is None else {"input_name": io[0], "output_name": io[1]}
    runners: list[Runner] = [TorchRunner(model, "fp32", "cpu"), TorchRunner(model, "bf16", "cpu"),
                             TorchRunner(model, "fp16", "cuda")]
    if gpu:
        runners.append(TorchRunner(model, "fp32", "cuda"))
    for ep, kinds in ORT_KINDS.items():
        for kind in kinds:
            runners.append(OrtRunner(folder.onnx(kind), artifact_kind(kind).precision, ep,
                                     threads if ep == "cpu" else None, kind=kind, **names))
    runners += [OpenVinoRunner(folder.onnx(kind), prec, threads, **names) for prec, kind in OPENVINO_ROWS.items()]
    runners += [TensorRTRunner(folder.plan(prec)) for prec in PLAN_ORDER]
    return runners


# -- the whole job ------------------------------------------------------------------------------------------

@dataclass
class _Inputs:
    data: Dataset  # every input, for latency batches
    x_parity: np.ndarray  # the inputs parity is computed on
    labels: np.ndarray | None  # their labels, when the folders name the model's classes


def _load_inputs(manifest: Manifest, opts: BenchOptions, log: Log) -> _Inputs:
    data_dir = Path(opts.data) if opts.data else default_heldout_dir(manifest.variant)
    int8 = manifest.precisions.get("int8")
    calib_dir = None if int8 is None or int8.calibration is None else int8.calibration.data
    if calib_dir and Path(calib_dir).resolve() == data_dir.resolve():
        log.warn(f"{data_dir} is the data the INT8 model was calibrated on: its INT8 parity will look better "
                 "than on unseen images.")
    with log.step(f"Loading inputs from {data_dir}"):
        data = load_folder(data_dir, manifest.preprocess)
    x_parity = data.x if opts.parity_limit is None else data.x[:opts.parity_limit]
    all_labels, why = labels_for_model(data, manifest.num_classes)
    if why:
        log.warn(f"Class folders of {data_dir} not used as labels: {why}.")
    labels = None if all_labels is None else all_labels[:len(x_parity)]
    classes = f" with labels ({len(data.classes or [])} classes)" if labels is not None else ""
    log.info(f"{len(data)} inputs{classes}")
    return _Inputs(data, x_parity, labels)


class _Reference:
    """PyTorch FP32 eager on the CPU (first in the list); if it cannot run, the next FP32 backend stands in."""

    def __init__(self) -> None:
        self.out: np.ndarray | None = None
        self.name = "none"
        self.throughput: dict[int, float] = {}  # batch -> images/s


def _run_backend(runner: Runner, inputs: _Inputs, batches: tuple[int, ...], opts: BenchOptions, ref: _Reference,
                 log: Log) -> BackendResult:
    """Load, parity on every input, latency per batch, close: one row of the report."""
    res = BackendResult(runner.name, runner.backend, runner.precision, runner.device, runner.provider, False)
    try:
        runner.load()
    except BackendUnavailable as e:
        res.reason = str(e)  # listed once, under the table
        return res
    res.available, res.info = True, dict(runner.info)
    try:
        with log.step(f"{runner.name}"):
            out = runner.infer_all(inputs.x_parity)
            is_reference = ref.out is None and runner.precision == "fp32"
            if is_reference:
                ref.out, ref.name = out, runner.name
            if ref.out is None:
                raise VitexportError("the PyTorch FP32 reference is unavailable")
            res.parity = judge(compare(ref.out, out, inputs.labels), runner.precision,
                               opts.thresholds.get(runner.precision))
            if not runner.timed:
                res.info["not_timed"] = "the graph is shaped for another runtime; its speed here means nothing"
            for b in batches if runner.timed else ():
                lo, hi = runner.batch_range or (1, b)
                if not lo <= b <= hi:
                    res.info.setdefault("skipped_batches", []).append(b)
                    log.info(f"{runner.name}: batch {b} is outside its range {lo}-{hi}; not timed")
                    continue
                lat = measure_latency(runner, batch_of(inputs.data.x, b), opts.iterations, opts.min_time,
                                      opts.warmup)
                if is_reference:
                    ref.throughput[b] = lat.throughput
                if b in ref.throughput:
                    lat.relative_to_reference = lat.throughput / ref.throughput[b]
                res.latency.append(lat)
    except BackendUnavailable as e:
        res.available, res.reason = False, str(e)
    except (VitexportError, ValueError) as e:  # ValueError: an output of another shape than the reference
        res.available, res.reason = False, f"failed: {e}"
    finally:
        runner.close()
    return res


def _not_run(runner: Runner, wrong: dict[Path, FileCheck]) -> BackendResult | None:
    """The row of a runner whose file did not verify: not run (the artifact's failure is in the report)."""
    path = getattr(runner, "path", None) or getattr(runner, "plan_path", None)
    check = wrong.get(Path(path)) if path is not None else None
    if check is None:
        return None
    return BackendResult(runner.name, runner.backend, runner.precision, runner.device, runner.provider, False,
                         reason=f"not run: {check.path.name} {check.reason}")


def run_bench(model_dir: ModelFolder | Path, opts: BenchOptions, log: Log = QUIET) -> BenchReport:
    """Every backend this machine offers for the model in `model_dir`, on the same inputs; see prepare_bench."""
    import torch

    t_start = time.perf_counter()
    folder = model_dir if isinstance(model_dir, ModelFolder) else ModelFolder(model_dir)
    manifest = folder.read_manifest()
    threads = opts.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    gpu = cuda_gpu() is not None
    batches = opts.batches or ((1, 8, 32) if gpu else (1, 8))
    if any(b < 1 for b in batches):
        raise VitexportError("Batch sizes must be at least 1.")
    check_batches(manifest.config, batches, f"{manifest.variant} at {manifest.img_size[0]}x{manifest.img_size[1]}")
    with reading(folder, log) as debris:  # verified once no other run is writing the folder
        checks = [c for c in check_folder(folder, manifest) if c.status != MISSING]
    if dead := [d for d in debris if not d.alive]:
        log.warn(f"{folder.path} holds {len(dead)} leftover(s) of an interrupted run; `vitexport info --clean "
                 f"{folder.path}` removes them.")
    inputs = _load_inputs(manifest, opts, log)
    try:
        model = model_from_manifest(manifest)
    except VitexportError as e:
        model = None
        log.warn(f"PyTorch backends unavailable: {e}.")
    runners = discover(folder, model, threads, gpu, (manifest.input_name, manifest.output_name))
    if opts.backends:
        runners = [r for r in runners if any(s.lower() in r.name.lower() for s in opts.backends)
                   or (r.backend == "pytorch" and r.precision == "fp32" and r.device == "cpu")]
    ref = _Reference()
    wrong = {c.path: c for c in checks if c.problem}
    results = [_not_run(r, wrong) or _run_backend(r, inputs, batches, opts, ref, log) for r in runners]
    return BenchReport(
        vitexport_version=__version__,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        environment=environment(threads),
        model={"folder": display_path(folder.path), "variant": manifest.variant, "img_size": list(manifest.img_size),
               "num_classes": manifest.num_classes,
               "checkpoint": None if manifest.checkpoint is None else asdict(manifest.checkpoint),
               "random_weights": manifest.checkpoint is None},
        artifacts=[{"file": display_path(c.path), "kind": c.kind, "bytes": c.path.stat().st_size, "sha256": c.sha256,
                    "status": c.status, "reason": c.reason, "remedy": c.remedy} for c in checks],
        data={"source": display_path(inputs.data.source), "n": len(inputs.data), "n_parity": len(inputs.x_parity),
              "labelled": inputs.labels is not None, "classes": inputs.data.classes},
        reference=ref.name,
        thresholds={p: (opts.thresholds.get(p) or th).to_dict() for p, th in DEFAULT_THRESHOLDS.items()},
        options={"batches": list(batches), "iterations": opts.iterations, "min_time": opts.min_time,
                 "warmup": opts.warmup, "threads": threads, "strict": opts.strict},
        results=results,
        wall_s=time.perf_counter() - t_start,
    )
