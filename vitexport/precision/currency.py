"""Whether a folder's FP16/INT8/FP8 ONNX is current: made from the FP32 export's present bytes, the file its record
describes, with the options asked for now."""

from __future__ import annotations

from pathlib import Path

from ..artifacts.folder import ModelFolder, artifact_kind
from ..artifacts.manifest import Manifest, PrecisionRecord
from ..artifacts.verify import BROKEN, MISSING, check_onnx
from ..paths import default_calib_dir
from .int8 import cpu_weight_max, placement_of
from .settings import CalibOptions


def stale_reason(folder: ModelFolder, kind: str, calib: CalibOptions | None) -> str | None:
    """Why the `kind` ONNX must be made (again), or None when the one in the folder is current.

    Current: the file exists, was made from the FP32 export's present bytes, is the file its record describes,
    and (when `calib` is given) was made with those options.
    """
    manifest = folder.read_manifest()
    out, rec = folder.onnx(kind), manifest.precisions.get(kind)
    check = check_onnx(folder, kind, manifest)  # the rules every command applies (an 8-bit CPU INT8 graph: stale)
    if rec is None or check.status in (MISSING, BROKEN) or rec.source_sha256 != manifest.onnx_sha256:
        return f"{out.name} is missing or was made from another model: making it now."
    if calib is not None and not _made_with(rec, kind, calib, manifest):
        return f"{out.name} was made with other options: making it again."
    if not check.ok:
        return f"{out.name} {check.reason}: making it again."
    return None


def _made_with(rec: PrecisionRecord, kind: str, calib: CalibOptions, manifest: Manifest) -> bool:
    """Whether an existing conversion record matches the options asked for now."""
    if kind == "fp16-trt":
        return not rec.keep_fp32  # the TensorRT-shaped graph keeps nothing in FP32, whatever --keep-fp32 says
    if artifact_kind(kind).precision == "fp16":
        return list(rec.keep_fp32 or []) == list(calib.keep_fp32)
    cal = rec.calibration
    if cal is None:
        return False
    if kind == "int8-trt" and (rec.qdq or {}).get("placement", "vitexport") != placement_of(kind, calib.int8):
        return False
    if kind == "int8" and (rec.qdq or {}).get("weight_max") != cpu_weight_max(calib.int8.weight_bits):
        return False
    data = Path(calib.data) if calib.data else default_calib_dir(manifest.variant)
    wanted = {"data": str(data.resolve()), "requested_samples": calib.samples, **calib.int8.to_dict(),
              "smoothquant": calib.int8.smoothquant}
    asked = wanted.pop("quantize_attention")  # the default (None) chose; otherwise it is what the file has
    have = cal.to_dict()
    attention_ok = cal.attention_auto if asked is None else (not cal.attention_auto and cal.quantize_attention == asked)
    return attention_ok and all(have.get(k) == v for k, v in wanted.items()) and \
        (cal.fallback or {}).get("target", {}) == calib.int8.target()
