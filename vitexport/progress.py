"""Progress on stderr: each step with its elapsed time; silenced by --quiet."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Iterator


class Log:
    def __init__(self, quiet: bool = False, stream=None):
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.t0 = time.perf_counter()

    def _print(self, text: str) -> None:
        if not self.quiet:
            print(text, file=self.stream, flush=True)

    def info(self, text: str) -> None:
        self._print(f"[{time.perf_counter() - self.t0:7.1f}s] {text}")

    def warn(self, text: str) -> None:
        # warnings are shown even with --quiet: they change what the result means
        print(f"warning: {text}", file=self.stream, flush=True)

    @contextmanager
    def step(self, text: str) -> Iterator[None]:
        start = time.perf_counter()
        self.info(f"{text} ...")
        yield
        self.info(f"{text}: done in {time.perf_counter() - start:.1f}s")


QUIET = Log(quiet=True)
