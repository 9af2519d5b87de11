"""How a failure reaches the user: one sentence and an exit code, never a traceback, unless asked for one.

- `VitexportError` (a condition the user can fix): its sentence and its exit code (2 unless it says otherwise).
- `OSError` that reached the command (permissions, full disk, file-size limit): one sentence naming the file (a
  hidden temporary is named by the file it was for), exit 2. `MemoryError`: one sentence, exit 2.
- `KeyboardInterrupt`: exit 130; every file is written to a temporary first, so nothing partial is kept.
- SIGTERM / SIGHUP (`stop_on_signals`, installed by `main`): the same, exit 128 + the signal (143, 129).
- Anything else is a bug: one line saying so and how to get the traceback, exit 70.

`vitexport --debug ...` (or `VITEXPORT_DEBUG=1`) prints the traceback of the library's exception (the one a
VitexportError was raised from, too) before the sentence, for a bug report.
"""

from __future__ import annotations

import os
import re
import traceback
from pathlib import Path

import click

from ..errors import Terminated, VitexportError
from ..precision.settings import DEFAULT_ALPHA

DEBUG_ENV = "VITEXPORT_DEBUG"
INTERNAL_ERROR_EXIT = 70  # EX_SOFTWARE
INTERRUPTED_EXIT = 130
_STAGING = re.compile(r"^\.(.+)\.vx\d+-")  # paths.staging_prefix: '.model.onnx.vx123-ab.onnx' -> 'model.onnx'

_debug = False


class UserError(click.ClickException):
    """Printed as 'Error: <sentence>' with the error's own exit code."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(printable(message))
        self.exit_code = exit_code


def set_debug(flag: bool) -> None:
    global _debug
    _debug = flag


def debugging() -> bool:
    return _debug or os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def printable(text: str) -> str:
    """A message any terminal can print: bytes of non-UTF-8 file names shown as \\xNN escapes."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def public_path(name: str | os.PathLike | None) -> str:
    """A path as the user knows it: a hidden temporary of ours is named by the file it was going to become."""
    if name is None:
        return ""
    path = Path(os.fsdecode(name))
    m = _STAGING.match(path.name)
    return str(path.with_name(m.group(1)) if m else path)


def _os_error_sentence(e: OSError) -> str:
    from ..paths import FILE_SYSTEM_LIMITS, write_reason

    where = public_path(e.filename)
    # the file system's limits read the same for any file (a full one is named); permissions are said as the
    # system says them
    why = write_reason(e, Path(where).parent if where else None) if e.errno in FILE_SYSTEM_LIMITS else \
        (e.strerror or str(e)).rstrip(".").lower()
    return f"{where}: {why}." if where else f"{why[:1].upper()}{why[1:]}."


def _print_traceback(e: BaseException) -> None:
    chain: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    for exc in reversed(chain):
        click.echo("".join(traceback.format_exception(type(exc), exc, exc.__traceback__, chain=False)).rstrip(),
                   err=True)


def to_click(e: BaseException) -> click.ClickException | click.exceptions.Exit | click.Abort:
    """The click exception that ends the command for `e`: a sentence and an exit code."""
    if isinstance(e, (click.ClickException, click.exceptions.Exit, click.Abort)):
        return e
    if debugging() and not isinstance(e, KeyboardInterrupt):
        _print_traceback(e)
    if isinstance(e, VitexportError):
        return UserError(str(e), e.exit_code)
    if isinstance(e, Terminated):
        import signal

        name = signal.Signals(e.signum).name
        return UserError(f"Stopped by {name}; no partial output was kept.", 128 + e.signum)
    if isinstance(e, KeyboardInterrupt):
        return UserError("Interrupted; no partial output was kept.", INTERRUPTED_EXIT)
    if isinstance(e, MemoryError):
        return UserError("Ran out of memory; use a smaller --batch or --img-size, or free some memory.")
    if isinstance(e, OSError):
        return UserError(_os_error_sentence(e))
    first = (str(e).strip().splitlines() or [""])[0][:200]
    return UserError(f"Internal error ({type(e).__name__}{': ' + first if first else ''}); this is a bug: rerun with "
                     f"`vitexport --debug ...` (or {DEBUG_ENV}=1) and report the traceback.", INTERNAL_ERROR_EXIT)


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP end a command as Ctrl-C does (temporaries removed, the folder's lock released), with exit
    128 + the signal. A signal the parent set to be ignored stays ignored (nohup: keep running), as Python
    itself leaves an inherited SIG_IGN for SIGINT."""
    import signal

    def stop(signum, frame):
        raise Terminated(signum)

    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None and signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, stop)


OPTIONAL_VALUES = {"--smoothquant": str(DEFAULT_ALPHA)}  # options whose value may be left out: what stands in


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def with_optional_values(args: list[str]) -> list[str]:
    """Args with each OPTIONAL_VALUES option that is not followed by a number given its default (`--smoothquant
    MODEL_DIR` is the option without a value, then the folder, where click would read MODEL_DIR as its value)."""
    out = []
    for i, a in enumerate(args):
        if a in OPTIONAL_VALUES and (i + 1 == len(args) or not _number(args[i + 1])):
            a = f"{a}={OPTIONAL_VALUES[a]}"
        out.append(a)
    return out


class VitexportGroup(click.Group):
    """The command group: every command's failures go through `to_click`, whichever module defines it."""

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name, cmd, rest = super().resolve_command(ctx, args)
        return name, cmd, with_optional_values(rest)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except BaseException as e:  # noqa: BLE001 - the one place every failure passes
            if isinstance(e, (SystemExit, GeneratorExit)):
                raise
            raise to_click(e) from None
