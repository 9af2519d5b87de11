"""One parse of an ONNX graph shared by the steps of one precision run.

Making an INT8 graph reads the FP32 graph for its precision, its GEMM choice, its calibration and the Q/DQ writer;
a ViT-B/16 graph with its weights inline is 346 MB, 0.4-0.6 s a parse. Inside `sharing()`, `read_graph` parses a
file once (by its state: device, inode, size, mtime) and hands every reader the same message, which readers must
not change (the calibration reads it: its session gets a copy of the graph and of the weights); `take_graph` hands
a step that changes the graph (the Q/DQ writer) the shared message and forgets it, so nobody sees it changed and its
memory goes with its taker. Outside `sharing()` both simply parse. `prefetch` parses a file on a thread of its own
while the command does other work (hashing the same file for its check); the first read inside sharing() takes it.
Weights in external data are never loaded here (`load_external_data=False`): readers fetch them one at a time.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

_shared: dict[tuple, object] | None = None  # file state -> ModelProto, inside sharing() only
_prefetched: dict[tuple, Future] = {}  # file state -> its parse under way (prefetch), until read or let go
_prefetch_lock = threading.Lock()


def _state(path: Path) -> tuple:
    st = os.stat(path)  # the file itself (device and inode: any path to it), and its size and time of change
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _parse(path: Path):
    import onnx

    return onnx.load(str(path), load_external_data=False)


def prefetch(path: Path) -> None:
    """Start parsing the graph at `path` on a thread of its own (the parse of a large graph runs beside the digest
    of the same file, whose reads and hashing release the GIL); the first read_graph or take_graph of the file in
    the same state inside sharing() takes it. The weights' external data is never read (as in every parse here).
    Never raises: the reader that parses again says what is wrong."""
    try:
        key = _state(path)
        if not Path(path).is_file():  # not a FIFO or a device, whose read would never end
            return
    except OSError:
        return
    parse: Future = Future()

    def run() -> None:
        try:
            parse.set_result(_parse(path))
        except BaseException as e:  # said again by the reader's own parse
            parse.set_exception(e)

    with _prefetch_lock:  # one at a time: a parse no run took (its command failed first) goes with the next
        _prefetched.clear()
        _prefetched[key] = parse
    threading.Thread(target=run, name="vitexport-parse", daemon=True).start()


def _parsed(path: Path, key: tuple):
    """The prefetched parse of `path` in the state `key` (waited for), else a parse now."""
    with _prefetch_lock:
        parse = _prefetched.pop(key, None)
    if parse is not None:
        try:
            return parse.result()
        except Exception:
            pass
    return _parse(path)


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
        with _prefetch_lock:  # a parse nobody read (the file changed meanwhile) is let go with the run
            _prefetched.clear()


def read_graph(path: Path):
    """The graph at `path` to read, not to change (shared with the run's other readers inside sharing())."""
    shared = _shared  # one reference: another thread's sharing() may end meanwhile
    if shared is None:
        return _parse(path)
    key = _state(path)
    if key not in shared:
        shared[key] = _parsed(path, key)
    return shared[key]


def take_graph(path: Path):
    """The graph at `path` to change or use up: the shared parse when there is one, else a new one. Every shared
    graph is let go: a taker is about to need memory (a session, a written graph), and the readers are done."""
    shared = _shared
    if shared is not None:
        key = _state(path)
        taken = shared.pop(key, None)
        shared.clear()
        return taken if taken is not None else _parsed(path, key)
    return _parse(path)


def let_go() -> None:
    """Forget the shared graphs now (before work that reads its graphs its own way and needs the memory)."""
    shared = _shared
    if shared is not None:
        shared.clear()
