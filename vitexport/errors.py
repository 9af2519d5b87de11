"""User-facing errors: one sentence, a non-zero exit code, no traceback."""

from __future__ import annotations


class VitexportError(Exception):
    """A problem the user can fix (bad input, missing file, ...). The CLI prints the message and exits."""

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class ParityError(VitexportError):
    """Two backends disagree beyond the tolerance."""

    exit_code = 1


class BackendUnavailable(VitexportError):
    """A backend's library, provider, artifact or device is missing."""

    exit_code = 3


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP: handled like Ctrl-C (every cleanup that runs for one runs for it), exit 128 + signal."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (a library's reason, without its traceback-like detail), else the
    exception's type name."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
