"""`bench`, `openvino`, `trt`, `triton` and `predict`: the steps that run, convert or serve an export."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import VitexportError
from .results import (BenchResult, BenchRow, OpenVinoResult, Prediction, Progress, TritonResult, TrtResult, _log,
                      _parity)

if TYPE_CHECKING:
    from ..model.spec import ModelSpec


def bench(folder: str | Path | None = None, *, model: str | None = None, data: str | Path | None = None,
          labels: tuple[str | Path, ...] = (), backends: tuple[str, ...] = (), batches: tuple[int, ...] | None = None,
          iterations: int | None = None, max_images: int | None = None, threads: int | None = None,
          strict: bool = False, prepare: bool = True, progress: Progress | None = None) -> BenchResult:
    """`vitexport bench`: every available backend on the same inputs, parity against PyTorch FP32 and latency.
    `folder`: an exported folder; None: the folder of `model` (default: the default model), exported and its
    FP16/INT8 graphs made first when missing (prepare=False: only what exists). `backends`: substrings of row
    names to keep. strict: a parity miss, an undecided bound or skipped data files raise ParityError (else they
    are in `failures`)."""
    from ..benchmark.run import BenchOptions, outcome, prepare_bench, run_bench
    from ..model.spec import spec_for
    from ..preflight import check_bench

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


def _target(folder: str | Path | None, model: str | None) -> tuple[Path | None, "ModelSpec | None"]:
    """An exported folder (or its model.onnx), or the default folder of `model` (exported first when absent)."""
    from ..model.spec import spec_for

    if folder is not None and model is not None:
        raise VitexportError("Give a model folder or a model name, not both.")
    return (Path(folder), None) if folder is not None else (None, spec_for(model))


def openvino(folder: str | Path | None = None, precision: str = "fp32", *, model: str | None = None,
             calib_data: str | Path | None = None, calib_samples: int | None = None, check: bool = True,
             check_data: str | Path | None = None, progress: Progress | None = None) -> OpenVinoResult:
    """`vitexport openvino --precision fp32|fp16|int8`: OpenVINO IR (model.openvino.<precision>.xml + .bin) beside
    the export, checked against FP32 on held-out images (int8: from the INT8 Q/DQ graph, made first when missing,
    with the calibration keywords). Raises ParityError when the IR misses its bounds."""
    from ..ensure import ensure_artifact
    from ..openvino_ir.convert import ir_kind
    from ..precision.settings import calib_options

    kind = ir_kind(precision)
    target, spec = _target(folder, model)
    calib = calib_options(calib_data=calib_data, calib_samples=calib_samples, check_data=check_data,
                          no_check=not check)
    made = ensure_artifact(target, kind, spec=spec, calib=calib, fresh=True, log=_log(progress)).precision
    assert made is not None  # a fresh IR is always made
    v = made.verdict
    return OpenVinoResult(precision=precision, xml=made.onnx_path, bin=made.onnx_path.with_suffix(".bin"),
                          parity=None if v is None else _parity(v.stats, v.status))


def trt(folder: str | Path | None = None, precision: str = "fp16", *, model: str | None = None,
        min_batch: int = 1, opt_batch: int = 8, max_batch: int = 32, workspace_gib: float | None = None,
        timing_cache: str | Path | None = None, opt_level: int | None = None,
        calib_data: str | Path | None = None, calib_samples: int | None = None, check: bool = True,
        check_data: str | Path | None = None, progress: Progress | None = None) -> TrtResult:
    """`vitexport trt --fp16 | --int8 | --fp8 | --fp32`: the precision's ONNX (made first when missing, with the
    calibration keywords), then model.<precision>.plan and its sidecar. Without TensorRT or a CUDA GPU the ONNX is
    still made, then BackendUnavailable is raised (exit codes 4 and 5 at the CLI)."""
    from ..ensure import build_plan
    from ..precision.settings import calib_options
    from ..tensorrt_engine.options import BuildOptions

    opts = BuildOptions(precision=precision, min_batch=min_batch, opt_batch=opt_batch, max_batch=max_batch,
                        workspace_gib=workspace_gib, timing_cache=None if timing_cache is None else Path(timing_cache),
                        opt_level=opt_level)
    target, spec = _target(folder, model)
    calib = calib_options(calib_data=calib_data, calib_samples=calib_samples, check_data=check_data,
                          no_check=not check)
    r = build_plan(target, opts, spec=spec, calib=calib, log=_log(progress))
    return TrtResult(plan=r.plan_path, sidecar=r.sidecar_path, onnx=r.onnx_path, build_seconds=r.build_seconds,
                     notes=list(r.notes))


def triton(folder: str | Path | None, repo: str | Path, *, model: str | None = None, precision: str = "fp32",
           format: str = "onnx", name: str | None = None, max_batch: int | None = None, instances: int = 1,
           force: bool = False, uint8_input: bool = False, progress: Progress | None = None) -> TritonResult:
    """`vitexport triton -o REPO`: a Triton model repository entry for the folder's model file of `precision`
    (made first when missing), as an ONNX (`format="onnx"`) or a TensorRT plan (`"plan"`)."""
    from ..deploy.triton import TritonOptions, write_triton
    from ..ensure import open_model

    opts = TritonOptions(precision=precision, format=format, name=name, max_batch=max_batch, instances=instances,
                         force=force, uint8_input=uint8_input)
    log = _log(progress)
    target, spec = _target(folder, model)
    r = write_triton(open_model(target, spec, log=log), repo, opts, log=log)
    return TritonResult(folder=r.folder.path, name=r.folder.path.name, platform=r.platform,
                        max_batch_size=r.max_batch_size, config=r.config_text)


def predict(folder: str | Path | None, images: str | Path | list[str | Path] | tuple[str | Path, ...], *,
            model: str | None = None, top_k: int = 5, backend: str = "onnxruntime", precision: str = "fp32",
            progress: Progress | None = None) -> list[Prediction]:
    """`vitexport predict`: the top-k classes of each image (files, or folders searched recursively) with the
    model's own preprocessing, on one backend ('onnxruntime', 'pytorch', 'openvino', 'tensorrt') and precision.
    For a large folder, the CLI's --jsonl streams instead of holding every result."""
    from ..deploy.predict import iter_predictions
    from ..ensure import open_model

    log = _log(progress)
    target, spec = _target(folder, model)
    paths = [images] if isinstance(images, (str, Path)) else list(images)
    if not paths:
        raise VitexportError("predict() needs at least one image or folder.")
    found = open_model(target, spec, log=log)
    return [Prediction(image=p.image, top=[(c.index, c.label, c.prob) for c in p.top])
            for p in iter_predictions(found, paths, backend=backend, precision=precision, top_k=top_k, log=log)]
