"""What a model folder holds, each file verified, and what can go: the library side of `vitexport info [--clean]`.

Removable ("stale") files are the ones the next command would make again anyway: a derived ONNX or a plan that
does not verify (made from an earlier export, damaged, or described by no record), a sidecar without its plan,
and the leftovers of interrupted runs. The FP32 export and the manifest are never removed (a wrong FP32 export
is reported, with the command that replaces it); nor are calibration caches and rejected conversions, which are
kept on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import VitexportError
from ..paths import artifacts_dir
from ..progress import QUIET, Log
from .folder import ARTIFACTS, IR_SOURCE, PLAN_PRECISIONS, ModelFolder
from .manifest import Manifest
from .verify import BROKEN, MISSING, OK, STALE, UNRECORDED, FileCheck, check_folder
from .workspace import Debris, find_debris, reading, remove_debris, writing


@dataclass
class FolderStatus:
    folder: ModelFolder
    manifest: Manifest
    checks: list[FileCheck]  # every ONNX kind and plan, present or not
    orphans: list[Path] = field(default_factory=list)  # sidecars whose plan is gone
    rejected: list[Path] = field(default_factory=list)  # conversions that failed their parity check, kept
    caches: list[Path] = field(default_factory=list)  # calibration caches
    debris: list[Debris] = field(default_factory=list)  # leftovers of interrupted runs

    @property
    def present(self) -> list[FileCheck]:
        return [c for c in self.checks if c.status != MISSING]

    @property
    def failed(self) -> list[FileCheck]:
        """Present files that must not be used."""
        return [c for c in self.checks if c.status in (BROKEN, UNRECORDED, STALE)]

    def removable(self) -> list[Path]:
        """What `--clean` removes: derived files that do not verify (and their sidecars), orphan sidecars, and the
        leftovers of runs that are no longer alive. Never the FP32 export."""
        files: list[Path] = []
        for c in self.failed:
            if c.kind == "fp32":
                continue
            files.append(c.path)
            if c.kind.startswith("plan:"):
                files.append(self.folder.sidecar(c.kind.split(":", 1)[1]))
            if c.kind in IR_SOURCE:  # an OpenVINO IR's .bin goes with its .xml
                files.append(self.folder.ir_weights(c.kind))
        files += self.orphans + [d.path for d in self.debris if not d.alive]
        return [p for p in dict.fromkeys(files) if p.exists()]


def folder_status(folder: ModelFolder) -> FolderStatus:
    """The folder's manifest and every file checked against it (one sentence when the manifest cannot be read)."""
    if not folder.path.is_dir():
        raise VitexportError(f"{folder.path} is not a folder.")
    with reading(folder) as debris:  # not halfway through another run's write
        manifest = folder.read_manifest()
        checks = check_folder(folder, manifest)
        orphans = [folder.sidecar(p) for p in PLAN_PRECISIONS
                   if folder.sidecar(p).is_file() and not folder.plan(p).is_file()]
        orphans += [folder.ir_weights(k) for k in IR_SOURCE  # an IR's .bin without its .xml
                    if folder.ir_weights(k).is_file() and not folder.onnx(k).is_file()]
    rejected = [folder.rejected(k) for k in ARTIFACTS if k != "fp32" and folder.rejected(k).is_file()]
    caches = sorted(folder.calib_cache_dir.glob("*.json")) if folder.calib_cache_dir.is_dir() else []
    return FolderStatus(folder, manifest, checks, orphans, rejected, caches, debris)


def model_folders(root: Path | None = None) -> list[ModelFolder]:
    """Every model folder under the artifact folder (models/, $VITEXPORT_MODELS): those with a manifest."""
    root = Path(root) if root is not None else artifacts_dir()
    if not root.is_dir():
        return []
    return [ModelFolder(p) for p in sorted(root.iterdir()) if p.is_dir() and ModelFolder(p).has_manifest()]


def clean(folder: ModelFolder, log: Log = QUIET) -> list[Path]:
    """Remove what `FolderStatus.removable` lists, and the manifest records of removed ONNX files; the paths removed."""
    leftovers = [d.path for d in find_debris(folder) if not d.alive]
    with writing(folder, log):  # removes dead runs' leftovers first, under the lock
        status = folder_status(folder)
        removed = [p for p in leftovers if not p.exists()]
        for path in status.removable():
            path.unlink(missing_ok=True)
            removed.append(path)
        gone = [c.kind for c in status.failed if c.path in removed and c.kind in status.manifest.precisions]
        if gone:
            for kind in gone:
                del status.manifest.precisions[kind]
            folder.write_manifest(status.manifest)
    return removed


def summary(status: FolderStatus) -> str:
    """One line: what the folder holds and in what state ('fp32 ok, int8 ok, fp16 stale')."""
    parts = [f"{c.kind.replace('plan:', 'plan ')} {c.status}" for c in status.present]
    if status.debris:
        parts.append(f"{len(status.debris)} leftover(s)")
    m = status.manifest
    return f"{m.variant} {m.img_size[0]}x{m.img_size[1]}: {', '.join(parts) or 'no files'}"


__all__ = ["BROKEN", "MISSING", "OK", "STALE", "UNRECORDED", "FolderStatus", "clean", "folder_status",
           "model_folders", "remove_debris", "summary"]
