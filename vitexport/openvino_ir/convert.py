"""OpenVINO IR (.xml + .bin) beside the ONNX, for deployment with OpenVINO's runtime or its model server.

    make_ir(folder, "openvino-int8")   the folder's INT8 ONNX -> its IR, checked against FP32, recorded
    verify_ir(xml_path)                an IR in a model folder: whole, made from this model, still in parity

An IR is converted from an ONNX kind the folder already holds (folder.IR_SOURCE): FP32 and FP16 from the FP32
export (FP16 stores the weights in FP16: `compress_to_fp16`), INT8 from the CPU INT8 Q/DQ graph. Both files are
written under temporary names and renamed into place only after the IR has passed its check against the FP32
ONNX (ONNX Runtime) on held-out images, with the parity thresholds of its precision; an IR that fails is kept
under the folder's rejected name. The manifest records the digests of both files and of the ONNX the IR was
made from, so an IR whose .bin is missing, cut short, or comes from another model is refused in one sentence.
"""

from __future__ import annotations

import errno
import os
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..artifacts.folder import IR_SOURCE, ModelFolder, artifact_kind, ir_weights_of, onnx_digest
from ..artifacts.manifest import HeldOutCheck, IrRecord, Manifest, PrecisionRecord
from ..artifacts.verify import check_onnx, require
from ..backends.openvino_backend import INSTALL_COMMAND, OpenVinoRunner, first_line, import_openvino
from ..backends.ort_session import create_session, session_infer
from ..errors import BackendUnavailable, ParityError, VitexportError
from ..model.posembed import antialiased_resizes
from ..model.labels import class_names
from ..model.spec import second_size
from ..parity.compare import ParityVerdict, Thresholds, describe, judge
from ..paths import default_heldout_dir, display_path, out_of_space, sha256_file, staging_prefix, write_error
from ..precision.prepare import PrecisionResult
from ..precision.settings import CalibOptions
from ..progress import QUIET, Log
from ..validate.evaluate import ValidationSet, eval_batch, evaluate, open_validation


def ir_kind(precision: str) -> str:
    """'int8' -> 'openvino-int8', the folder's name for that IR."""
    kind = f"openvino-{precision}"
    if kind not in IR_SOURCE:
        raise VitexportError(f"Unknown IR precision {precision!r}; choose one of: "
                             f"{', '.join(artifact_kind(k).precision for k in IR_SOURCE)}.")
    return kind


def _command(kind: str, folder: ModelFolder) -> str:
    return f"vitexport openvino {display_path(folder.path)} --precision {artifact_kind(kind).precision}"


# -- the files ----------------------------------------------------------------------------------------------

def check_ir_files(xml: Path) -> int:
    """One sentence (VitexportError) unless `xml` is an OpenVINO IR whose .bin is present and long enough for
    every constant the .xml points into. Returns the bytes the .xml needs from the .bin."""
    xml, weights = Path(xml), ir_weights_of(xml)
    if not xml.is_file():
        raise VitexportError(f"{xml} does not exist.")
    try:
        root = ET.parse(xml).getroot()
    except (ET.ParseError, OSError, UnicodeDecodeError) as e:
        raise VitexportError(f"{xml} is not an OpenVINO IR: it is not readable XML ({e.__class__.__name__}).") from None
    if root.tag != "net" or root.find("layers") is None:
        raise VitexportError(f"{xml} is not an OpenVINO IR (its root is <{root.tag}>, not <net> with <layers>).")
    needed = 0
    for data in root.iterfind("layers/layer[@type='Const']/data"):
        try:
            needed = max(needed, int(data.get("offset", 0)) + int(data.get("size", 0)))
        except ValueError:
            raise VitexportError(f"{xml} has a constant with an unreadable offset or size; it is damaged.") from None
    if needed and not weights.is_file():
        raise VitexportError(f"{xml.name} needs its weights file {weights.name}, which is missing from {xml.parent}.")
    have = weights.stat().st_size if weights.is_file() else 0
    if have < needed:
        raise VitexportError(f"{weights} is truncated: it has {have:,} bytes and {xml.name} needs {needed:,}.")
    return needed


def _openvino() -> Any:
    try:
        return import_openvino()
    except BackendUnavailable:
        # exit 3, as for every missing backend library (predict --backend openvino says the same)
        raise BackendUnavailable(f"OpenVINO is not installed; install it with `{INSTALL_COMMAND}`.") from None


def write_ir(onnx_path: Path, xml: Path, fp16_weights: bool, final: Path | None = None) -> str:
    """Convert an ONNX file and save it as `xml` + its .bin (a temporary for `final`); returns OpenVINO's version."""
    ov = _openvino()
    try:
        model = ov.convert_model(str(onnx_path))
    except Exception as e:  # OpenVINO's frontends raise RuntimeError / OpConversionFailure
        raise VitexportError(f"OpenVINO could not convert {Path(onnx_path).name}: {first_line(e)}") from None
    try:
        ov.save_model(model, str(xml), compress_to_fp16=fp16_weights)
    except Exception as e:  # its serializer's C++ stream fails without the system's reason ('iostream error')
        final = Path(final or xml)
        full = out_of_space(xml)
        for half in (xml, ir_weights_of(xml)):
            half.unlink(missing_ok=True)  # first: the space a full disk has left is said without them
        if full:
            raise write_error(final, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))) from None
        raise VitexportError(f"OpenVINO could not write {final} ({first_line(e)}); is {final.parent} writable, "
                             f"with room for the IR?") from None
    return str(ov.__version__)


def _publish(tmp_xml: Path, xml: Path) -> None:
    """Move a finished IR pair into place; the old .xml goes first, so no moment shows an .xml with another .bin."""
    xml.unlink(missing_ok=True)
    os.replace(ir_weights_of(tmp_xml), ir_weights_of(xml))
    os.replace(tmp_xml, xml)


# -- checking against FP32 ----------------------------------------------------------------------------------

def _heldout(calib: CalibOptions, manifest: Manifest, log: Log) -> ValidationSet | None:
    if not calib.check:
        return None
    root = Path(calib.check_data) if calib.check_data else default_heldout_dir(manifest.variant)
    return open_validation(root, manifest.preprocess, manifest.num_classes, log=log, names=class_names(manifest),
                           label_files=calib.check_labels, dense=manifest.dense,
                           batch=eval_batch(manifest.config))


def check_ir_against_fp32(fp32: Path, xml: Path, precision: str, manifest: Manifest, held: ValidationSet,
                          thresholds: Thresholds | None = None, log: Log = QUIET) -> ParityVerdict:
    """The IR on OpenVINO's CPU plugin against the FP32 ONNX on ONNX Runtime, batch by batch over the held-out set.

    The IR runs with the f32 inference precision: the check is of the file, not of a CPU's bf16 arithmetic."""
    reference = session_infer(create_session(fp32), manifest.input_name, manifest.output_name)
    runner = OpenVinoRunner(xml, precision, hint="f32", input_name=manifest.input_name,
                            output_name=manifest.output_name)
    try:
        with runner:
            ev = evaluate(runner.infer_all, held.inputs, held.truth, reference=reference,
                          label=f"checking the {precision} IR", log=log)
    except BackendUnavailable as e:
        raise VitexportError(f"{e}.") from None
    verdict = judge(ev.stats, precision, thresholds)
    log.info(f"OpenVINO {precision.upper()} IR vs FP32 on {len(held):,} held-out inputs: {describe(verdict.stats)}")
    for line in verdict.inconclusive:
        log.warn(f"The {precision.upper()} IR's check {line}.")
    return verdict


# -- making an IR (ensure.MAKERS) ---------------------------------------------------------------------------

def make_ir(folder: ModelFolder, kind: str, calib: CalibOptions | None = None, log: Log = QUIET) -> PrecisionResult:
    """Convert the folder's IR_SOURCE[kind] ONNX (present; ensure_artifact makes it current first) into the IR
    `kind`, check it against the FP32 ONNX, record it. ParityError (exit 1) on a miss, the previous IR untouched."""
    calib = calib or CalibOptions()
    source_kind = IR_SOURCE[kind]
    manifest, fp32, source, xml = folder.read_manifest(), folder.onnx("fp32"), folder.onnx(source_kind), folder.onnx(kind)
    if not source.is_file():
        raise VitexportError(f"{source} is missing; make it with `{artifact_kind(source_kind).made_by}` first.")
    fp32_sha = sha256_file(fp32)
    if manifest.onnx_sha256 and manifest.onnx_sha256 != fp32_sha:
        raise VitexportError(f"{fp32} changed since it was exported (sha256 differs from the manifest); re-export it.")
    _openvino()
    held = _heldout(calib, manifest, log)  # a bad data folder fails before the conversion
    try:
        return _convert(folder, kind, calib, manifest, fp32, fp32_sha, source, xml, held, log)
    finally:
        if held is not None:
            held.close()


def _convert(folder: ModelFolder, kind: str, calib: CalibOptions, manifest: Manifest, fp32: Path, fp32_sha: str,
             source: Path, xml: Path, held: ValidationSet | None, log: Log) -> PrecisionResult:
    precision, source_kind = artifact_kind(kind).precision, IR_SOURCE[kind]
    # named like every temporary of the folder (.<file>.vx<pid>-*), so a killed run's leftovers are recognised
    fd, tmp_name = tempfile.mkstemp(prefix=staging_prefix(xml.name), suffix=".xml", dir=folder.path)
    os.close(fd)
    tmp_xml = Path(tmp_name)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_xml, 0o666 & ~umask)  # mkstemp makes 0600 files; the IR gets the usual mode (a server reads it)
    try:
        fp16 = precision == "fp16"
        with log.step(f"Converting {source.name} to OpenVINO IR{' with FP16 weights' if fp16 else ''}"):
            version = write_ir(source, tmp_xml, fp16, final=xml)
        check_ir_files(tmp_xml)
        verdict = None
        if held is not None:
            with log.step(f"Checking the {precision.upper()} IR against FP32 on {len(held):,} held-out inputs"):
                verdict = check_ir_against_fp32(fp32, tmp_xml, precision, manifest, held, calib.thresholds, log)
            if verdict.failed:
                rejected = folder.rejected(kind)
                _publish(tmp_xml, rejected)
                raise ParityError(f"The {precision.upper()} IR failed the parity check ({'; '.join(verdict.failures)}); "
                                  f"kept it as {rejected.name} and left {xml.name} unchanged.")
        size_check = None
        if held is not None and manifest.img_size_range is not None:
            size_check = _check_second_size(folder, kind, fp32, tmp_xml, xml, manifest, calib, log)
        tmp_bin = ir_weights_of(tmp_xml)
        record = PrecisionRecord(
            file=xml.name, source_sha256=fp32_sha, sha256=sha256_file(tmp_xml),
            check=None if verdict is None else HeldOutCheck.from_verdict(held.source, verdict), size_check=size_check,
            openvino=IrRecord(ir_weights_of(xml).name, sha256_file(tmp_bin), tmp_bin.stat().st_size, source_kind,
                              onnx_digest(source), fp16, version))
        _publish(tmp_xml, xml)
    finally:
        for tmp in (tmp_xml, ir_weights_of(tmp_xml)):
            tmp.unlink(missing_ok=True)
    folder.record_precision(kind, record)
    return PrecisionResult(kind, xml, verdict, None, None)


def _check_second_size(folder: ModelFolder, kind: str, fp32: Path, tmp_xml: Path, xml: Path, manifest: Manifest,
                       calib: CalibOptions, log: Log) -> HeldOutCheck:
    """A dynamic-size export's IR checked again at a second size (model.spec.second_size): OpenVINO resamples the
    position embedding itself there."""
    precision = artifact_kind(kind).precision
    size = second_size(manifest.img_size, manifest.img_size_range)
    held = _heldout(calib, replace(manifest, preprocess=replace(manifest.preprocess, input_size=tuple(size))), QUIET)
    assert held is not None
    try:
        with log.step(f"Checking the {precision.upper()} IR against FP32 at {size[0]}x{size[1]}"):
            verdict = check_ir_against_fp32(fp32, tmp_xml, precision, manifest, held, calib.thresholds, log)
    finally:
        held.close()
    if verdict.failed:
        rejected = folder.rejected(kind)
        _publish(tmp_xml, rejected)
        hint = ""
        if antialiased_resizes(fp32):
            hint = (" OpenVINO's antialiased bicubic resampling differs from PyTorch's; an export with "
                    "--pos-embed-interp bicubic (or bilinear) converts exactly.")
        raise ParityError(f"The {precision.upper()} IR failed the parity check at {size[0]}x{size[1]} "
                          f"({'; '.join(verdict.failures)}); kept it as {rejected.name} and left {xml.name} "
                          f"unchanged.{hint}")
    return HeldOutCheck.from_verdict(held.source, verdict, size)


# -- whether an IR in the folder is the one recorded --------------------------------------------------------

def ir_problem(folder: ModelFolder, kind: str, manifest: Manifest) -> str | None:
    """Why the folder's IR `kind` cannot be used as it is (a phrase without its remedy), or None: both files
    whole (check_ir_files), the very files the manifest records, made from the current export and ONNX."""
    xml = folder.onnx(kind)
    if kind not in manifest.precisions:
        return f"{xml.name} is not recorded in the manifest of {display_path(folder.path)}"
    try:
        check_ir_files(xml)
    except VitexportError as e:
        return str(e).rstrip(".")
    check = check_onnx(folder, kind, manifest)
    return None if check.ok else f"{xml.name} {check.reason}"


def ir_stale_reason(folder: ModelFolder, kind: str, calib: CalibOptions | None = None) -> str | None:
    """ensure_artifact's question for an IR kind: why it must be made (again), or None when it is current."""
    problem = ir_problem(folder, kind, folder.read_manifest())
    return None if problem is None else f"{problem}: making it now."


def verify_ir(xml: Path, precision: str | None = None, calib: CalibOptions | None = None,
              log: Log = QUIET) -> PrecisionResult:
    """An IR a user names, before it is deployed: both files whole, the very files vitexport made from this
    folder's current model, and (unless calib.check is False) still in parity with the FP32 ONNX."""
    xml, calib = Path(xml), calib or CalibOptions()
    if xml.suffix != ".xml":
        raise VitexportError(f"{xml} is not an OpenVINO IR (.xml).")
    check_ir_files(xml)
    folder = ModelFolder(xml.parent)
    if not folder.has_manifest():
        raise VitexportError(f"{xml} has no manifest beside it, so vitexport cannot tell which model it is.")
    kind = next((k for k in IR_SOURCE if folder.onnx(k).name == xml.name), None)
    if kind is None:
        raise VitexportError(f"{xml.name} is not one of the IR files vitexport writes "
                             f"({', '.join(folder.onnx(k).name for k in IR_SOURCE)}).")
    if precision is not None and ir_kind(precision) != kind:
        raise VitexportError(f"{xml.name} is the {artifact_kind(kind).precision} IR, not {precision}.")
    manifest = folder.read_manifest()
    require(folder, "fp32", manifest)  # a replaced export first: remaking the IR cannot help until it is fixed
    problem = ir_problem(folder, kind, manifest)
    if problem is not None:
        raise VitexportError(f"{problem}; make it again with `{_command(kind, folder)}`.")
    verdict, held = None, _heldout(calib, manifest, log)
    if held is not None:
        prec = artifact_kind(kind).precision
        with held:
            verdict = check_ir_against_fp32(folder.onnx("fp32"), xml, prec, manifest, held, calib.thresholds, log)
        if verdict.failed:
            raise ParityError(f"{xml.name} misses the {prec.upper()} parity thresholds against FP32 "
                              f"({'; '.join(verdict.failures)}).")
    return PrecisionResult(kind, xml, verdict, None, None)
