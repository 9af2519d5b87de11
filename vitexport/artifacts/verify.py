"""Is each file of a model folder the file its records say it is? Digests against the manifest and the sidecars.

    check_onnx(folder, "int8")   # FileCheck(status='broken', reason='does not match its record in manifest.json ...')
    check_plan(folder, "fp16")   # the plan against its sidecar, and the sidecar against the ONNX it was built from
    require(folder, "fp32")      # the path, or one sentence saying what is wrong and what to run

Statuses: `ok`; `missing`; `broken` (present, but not the bytes its record describes: replaced, damaged, or a
file of another export); `stale` (its bytes are as recorded, but it was made from an earlier FP32 export or
ONNX); `unrecorded` (present, but no record describes it). Commands that read an artifact go through here
(ensure.open_model for the FP32 export, bench for everything it runs), so a wrong file is never used.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from .. import environment
from ..errors import VitexportError
from ..paths import sha256_file
from .folder import (
    ARTIFACTS,
    CPU_INT8_WEIGHT_MAX,
    CPU_INT8_WEIGHT_MAX_EXACT,
    MANIFEST_NAME,
    PLAN_PRECISIONS,
    ModelFolder,
    artifact_kind,
    external_data_problem,
    onnx_digest,
)
from .manifest import IrRecord, Manifest

OK, MISSING, BROKEN, STALE, UNRECORDED = "ok", "missing", "broken", "stale", "unrecorded"
PROBLEMS = (BROKEN, STALE, UNRECORDED)  # present and not to be used

_digests: dict[tuple, Future] = {}  # (path, inode, size, mtime) -> sha256: a file is read once per process
_digests_lock = threading.Lock()


def digest(path: Path, fold_external_data: bool = False) -> str:
    """sha256 of a file (with its external data folded in when asked), remembered while the file is unchanged; one
    being computed (prefetch_digest) is waited for, not computed twice."""
    st = os.stat(path)
    key = (str(Path(path).resolve()), st.st_ino, st.st_size, st.st_mtime_ns, fold_external_data)
    with _digests_lock:
        known = _digests.get(key)
        if known is None:
            known = _digests[key] = Future()
            mine = True
        else:
            mine = False
    if mine:
        try:
            known.set_result(onnx_digest(path) if fold_external_data else sha256_file(path))
        except BaseException as e:  # unreadable now: asked again, it is read again
            with _digests_lock:
                _digests.pop(key, None)
            known.set_exception(e)
            raise
    return known.result()


def prefetch_digest(path: Path) -> None:
    """Start hashing the regular file `path` on a thread of its own (hashlib and reads release the GIL), while the
    caller imports and reads; the digest() that asks for it waits for it. Never raises: that digest() says what is
    wrong."""

    def run() -> None:
        try:
            digest(path)
        except Exception:
            pass

    try:
        if Path(path).is_file():  # not a FIFO or a device, whose read would never end
            threading.Thread(target=run, name="vitexport-digest", daemon=True).start()
    except OSError:
        pass


_external: dict[tuple, str | None] = {}  # external_data_problem per file state, like _digests


def _external_data_problem(path: Path) -> str | None:
    if path.suffix != ".onnx":  # an OpenVINO IR's .xml: its .bin is checked by name and digest
        return None
    st = os.stat(path)
    key = (str(Path(path).resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _external:
        _external[key] = external_data_problem(path)
    return _external[key]


@dataclass(frozen=True)
class FileCheck:
    kind: str  # a folder.ARTIFACTS kind ('fp32', 'fp16', ...), 'plan:<precision>' or 'decoder'
    path: Path
    status: str  # OK | MISSING | BROKEN | STALE | UNRECORDED
    reason: str = ""  # why it is not ok, a phrase that follows the file name
    sha256: str | None = None  # its digest, when it was read
    remedy: str = ""  # what makes it right: a command

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def problem(self) -> bool:
        """Present, but not to be used."""
        return self.status in PROBLEMS

    def sentence(self) -> str:
        return f"{self.path} {self.reason}; {self.remedy}."


def _manifest(folder: ModelFolder, manifest: Manifest | None) -> Manifest:
    return manifest if manifest is not None else folder.read_manifest()


def check_onnx(folder: ModelFolder, kind: str, manifest: Manifest | None = None) -> FileCheck:
    """An ONNX kind of the folder against the manifest."""
    manifest = _manifest(folder, manifest)
    path = folder.onnx(kind)
    remedy = "re-export it with `vitexport onnx` (the same options), or restore the original file" \
        if kind == "fp32" else f"make it again with `{artifact_kind(kind).made_by}`"
    if not path.is_file():
        return FileCheck(kind, path, MISSING, "is missing", remedy=remedy)
    why = _external_data_problem(path)  # before any library loads the file (and while a prefetched digest is made)
    sha = digest(path)
    if why is not None:
        return FileCheck(kind, path, BROKEN, why, sha, remedy)
    if kind == "fp32":
        if not manifest.onnx_sha256:
            return FileCheck(kind, path, UNRECORDED, f"has no digest in {MANIFEST_NAME}", sha, remedy)
        if sha != manifest.onnx_sha256:
            return FileCheck(kind, path, BROKEN, f"does not match {MANIFEST_NAME} (its sha256 differs: it was "
                                                 f"replaced or damaged after the export)", sha, remedy)
        return FileCheck(kind, path, OK, sha256=sha)
    rec = manifest.precisions.get(kind)
    if rec is None:
        return FileCheck(kind, path, UNRECORDED, f"is not described by {MANIFEST_NAME} (not made by vitexport for "
                                                 f"this export, or its run was interrupted)", sha, remedy)
    if sha != rec.sha256:
        return FileCheck(kind, path, BROKEN, f"does not match its record in {MANIFEST_NAME} (its sha256 differs: "
                                             f"it was replaced or damaged after it was made)", sha, remedy)
    if rec.source_sha256 != manifest.onnx_sha256:
        return FileCheck(kind, path, STALE, f"was made from an earlier {manifest.onnx}", sha, remedy)
    if rec.openvino is not None:  # an OpenVINO IR: its .bin, and the ONNX it was converted from
        return _check_ir(folder, kind, rec.openvino, sha, remedy)
    weight_max = (rec.qdq or {}).get("weight_max")
    if kind == "int8" and weight_max not in (CPU_INT8_WEIGHT_MAX, CPU_INT8_WEIGHT_MAX_EXACT):
        return FileCheck(kind, path, STALE, "has 8-bit weights (made by an earlier vitexport), which saturate on "
                                            "CPUs without VNNI", sha, remedy)
    if kind == "int8" and weight_max == CPU_INT8_WEIGHT_MAX_EXACT and not environment.cpu_sums_int8_exactly():
        return FileCheck(kind, path, STALE, "has 8-bit weights, which this CPU (no VNNI or AMX) sums with "
                                            "saturation", sha, remedy)
    return FileCheck(kind, path, OK, sha256=sha)


def check_decoder(folder: ModelFolder, manifest: Manifest | None = None) -> FileCheck:
    """SAM's decoder graph (`decoder.onnx`) against the manifest's `decoder` record."""
    manifest = _manifest(folder, manifest)
    path, remedy = folder.decoder(), "re-export the model with `vitexport onnx` (the same options)"
    if manifest.decoder is None:
        return FileCheck("decoder", path, UNRECORDED, f"is not described by {MANIFEST_NAME} (the folder holds no "
                                                      f"Segment Anything model with its decoder)", remedy=remedy)
    if not path.is_file():
        return FileCheck("decoder", path, MISSING, "is missing", remedy=remedy)
    sha = digest(path)
    if sha != manifest.decoder.get("sha256"):
        return FileCheck("decoder", path, BROKEN, f"does not match its record in {MANIFEST_NAME} (its sha256 "
                                                  f"differs: it was replaced or damaged after the export)", sha, remedy)
    return FileCheck("decoder", path, OK, sha256=sha)


def _check_ir(folder: ModelFolder, kind: str, ir: IrRecord, sha: str, remedy: str) -> FileCheck:
    path, weights, source = folder.onnx(kind), folder.ir_weights(kind), folder.onnx(ir.source)
    if not weights.is_file():
        return FileCheck(kind, path, BROKEN, f"has lost its weights file {weights.name}", sha, remedy)
    if digest(weights) != ir.weights_sha256:
        return FileCheck(kind, path, BROKEN, f"comes with a {weights.name} that does not match its record in "
                                             f"{MANIFEST_NAME} (its sha256 differs)", sha, remedy)
    if not source.is_file() or digest(source, fold_external_data=True) != ir.source_sha256:
        return FileCheck(kind, path, STALE, f"was made from an earlier {source.name}", sha, remedy)
    return FileCheck(kind, path, OK, sha256=sha)


def check_plan(folder: ModelFolder, precision: str) -> FileCheck:
    """A TensorRT plan against its sidecar, and the sidecar against the ONNX it names as its source."""
    from .sidecar import read_sidecar, rebuild_command

    kind, path, sidecar_path = f"plan:{precision}", folder.plan(precision), folder.sidecar(precision)
    remedy = f"rebuild it with `{rebuild_command(precision, folder.path)}`"
    if not path.is_file():
        return FileCheck(kind, path, MISSING, "is missing", remedy=remedy)
    sha = digest(path)
    try:
        sidecar = read_sidecar(sidecar_path)
    except VitexportError:
        return FileCheck(kind, path, BROKEN, f"has no readable sidecar {sidecar_path.name}", sha, remedy)
    if sha != sidecar.get("plan_sha256"):
        return FileCheck(kind, path, BROKEN, f"is not the plan {sidecar_path.name} describes (its sha256 differs)",
                         sha, remedy)
    name = sidecar.get("source_onnx")
    source = folder.member(name, sidecar_path.name) if name else folder.plan_source(precision)
    recorded = sidecar.get("source_onnx_sha256")
    if recorded is not None and (not source.is_file() or digest(source, fold_external_data=True) != recorded):
        return FileCheck(kind, path, STALE, f"was built from an earlier {source.name}", sha, remedy)
    return FileCheck(kind, path, OK, sha256=sha)


def check_folder(folder: ModelFolder, manifest: Manifest | None = None) -> list[FileCheck]:
    """Every ONNX kind and plan the folder may hold, present or not, in table order."""
    manifest = _manifest(folder, manifest)
    return [check_onnx(folder, k, manifest) for k in ARTIFACTS] + [check_plan(folder, p) for p in PLAN_PRECISIONS]


def require(folder: ModelFolder, kind: str, manifest: Manifest | None = None) -> Path:
    """The file of `kind` ('fp32', 'fp16', ..., 'plan:<precision>', or SAM's 'decoder'), once it verifies; else one
    sentence."""
    check = check_plan(folder, kind.split(":", 1)[1]) if kind.startswith("plan:") else \
        check_decoder(folder, manifest) if kind == "decoder" else check_onnx(folder, kind, manifest)
    if not check.ok:
        raise VitexportError(check.sentence())
    return check.path
