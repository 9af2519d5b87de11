"""`vitexport aoti`: a folder's AOTInductor package (`model.aoti.<precision>.pt2`), made from the reference model the
manifest describes, checked and recorded like every other file of the folder.

    make_package(folder, "aoti-int8")   built (INT8: calibrated on `quantize --int8`'s images), its wrapper read
                                        for unfused linears (package.fusion_problem), run against the FP32 ONNX
                                        on the held-out images with the precision's bounds, then recorded

The package is written under a temporary name and renamed into place only once both checks passed; one that fails
is kept under the folder's rejected name and the previous package stays. Its record holds the package's facts
(what its wrapper calls), the float parts' arithmetic and, for INT8, the calibration data.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np

from ..artifacts.folder import ModelFolder
from ..artifacts.manifest import HeldOutCheck, PrecisionRecord
from ..artifacts.verify import BROKEN, MISSING, check_onnx, require
from ..backends.aoti_backend import AotiRunner
from ..errors import BackendUnavailable, ParityError, VitexportError
from ..parity.compare import describe
from ..paths import default_calib_dir, sha256_file, staging_prefix
from ..precision.check import judge_against_fp32
from ..precision.int8 import CALIB_BATCH, calibration_set
from ..precision.prepare import PrecisionResult, heldout_set
from ..precision.settings import CalibOptions
from ..progress import QUIET, Log
from .package import build_package, import_torchao_pt2e, float_parts, fusion_problem, package_facts

AOTI_KINDS = {"aoti-fp32": "fp32", "aoti-bf16": "bf16", "aoti-int8": "int8"}  # folder.ARTIFACTS kinds


def aoti_kind(precision: str) -> str:
    return f"aoti-{precision}"


def _calibration(folder: ModelFolder, calib: CalibOptions):
    manifest = folder.read_manifest()
    root = Path(calib.data) if calib.data else default_calib_dir(manifest.variant)
    return root, calibration_set(root, manifest.preprocess, calib.samples)


def make_package(folder: ModelFolder, kind: str, calib: CalibOptions | None = None, log: Log = QUIET,
                 freezing: bool = True) -> PrecisionResult:
    """Build, check and record the package `kind` ('aoti-fp32', 'aoti-bf16', 'aoti-int8'); ParityError (exit 1)
    when it misses its bounds or its linears are not what its precision says, the previous package untouched."""
    calib = calib or CalibOptions()
    precision, path = AOTI_KINDS[kind], folder.onnx(kind)
    if precision == "int8":
        try:
            import_torchao_pt2e()  # before any work
        except BackendUnavailable as e:
            raise VitexportError(f"{e}.") from None
    manifest = folder.read_manifest()
    if manifest.img_size_range is not None:
        raise VitexportError(f"{folder.path} holds a dynamic-size export; an AOTInductor package is compiled for one "
                             f"image size: export the size to serve (`vitexport onnx --img-size`) and package that.")
    fp32 = require(folder, "fp32", manifest)
    fp32_sha = manifest.onnx_sha256 or sha256_file(fp32)
    from ..exporter.torch_model import model_from_manifest  # torch: only when a package is made
    from ..model.outputs import WithOutputs

    model = model_from_manifest(manifest)
    model.set_fused_attn(True)  # scaled_dot_product_attention: Inductor's flash attention for CPU
    model = WithOutputs(model, (manifest.output_name,)).eval()
    data = _calibration(folder, calib) if precision == "int8" else None
    held = heldout_set(calib, manifest, "int8" if precision == "int8" else precision, log)
    fd, tmp_name = tempfile.mkstemp(prefix=staging_prefix(path.name), suffix=".pt2", dir=folder.path)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        batches = () if data is None else data[1].batches(manifest.preprocess, CALIB_BATCH)
        # the example the export traces with: two held-out images, or (--no-check) two of noise
        example = next(iter(held.inputs.batches(2, stop=2)))[1] if held is not None else \
            np.random.default_rng(0).standard_normal((2, 3, *manifest.img_size)).astype(np.float32)
        parts = float_parts(precision)
        t0 = time.perf_counter()
        with log.step(f"Compiling the {precision.upper()} AOTInductor package ({'PT2E INT8, ' if data else ''}"
                      f"float parts in {parts}, Inductor with freezing{'' if freezing else ' OFF'})"):
            linears = build_package(model, precision, example, tmp, batches, freezing=freezing)
        seconds = time.perf_counter() - t0
        facts = package_facts(tmp)
        problem = fusion_problem(facts, precision, linears)
        if precision == "int8":
            log.info(f"{facts.qlinear} of the {linears} linear layers the forward runs are fused INT8 kernels, "
                     f"{facts.unfused} plain matmuls.")
        verdict = None
        if problem is None and held is not None:
            runner = AotiRunner(tmp, precision)
            try:
                with runner:
                    verdict = judge_against_fp32(fp32, runner.infer_all, held, precision, manifest,
                                                 calib.thresholds, log)
            except BackendUnavailable as e:
                raise VitexportError(f"{e}.") from None
            log.info(f"{precision.upper()} package vs FP32 on {len(held):,} held-out inputs: "
                     f"{describe(verdict.stats)}")
        if problem is not None or (verdict is not None and verdict.failed):
            rejected = folder.rejected(kind)
            os.replace(tmp, rejected)
            why = problem or "; ".join(verdict.failures)  # type: ignore[union-attr]
            raise ParityError(f"The {precision.upper()} package failed its check ({why}); kept it as "
                              f"{rejected.name} and left {path.name} unchanged.")
        aoti = {"facts": facts.to_dict(), "linears": linears, "float_parts": parts, "compile_s": round(seconds, 1)}
        if data is not None:
            aoti["calibration"] = {"data": str(data[0].resolve()), "requested_samples": calib.samples,
                                   "samples": data[1].count}
        record = PrecisionRecord(file=path.name, source_sha256=fp32_sha, sha256=sha256_file(tmp),
                                 check=None if verdict is None else HeldOutCheck.from_verdict(held.source, verdict),
                                 extra={"aoti": aoti})
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        if held is not None:
            held.close()
    folder.record_precision(kind, record)
    log.info(f"Wrote {path.name} ({facts.bytes / 1e6:.1f} MB, compiled in {seconds:.0f} s).")
    return PrecisionResult(kind, path, verdict, None, None)


def package_stale_reason(folder: ModelFolder, kind: str, calib: CalibOptions | None) -> str | None:
    """Why the package `kind` must be made (again), or None when the folder's is current: made from the FP32
    export's present bytes, the file its record describes, and (INT8, when `calib` is given) from the same data."""
    manifest = folder.read_manifest()
    path, rec = folder.onnx(kind), manifest.precisions.get(kind)
    check = check_onnx(folder, kind, manifest)
    if rec is None or check.status in (MISSING, BROKEN) or rec.source_sha256 != manifest.onnx_sha256:
        return f"{path.name} is missing or was made from another model: making it now."
    if calib is not None and AOTI_KINDS[kind] == "int8":
        made = (rec.extra.get("aoti") or {}).get("calibration") or {}
        root = Path(calib.data) if calib.data else default_calib_dir(manifest.variant)
        if made.get("data") != str(root.resolve()) or made.get("requested_samples") != calib.samples:
            return f"{path.name} was calibrated on other data: making it again."
    if not check.ok:
        return f"{path.name} {check.reason}: making it again."
    return None
