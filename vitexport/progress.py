"""Progress on stderr: each step with its elapsed time; silenced by --quiet."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator


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

    @contextmanager
    def bar(self, label: str, total: int, unit: str = "images") -> Iterator[Callable[[int], None]]:
        """A progress bar on stderr with the rate and an ETA; yields advance(n). Nothing with --quiet."""
        if self.quiet or total <= 0:
            yield lambda n: None
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                       TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), transient=True,
                       console=Console(stderr=True))
        task, start, done = bar.add_task(label, total=total, rate=""), time.perf_counter(), 0
        with bar:
            def advance(n: int) -> None:
                nonlocal done
                done += n
                elapsed = time.perf_counter() - start
                bar.update(task, advance=n, rate=f"{done / elapsed:,.0f} {unit}/s" if elapsed > 0 else "")

            yield advance


QUIET = Log(quiet=True)
