"""What the API's functions return: plain frozen dataclasses, and the two helpers every function uses (a
`Parity` from a check's statistics, the progress callback as the CLI's log)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from ..parity.compare import ParityStats
    from ..progress import Log

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
    # a model object's export: ONNX Runtime against the object's own forward, per checked batch
    object_checks: list[Parity] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in [*self.checks, *self.object_checks])


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
    from ..progress import Log

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
              csv: str | Path | None = None, plot: str | Path | None = None,
              html: str | Path | None = None) -> list[Path]:
        """The report files the CLI's --json/--markdown/--csv/--plot/--html write; the paths written."""
        from ..benchmark.outputs import write_outputs

        return write_outputs(self.report, json, markdown, csv, plot, html)  # type: ignore[arg-type]


@dataclass(frozen=True)
class OpenVinoResult:
    """An OpenVINO IR `openvino` wrote beside the export, and its check against FP32 on held-out images."""

    precision: str  # 'fp32' | 'fp16' | 'int8'
    xml: Path
    bin: Path
    parity: Parity | None  # None: the check was skipped (check=False)


@dataclass(frozen=True)
class TrtResult:
    """A TensorRT engine `trt` built, with its sidecar and the ONNX it was built from."""

    plan: Path
    sidecar: Path
    onnx: Path
    build_seconds: float
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TritonResult:
    """A Triton model repository entry `triton` wrote: REPO/NAME with config.pbtxt, 1/model.* and labels.txt."""

    folder: Path  # REPO/NAME
    name: str
    platform: str  # 'onnxruntime_onnx' | 'tensorrt_plan'
    max_batch_size: int
    config: str  # config.pbtxt's text


@dataclass(frozen=True)
class Prediction:
    """One image's top classes, best first: (class index, label, softmax probability)."""

    image: str  # as given (relative to the working directory when below it)
    top: list[tuple[int, str, float]]
