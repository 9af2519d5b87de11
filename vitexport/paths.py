"""Where shipped data and default artifacts live, and writing a file so that readers never see half of it."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import tempfile
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from .errors import VitexportError

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
    """Data shipped with vitexport (`parts` as the checkout lays it out, e.g. calibration/photos/calib): inside the
    installed package when it came from a wheel (vitexport/shipped/, setup.py puts it there), else in the source
    checkout, from any working directory."""
    packaged = Path(str(resources.files(__package__).joinpath("shipped", *parts)))
    return packaged if packaged.exists() else project_root().joinpath(*parts)


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


_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # the sentence says which file system, and what it has left
FILE_SYSTEM_LIMITS = (errno.EFBIG, *_FULL_ERRNOS, errno.EROFS)  # the same for any file written there
OUT_OF_SPACE = 1 << 20  # bytes: a file system with less free is full (a write failed there for want of room)


def mount_point(path: Path | str) -> Path:
    """Where the file system holding `path` (or the nearest folder above it that exists) is mounted: the highest
    folder above it on the same device."""
    path = Path(path).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    device = path.stat().st_dev
    while path != path.parent and path.parent.stat().st_dev == device:
        path = path.parent
    return path


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def file_system_space(path: Path | str) -> str:
    """'the file system mounted at /data holds 12.3 MB free', for the file system holding `path` ('' when that
    cannot be told)."""
    try:
        mount = mount_point(path)
        return f"the file system mounted at {mount} holds {_size(shutil.disk_usage(mount).free)} free"
    except OSError:
        return ""


def out_of_space(path: Path | str) -> bool:
    """Whether the file system holding `path` is full (less than OUT_OF_SPACE free): what a write that failed
    without saying why (a library's own C++ stream) ran into there."""
    try:
        return shutil.disk_usage(mount_point(path)).free < OUT_OF_SPACE
    except OSError:
        return False


def write_reason(e: OSError, where: Path | str | None = None) -> str:
    """Why a write failed, in words (no file name: the caller names the file the user knows); a full disk or
    quota also says which file system holds `where` and what it has left."""
    why = _WRITE_ERRNOS.get(e.errno or 0) or (e.strerror or str(e)).rstrip(".")
    space = file_system_space(where) if where is not None and e.errno in _FULL_ERRNOS else ""
    return f"{why} ({space})" if space else why


def write_error(final: Path, e: OSError) -> "VitexportError":
    """One sentence about a failed write that names the file the user asked for, not a hidden temporary (and,
    when the disk is full, the file system)."""
    from .errors import VitexportError

    return VitexportError(f"Could not write {final}: {write_reason(e, Path(final).parent)}.")


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
            tmp_path.unlink(missing_ok=True)  # first: the space a full disk has left is said without it
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


def pyplot():
    """matplotlib.pyplot on the Agg backend, for the PNG plots (`bench --plot`, `quantize --sensitivity --plot`):
    the optional `plot` extra, imported only when a plot is asked for; one sentence when it is not installed."""
    from .errors import VitexportError

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise VitexportError("--plot needs matplotlib: pip install 'vitexport[plot]'.") from None
    return plt


def save_png(fig, path: Path, dpi: int = 120) -> None:
    """A matplotlib figure as a PNG at path, written through a temporary file, then closed."""
    with atomic_path(Path(path), suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=dpi)
    pyplot().close(fig)
