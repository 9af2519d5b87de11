"""The precision step: the FP32 ONNX -> an FP16 or INT8 ONNX, checked against FP32 on held-out data, recorded
in the manifest. A conversion that fails its check is kept as model.<kind>.rejected.onnx and never replaces a
previous good file.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..artifacts.folder import ModelFolder, artifact_kind, onnx_digest
from ..artifacts.manifest import CalibrationRecord, HeldOutCheck, Manifest, PrecisionRecord
from ..artifacts.verify import digest
from ..backends.ort_session import interleaved_latency, optimization_for, session_options
from ..errors import ParityError, VitexportError
from ..model.labels import class_names
from ..model.spec import second_size
from ..parity.compare import DEFAULT_THRESHOLDS, ParityVerdict
from ..paths import atomic_path, default_calib_dir, default_heldout_dir, sha256_file
from ..progress import QUIET, Log
from ..validate.evaluate import ValidationSet, eval_batch, open_validation
from .attention import attention_attempts, without_attention
from .check import check_against_fp32, fp32_reference
from .convert import graph_precision
from .fp16 import write_fp16
from .graphs import let_go, read_graph, sharing
from .groups import without, without_nodes
from .int8 import (
    QDQ_KINDS,
    calibration_key,
    calibration_set,
    channel_maxima,
    kind_format,
    placement_of,
    ranges,
    selection_for,
    write_int8,
)
from .selection import GemmSelection
from .ranges import Kept, measured_keep, overflow_hint
from .sensitivity import Sensitivity, Simulator, Target, measure, search
from .settings import CalibOptions
from .smoothquant import smooth_sites, write_smoothed

FP16_KINDS = ("fp16", "fp16-trt")  # FP32 LayerNorm/Softmax for CPU runtimes | every op FP16, shaped for TensorRT
CONVERTERS = (*FP16_KINDS, *QDQ_KINDS)  # the ARTIFACTS kinds this step makes


@dataclass
class PrecisionResult:
    precision: str  # the kind made: 'fp16' | 'fp16-trt' | 'int8' | 'int8-trt' | 'fp8'
    onnx_path: Path  # where it is
    verdict: ParityVerdict | None  # its check against FP32 (None: skipped)
    cache_reused: bool | None  # INT8: the calibration cache was reused
    calib_key: str | None  # INT8: the calibration's content address


def _fp32_source(folder: ModelFolder, precision: str) -> tuple[Path, str, Manifest]:
    """(FP32 ONNX, its sha256, manifest), once it is known to be the FP32 export this precision can be made from."""
    if precision not in CONVERTERS:
        raise VitexportError(f"Unknown precision {precision!r}: choose one of {', '.join(CONVERTERS)}.")
    manifest = folder.read_manifest()
    fp32 = folder.onnx("fp32")
    if (found := graph_precision(fp32)) != "fp32":
        raise VitexportError(f"{fp32} is already {found.upper()}; nothing to convert.")
    fp32_sha = digest(fp32)  # hashed once a process, while the file is unchanged (the command checked it already)
    if manifest.onnx_sha256 and manifest.onnx_sha256 != fp32_sha:
        raise VitexportError(f"{fp32} changed since it was exported (sha256 differs from the manifest); re-export it.")
    return fp32, fp32_sha, manifest


def heldout_set(opts: CalibOptions, manifest: Manifest, precision: str, log: Log) -> ValidationSet | None:
    """The held-out data of the check, decoded first: a bad folder should fail before minutes of calibration."""
    if not opts.check:
        return None
    held_dir = Path(opts.check_data) if opts.check_data else default_heldout_dir(manifest.variant)
    calib_dir = Path(opts.data) if opts.data else default_calib_dir(manifest.variant)
    if precision in QDQ_KINDS and held_dir.resolve() == calib_dir.resolve():
        raise VitexportError("The check data is the calibration data; pass held-out images with --check-data.")
    return open_validation(held_dir, manifest.preprocess, manifest.num_classes, log=log, names=class_names(manifest),
                           label_files=opts.check_labels, dense=manifest.dense,
                           batch=eval_batch(manifest.config))


def run_quantize(model_dir: ModelFolder | Path, precision: str, opts: CalibOptions | None = None,
                 log: Log = QUIET) -> PrecisionResult:
    """Make the FP16 or INT8 ONNX of an exported model now, check it, record it; ParityError (exit 1) on a miss."""
    opts = opts or CalibOptions()
    folder = model_dir if isinstance(model_dir, ModelFolder) else ModelFolder(model_dir)
    with sharing():  # model.onnx parsed once for the steps that read it (graphs)
        fp32, fp32_sha, manifest = _fp32_source(folder, precision)
        out_path = folder.onnx(precision)
        record = PrecisionRecord(file=out_path.name, source_sha256=fp32_sha, onnxruntime=session_options(precision))
        held = heldout_set(opts, manifest, precision, log)
        try:
            return _make(folder, precision, fp32, fp32_sha, manifest, record, held, opts, log)
        finally:
            if held is not None:
                held.close()


def _make(folder: ModelFolder, precision: str, fp32: Path, fp32_sha: str, manifest: Manifest, record: PrecisionRecord,
          held: ValidationSet | None, opts: CalibOptions, log: Log) -> PrecisionResult:
    out_path = folder.onnx(precision)
    key, reused, verdict = None, None, None
    attempts = attention_attempts(precision, manifest, opts, held, log) if precision not in FP16_KINDS else [None]
    with atomic_path(out_path, suffix=".onnx") as tmp:
        for attempt, attention in enumerate(attempts):
            verdict, failures, key, reused = _make_once(folder, precision, fp32, fp32_sha, manifest, record, held,
                                                        opts, tmp, attention, len(attempts) > 1, log)
            if failures and attempt + 1 < len(attempts):
                log.info(f"With its attention products in INT8 the graph misses ({'; '.join(failures)}): writing it "
                         f"with them in FP32.")
                continue
            break
        if failures:
            rejected = folder.rejected(precision)
            os.replace(tmp, rejected)
            hint = overflow_hint(rejected, held, manifest.input_name) if "NaN/Inf" in str(failures) else ""
            hint += "" if precision not in QDQ_KINDS else (
                " To see which GEMMs cost the most, run `vitexport quantize` with --sensitivity; --min-cos C or "
                "--max-drop POINTS keeps the costliest in float until that holds, and --smoothquant moves "
                "LayerNorm outliers into the weights.")
            raise ParityError(f"{precision.upper()} model failed the parity check ({'; '.join(failures)}); "
                              f"kept it as {rejected} and left {out_path.name} unchanged.{hint}")
    record.sha256 = sha256_file(out_path)
    folder.record_precision(precision, record)
    return PrecisionResult(precision, out_path, verdict, reused, key)


def _make_once(folder: ModelFolder, precision: str, fp32: Path, fp32_sha: str, manifest: Manifest,
               record: PrecisionRecord, held: ValidationSet | None, opts: CalibOptions, tmp: Path,
               attention: bool | None, auto: bool, log: Log) -> tuple[ParityVerdict | None, list[str], str | None,
                                                                      bool | None]:
    """Write `precision` to tmp and check it: (verdict, the bounds it missed, calibration key, cache reused).
    attention: the CPU INT8 graph's attention products in INT8 or not (None: as opts say); auto: the default chose
    (the ranges are calibrated with the attention products' inputs either way, so a second attempt reuses them)."""
    key, reused, verdict, failures = None, None, None, []
    if precision in FP16_KINDS:
        bounds = write_fp16(precision, fp32, fp32_sha, tmp, manifest, opts, held, folder.calib_cache, record, log)
        opts = replace(opts, thresholds=bounds or opts.thresholds)
    else:
        key, reused, verdict = _quantize(folder, precision, fp32, fp32_sha, tmp, manifest, opts, record, held, log,
                                         attention, auto)
    if held is not None:
        if verdict is None:  # a fallback checked what it wrote already
            with log.step(f"Checking {precision.upper()} against FP32 on {len(held):,} held-out inputs "
                          f"({held.source})"):
                verdict = check_against_fp32(fp32, tmp, held, artifact_kind(precision).precision, manifest,
                                             opts.thresholds, log)
        record.check = HeldOutCheck.from_verdict(held.source, verdict)
        failures = list(verdict.failures)
        if not failures and manifest.img_size_range is not None:
            (h, w), second = _check_second_size(fp32, tmp, precision, manifest, opts, record, log)
            failures = [f"at {h}x{w}: {f}" for f in second.failures]
    return verdict, failures, key, reused


def _check_second_size(fp32: Path, candidate: Path, precision: str, manifest: Manifest, opts: CalibOptions,
                       record: PrecisionRecord, log: Log) -> tuple[tuple[int, int], ParityVerdict]:
    """A dynamic-size export's converted file checked again at a second size (spec.second_size): its ranges were
    calibrated at the default size, and the resampled position embedding runs in its precision too."""
    size = second_size(manifest.img_size, manifest.img_size_range)
    pp = replace(manifest.preprocess, input_size=tuple(size))
    held = heldout_set(opts, replace(manifest, preprocess=pp), precision, QUIET)
    assert held is not None
    try:
        with log.step(f"Checking {precision.upper()} against FP32 at {size[0]}x{size[1]} on {len(held):,} held-out "
                      f"inputs"):
            verdict = check_against_fp32(fp32, candidate, held, artifact_kind(precision).precision, manifest,
                                         opts.thresholds, log)
    finally:
        held.close()
    record.size_check = HeldOutCheck.from_verdict(held.source, verdict, size)
    return size, verdict


@dataclass
class Calibrated:
    """A kind's GEMMs and their ranges, ready to be written."""

    source: Path  # the FP32 graph the Q/DQ go into: model.onnx, or its smoothed copy (--smoothquant)
    selection: GemmSelection
    amax: dict[str, float]
    key: str
    reused: bool
    used: int  # calibration inputs used
    root: Path  # the calibration data
    skipped: int
    smoothed: dict[str, float] | None = None  # LayerNorm -> the largest SmoothQuant factor applied
    kept: list[Kept] = field(default_factory=list)  # nodes the FP16 remainder keeps in FP32 (ranges.fp32_nodes)

    @property
    def keep_nodes(self) -> tuple[str, ...]:
        return tuple(k.node for k in self.kept)


def _calibrated(folder: ModelFolder, kind: str, fp32: Path, fp32_sha: str, manifest: Manifest, opts: CalibOptions,
                scratch: Path, log: Log) -> Calibrated:
    """Choose the GEMMs, smooth them when asked (the smoothed FP32 copy goes in `scratch`), then calibrate in bounded
    memory or reuse the cached ranges. The ranges are shared by both INT8 kinds: the second one made reuses the
    cache. FP8 and ModelOpt's placement measure other tensors, so their keys and caches are their own."""
    calib_root = Path(opts.data) if opts.data else default_calib_dir(manifest.variant)
    data = calibration_set(calib_root, manifest.preprocess, opts.samples)
    if opts.samples is not None and data.count < opts.samples:
        log.warn(f"Asked for {opts.samples} calibration inputs, {calib_root} has only {data.count}: using "
                 f"{data.count}.")
    settings = opts.int8
    selection = selection_for(fp32, settings, kind)
    placement = placement_of(kind, settings)  # another placement measures other tensors: its own calibration
    keyed = {} if placement == "vitexport" else {"placement": placement}
    pp = manifest.preprocess.to_dict()
    source, smoothed, source_sha = fp32, None, fp32_sha
    if settings.smoothquant is not None:
        sites = smooth_sites(read_graph(fp32).graph, set(selection.nodes))
        if not sites:
            log.warn("No LayerNorm feeds quantized MatMuls of its own: --smoothquant changes nothing.")
        tensors = [site.tensor for site in sites]
        stats_key = calibration_key(fp32_sha, data, pp, {"per_channel": tensors})
        x_max = channel_maxima(fp32, data, manifest.preprocess, manifest.input_name, tensors,
                               folder.calib_cache(stats_key), log) if tensors else {}
        source = scratch / "smoothed.onnx"
        with log.step(f"Smoothing {len(sites)} LayerNorms and their GEMMs (alpha {settings.smoothquant:g})"):
            smoothed = write_smoothed(fp32, source, sites, x_max, settings.smoothquant)
            source_sha = onnx_digest(source)  # the ranges are the smoothed graph's: its bytes (and weights) key them
    with log.step(f"Hashing {data.count} calibration inputs for the cache key"):
        key = calibration_key(source_sha, data, pp, {**settings.to_dict(), **keyed})
    amax, reused, used = ranges(source, data, manifest.preprocess, manifest.input_name, selection, settings,
                                folder.calib_cache(key), log)
    kept: list[Kept] = []
    if kind_format(kind).fp16:  # the FP16 remainder: what its ranges keep in FP32, and those GEMMs unquantized
        let_go()  # the ranges of every tensor need the memory more than the writer needs the parse
        kept = measured_keep(source, source_sha, manifest, opts, folder.calib_cache, log)
        selection = without_nodes(selection, {k.node for k in kept})
    return Calibrated(source, selection, amax, key, reused, used, calib_root, data.count - used, smoothed, kept)


def _quantize(folder: ModelFolder, kind: str, fp32: Path, fp32_sha: str, dst: Path, manifest: Manifest,
              opts: CalibOptions, record: PrecisionRecord, held: ValidationSet | None, log: Log,
              attention: bool | None = None, auto: bool = False) -> tuple[str, bool, ParityVerdict | None]:
    """Calibrate (_calibrated), write the Q/DQ graph of `kind` to dst, fill the record's calibration fields; with a
    fallback target, first choose the groups kept in float (_fall_back, which checks what it writes: its verdict is
    returned, else None). attention, auto: as _make_once's."""
    asked = opts.int8.quantize_attention
    if attention is not None:  # what the ranges cover: both products' inputs when the default tries them
        opts = replace(opts, int8=replace(opts.int8, quantize_attention=True if auto else attention))
    settings = opts.int8
    if settings.target():
        _can_fall_back(held, settings.max_drop)
    with tempfile.TemporaryDirectory(prefix="vitexport-int8-") as scratch:
        cal = _calibrated(folder, kind, fp32, fp32_sha, manifest, opts, Path(scratch), log)
        if auto and not attention:  # the second attempt: the same ranges, the products left in FP32
            cal = replace(cal, selection=without_attention(cal.source, cal.selection))
        verdict, fallback = None, None
        if settings.target():
            let_go()  # the search reads its graphs its own way: the shared one would only hold memory
            verdict, fallback = _fall_back(folder, kind, fp32, cal, dst, held, manifest, opts, record, Path(scratch),
                                           log)
        else:
            with log.step(f"Writing {folder.onnx(kind).name} ({len(cal.selection.nodes)} "
                          f"{artifact_kind(kind).precision.upper()} GEMMs)"):
                record.qdq = write_int8(kind, cal.source, dst, cal.selection, cal.amax, cal.keep_nodes,
                                        settings.weight_bits)
    if kind == "int8-trt":
        record.qdq["placement"] = placement_of(kind, settings)
    if cal.smoothed is not None:
        record.qdq["smoothed_layernorms"] = len(cal.smoothed)
    if kind_format(kind).fp16:
        record.fp32_nodes = [k.to_dict() for k in cal.kept]
    s = settings.to_dict()
    written = bool(attention) if attention is not None else bool(settings.quantize_attention)
    record.calibration = CalibrationRecord(
        key=cal.key, method=settings.method, samples=cal.used, data=str(cal.root.resolve()),
        requested_samples=opts.samples, percentile=s["percentile"], quantize_attention=written,
        exclude_nodes=s["exclude_nodes"], exclude_blocks=s["exclude_blocks"], skipped=cal.skipped,
        smoothquant=settings.smoothquant, fallback=fallback, attention_auto=asked is None)
    return cal.key, cal.reused, verdict


def _can_fall_back(held: ValidationSet | None, max_drop: float | None = None) -> None:
    """What a fallback needs, said before minutes of calibrating and measuring."""
    if held is None:
        raise VitexportError("--min-cos and --max-drop choose what stays in float on held-out data: drop --no-check.")
    if max_drop is not None and held.labels is None:
        raise VitexportError(f"--max-drop needs labelled held-out data (class folders named as the model's classes); "
                             f"{held.source} has none: pass such a folder with --check-data, or use --min-cos.")


def _fall_back(folder: ModelFolder, kind: str, fp32: Path, cal: Calibrated, dst: Path, held: ValidationSet | None,
               manifest: Manifest, opts: CalibOptions, record: PrecisionRecord, scratch: Path,
               log: Log) -> tuple[ParityVerdict, dict]:
    """When every group quantized already meets the target, nothing more; else measure every group
    (sensitivity.measure) and return the costliest to float until the target holds. Then write the graph and check
    it with the target's bounds; a graph that misses where the switched graph met it (the real kernels' rounding)
    gets the next group in float too, until it holds. Returns (its verdict, the record's facts). Its temporaries (the
    FP32 outputs among them) go in `scratch`, removed with it."""
    settings, precision = opts.int8, artifact_kind(kind).precision
    assert held is not None  # _can_fall_back
    target = Target(settings.min_cos, settings.max_drop, opts.thresholds or DEFAULT_THRESHOLDS[precision],
                    settings.dense_target)
    bounds = target.thresholds()
    with log.step(f"FP32 reference on {len(held):,} held-out inputs"):
        store = fp32_reference(fp32, held, manifest, scratch, log)  # every pass and check is judged against it
    sim_args = (store, cal.source, cal.selection, cal.amax, kind, held, (manifest.input_name, manifest.output_name),
                scratch)
    sim = Simulator(*sim_args, log, settings.weight_bits)
    sens: Sensitivity | None = None
    try:
        groups = sim.groups
        everything, nothing = sim.run(set(range(len(groups))), "all groups"), sim.run(set(), "no group")
        strict = target.decidable(nothing.stats)
        if target.holds(everything.stats, strict):
            log.info(f"Every group quantized meets {target.describe()} on the held-out set: none to measure.")
            k = 0
        else:
            sens = measure(sim, kind, log, (everything, nothing))
            with log.step(f"Returning groups to float until {target.describe()}"):
                k = len(search(sim, sens, target, log=log).floated)
    finally:
        sim.close()
    while True:
        if k and sens is None:  # the written graph missed where the switched one met: now the ranking is needed
            sim = Simulator(*sim_args, log, settings.weight_bits)
            try:
                sens = measure(sim, kind, log)
            finally:
                sim.close()
        order = sens.ranked() if sens is not None else []
        floated = [groups[i] for i in order[:k]]
        chosen = without(cal.selection, floated)
        with log.step(f"Writing {folder.onnx(kind).name} ({len(chosen.nodes)} {precision.upper()} GEMMs, {k} "
                      f"groups in float)"):
            record.qdq = write_int8(kind, cal.source, dst, chosen, cal.amax, cal.keep_nodes, settings.weight_bits)
        with log.step(f"Checking {precision.upper()} against FP32 on {len(held):,} held-out inputs ({held.source})"):
            verdict = check_against_fp32(fp32, dst, held, precision, manifest, bounds, log, reference=store)
        if target.holds(verdict.stats, strict) or k == len(groups):
            break
        log.warn(f"The written graph misses {target.describe()} where the switched graph met it: one more group in "
                 f"float.")
        k += 1
    speed = _speed_cost(kind, cal, dst, scratch, held, log, settings.weight_bits) if floated else None
    names = [g.name for g in floated]
    emulated = "" if kind == "int8" else " (a CPU emulation of TensorRT's kernels: it says nothing of their speed)"
    log.info(f"Kept in float ({k} of {len(groups)} groups): {', '.join(names) or 'none'}"
             + (f"; ONNX Runtime CPU latency {speed['slowdown']:.2f}x all-{precision.upper()}'s{emulated}"
                if speed else ""))
    facts = {"target": target.to_dict(), "float_groups": names, "float_nodes": [n for g in floated for n in g.nodes],
             "groups": len(groups), "data": held.source,
             "status": "met" if target.met(verdict.stats) and target.decided(verdict.stats) else
             "inconclusive" if target.met(verdict.stats) else "missed"}
    return verdict, {**facts, **({"speed": speed} if speed else {})}


def _speed_cost(kind: str, cal: Calibrated, result: Path, scratch: Path, held: ValidationSet, log: Log,
                weight_bits: int | None) -> dict:
    """ONNX Runtime CPU latency (batch 1, medians of interleaved runs) of the result against the graph with every
    group quantized, written for the comparison and let go."""
    everything = scratch / "all-quantized.onnx"
    with log.step("Timing the result against every group quantized (ONNX Runtime CPU, batch 1)"):
        write_int8(kind, cal.source, everything, cal.selection, cal.amax, cal.keep_nodes, weight_bits)
        ms = interleaved_latency([result, everything], held.inputs.sample(1), optimization_for(
            artifact_kind(kind).precision))
        everything.unlink(missing_ok=True)
    return {"latency_ms": {"result": round(ms[0], 3), "all_quantized": round(ms[1], 3)},
            "slowdown": round(ms[0] / ms[1], 3), "batch": 1, "runtime": "onnxruntime-cpu"}


def run_sensitivity(model_dir: ModelFolder | Path, kind: str, opts: CalibOptions | None = None,
                    log: Log = QUIET) -> Sensitivity:
    """What each GEMM group of `kind` costs alone quantized, on the held-out data (sensitivity.measure), from the
    kind's calibration (the cache's when it is there). Writes no model."""
    opts = opts or CalibOptions()
    folder = model_dir if isinstance(model_dir, ModelFolder) else ModelFolder(model_dir)
    if kind not in QDQ_KINDS:
        raise VitexportError("--sensitivity measures the GEMMs of --int8 or --fp8.")
    fp32, fp32_sha, manifest = _fp32_source(folder, kind)
    held = heldout_set(opts, manifest, kind, log)
    if held is None:
        raise VitexportError("--sensitivity measures on held-out data: drop --no-check.")
    try:
        with tempfile.TemporaryDirectory(prefix="vitexport-int8-") as scratch:
            cal = _calibrated(folder, kind, fp32, fp32_sha, manifest, opts, Path(scratch), log)
            with log.step(f"FP32 reference on {len(held):,} held-out inputs"):
                store = fp32_reference(fp32, held, manifest, Path(scratch), log)  # removed with scratch
            sim = Simulator(store, cal.source, cal.selection, cal.amax, kind, held,
                            (manifest.input_name, manifest.output_name), Path(scratch), log, opts.int8.weight_bits)
            try:
                return measure(sim, kind, log)
            finally:
                sim.close()
    finally:
        held.close()
