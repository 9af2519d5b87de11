"""Where shipped data and default artifacts live, and writing a file so that readers never see half of it."""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

_PKG_PARENT = Path(__file__).resolve().parents[1]
DIGITS_VARIANT = "vit_digits_patch4_32"  # the variant of the shipped digits checkpoint (model.variants)


def project_root() -> Path:
    """The source checkout when running from one (editable install), else the working directory."""
    if (_PKG_PARENT / "pyproject.toml").is_file() and (_PKG_PARENT / "calibration").is_dir():
        return _PKG_PARENT
    return Path.cwd()


def artifacts_dir() -> Path:
    """Default artifact folder: ./models (relative to where the command runs)."""
    return Path(os.environ.get("VITEXPORT_MODELS", "models"))


def shipped(*parts: str) -> Path:
    return project_root().joinpath(*parts)


DIGITS_CHECKPOINT = ("models", "digits", "vit_digits_patch4_32.safetensors")
DIGITS_HELDOUT = ("calibration", "digits", "heldout")
DIGITS_CALIB = ("calibration", "digits", "calib")
PHOTOS_CALIB = ("calibration", "photos", "calib")
PHOTOS_HOLDOUT = ("calibration", "photos", "holdout")


def shipped_checkpoint(variant: str) -> Path | None:
    """The trained weights shipped for a variant (the digits model), or None."""
    path = shipped(*DIGITS_CHECKPOINT)
    return path if variant == DIGITS_VARIANT and path.is_file() else None


def default_calib_dir(variant: str) -> Path:
    """Calibration images shipped for a variant: the digits' own, else the photos."""
    return shipped(*(DIGITS_CALIB if variant == DIGITS_VARIANT else PHOTOS_CALIB))


def default_heldout_dir(variant: str) -> Path:
    """Held-out evaluation images shipped for a variant (never used for calibration)."""
    return shipped(*(DIGITS_HELDOUT if variant == DIGITS_VARIANT else PHOTOS_HOLDOUT))


STAGING_MARK = "vx"  # hidden staging names carry '.vx<pid>-': a later run can tell a dead writer's leftovers
# errors of writing a file that say nothing about the program: the file system's limits and permissions
_WRITE_ERRNOS = {errno.EFBIG: "the file-size limit of this process (ulimit -f) was reached",
                 errno.ENOSPC: "no space is left on the device", errno.EDQUOT: "the disk quota is exceeded",
                 errno.EROFS: "the file system is read-only",
                 errno.EACCES: "permission denied (is the folder read-only or immutable?)",
                 errno.EPERM: "the operation is not permitted (is the folder immutable?)"}


def staging_prefix(name: str) -> str:
    """'.model.onnx.vx<pid>-': how this process names its temporaries for `name` (see workspace.find_debris)."""
    return f".{name}.{STAGING_MARK}{os.getpid()}-"


def write_reason(e: OSError) -> str:
    """Why a write failed, in words (no file name: the caller names the file the user knows)."""
    return _WRITE_ERRNOS.get(e.errno or 0) or (e.strerror or str(e)).rstrip(".")


def write_error(final: Path, e: OSError) -> "VitexportError":
    """One sentence about a failed write that names the file the user asked for, not a hidden temporary."""
    from .errors import VitexportError

    return VitexportError(f"Could not write {final}: {write_reason(e)}.")


def _is_write_failure(e: OSError, paths: tuple[Path, ...]) -> bool:
    named = e.filename is not None and os.fspath(e.filename) in {os.fspath(p) for p in paths}
    return named or (e.errno in _WRITE_ERRNOS and e.errno not in (errno.EACCES, errno.EPERM) and e.filename is None)


@contextmanager
def atomic_path(final: Path, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside `final`; rename it into place only if the block succeeds.

    The temporary's name is unique to this process and says whose it is (staging_prefix). A write that fails
    for a reason of the file system (full disk, file-size limit, read-only or immutable folder) is one
    sentence naming `final`.
    """
    final = Path(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=staging_prefix(final.name), suffix=suffix or ".tmp", dir=final.parent)
    except OSError as e:
        raise write_error(final, e) from None
    os.close(fd)
    tmp_path = Path(tmp)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_path, 0o666 & ~umask)  # mkstemp makes 0600 files; final artifacts get the usual mode
    try:
        yield tmp_path
        os.replace(tmp_path, final)
    except OSError as e:
        if _is_write_failure(e, (tmp_path, final)):
            raise write_error(final, e) from e
        raise
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def display_path(p: Path | str) -> str:
    """A path as a person would type it here: relative to the working directory when below it."""
    p = Path(p)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def plain_name(name: object, what: str) -> str:
    """A file name a record in a model folder gives (a manifest's, a sidecar's), checked before anything is read
    or written through it: a plain name inside the folder, never a path that leaves it. A folder is input, and
    whoever wrote it wrote its records too."""
    from .errors import VitexportError

    ok = isinstance(name, str) and name not in ("", ".", "..") and not any(c in name for c in "/\\\0") \
        and not Path(name).is_absolute()
    if not ok:
        raise VitexportError(f"{what} names {name!r}, which is not a plain file name inside the model folder; "
                             f"vitexport reads and writes only inside it (re-export the model, or fix the record).")
    return str(name)
