"""One writer per model folder at a time, readers that see a consistent folder, temporaries that stay inside the
folder, and the leftovers of a run that was killed.

    with writing(folder, log):   # every step that writes into a model folder (ensure, export, info --clean)
        ...
    with reading(folder, log):   # a step that checks files and then uses them (bench, predict, triton, checks)
        ...

- **The lock**: `.vitexport.lock` (filelock: an OS lock, released by the kernel when its holder dies). A second
  writer waits, saying who holds it (pid and command, from `.vitexport.owner`), and gives up after
  `lock_timeout()` seconds (`--lock-timeout`, `$VITEXPORT_LOCK_TIMEOUT`) with one sentence. Nested `writing` of the
  same folder in one process is free. Readers hold a shared flock on the same file while they check and use the
  files: they never wait for each other, a writer waits for them, and they wait for a writer.
- **Temporaries**: while the lock is held, `tempfile` (and so every library that asks it, e.g. ONNX Runtime's
  quantizer) makes its files in a hidden `.vx<pid>-tmp*` folder inside the model folder, removed on the way out.
- **Leftovers**: every temporary a step makes is named `.<file>.vx<pid>-*` (paths.atomic_path). A run that gets
  the lock removes those of processes that are no longer alive, and the older pid-less names (`.<file>.*`,
  `.export-*`, `.staging-*`); a run that only reads reports them (`vitexport info --clean` removes them).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import VitexportError
from ..paths import STAGING_MARK, write_reason, write_text_atomic
from ..progress import QUIET, Log
from .folder import LOCK_NAME, OWNER_NAME, ModelFolder

DEFAULT_LOCK_TIMEOUT = 1800.0  # seconds a writer waits for another one before it gives up
LOCK_TIMEOUT_ENV = "VITEXPORT_LOCK_TIMEOUT"
_PID_TAG = re.compile(rf"(?:^|\.){STAGING_MARK}(\d+)-")  # '.model.onnx.vx1234-ab12.onnx', '.vx1234-tmpab12'
_LEGACY_PREFIXES = (".export-", ".staging-", "vitexport-quant-", "ort.quant.")  # names of earlier versions

_timeout_override: float | None = None
_held: dict[str, "_Session"] = {}  # resolved folder path -> this process's session on it
_reading: dict[str, int] = {}  # resolved folder path -> the descriptor of this process's shared lock on it


def set_lock_timeout(seconds: float | None) -> None:
    """How long a writer waits for the lock of a busy folder (None: $VITEXPORT_LOCK_TIMEOUT, else the default)."""
    global _timeout_override
    _timeout_override = seconds


def lock_timeout() -> float:
    if _timeout_override is not None:
        return _timeout_override
    text = os.environ.get(LOCK_TIMEOUT_ENV)
    if not text:
        return DEFAULT_LOCK_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise VitexportError(f"${LOCK_TIMEOUT_ENV} is {text!r}; set it to a number of seconds (0 or more).")
    return value


# -- leftovers ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Debris:
    """A temporary file or folder a run left behind."""

    path: Path
    pid: int | None  # the process that made it (None: a name of an earlier version, which did not say)
    alive: bool  # that process still runs: its temporary may still be in use

    def describe(self) -> str:
        who = "an earlier version" if self.pid is None else f"pid {self.pid}" + (" (running)" if self.alive else "")
        return f"{self.path.name} (left by {who})"


def pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed child that nobody reaped yet is a zombie: gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _debris_of(path: Path, own: set[str]) -> Debris | None:
    name = path.name
    if name in (LOCK_NAME, OWNER_NAME):
        return None
    if name.startswith(".") and (m := _PID_TAG.search(name)):
        pid = int(m.group(1))
        return Debris(path, pid, pid_alive(pid))
    if name.startswith(_LEGACY_PREFIXES) or (name.startswith(".") and any(name.startswith(f".{n}.") for n in own)):
        return Debris(path, None, False)
    return None


def find_debris(folder: ModelFolder) -> list[Debris]:
    """Temporaries of runs in this folder (and its calibration cache) that did not finish, oldest name first."""
    own = folder.own_names()
    found = []
    for where in (folder.path, folder.calib_cache_dir):
        try:
            entries = sorted(where.iterdir())
        except OSError:  # absent or unreadable
            continue
        found += [d for p in entries if (d := _debris_of(p, own)) is not None]
    return found


def remove_debris(debris: list[Debris], log: Log = QUIET) -> list[Path]:
    """Remove the leftovers whose process is gone; the paths removed."""
    removed = []
    for d in debris:
        if d.alive:
            continue
        try:
            shutil.rmtree(d.path) if d.path.is_dir() and not d.path.is_symlink() else d.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warn(f"Could not remove {d.path}, a leftover of an interrupted run: {e.strerror or e}.")
            continue
        removed.append(d.path)
    if removed:
        names = ", ".join(p.name for p in removed[:3]) + (f" and {len(removed) - 3} more" if len(removed) > 3 else "")
        log.info(f"Removed {len(removed)} leftover(s) of an interrupted run in {removed[0].parent}: {names}.")
    return removed


# -- the lock -----------------------------------------------------------------------------------------------

@dataclass
class _Session:
    lock: object  # filelock.FileLock
    depth: int
    tmpdir: Path | None  # where tempfile makes its files meanwhile (None: the system's)
    saved: tuple[str | None, str | None]  # tempfile.tempdir and $TMPDIR before


def _owner(folder: ModelFolder) -> str:
    """'pid 1234 (vitexport quantize --int8, since 17:52:03)', or what can be said without the owner file."""
    try:
        data = json.loads(folder.owner_path.read_text())
        return f"pid {int(data['pid'])} ({data['command']}, since {data['since']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another vitexport run"


def _write_owner(folder: ModelFolder) -> None:
    """Say who holds the lock, for a run that waits; a folder that takes no new file says nothing (the step's own
    write then fails, naming the file the user asked for)."""
    argv = " ".join(sys.argv[1:])
    data = {"pid": os.getpid(), "command": f"vitexport {argv}".strip(), "since": time.strftime("%H:%M:%S")}
    try:
        write_text_atomic(folder.owner_path, json.dumps(data) + "\n")
    except VitexportError:
        pass


def _acquire(folder: ModelFolder, log: Log, required: bool = True):
    """The folder's lock, waited for; None when the lock file cannot be made and `required` is False."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(folder.lock_path))
    try:
        lock.acquire(timeout=0)
        return lock
    except Timeout:
        pass
    except OSError as e:
        if not required:
            return None
        raise VitexportError(f"Cannot write in {folder.path}: {write_reason(e, folder.path)}.") from None
    busy = f"being written by {_owner(folder)}" if folder.owner_path.exists() else \
        "in use by another vitexport run that reads it (bench, predict, a check)"
    timeout = _say_waiting(folder, busy, log)
    try:
        lock.acquire(timeout=timeout)
    except Timeout:
        raise _still_busy(folder, busy, timeout) from None
    return lock


def _say_waiting(folder: ModelFolder, busy: str, log: Log) -> float:
    """Warn that this run waits for the one holding the folder ('being written by pid ...'); the seconds it waits."""
    timeout = lock_timeout()
    log.warn(f"{folder.path} is {busy}; waiting for it to finish (at most {timeout:g} s, see --lock-timeout).")
    return timeout


def _still_busy(folder: ModelFolder, busy: str, timeout: float) -> VitexportError:
    return VitexportError(f"{folder.path} is still {busy} after {timeout:g} s; let that run finish (or stop it) and "
                          f"try again, or wait longer with --lock-timeout.")


def _private_tempdir(folder: ModelFolder) -> Path | None:
    """A hidden temporary folder inside the model folder (None where the folder takes no new entry); an absolute
    path, since libraries run compilers and tools from other working folders with it."""
    try:
        return Path(tempfile.mkdtemp(prefix=f".{STAGING_MARK}{os.getpid()}-tmp", dir=folder.path.resolve()))
    except OSError:
        return None


@contextmanager
def writing(folder: ModelFolder, log: Log = QUIET, temporaries: bool = True) -> Iterator[ModelFolder]:
    """Hold the folder's lock: remove dead runs' leftovers first, keep temporaries inside, clean up after.

    temporaries: point tempfile into the folder meanwhile. The export passes False: torch derives its compile
    cache folder from tempfile and reuses it for the rest of the process, so it must not be ours to remove.
    """
    key = str(folder.path.resolve())
    if key in _held:  # nested in this process: already ours
        _held[key].depth += 1
        try:
            yield folder
        finally:
            _held[key].depth -= 1
        return
    if key in _reading:
        raise RuntimeError(f"writing {folder.path} while this process reads it: the lock cannot be upgraded")
    lock = _acquire(folder, log)
    try:
        _write_owner(folder)
        remove_debris(find_debris(folder), log)
        tmpdir = _private_tempdir(folder) if temporaries else None
    except BaseException:
        lock.release()
        raise
    _held[key] = _Session(lock, 1, tmpdir, (tempfile.tempdir, os.environ.get("TMPDIR")))
    if tmpdir is not None:
        tempfile.tempdir, os.environ["TMPDIR"] = str(tmpdir), str(tmpdir)
    try:
        yield folder
    finally:
        _release(key, folder)


def _release(key: str, folder: ModelFolder) -> None:
    session = _held.pop(key)
    tempfile.tempdir = session.saved[0]
    if session.saved[1] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = session.saved[1]
    try:
        if session.tmpdir is not None:
            shutil.rmtree(session.tmpdir, ignore_errors=True)
        folder.owner_path.unlink(missing_ok=True)
    except OSError:  # a folder made read-only meanwhile: the next writer overwrites the owner file
        pass
    finally:
        session.lock.release()  # type: ignore[attr-defined]


def is_writing(folder: ModelFolder) -> bool:
    """Whether this process holds the folder's lock."""
    return str(folder.path.resolve()) in _held


@contextmanager
def reading(folder: ModelFolder, log: Log = QUIET) -> Iterator[list[Debris]]:
    """Read a consistent folder: wait for a writer to finish, then hold a shared lock meanwhile, so that no writer
    replaces a file between its check and its use; readers do not wait for each other. Without the lock where no
    lock file can be opened (a read-only folder never written: no writer either). Yields the leftovers found, for
    the caller to report."""
    key = str(folder.path.resolve())
    if is_writing(folder) or key in _reading:
        yield find_debris(folder)
        return
    fd = _acquire_shared(folder, log)
    if fd is not None:
        _reading[key] = fd
    try:
        yield find_debris(folder)
    finally:
        if fd is not None:
            del _reading[key]
            os.close(fd)  # releases the shared lock


def _acquire_shared(folder: ModelFolder, log: Log) -> int | None:
    """A shared flock on the folder's lock file (the one filelock holds exclusively for a writer), waited for."""
    import fcntl

    fd = None
    for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY):
        try:
            fd = os.open(folder.lock_path, flags | os.O_CLOEXEC, 0o644)
            break
        except OSError:
            continue
    if fd is None:
        return None
    deadline = None
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            pass
        except OSError:  # a file system without flock: nothing to share with
            os.close(fd)
            return None
        if deadline is None:  # only a writer holds the lock exclusively
            busy = f"being written by {_owner(folder)}"
            timeout = _say_waiting(folder, busy, log)
            deadline = time.monotonic() + timeout
        if time.monotonic() >= deadline:
            os.close(fd)
            raise _still_busy(folder, busy, timeout)
        time.sleep(0.05)
