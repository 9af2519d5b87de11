"""vitexport from Python: the steps the CLI runs, as functions returning results instead of printing them.

    import vitexport

    exported = vitexport.export("vit_base_patch16_224", img_size=384)
    int8 = vitexport.quantize(exported.folder, "int8")

Each function decides what the matching command decides, through the same code (`ensure.ensure_artifact`, the
spec and calibration options built by `model.spec.spec_for` and `precision.settings.calib_options`, which the CLI's
option groups call too). Bad input, a parity miss and a missing runtime raise `VitexportError` and its subclasses
(`ParityError`, `BackendUnavailable`), each carrying the one sentence the CLI prints; nothing here exits the
process. Progress is silent unless `progress` is given: it is called with each line the CLI would print on stderr
(warnings start with "warning: "). Nothing heavy (torch, onnxruntime) is imported until a function runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .errors import VitexportError

if TYPE_CHECKING:
    from .parity.compare import ParityStats
    from .progress import Log

Progress = Callable[[str], None]  # called with one line of progress (a warning starts with "warning: ")


@dataclass(frozen=True)
class Parity:
    """One comparison of a graph's outputs with its reference's, on the same inputs. status: 'pass', 'fail' (a
    bound missed) or 'inconclusive' (no bound missed, but one judged on a sample could not be decided on this many
    images: docs/PARITY.md)."""

    status: str
    images: int  # how many inputs were compared
    max_abs: float
    min_cosine: float
    mean_cosine: float
    top1_agree: float  # fraction of inputs whose top-1 matches the reference's

    @property
    def passed(self) -> bool:
        return self.status == "pass"


@dataclass(frozen=True)
class ExportResult:
    """What `export` wrote and how its check went: ONNX Runtime against PyTorch at each checked batch size."""

    folder: Path  # the model folder (manifest.json, model.onnx, and what later steps add)
    onnx: Path
    manifest: Path
    checks: list[Parity] = field(default_factory=list)  # one per checked batch (and size)
    notes: list[str] = field(default_factory=list)  # what the build said of the weights (missing, resized, ...)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)


@dataclass(frozen=True)
class QuantizeResult:
    """One graph `quantize` made (or found current), and its check against FP32 on held-out images."""

    kind: str  # 'fp16' | 'fp16-trt' | 'int8' | 'int8-trt' | 'fp8'
    onnx: Path
    made: bool  # False: the file in the folder was current and kept
    parity: Parity | None  # None: the check was skipped (check=False) or the file was kept


def _parity(stats: "ParityStats", status: str) -> Parity:
    return Parity(status=status, images=stats.n, max_abs=stats.max_abs, min_cosine=stats.cos_min,
                  mean_cosine=stats.cos_mean, top1_agree=stats.top1_agree)


def _log(progress: Progress | None) -> "Log":
    from .progress import Log

    class _Lines:  # a stream that hands each complete line to the callback
        def __init__(self, fn: Progress):
            self.fn, self.buf = fn, ""

        def write(self, text: str) -> int:
            self.buf += text
            *lines, self.buf = self.buf.split("\n")
            for line in lines:
                if line.strip():
                    self.fn(line)
            return len(text)

        def flush(self) -> None:
            pass

    return Log(quiet=progress is None, stream=_Lines(progress or (lambda line: None)))  # None: warnings too


def _model_ref(model: str | Path | None, checkpoint: str | Path | None) -> tuple[str | None, str | Path | None]:
    """`model` as the CLI's -m and -c: a name (ARCH, ARCH.TAG) is -m; an hf-hub: reference or an existing path is
    the checkpoint (its config names the model)."""
    if model is None:
        return None, checkpoint
    if not isinstance(model, (str, Path)):
        raise VitexportError(f"export() takes a model name, a folder or file, or an hf-hub: reference; got a "
                             f"{type(model).__module__}.{type(model).__qualname__} object.")
    text = str(model)
    if text.startswith("hf-hub:") or isinstance(model, Path) or Path(text).exists():
        if checkpoint is not None:
            raise VitexportError(f"{text} is a checkpoint already; give `checkpoint` with a model name only.")
        return None, text
    return text, checkpoint


def export(model: str | Path | None = None, *, checkpoint: str | Path | None = None,
           img_size: int | tuple[int, int] | None = None, num_classes: int | None = None,
           output: str | Path | None = None, dynamic_img_size: bool = False,
           img_size_range: tuple[tuple[int, int], tuple[int, int]] | None = None, outputs: str | None = None,
           pos_embed_interp: str | None = None, opset: int | None = None, atol: float | None = None,
           check_batches: tuple[int, ...] = (1, 3), force: bool = False,
           progress: Progress | None = None) -> ExportResult:
    """`vitexport onnx`: build the model, load its weights, export ONNX with a symbolic batch and check it against
    PyTorch in ONNX Runtime. `model`: a timm architecture or tagged name, an hf-hub: reference, or a checkpoint file
    or folder (its config names the model); None: the default model. `output`: the folder (default
    models/<variant>-<H>x<W>/). Raises ParityError when ONNX Runtime and PyTorch disagree."""
    from .ensure import ensure_artifact
    from .model.spec import ExportOptions, spec_for
    from .preflight import check_export

    name, ckpt = _model_ref(model, checkpoint)
    size = (img_size, img_size) if isinstance(img_size, int) else img_size
    spec = spec_for(name, ckpt, size, num_classes=num_classes, pos_embed_interp=pos_embed_interp,
                    dynamic_img_size=dynamic_img_size, img_size_range=img_size_range)
    opts = ExportOptions(check_batches=tuple(check_batches), force=force, outputs=outputs)
    if opset is not None:
        opts.opset = opset
    if atol is not None:
        opts.atol = atol
    check_export(spec, opts.check_batches)
    artifact = ensure_artifact(None if output is None else Path(output), "fp32", spec=spec, export_opts=opts,
                               fresh=True, log=_log(progress))
    result = artifact.export
    checks = [] if result is None else [_parity(c.stats, "pass" if c.passed else "fail") for c in result.checks]
    return ExportResult(folder=artifact.folder.path, onnx=artifact.path, manifest=artifact.folder.manifest_path,
                        checks=checks, notes=[] if result is None else list(result.notes))


def quantize(folder: str | Path, precision: str, *, target: str = "cpu", calib_data: str | Path | None = None,
             calib_samples: int | None = None, check: bool = True, check_data: str | Path | None = None,
             quantize_attention: bool | None = None, smoothquant: float | None = None,
             min_cos: float | None = None, max_drop: float | None = None,
             progress: Progress | None = None) -> list[QuantizeResult]:
    """`vitexport quantize --fp16 | --int8 | --fp8 [--target cpu|tensorrt|all]` on an exported folder (or its
    model.onnx): each graph made and checked against FP32 on held-out images, one result per graph. Raises
    ParityError when a graph misses its bounds (the file is not kept)."""
    from .ensure import ensure_artifact
    from .precision.settings import GRAPH_KINDS, calib_options, graph_kinds

    if precision not in GRAPH_KINDS:
        raise VitexportError(f"Unknown precision {precision!r}: choose one of {', '.join(GRAPH_KINDS)}.")
    if target not in GRAPH_KINDS[precision]:
        raise VitexportError(f"Unknown target {target!r}: choose one of {', '.join(GRAPH_KINDS[precision])}.")
    if precision == "fp16" and smoothquant is not None:
        raise VitexportError("smoothquant is for int8 and fp8.")
    calib = calib_options(calib_data=calib_data, calib_samples=calib_samples, quantize_attention=quantize_attention,
                          smoothquant=smoothquant, min_cos=min_cos, max_drop=max_drop, check_data=check_data,
                          no_check=not check)
    log, results = _log(progress), []
    for kind in graph_kinds(precision, target):
        artifact = ensure_artifact(Path(folder), kind, calib=calib, fresh=True, log=log)
        made = artifact.precision
        verdict = None if made is None else made.verdict
        results.append(QuantizeResult(kind=kind, onnx=artifact.path, made=artifact.made,
                                      parity=None if verdict is None else _parity(verdict.stats, verdict.status)))
    return results


@dataclass(frozen=True)
class BenchRow:
    """One row of a bench: a backend at one batch size (batch None: a graph checked for parity only, or a backend
    that did not run), with its latency and its parity against the PyTorch FP32 reference on every input."""

    name: str  # 'onnxruntime cpu int8'
    backend: str  # 'pytorch' | 'onnxruntime' | 'openvino' | 'tensorrt' | 'endpoint'
    precision: str
    device: str
    available: bool
    reason: str  # why it did not run ('' when it did)
    batch: int | None
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    throughput: float | None  # images per second
    parity: Parity | None
    top1: float | None  # top-1 accuracy on labelled data, else None
    verdict: str  # 'pass' | 'fail' | 'inconclusive' | 'unavailable'


@dataclass(frozen=True)
class BenchResult:
    """A finished bench: its rows, the report the CLI renders (`report`), and the same writers."""

    rows: list[BenchRow]
    report: object  # vitexport.benchmark.run.BenchReport
    passed: bool
    failures: list[str]

    def write(self, json: str | Path | None = None, markdown: str | Path | None = None,
              csv: str | Path | None = None, plot: str | Path | None = None) -> list[Path]:
        """The report files the CLI's --json/--markdown/--csv/--plot write; the paths written."""
        from .benchmark.outputs import write_outputs

        return write_outputs(self.report, json, markdown, csv, plot)  # type: ignore[arg-type]


def bench(folder: str | Path | None = None, *, model: str | None = None, data: str | Path | None = None,
          labels: tuple[str | Path, ...] = (), backends: tuple[str, ...] = (), batches: tuple[int, ...] | None = None,
          iterations: int | None = None, max_images: int | None = None, threads: int | None = None,
          strict: bool = False, prepare: bool = True, progress: Progress | None = None) -> BenchResult:
    """`vitexport bench`: every available backend on the same inputs, parity against PyTorch FP32 and latency.
    `folder`: an exported folder; None: the folder of `model` (default: the default model), exported and its
    FP16/INT8 graphs made first when missing (prepare=False: only what exists). `backends`: substrings of row
    names to keep. strict: a parity miss, an undecided bound or skipped data files raise ParityError (else they
    are in `failures`)."""
    from .benchmark.run import BenchOptions, outcome, prepare_bench, run_bench
    from .model.spec import spec_for
    from .preflight import check_bench

    if folder is not None and model is not None:
        raise VitexportError("Give a model folder or a model name, not both.")
    target = None if folder is None else Path(folder)
    spec = None if target is not None else spec_for(model)
    check_bench(target, spec, batches)
    opts = BenchOptions(data=None if data is None else Path(data), labels=tuple(Path(p) for p in labels),
                        backends=tuple(backends), batches=batches, iterations=iterations, max_images=max_images,
                        threads=threads, strict=strict)
    log = _log(progress)
    chosen = prepare_bench(target, spec, prepare=prepare, data=opts.data, log=log)
    report = run_bench(chosen, opts, log)
    error, warning = outcome(report, strict)
    if error is not None:
        raise error
    if warning:
        log.warn(warning)
    rows = []
    for r in report.results:
        parity = None if r.parity is None else _parity(r.parity.stats, r.parity.status)
        verdict = "unavailable" if not r.available else parity.status if parity is not None else "pass"
        top1 = None if r.parity is None else r.parity.stats.acc
        common = dict(name=r.name, backend=r.backend, precision=r.precision, device=r.device,
                      available=r.available, reason=r.reason, parity=parity, top1=top1, verdict=verdict)
        if not r.latency:  # parity only, or not run
            rows.append(BenchRow(batch=None, p50_ms=None, p90_ms=None, p99_ms=None, throughput=None,
                                 **common))  # type: ignore[arg-type]
        for lat in r.latency:
            rows.append(BenchRow(batch=lat.batch, p50_ms=lat.p50_ms, p90_ms=lat.p90_ms, p99_ms=lat.p99_ms,
                                 throughput=lat.throughput, **common))  # type: ignore[arg-type]
    return BenchResult(rows=rows, report=report, passed=report.passed, failures=report.failures())
