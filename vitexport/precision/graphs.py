"""One parse of an ONNX graph shared by the steps of one precision run.

Making an INT8 graph reads the FP32 graph for its precision, its GEMM choice, its calibration and the Q/DQ writer;
a ViT-B/16 graph with its weights inline is 346 MB, 0.4-0.6 s a parse. Inside `sharing()`, `read_graph` parses a
file once (by its state: device, inode, size, mtime) and hands every reader the same message, which readers must
not change (the calibration reads it: its session gets a copy of the graph and of the weights); `take_graph` hands
a step that changes the graph (the Q/DQ writer) the shared message and forgets it, so nobody sees it changed and its
memory goes with its taker. Outside `sharing()` both simply parse.
Weights in external data are never loaded here (`load_external_data=False`): readers fetch them one at a time.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

_shared: dict[tuple, object] | None = None  # file state -> ModelProto, inside sharing() only


def _state(path: Path) -> tuple:
    st = os.stat(path)  # the file itself (device and inode: any path to it), and its size and time of change
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _parse(path: Path):
    import onnx

    return onnx.load(str(path), load_external_data=False)


@contextmanager
def sharing() -> Iterator[None]:
    """Within: each graph file is parsed once for its readers, and once more only after a taker took it. On exit
    every shared graph is let go (nested uses share the outer one's)."""
    global _shared
    if _shared is not None:
        yield
        return
    _shared = {}
    try:
        yield
    finally:
        _shared = None


def read_graph(path: Path):
    """The graph at `path` to read, not to change (shared with the run's other readers inside sharing())."""
    shared = _shared  # one reference: another thread's sharing() may end meanwhile
    if shared is None:
        return _parse(path)
    key = _state(path)
    if key not in shared:
        shared[key] = _parse(path)
    return shared[key]


def take_graph(path: Path):
    """The graph at `path` to change or use up: the shared parse when there is one, else a new one. Every shared
    graph is let go: a taker is about to need memory (a session, a written graph), and the readers are done."""
    shared = _shared
    if shared is not None:
        taken = shared.pop(_state(path), None)
        shared.clear()
        if taken is not None:
            return taken
    return _parse(path)


def let_go() -> None:
    """Forget the shared graphs now (before work that reads its graphs its own way and needs the memory)."""
    shared = _shared
    if shared is not None:
        shared.clear()
