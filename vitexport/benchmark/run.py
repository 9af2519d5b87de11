"""`vitexport bench`: every available backend on the same real inputs, parity against PyTorch FP32, latency.

Backends run one after another in one process, so their latency ratios are comparable. Parity is computed
on the whole data set against PyTorch FP32 eager; latency on batches drawn from the same data.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..version import __version__
from ..artifacts.folder import ModelFolder, artifact_kind
from ..artifacts.manifest import Manifest
from ..artifacts.verify import MISSING, FileCheck, check_folder
from ..artifacts.workspace import reading
from ..backends.base import Runner
from ..ensure import ensure_artifact, open_model, stale_reason
from ..environment import cuda_gpu, environment, usable_cores
from ..errors import BackendUnavailable, ParityError, VitexportError
from ..model.labels import class_names
from ..model.spec import ModelSpec
from ..parity.compare import DEFAULT_THRESHOLDS, ParityVerdict, Thresholds, judge
from ..parity.knn import DEFAULT_K, DEFAULT_T
from ..paths import display_path
from ..precision.settings import CalibOptions
from ..preflight import check_batches
from ..progress import QUIET, Log
from ..validate.evaluate import ValidationSet, eval_batch, open_validation
from .against import Reference, parity_pass
from .examples import attach
from .plan import bench_sizes, default_bench_data, generated_note, judged_output, refuse_unusable, torch_model
from .latency import Latency, measure_latency, takes_batch
from .served import EndpointOptions, endpoint_runners, partial, probe, time_served

AOTI_PREPARED_KINDS = ("aoti-bf16", "aoti-int8")  # bench --aoti: PyTorch's compiled packages, made when missing
PREPARED_KINDS = ("fp16", "int8", "int8-trt")  # ONNX kinds the bench makes when missing (unless --no-prepare) ...
GPU_PREPARED_KINDS = ("fp16-trt",)  # ... and, with a CUDA GPU, for ONNX Runtime's TensorRT provider
# ONNX kinds each ONNX Runtime provider runs: each INT8 graph where it belongs (the TensorRT-shaped one on the CPU
# for its accuracy only: FP16 is emulated there, so that row is not timed)
ORT_KINDS = {"cpu": ("fp32", "fp16", "int8", "int8-trt", "fp8"), "cuda": ("fp32", "fp16", "int8"),
             "tensorrt": ("fp32", "fp16-trt", "int8-trt")}
PLAN_ORDER = ("fp16", "int8", "fp8", "fp32")  # TensorRT plans, in the order they are run and listed
# OpenVINO CPU rows: row precision -> the ONNX kind it reads (bf16: the FP32 graph, OpenVINO's bf16 inference precision)
OPENVINO_ROWS = {"fp32": "fp32", "bf16": "fp32", "int8": "int8"}


@dataclass
class BenchOptions:
    data: Path | None = None  # default: the shipped held-out set for the model
    batches: tuple[int, ...] | None = None  # default: (1, 8) on CPU, (1, 8, 32) with a GPU
    iterations: int | None = None  # at least this many timed runs per backend and batch (None: latency.enough's
    # rule: MIN_RUNS, then until the median is stable, DEFAULT_RUNS or BUDGET_S seconds of runs) ...
    min_time: float = 1.0  # ... and at least this many seconds
    # untimed runs at each batch size before its timed ones: the parity pass has run the runner already, so one
    # run makes what is particular to the batch's shape (allocations, primitives); a second one changed nothing
    warmup: int = 1
    threads: int | None = None  # default: every core this process may use
    backends: tuple[str, ...] = ()  # substrings of runner names to keep; empty: all
    rows: tuple[str, ...] = ()  # ... or exactly these rows (`quantize --html`: the graph just made)
    timed: bool = True  # False: parity only (`quantize --html`)
    extra: tuple[tuple[str, str, Path], ...] = ()  # (row kind, precision, ONNX file) outside the manifest, on ONNX
    # Runtime's CPU provider: `quantize --html`'s rejected graph
    thresholds: dict[str, Thresholds] = field(default_factory=dict)  # per-precision overrides
    strict: bool = False
    max_images: int | None = None  # this many images spread evenly over --data (None: every one)
    img_sizes: tuple[tuple[int, int], ...] | None = None  # a dynamic-size export: bench at each (None: its default)
    workers: int | None = None  # decoding threads (None: data.stream.default_workers)
    labels: tuple[Path, ...] = ()  # label files for --data (data.labelfile)
    depth_scale: float = 1000.0  # a depth model's ground-truth PNGs: value per unit (data.dense_truth)
    annotations: Path | None = None  # a detector's COCO JSON for --data (data.detection_truth)
    judge_output: str | None = None  # the output judged (model.outputs; None: the manifest's output_name)
    knn_k: int = DEFAULT_K  # an embedding model's k-NN (parity.knn)
    knn_t: float = DEFAULT_T
    endpoints: EndpointOptions = field(default_factory=EndpointOptions)  # served models (bench/served.py)


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
    parity: ParityVerdict | None = None  # against the reference, on every input
    latency: list[Latency] = field(default_factory=list)  # one per timed batch size
    per_class: list[dict] = field(default_factory=list)  # labelled data: top-1 per class, reference and this
    timing: dict = field(default_factory=dict)  # the parity pass: inference and input-reading seconds, images/s
    img_size: tuple[int, int] | None = None  # a dynamic-size export benched at several sizes: this row's
    error: str = ""  # a served row that stopped part-way: why, and how far it got (a failure of the bench)
    examples: list[dict] = field(default_factory=list)  # the images that explain a miss, worst first (parity.examples)

    @property
    def missed_parity(self) -> bool:
        return self.available and self.parity is not None and not self.parity.passed

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "backend": self.backend, "precision": self.precision, "device": self.device,
                "provider": self.provider, "available": self.available, "reason": self.reason, "info": self.info,
                "parity": None if self.parity is None else self.parity.to_dict(),
                "latency": [asdict(lt) for lt in self.latency], "per_class": self.per_class, "timing": self.timing,
                **({} if self.img_size is None else {"img_size": list(self.img_size)}),
                **({"error": self.error} if self.error else {}),
                **({"examples": self.examples} if self.examples else {})}


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
    pictures: dict = field(default_factory=dict)  # str(input index): {file, thumb} of the images examples name
    command: str = ""  # the command line that made it

    @property
    def passed(self) -> bool:
        """No parity miss, and every artifact present verified (a wrong file is a failure, not 'unavailable')."""
        return not self.failures()

    def failures(self) -> list[str]:
        """What failed, one phrase each: parity misses, then artifacts that did not verify."""
        missed = [r.name for r in self.results if r.missed_parity and r.parity and r.parity.failed]
        undecided = [r.name for r in self.results if r.missed_parity and r.parity and not r.parity.failed]
        return ([f"parity missed by {', '.join(missed)}"] if missed else []) + \
            ([f"parity inconclusive for {', '.join(undecided)} on {self.data['n_parity']:,} images (too few to decide "
              "the accuracy bound; docs/PARITY.md)"] if undecided else []) + \
            [f"{Path(a['file']).name} {a['reason']}" for a in self.artifacts if a.get("status", "ok") != "ok"] + \
            [f"{r.name} failed: {r.error}" for r in self.results if r.error]

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["results"] = [r.to_dict() for r in self.results]
        d["passed"] = self.passed
        return d


def outcome(report: BenchReport, strict: bool) -> tuple[VitexportError | None, str]:
    """What a finished bench ends with, for the CLI and `vitexport.bench` alike: (the error to raise, or None; a
    warning to show, or ''). A served row that failed is an error with or without strict; a parity miss, an
    undecided bound or skipped data files are one (ParityError) only with strict, else a warning."""
    skipped = int((report.data.get("skipped") or {}).get("count", 0))
    if skipped and strict:
        return ParityError(f"{skipped:,} file(s) of {report.data['source']} were skipped (--strict); see the warning "
                           f"above and data.skipped in the JSON."), ""
    if report.passed:
        return None, ""
    msg = f"Failed: {'; '.join(report.failures())}."
    if any(r.error for r in report.results):
        return VitexportError(msg), ""
    return (ParityError(msg), "") if strict else (None, f"{msg} (--strict makes this exit 1)")


def prepare_bench(target: Path | ModelFolder | None, spec: ModelSpec | None = None, *, prepare: bool = True,
                  sizes: tuple[tuple[int, int], ...] | None = None, judge_output: str | None = None,
                  data: Path | None = None, aoti: bool = False, log: Log = QUIET) -> ModelFolder:
    """The folder to bench, with its FP16/INT8 ONNX made when missing (default options; the bench checks parity
    itself), and with `aoti` PyTorch's compiled packages too (minutes: `vitexport aoti`). A kind that cannot be made
    is warned about and then listed as unavailable. Sizes the export cannot
    take, an output it does not have, and a --data folder none of whose images can be used, are refused first,
    before anything is made."""
    folder = open_model(target, spec, export=prepare, verify=False, log=log)  # a wrong file: a FAIL in the table
    manifest = folder.read_manifest()
    bench_sizes(manifest, sizes)
    judged_output(manifest, judge_output)
    if prepare and data is not None:
        refuse_unusable(Path(data), manifest)
    if prepare:
        for kind in PREPARED_KINDS + (GPU_PREPARED_KINDS if cuda_gpu() is not None else ()) + \
                (AOTI_PREPARED_KINDS if aoti else ()):
            with reading(folder, log):  # a file made with other options is the user's: benched as it is
                if stale_reason(folder, kind, None) is None:
                    continue
            try:
                ensure_artifact(folder, kind, calib=CalibOptions(check=False), log=log)
            except ParityError:
                raise
            except VitexportError as e:
                log.warn(f"Could not prepare the {kind.upper()} model: {e}")
    return folder


def discover(folder: ModelFolder, model, threads: int, gpu: bool, io: tuple[str, str] | None = None,
             extra: tuple[tuple[str, str, Path], ...] = ()) -> list[Runner]:
    """Every backend x precision worth trying for this model, available or not (load() decides); `extra`: ONNX
    files outside the manifest, (row kind, precision, file), on ONNX Runtime's CPU provider."""
    from ..aoti.make import AOTI_KINDS
    from ..backends.aoti_backend import AotiRunner
    from ..backends.openvino_backend import OpenVinoRunner
    from ..backends.ort_backend import OrtRunner
    from ..backends.tensorrt import TensorRTRunner
    from ..backends.torch_backend import TorchRunner

    names = {} if io is None else {"input_name": io[0], "output_name": io[1]}
    runners: list[Runner] = [TorchRunner(model, "fp32", "cpu"), TorchRunner(model, "bf16", "cpu"),
                             TorchRunner(model, "fp16", "cuda")]
    if gpu:
        runners.append(TorchRunner(model, "fp32", "cuda"))
    def example() -> tuple[int, ...]:  # PyTorch's compiled CUDA rows are compiled at the export's size (on a GPU)
        return (3, *folder.read_manifest().img_size)

    runners += [TorchRunner(model, p, "cuda", compiled=True, example=example) for p in ("fp16", "bf16")]
    for ep, kinds in ORT_KINDS.items():
        for kind in kinds:
            runners.append(OrtRunner(folder.onnx(kind), artifact_kind(kind).precision, ep,
                                     threads if ep == "cpu" else None, kind=kind, **names))
    runners += [OpenVinoRunner(folder.onnx(kind), prec, threads, **names) for prec, kind in OPENVINO_ROWS.items()]
    runners += [TensorRTRunner(folder.plan(prec), output_name=None if io is None else io[1]) for prec in PLAN_ORDER]
    runners += [AotiRunner(folder.onnx(kind), prec, None if io is None else io[1]) for kind, prec in AOTI_KINDS.items()]
    runners += [OrtRunner(path, prec, "cpu", threads, kind=kind, **names) for kind, prec, path in extra]
    return runners


# -- the whole job ------------------------------------------------------------------------------------------

def _open_inputs(manifest: Manifest, opts: BenchOptions, log: Log,
                 size: tuple[int, int] | None = None) -> ValidationSet:
    if size is not None:
        manifest = replace(manifest, preprocess=replace(manifest.preprocess, input_size=tuple(size)))
    data_dir = Path(opts.data) if opts.data else default_bench_data(manifest.variant, log)
    int8 = manifest.precisions.get("int8")
    calib_dir = None if int8 is None or int8.calibration is None else int8.calibration.data
    if calib_dir and Path(calib_dir).resolve() == data_dir.resolve():
        log.warn(f"{data_dir} is the data the INT8 model was calibrated on: its INT8 parity will look better "
                 "than on unseen images.")
    return open_validation(data_dir, manifest.preprocess, manifest.num_classes, opts.max_images, opts.workers, log,
                           class_names(manifest), opts.labels, dense=manifest.dense, depth_scale=opts.depth_scale,
                           batch=eval_batch(manifest.config), annotations=opts.annotations)


def _run_backend(runner: Runner, vset: ValidationSet, batches: tuple[int, ...], opts: BenchOptions,
                 ref: Reference, log: Log) -> BackendResult:
    """Load, parity on every input, latency per batch, close: one row of the report."""
    res = BackendResult(runner.name, runner.backend, runner.precision, runner.device, runner.provider, False)
    served = getattr(runner, "endpoint", False)
    try:
        runner.load()
    except BackendUnavailable as e:
        res.reason = str(e)  # listed once, under the table
        return res
    except VitexportError as e:
        if not served:
            raise
        res.reason = res.error = str(e)  # a server that went away since it was probed
        return res
    # the provider as loading settled it (OpenVINO's INT8 row decides its inference precision there)
    res.available, res.info, res.provider = True, dict(runner.info), runner.provider
    try:
        with log.step(f"{runner.name}"):
            ev, is_reference = parity_pass(runner, vset, ref, log)
            res.parity = judge(ev.stats, runner.precision, opts.thresholds.get(runner.precision))
            res.per_class, res.timing, res.examples = ev.per_class, ev.timing(), ev.examples
            if not runner.timed:
                res.info["not_timed"] = "the graph is shaped for another runtime; its speed here means nothing"
            if served:
                res.latency = time_served(runner, vset.inputs.sample, batches, opts.endpoints, opts.min_time,
                                          opts.warmup, res.info, log)
                _relative(res.latency, ref)
            for b in batches if runner.timed and opts.timed and not served else ():
                if not takes_batch(runner, b, res.info, log):
                    continue
                lat = measure_latency(runner, vset.inputs.sample(b), opts.iterations, opts.min_time, opts.warmup)
                if is_reference:
                    ref.throughput[b] = lat.throughput
                if b in ref.throughput:
                    lat.relative_to_reference = lat.throughput / ref.throughput[b]
                res.latency.append(lat)
    except BackendUnavailable as e:
        res.available, res.reason = False, str(e)
    except (VitexportError, ValueError) as e:  # ValueError: an output of another shape than the reference
        if served and isinstance(e, VitexportError):  # what it measured stays; the bench fails
            res.error = partial(runner, len(vset), e)
            res.available, res.reason = res.parity is not None, res.error
        else:
            res.available, res.reason = False, f"failed: {e}"
    finally:
        runner.close()
    return res


def _relative(latencies: list[Latency], ref: Reference) -> None:
    for lat in latencies:
        if lat.batch in ref.throughput:
            lat.relative_to_reference = lat.throughput / ref.throughput[lat.batch]


def _data(vset: ValidationSet, num_classes: int, knn: tuple[int, float] | None, note: str = "") -> dict:
    return {"source": display_path(vset.source), "n": vset.images.total,
            **({"generated": note} if note else {}), "n_parity": len(vset),
            "subset": len(vset.images) < vset.images.total, "labelled": vset.labels is not None,
            "classes": vset.images.classes, "decode": vset.inputs.decode.to_dict(),
            "skipped": vset.images.skipped.to_dict(),
            **({"embeddings": {"k": knn[0], "t": knn[1], "labelled": vset.set_labels is not None}} if knn else {}),
            **({"labels": {"source": vset.images.label_source, "how": vset.how,
                           "num_classes": num_classes, "real": vset.real is not None,
                           **({"present": len(vset.subset)} if vset.subset is not None else {})}}
               if vset.labels is not None else {})}


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
    threads = opts.threads or usable_cores()
    torch.set_num_threads(threads)
    gpu = cuda_gpu() is not None
    batches = opts.batches or ((1, 8, 32) if gpu else (1, 8))
    if any(b < 1 for b in batches):
        raise VitexportError("Batch sizes must be at least 1.")
    sizes = bench_sizes(manifest, opts.img_sizes)
    largest = max((s for s in sizes if s is not None), default=manifest.img_size, key=lambda s: s[0] * s[1])
    check_batches({**manifest.config, "img_size": list(largest)}, batches,
                  f"{manifest.variant} at {largest[0]}x{largest[1]}")
    with reading(folder, log) as debris:  # no other run writes the folder from the check to the last row
        manifest = folder.read_manifest()  # as it is now that no writer holds the folder
        checks = [c for c in check_folder(folder, manifest) if c.status != MISSING]
        if dead := [d for d in debris if not d.alive]:
            log.warn(f"{folder.path} holds {len(dead)} leftover(s) of an interrupted run; `vitexport info --clean "
                     f"{folder.path}` removes them.")
        return _bench(folder, manifest, sizes, checks, threads, gpu, batches, opts, t_start, log)


def _bench(folder: ModelFolder, manifest: Manifest, sizes: list, checks: list[FileCheck], threads: int,
           gpu: bool, batches: tuple[int, ...], opts: BenchOptions, t_start: float, log: Log) -> BenchReport:
    output, embedding = judged_output(manifest, opts.judge_output)
    model = torch_model(manifest, output, log)
    runners = discover(folder, model, threads, gpu, (manifest.input_name, output), opts.extra)
    if opts.backends or opts.rows:
        runners = [r for r in runners if any(s.lower() in r.name.lower() for s in opts.backends) or r.name in opts.rows
                   or (r.backend == "pytorch" and r.precision == "fp32" and r.device == "cpu"
                       and r.provider != "aoti")]  # the reference, whatever --backend says
    served = endpoint_runners(manifest, opts.endpoints)  # asked for by URL: kept whatever --backend says
    if served and sizes != [None]:
        raise VitexportError("--endpoint benches the served model at the export's own size; leave out --img-size.")
    probe(served, log)
    runners += served
    wrong = {c.path: c for c in checks if c.problem}
    results: list[BackendResult] = []
    data, reference, pictures = {}, [], {}
    for size in sizes:  # one pass over the data per size, each against the PyTorch reference at that size
        vset = _open_inputs(replace(manifest, num_classes=0) if embedding else manifest, opts, log, size)
        try:
            ref = Reference((opts.knn_k, opts.knn_t) if embedding else None)
            at = [_not_run(r, wrong) or _run_backend(r, vset, batches, opts, ref, log) for r in runners]
            if size is not None:
                for res in at:
                    res.name, res.img_size = f"{res.name} @ {size[0]}x{size[1]}", tuple(size)
            results += at
            attach([r.examples for r in at], vset, None if embedding else class_names(manifest), pictures)
            reference.append(ref.name)
            data = data or _data(vset, manifest.num_classes, ref.knn, generated_note(manifest.variant, opts.data,
                                                                                     vset.source))
        finally:
            vset.close()
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
        data=data,
        reference=reference[0] if len(set(reference)) == 1 else ", ".join(reference),
        thresholds={p: (opts.thresholds.get(p) or th).to_dict() for p, th in DEFAULT_THRESHOLDS.items()},
        options={"batches": list(batches), "iterations": opts.iterations, "min_time": opts.min_time,
                 **({} if sizes == [None] else {"img_sizes": [list(s) for s in sizes]}),
                 "warmup": opts.warmup, "threads": threads, "strict": opts.strict, "max_images": opts.max_images,
                 **({"concurrency": list(opts.endpoints.concurrency), "timeout_s": opts.endpoints.timeout}
                    if served else {})},
        results=results, wall_s=time.perf_counter() - t_start, pictures=pictures)
