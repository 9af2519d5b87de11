"""One entry that makes sure an artifact exists: export if missing, prepare a precision if missing or stale.

Every command, the scripts and the GPU tests go through here, so the CLI only parses options and reports:

    ensure_artifact(target, "int8", calib=CalibOptions(...))   # -> Artifact(path=.../model.int8.onnx, ...)
    build_plan(target, BuildOptions(precision="fp16"))         # the ONNX it needs, then a TensorRT plan

`target` is a model folder, its FP32 ONNX file, a ModelFolder, or None (the default folder of `spec`, exported
first when absent). A new ONNX kind is made by one line in MAKERS (and one in folder.ARTIFACTS).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Union

from .artifacts.folder import IR_SOURCE, MANIFEST_NAME, PLAN_SOURCE, ModelFolder, artifact_kind
from .artifacts.verify import require
from .artifacts.workspace import reading, writing
from .errors import VitexportError
from .model.spec import ExportOptions, ModelSpec
from .aoti.make import AOTI_KINDS, make_package, package_stale_reason
from .openvino_ir.convert import ir_stale_reason, make_ir
from .precision.convert import graph_precision
from .precision.prepare import PrecisionResult, run_quantize
from .precision.currency import stale_reason as onnx_stale_reason
from .precision.settings import DEFAULT_KEEP_FP32, CalibOptions
from .preflight import check_op_types
from .progress import QUIET, Log
from .tensorrt_engine.compiler import BuildFn, TrtResult, run_trt
from .tensorrt_engine.options import BuildOptions

if TYPE_CHECKING:  # export imports torch: a command that exports nothing (quantize, bench's checks) never loads it
    from .exporter.run import ExportResult

Target = Union[Path, str, ModelFolder, None]
Maker = Callable[[ModelFolder, str, Union[CalibOptions, None], Log], PrecisionResult]

# ONNX kind -> the step that makes it from the FP32 export ('fp32' itself is the export)
MAKERS: dict[str, Maker] = {
    "fp16": run_quantize,
    "fp16-trt": run_quantize,
    "int8": run_quantize,
    "int8-trt": run_quantize,
    "fp8": run_quantize,
    **{kind: make_ir for kind in IR_SOURCE},  # OpenVINO IR, converted from the ONNX kind IR_SOURCE[kind]
    **{kind: make_package for kind in AOTI_KINDS},  # AOTInductor packages of the reference model
}
# kinds made from another ONNX kind than the export (made sure of first), and how their currency is judged
SOURCE_KIND: dict[str, str] = dict(IR_SOURCE)
STALE_REASON: dict[str, Callable[[ModelFolder, str, Union[CalibOptions, None]], Union[str, None]]] = {
    **{kind: ir_stale_reason for kind in IR_SOURCE}, **{kind: package_stale_reason for kind in AOTI_KINDS}}


def stale_reason(folder: ModelFolder, kind: str, calib: CalibOptions | None) -> str | None:
    """Why `kind` must be made (again), or None when the folder's file is current."""
    return STALE_REASON.get(kind, onnx_stale_reason)(folder, kind, calib)


@dataclass
class Artifact:
    kind: str  # a folder.ARTIFACTS kind: 'fp32', 'fp16', 'int8', ...
    path: Path  # the file, present and current
    folder: ModelFolder  # the model folder it lies in
    made: bool  # made (again) by this call; False: the file in the folder was current and kept
    export: ExportResult | None = None  # when this call exported
    precision: PrecisionResult | None = None  # when this call converted


def open_model(target: Target, spec: ModelSpec | None = None, *, export: bool = True, verify: bool = True,
               log: Log = QUIET) -> ModelFolder:
    """The model folder a user named (checked), or the default folder of `spec`, exported first when absent.

    verify: its FP32 export must be the bytes its manifest records (one sentence otherwise); bench passes False
    to report a wrong file in its table instead.
    """
    folder = _open(target, spec, export, log)[0]
    if verify:
        with reading(folder, log):  # not halfway through another run's export
            require(folder, "fp32")
    return folder


def use_artifact(target: Target, kind: str, *, spec: ModelSpec | None = None, log: Log = QUIET) -> Path:
    """An artifact that exists and verifies, for a command that only reads it (predict, triton, ...): never made
    here; one sentence saying what is wrong and what to run otherwise. kind: an ARTIFACTS kind or 'plan:<p>'."""
    folder = open_model(target, spec, export=False, log=log)
    with reading(folder, log):
        return require(folder, kind)


def ensure_artifact(target: Target, kind: str, *, spec: ModelSpec | None = None, calib: CalibOptions | None = None,
                    export_opts: ExportOptions | None = None, fresh: bool = False, export: bool = True,
                    log: Log = QUIET) -> Artifact:
    """Make sure `kind` exists in the model folder and is current; make it (and the export) when it is not.

    calib: the precision step's options; a file made with others is made again (None: any options will do).
    fresh: make it again even when current (`vitexport onnx` and `vitexport quantize` always do).
    export: False refuses to export a missing default model (`bench --no-prepare`).
    """
    artifact_kind(kind)  # an unknown kind fails before any work
    if kind == "fp32" and fresh:
        output = None if target is None else _path_of(target)
        from .exporter.run import run_export

        result = run_export(spec or ModelSpec(), output=output, opts=export_opts, log=log)
        return Artifact("fp32", result.onnx_path, result.folder, True, export=result)
    folder, exported = _open(target, spec, export, log)
    if kind in SOURCE_KIND:  # converted from another ONNX kind: that one is made sure of first
        ensure_artifact(folder, SOURCE_KIND[kind], calib=calib, log=log)
    maker = MAKERS.get(kind)
    if maker is None and kind != "fp32":
        raise VitexportError(f"No step makes {folder.onnx(kind).name} yet.")
    with reading(folder, log):  # a file being written by another run is waited for, never read half-made
        require(folder, "fp32")  # nothing is made from, or handed out as, an FP32 file its manifest does not describe
        reason = None if kind == "fp32" else "" if fresh else stale_reason(folder, kind, calib)
    if reason is None:
        if kind != "fp32":
            log.info(f"Using the existing {folder.onnx(kind).name}.")
        return Artifact(kind, folder.onnx(kind), folder, kind == "fp32" and exported is not None, export=exported)
    with writing(folder, log):  # one writer per folder: the lock is held from the last check to the record
        require(folder, "fp32")
        if not fresh and (reason := stale_reason(folder, kind, calib)) is None:  # made meanwhile by another run
            log.info(f"Using the existing {folder.onnx(kind).name}, just made by another run.")
            return Artifact(kind, folder.onnx(kind), folder, False, export=exported)
        if reason:
            log.info(reason)
        if calib is not None and kind == "fp16":  # the TensorRT-shaped FP16 graph keeps nothing in FP32
            named = tuple(op for op in calib.keep_fp32 if op not in DEFAULT_KEEP_FP32)  # defaults absent: no news
            check_op_types(named, folder.onnx(), "--keep-fp32", log)
        result = maker(folder, kind, calib, log)
    return Artifact(kind, result.onnx_path, folder, True, export=exported, precision=result)


def build_plan(target: Target, opts: BuildOptions, *, spec: ModelSpec | None = None,
               calib: CalibOptions | None = None, log: Log = QUIET,
               on_source: Callable[[str, Path], None] | None = None, build: BuildFn | None = None) -> TrtResult:
    """A TensorRT plan (+ sidecar) of `opts.precision`, after making sure of the ONNX it is built from.

    Options are checked before any work; the ONNX is made even where TensorRT is missing (exit 4/5 after).
    on_source(precision, path) is told which ONNX the plan is built from, once it exists.
    """
    opts.validate()
    folder = open_model(target, spec, log=log)

    def source(precision: str) -> Path:
        path = ensure_artifact(folder, PLAN_SOURCE[precision], calib=calib, log=log).path
        if on_source is not None:
            on_source(precision, path)
        return path

    with writing(folder, log):
        return run_trt(folder, opts, log, prepare_onnx=source, build=build)


# -- opening a folder ----------------------------------------------------------------------------------------

def _path_of(target: Path | str | ModelFolder) -> Path:
    """Where an export goes: a folder's FP32 ONNX (under the manifest's name), or the path as given."""
    return target.onnx() if isinstance(target, ModelFolder) else Path(target)


def _open(target: Target, spec: ModelSpec | None, export: bool, log: Log) -> tuple[ModelFolder, ExportResult | None]:
    if isinstance(target, ModelFolder):
        return target, None
    if target is None:
        return _open_default(spec or ModelSpec(), export, log)
    return _open_given(Path(target)), None


def _open_default(spec: ModelSpec, export: bool, log: Log) -> tuple[ModelFolder, ExportResult | None]:
    folder, result = spec.default_folder(), None
    if not folder.has_manifest() or not folder.onnx().is_file():
        if not export:
            raise VitexportError(f"No exported model at {folder.path}; run `vitexport onnx` first.")
        log.info(f"No exported model at {folder.path}: exporting {spec.variant} first.")
        from .exporter.run import run_export

        result = run_export(spec, log=log)
    diffs = spec.differences(folder.read_manifest())
    if diffs:
        raise VitexportError(f"{folder.path} holds another export ({'; '.join(diffs)}); re-export with "
                             f"`vitexport onnx ... --force`, or use `--output` and pass that folder.")
    return folder, result


def _open_given(path: Path) -> ModelFolder:
    """A model folder or its FP32 ONNX, as a user named it: one sentence for anything else."""
    if not path.exists():
        from .model.variants import missing_path_sentence

        raise VitexportError(missing_path_sentence(path))
    folder = ModelFolder.containing(path)
    if not folder.has_manifest():
        from .model.readers.hub import checkpoint_refusal

        raise VitexportError(checkpoint_refusal(path) or
                             f"{path} has no {MANIFEST_NAME} beside it; export it with 'vitexport onnx' first.")
    manifest = folder.read_manifest()
    if path.is_file() and path.name != manifest.onnx:
        prec = graph_precision(path)
        if prec != "fp32":
            raise VitexportError(f"{path} is already {prec.upper()}; convert from the FP32 model {folder.onnx()}.")
        raise VitexportError(f"{path} is not the model the manifest in {folder.path} describes ({manifest.onnx}); "
                             f"pass the folder or that file.")
    if not folder.onnx().is_file():
        raise VitexportError(f"The manifest in {folder.path} names {manifest.onnx}, which is missing; re-export.")
    return folder
