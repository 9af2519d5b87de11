"""INT8 from real images: choose the GEMMs, calibrate in bounded memory (cached by content), write the graph.

One calibration serves both INT8 files of a folder (the CPU one and the TensorRT-shaped one): they quantize the
same GEMM inputs, so the ranges are measured once, stored under calib-cache/<key>.json, and reused.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

import numpy as np

from ..version import __version__
from ..data.images import IMAGE_SUFFIXES, Skipped, list_files, list_images, normalise, select
from ..data.stream import decoded_crops, default_workers
from ..errors import VitexportError
from ..paths import sha256_file, write_text_atomic
from ..progress import QUIET, Log
from .calibrate import calibrate, calibration_batch
from .qdq import (
    CPU_WEIGHT_MAX,
    FP8,
    FP8_MAX,
    INT8,
    INT8_MAX,
    QFormat,
    trt_int8_invariants,
    write_qdq,
)
from .selection import GemmSelection, select_gemms
from .settings import weight_bits_here

CACHE_FORMAT = "vitexport-calibration/2"
CALIB_BATCH = 4  # images per calibration run: memory is two batches of activations, whatever the image count
INT8_KINDS = ("int8", "int8-trt")  # FP32 remainder for CPU runtimes | FP16 remainder shaped for TensorRT
QDQ_KINDS = (*INT8_KINDS, "fp8")  # the kinds made from a calibration (FP8: its own placement, precision/fp8.py)


@dataclass
class CalibrationSet:
    """The calibration inputs chosen from a folder (or .npy files), read lazily batch by batch."""

    root: Path
    files: list[Path]  # images, or .npy files
    count: int  # inputs (images, or rows of the .npy arrays)
    npy_rows: list[tuple[int, int]] | None = None  # (file index, row) per input, for .npy data
    skipped: Skipped = field(default_factory=Skipped)  # what listing and decoding left out, and why
    unreadable: int = 0  # chosen images that could not be decoded (the others are calibrated on)

    def batches(self, preprocess, batch: int = CALIB_BATCH) -> Iterator[np.ndarray]:
        """(B, 3, H, W) inputs, decoded only when asked for; an image that cannot be decoded is left out and
        noted in `skipped` (it never stops a calibration of the others)."""
        if self.npy_rows is None:
            # the decoding pool validation uses: its threads decode the next batches while this one runs
            for crops, _, errors in decoded_crops(self.files, preprocess, workers=default_workers(), chunk=batch):
                for e in errors:
                    self.skipped.add_error(e)
                self.unreadable += len(errors)
                if len(crops):
                    yield normalise(crops, preprocess)
            return
        arrays = [np.load(f, mmap_mode="r", allow_pickle=False) for f in self.files]
        for i in range(0, len(self.npy_rows), batch):
            rows = [arrays[f][r] for f, r in self.npy_rows[i:i + batch]]
            yield np.ascontiguousarray(np.stack(rows), dtype=np.float32)


def calibration_set(root: Path, preprocess, samples: int | None) -> CalibrationSet:
    """Choose `samples` inputs spread over the folder without reading any image (only what is used is read)."""
    root = Path(root)
    if samples is not None and samples < 1:
        raise VitexportError("--calib-samples must be at least 1.")
    if not root.exists():
        raise VitexportError(f"Calibration data {root} does not exist.")
    if root.is_file() and root.suffix == ".npy":
        return _npy_set(root.parent, [root], preprocess, samples)
    if not root.is_dir():
        raise VitexportError(f"{root} is neither a folder of images nor a .npy file.")
    skipped = Skipped()
    files = list_images(root, skipped)
    if files:
        chosen = select(files, samples)
        return CalibrationSet(root, chosen, len(chosen), skipped=skipped)
    npys = list_files(root, (".npy",), skipped)
    if npys:
        return _npy_set(root, npys, preprocess, samples)
    raise VitexportError(f"Calibration folder {root} holds no images ({', '.join(IMAGE_SUFFIXES)}) or .npy batches.")


def _npy_set(root: Path, files: list[Path], preprocess, samples: int | None) -> CalibrationSet:
    rows = []
    want = (3, *preprocess.input_size)
    for i, f in enumerate(files):
        try:
            a = np.load(f, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as e:
            raise VitexportError(f"Cannot read {f}: {str(e).strip() or e.__class__.__name__}.") from None
        if a.ndim != 4 or tuple(a.shape[1:]) != want:
            raise VitexportError(f"{f} has shape {a.shape}; expected (N, {want[0]}, {want[1]}, {want[2]}) "
                                 "preprocessed inputs.")
        rows += [(i, r) for r in range(a.shape[0])]
    chosen = select(rows, samples)
    return CalibrationSet(root, files, len(chosen), chosen)


def calibration_key(fp32_sha: str, data: CalibrationSet, preprocess: dict, settings: dict) -> str:
    """Content address of a calibration: model bytes, the chosen inputs' bytes, preprocessing, method, version."""
    h = hashlib.sha256()
    payload = {"onnx": fp32_sha, "preprocess": preprocess, "settings": settings, "format": CACHE_FORMAT,
               "vitexport": __version__, "rows": data.npy_rows}
    h.update(json.dumps(payload, sort_keys=True).encode())
    for f in data.files:
        rel = f.relative_to(data.root) if f.is_relative_to(data.root) else Path(f.name)
        h.update(os.fsencode(rel))  # bytes, not text: names need not be valid UTF-8
        try:
            h.update(bytes.fromhex(sha256_file(f)))
        except OSError as e:  # unreadable: calibration leaves it out, and says so
            h.update(f"unreadable:{e.errno}".encode())
    return h.hexdigest()[:32]


def read_cached_ranges(cache: Path, needed: list[str], log: Log = QUIET) -> tuple[dict[str, float], dict] | None:
    """(ranges, the cache's body) when the file is whole and covers `needed`; None (and a warning) when damaged."""
    if not cache.is_file():
        return None
    try:
        data = json.loads(cache.read_text())
        amax = data["amax"]
        ok = data.get("format") == CACHE_FORMAT and isinstance(amax, dict) and all(
            isinstance(amax.get(t), (int, float)) and math.isfinite(amax[t]) and amax[t] >= 0 for t in needed)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        log.warn(f"The calibration cache {cache.name} is damaged or incomplete: calibrating again.")
        return None
    return {t: float(amax[t]) for t in needed}, data


def write_cached_ranges(cache: Path, amax: dict[str, float], method: str, samples: int,
                        skipped: Skipped | None = None) -> None:
    body = {"format": CACHE_FORMAT, "method": method, "samples": samples, "amax": amax,
            "skipped": (skipped or Skipped()).to_dict(limit=100)}
    write_text_atomic(cache, json.dumps(body, indent=1, sort_keys=True) + "\n")


def placement_of(kind: str, settings) -> str:
    """Where the Q/DQ of `kind` go: 'fp8' (FP8's own, precision/fp8.py), or for the INT8 kinds 'vitexport' or
    'modelopt' (settings.placement, which only the TensorRT graph takes; the CPU graph is always vitexport's)."""
    if kind == "fp8":
        return "fp8"
    return settings.placement if kind == "int8-trt" else "vitexport"


def selection_for(fp32: Path, settings, kind: str = "int8") -> GemmSelection:
    """The GEMMs to quantize for these settings and kind, read from one load of the FP32 graph (its weights
    left on disk)."""
    from .graphs import read_graph

    model = read_graph(fp32)
    excluded = set(resolve_exclusions(model.graph, settings))
    placement = placement_of(kind, settings)
    if placement == "fp8":
        from .fp8 import fp8_selection

        return fp8_selection(model, excluded)
    if placement == "modelopt":
        from .placement import modelopt_selection

        return modelopt_selection(model, excluded)
    return select_gemms(model.graph, excluded, quantize_attention=settings.quantize_attention,
                        skip_matrix_vector=True)


def ranges(fp32: Path, data: CalibrationSet, preprocess, input_name: str, selection: GemmSelection, settings,
           cache: Path, log: Log) -> tuple[dict[str, float], bool, int]:
    """(tensor -> amax, reused, inputs used): from the cache when it is there and whole, else calibrated now and
    cached. Files that could not be used are said in a warning, from the cache too."""
    cached = read_cached_ranges(cache, selection.activations, log)
    if cached is not None:
        amax, body = cached
        log.info(f"Reusing calibration cache {cache.name} (same model, data, preprocessing and method).")
        skipped = body.get("skipped") if isinstance(body.get("skipped"), dict) else {}
        if skipped.get("count"):
            log.warn(f"The cached calibration left out {skipped['count']:,} file(s) of {data.root} that cannot be "
                     f"read ({', '.join(f'{n} {k}' for k, n in skipped.get('kinds', {}).items())}).")
        samples = body.get("samples")
        return amax, True, samples if isinstance(samples, int) else data.count
    with log.step(f"Calibrating ({settings.method}) on {data.count} inputs, {len(selection.activations)} tensors"):
        with log.bar("calibrating", data.count) as tick:
            try:
                from .graphs import read_graph

                model = read_graph(fp32)  # one read for the batch size, the session and the Q/DQ writer
                batch = calibration_batch(fp32, selection.activations, CALIB_BATCH, model=model)
                stats = calibrate(fp32, selection.activations, data.batches(preprocess, batch), input_name,
                                  settings.method, settings.percentile, tick=tick, model=model, inputs=data.count)
                del model
            except VitexportError:
                if data.unreadable and data.unreadable == data.count:
                    raise data.skipped.nothing_usable(data.count, str(data.root)) from None
                raise
    if data.skipped:
        log.warn(data.skipped.summary(str(data.root)) + f" Calibrated on the other {stats.samples:,}.")
    if stats.samples != data.count - data.unreadable:
        raise VitexportError(f"Calibration read {stats.samples} inputs, expected {data.count - data.unreadable}.")
    write_cached_ranges(cache, stats.amax, settings.method, stats.samples, data.skipped)
    return stats.amax, False, stats.samples


@dataclass(frozen=True)
class KindFormat:
    """How a Q/DQ kind is written: its remainder's float type, its weights' range and element type."""

    what: str  # named in messages
    fp16: bool  # FP16 remainder and scales (else FP32)
    weight_max: float  # the weights' range: [-weight_max, weight_max]
    fmt: QFormat


KIND_FORMATS = {"int8": KindFormat("INT8", False, CPU_WEIGHT_MAX, INT8),  # weight_max: cpu_weight_max's
                "int8-trt": KindFormat("TensorRT INT8", True, INT8_MAX, INT8),
                "fp8": KindFormat("FP8", True, FP8_MAX, FP8)}
WEIGHT_BITS = {7: CPU_WEIGHT_MAX, 8: INT8_MAX}  # `--weight-bits` -> the CPU graph's weight range


def cpu_weight_max(weight_bits: int | None = None) -> int:
    """The CPU graph's weight range made on this CPU for `--weight-bits` (settings.weight_bits_here)."""
    return WEIGHT_BITS[weight_bits_here(weight_bits)]


def kind_format(kind: str, weight_bits: int | None = None) -> KindFormat:
    """How `kind` is written; the CPU graph's weight range from `weight_bits` (cpu_weight_max)."""
    if kind not in KIND_FORMATS:
        raise VitexportError(f"Unknown INT8 kind {kind!r}; choose one of: {', '.join(QDQ_KINDS)}.")
    if kind == "int8":
        return replace(KIND_FORMATS[kind], weight_max=cpu_weight_max(weight_bits))
    return KIND_FORMATS[kind]


CHANNEL_FORMAT = "vitexport-channel-max/1"


def channel_maxima(fp32: Path, data: CalibrationSet, preprocess, input_name: str, tensors: list[str], cache: Path,
                   log: Log) -> dict[str, list[float]]:
    """Each tensor's largest |x| per channel over the calibration inputs (what SmoothQuant needs), cached in
    calib-cache like the ranges."""
    try:
        body = json.loads(cache.read_text()) if cache.is_file() else None
        got = body["max"] if body and body.get("format") == CHANNEL_FORMAT else None
        if isinstance(got, dict) and all(isinstance(got.get(t), list) and got[t] and all(
                isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in got[t]) for t in tensors):
            log.info(f"Reusing the per-channel maxima in {cache.name}.")
            return {t: [float(v) for v in got[t]] for t in tensors}
        if body is not None:
            log.warn(f"The calibration cache {cache.name} is damaged or incomplete: measuring again.")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        log.warn(f"The calibration cache {cache.name} is damaged or incomplete: measuring again.")
    with log.step(f"Measuring per-channel maxima of {len(tensors)} LayerNorm outputs on {data.count} inputs"):
        with log.bar("per-channel maxima", data.count) as tick:
            from .graphs import take_graph

            model = take_graph(fp32)  # SmoothQuant's maxima: the smoothed graph is calibrated and written next
            batch = calibration_batch(fp32, tensors, CALIB_BATCH, model=model)
            stats = calibrate(fp32, tensors, data.batches(preprocess, batch), input_name, tick=tick, per_channel=True,
                              model=model)
            del model
    write_text_atomic(cache, json.dumps({"format": CHANNEL_FORMAT, "samples": stats.samples, "max": stats.amax},
                                        sort_keys=True) + "\n")
    return stats.amax  # type: ignore[return-value]


def write_int8(kind: str, fp32: Path, dst: Path, selection: GemmSelection, amax: dict[str, float],
               keep_nodes: tuple[str, ...] = (), weight_bits: int | None = None) -> dict:
    """Write the Q/DQ graph of `kind` (an INT8 kind, or fp8) to dst (checked by onnx.checker), its FP16 remainder
    but `keep_nodes` (ranges.fp32_nodes), the CPU graph's weights of `weight_bits` (cpu_weight_max); returns its Q/DQ
    invariants."""
    f = kind_format(kind, weight_bits)
    model = write_qdq(fp32, dst, selection, amax, f.what, fp16=f.fp16, weight_max=f.weight_max, fmt=f.fmt,
                      keep_nodes=keep_nodes if f.fp16 else ())
    inv = trt_int8_invariants(model)  # the graph just written, not read back
    if inv["nonzero_zero_points"]:
        raise VitexportError("Quantization produced non-zero zero points, which TensorRT rejects.")
    inv["quantized_gemms"] = len(selection.nodes)
    inv["weight_max"] = f.weight_max  # the weights' range: [-max, max]
    return inv


# a dense model's head (model.dense: DPT's neck and depth head), named so by the export (exporter.to_onnx)
DENSE_HEAD_SCOPES = ("neck.", "head.")


def dense_head_nodes(graph) -> list[str]:
    """The convolutions of a dense model's head, left in float: OpenVINO's CPU plugin computes DPT's quantized neck
    convolutions wrongly (the same INT8 graph of a Depth Anything model: AbsRel 0.17 against the FP32 depth on
    OpenVINO, 0.018 on ONNX Runtime; 0.014 on both with the head in float, docs/PARITY.md), and the backbone's GEMMs
    are where a ViT's time goes."""
    return [n.name for n in graph.node if n.name.startswith(DENSE_HEAD_SCOPES)]


def resolve_exclusions(graph, settings) -> list[str]:
    """--exclude-node / --exclude-block as node names of the graph, and a dense head's nodes; an unknown name is one
    sentence."""
    names = [n.name for n in graph.node]
    out = []
    for name in settings.exclude_nodes:
        if name not in names:
            close = [n for n in names if name in n][:3]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise VitexportError(f"No node named {name!r} in the graph{hint}.")
        out.append(name)
    out += dense_head_nodes(graph)
    for b in settings.exclude_blocks:
        block = [n for n in names if n.startswith(f"blocks.{b}.") or n.startswith(f"blocks.{b}/")]
        if not block:
            raise VitexportError(f"The graph has no block {b}.")
        out += block
    return sorted(set(out))
