"""`vitexport quantize`: resolve the model, convert, check against FP32 on held-out data, record in the manifest."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import __version__
from ..checkpoints import sha256_file
from ..compare import Thresholds, Verdict, compare, judge
from ..data import Dataset, labels_for_model, load_folder
from ..errors import ParityError, VitexportError
from ..manifest import preprocess_of, read_manifest, update_manifest
from ..paths import DIGITS_CALIB, DIGITS_HELDOUT, PHOTOS_CALIB, PHOTOS_HOLDOUT, atomic_path, shipped
from ..progress import QUIET, Log
from ..variants import DIGITS_VARIANT
from .convert import DEFAULT_KEEP_FP32, Int8Settings, convert_fp16, graph_precision, qdq_summary, quantize_int8

OUTPUT_NAMES = {"fp16": "model.fp16.onnx", "int8": "model.int8.onnx"}


@dataclass
class CalibOptions:
    data: Path | None = None  # images or .npy batches; default: the shipped set for the model
    samples: int | None = None  # None: all (shipped photos: 13; digits: 200)
    int8: Int8Settings = field(default_factory=Int8Settings)
    keep_fp32: tuple[str, ...] = DEFAULT_KEEP_FP32  # FP16 only
    check: bool = True
    check_data: Path | None = None  # held-out images for the parity check; default: the shipped held-out set
    thresholds: Thresholds | None = None


@dataclass
class PrecisionResult:
    precision: str
    onnx_path: Path
    verdict: Verdict | None
    cache_reused: bool | None
    calib_key: str | None


def default_calib_dir(manifest: dict) -> Path:
    return shipped(*(DIGITS_CALIB if manifest["variant"] == DIGITS_VARIANT else PHOTOS_CALIB))


def default_heldout_dir(manifest: dict) -> Path:
    return shipped(*(DIGITS_HELDOUT if manifest["variant"] == DIGITS_VARIANT else PHOTOS_HOLDOUT))


def resolve_model_dir(path: Path | None, log: Log = QUIET, spec=None, export: bool = True) -> tuple[Path, dict]:
    """A model folder or an FP32 ONNX path -> (folder, manifest).

    Without a path: the default folder of `spec` (default: the default model), exported first if absent.
    """
    if path is None:
        from ..export import ModelSpec, build_config, default_output_dir, run_export, spec_differences

        spec = spec or ModelSpec()
        folder = default_output_dir(spec, build_config(spec).img_size)
        if not (folder / "manifest.json").is_file() or not (folder / "model.onnx").is_file():
            if not export:
                raise VitexportError(f"No exported model at {folder}; run `vitexport onnx` first.")
            log.info(f"No exported model at {folder}: exporting {spec.variant} first.")
            run_export(spec, log=log)
        manifest = read_manifest(folder)
        diffs = spec_differences(spec, manifest)
        if diffs:
            raise VitexportError(f"{folder} holds another export ({'; '.join(diffs)}); re-export with "
                                 f"`vitexport onnx ... --force`, or use `--output` and pass that folder.")
        return folder, manifest
    path = Path(path)
    if not path.exists():
        raise VitexportError(f"{path} does not exist.")
    folder = path if path.is_dir() else path.parent
    manifest = read_manifest(path)
    if path.is_file() and path.name != manifest["onnx"]:
        prec = graph_precision(path)
        if prec != "fp32":
            raise VitexportError(f"{path} is already {prec.upper()}; convert from the FP32 model "
                                 f"{folder / manifest['onnx']}.")
        raise VitexportError(f"{path} is not the model the manifest in {folder} describes "
                             f"({manifest['onnx']}); pass the folder or that file.")
    if not (folder / manifest["onnx"]).is_file():
        raise VitexportError(f"The manifest in {folder} names {manifest['onnx']}, which is missing; re-export.")
    return folder, manifest


def calibration_key(fp32_sha: str, files: list[Path], root: Path, manifest: dict, settings: Int8Settings,
                    x: np.ndarray) -> str:
    """Content address of a calibration: model bytes, data bytes, preprocessing, method, version."""
    h = hashlib.sha256()
    payload = {
        "onnx": fp32_sha,
        "preprocess": manifest["preprocess"],
        "settings": settings.to_dict(),
        "vitexport": __version__,
    }
    h.update(json.dumps(payload, sort_keys=True).encode())
    for f in files:
        h.update(str(Path(f).relative_to(root) if Path(f).is_relative_to(root) else Path(f).name).encode())
        h.update(hashlib.sha256(Path(f).read_bytes()).digest())
    h.update(hashlib.sha256(np.ascontiguousarray(x).tobytes()).digest())  # what the calibrator actually saw
    return h.hexdigest()[:32]


def load_calibration(root: Path, manifest: dict, samples: int | None, log: Log) -> Dataset:
    if samples is not None and samples < 1:
        raise VitexportError("--calib-samples must be at least 1.")
    with log.step(f"Loading calibration data from {root}"):
        data = load_folder(Path(root), preprocess_of(manifest), limit=samples)
    if samples is not None and len(data) < samples:
        log.warn(f"Asked for {samples} calibration inputs, {root} has only {len(data)}: using {len(data)}.")
    log.info(f"{len(data)} calibration inputs")
    return data


def check_against_fp32(fp32: Path, candidate: Path, data: Dataset, precision: str, manifest: dict,
                       thresholds: Thresholds | None = None, log: Log = QUIET) -> Verdict:
    from ..backends.ort_session import create_session

    name, out = manifest["input_name"], manifest["output_name"]
    outs = []
    for p in (fp32, candidate):
        sess = create_session(p)
        outs.append(np.concatenate([sess.run([out], {name: data.x[i:i + 8]})[0] for i in range(0, len(data), 8)]))
    verdict = judge(compare(outs[0], outs[1], data.labels), precision, thresholds)
    s = verdict.stats
    acc = "" if s.acc is None else f", top-1 accuracy FP32 {s.acc_ref:.2%} vs {precision.upper()} {s.acc:.2%}"
    log.info(f"{precision.upper()} vs FP32 on {s.n} held-out inputs: max abs {s.max_abs:.3g}, mean abs "
             f"{s.mean_abs:.3g}, cosine min {s.cos_min:.5f} / mean {s.cos_mean:.5f}, top-1 agree "
             f"{s.top1_agree:.1%}, top-5 agree {s.top5_agree:.1%}{acc}")
    return verdict


def run_quantize(model: Path | None, precision: str, opts: CalibOptions | None = None,
                 log: Log = QUIET, spec=None) -> PrecisionResult:
    if precision not in OUTPUT_NAMES:
        raise VitexportError(f"Unknown precision {precision!r}: choose fp16 or int8.")
    opts = opts or CalibOptions()
    folder, manifest = resolve_model_dir(model, log, spec)
    fp32 = folder / manifest["onnx"]
    if graph_precision(fp32) != "fp32":
        raise VitexportError(f"{fp32} is already {graph_precision(fp32).upper()}; nothing to convert.")
    fp32_sha = sha256_file(fp32)
    if manifest.get("onnx_sha256") and manifest["onnx_sha256"] != fp32_sha:
        raise VitexportError(f"{fp32} changed since it was exported (sha256 differs from the manifest); re-export it.")
    if precision == "int8" and fp32.with_name(fp32.name + ".data").exists():
        raise VitexportError(f"{fp32} keeps its weights in external data (over 2 GB); INT8 calibration of such "
                             f"models is not supported yet (FP16 is).")
    out_path = folder / OUTPUT_NAMES[precision]
    key, reused = None, None
    record: dict = {"file": out_path.name, "source_sha256": fp32_sha}

    # held-out data first: a bad folder should fail before minutes of calibration
    held: Dataset | None = None
    if opts.check:
        held_dir = Path(opts.check_data) if opts.check_data else default_heldout_dir(manifest)
        calib_dir = Path(opts.data) if opts.data else default_calib_dir(manifest)
        if precision == "int8" and held_dir.resolve() == calib_dir.resolve():
            raise VitexportError("The check data is the calibration data; pass held-out images with --check-data.")
        held = load_folder(held_dir, preprocess_of(manifest))
        held.labels, why = labels_for_model(held, int(manifest["num_classes"]))
        if why:
            log.warn(f"Class folders of {held_dir} not used as labels: {why}.")

    staging_suffix = f".{precision}.onnx"
    with atomic_path(out_path, suffix=staging_suffix) as tmp:
        if precision == "fp16":
            with log.step(f"Converting to mixed FP16 (kept in FP32: {', '.join(opts.keep_fp32) or 'nothing'})"):
                convert_fp16(fp32, tmp, tuple(opts.keep_fp32))
            record.update({"keep_fp32": list(opts.keep_fp32)})
        else:
            calib_root = Path(opts.data) if opts.data else default_calib_dir(manifest)
            data = load_calibration(calib_root, manifest, opts.samples, log)
            key = calibration_key(fp32_sha, data.files, calib_root if calib_root.is_dir() else calib_root.parent,
                                  manifest, opts.int8, data.x)
            cache = folder / "calib-cache" / f"{key}.json"
            if cache.is_file():
                log.info(f"Reusing calibration cache {cache.name} (same model, data, preprocessing and method).")
            reused = _calibrate_and_quantize(fp32, tmp, data, manifest, opts.int8, cache, log)
            summary = qdq_summary(tmp)
            if summary["nonzero_zero_points"]:
                raise VitexportError("Quantization produced non-zero zero points, which TensorRT rejects.")
            record.update({"calibration": {"key": key, "method": opts.int8.method, "samples": len(data),
                                           "data": str(calib_root.resolve()), "requested_samples": opts.samples,
                                           **opts.int8.to_dict()}, "qdq": summary})
        verdict = None
        if held is not None:
            with log.step(f"Checking {precision.upper()} against FP32 on {len(held)} held-out inputs ({held.source})"):
                verdict = check_against_fp32(fp32, tmp, held, precision, manifest, opts.thresholds, log)
            record["check"] = {"data": held.source, "passed": verdict.passed, "failures": verdict.failures,
                               "thresholds": verdict.thresholds.to_dict(), **verdict.stats.to_dict()}
            if not verdict.passed:
                rejected = folder / f"model.{precision}.rejected.onnx"
                os.replace(tmp, rejected)
                raise ParityError(f"{precision.upper()} model failed the parity check ({'; '.join(verdict.failures)}); "
                                  f"kept it as {rejected} and left {out_path.name} unchanged.")
    record["sha256"] = sha256_file(out_path)
    update_manifest(folder, precisions={precision: record})
    return PrecisionResult(precision, out_path, verdict, reused, key)


def _calibrate_and_quantize(fp32: Path, dst: Path, data: Dataset, manifest: dict, settings: Int8Settings,
                            cache: Path, log: Log) -> bool:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if cache.is_file():
        with log.step("Quantizing with cached ranges"):
            return quantize_int8(fp32, dst, data.x, manifest["input_name"], settings, cache)
    with log.step(f"Calibrating ({settings.method}) and quantizing"):
        if log.quiet:
            return quantize_int8(fp32, dst, data.x, manifest["input_name"], settings, cache)
        with Progress(TextColumn("calibrating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      transient=True, console=_stderr_console()) as bar:
            task = bar.add_task("calib", total=len(data))
            return quantize_int8(fp32, dst, data.x, manifest["input_name"], settings, cache,
                                 tick=lambda n: bar.advance(task, n))


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


def prepare_precision(model_dir: Path, precision: str, calib: CalibOptions | None = None,
                      log: Log = QUIET) -> Path:
    """The ONNX for a precision: model.onnx for fp32; FP16/INT8 made now if missing or made from another model."""
    folder, manifest = resolve_model_dir(Path(model_dir), log)
    if precision == "fp32":
        return folder / manifest["onnx"]
    out = folder / OUTPUT_NAMES[precision]
    rec = manifest.get("precisions", {}).get(precision)
    if out.is_file() and rec and rec.get("source_sha256") == manifest.get("onnx_sha256") \
            and rec.get("sha256") == sha256_file(out):
        if calib is None or _made_with(rec, precision, calib, manifest):
            log.info(f"Using the existing {out.name}.")
            return out
        log.info(f"{out.name} was made with other options: making it again.")
    else:
        log.info(f"{out.name} is missing or was made from another model: making it now.")
    return run_quantize(folder, precision, calib, log).onnx_path


def _made_with(rec: dict, precision: str, calib: CalibOptions, manifest: dict) -> bool:
    """Whether an existing conversion record matches the options asked for now."""
    if precision == "fp16":
        return list(rec.get("keep_fp32", [])) == list(calib.keep_fp32)
    cal = rec.get("calibration") or {}
    data = Path(calib.data) if calib.data else default_calib_dir(manifest)
    wanted = {"data": str(data.resolve()), "requested_samples": calib.samples, **calib.int8.to_dict()}
    return all(cal.get(k) == v for k, v in wanted.items())
