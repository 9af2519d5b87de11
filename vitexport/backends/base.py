"""One interface for every backend (PyTorch, ONNX Runtime, OpenVINO, TensorRT): load, infer on a batch, close.

A runner whose library, provider, artifact or device is missing raises BackendUnavailable from load();
the bench lists it as "unavailable: <reason>" instead of failing. Heavy libraries are imported inside load().

For timing, inference is split into stage (host -> device copy of the input), run (compute only, synchronized
before it returns) and fetch (device -> host copy of the output), so latency and copy time are reported apart.
timed_run() is what the bench times: wall clock around run() here; a GPU runner with its own stream overrides it
with CUDA events on that stream.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any, Callable

import numpy as np

from ..errors import BackendUnavailable, VitexportError


class Runner(ABC):
    backend: str = "?"  # 'pytorch' | 'onnxruntime' | 'tensorrt'
    precision: str = "fp32"  # 'fp32' | 'bf16' | 'fp16' | 'int8'
    device: str = "cpu"  # 'cpu' | 'cuda'
    provider: str = ""  # e.g. 'CPUExecutionProvider', 'eager', 'autocast-bf16'
    batch_range: tuple[int, int] | None = None  # (min, max) batch an engine accepts; None: any
    timed: bool = True  # False: parity only (a graph shaped for another runtime, whose speed here means nothing)

    def __init__(self) -> None:
        self._loaded = False
        self.info: dict[str, Any] = {}  # recorded in reports: threads, providers, artifact sha256, ...

    @property
    def name(self) -> str:
        """'pytorch cpu fp32', 'pytorch cpu bf16', 'onnxruntime cpu int8', 'onnxruntime trt-ep fp16', 'tensorrt gpu fp16'."""
        return f"{self.backend} {self.where} {self.precision}"

    @property
    def where(self) -> str:
        return self.device

    # -- lifecycle: load() and close() own the state; subclasses implement _load() and _close() ----------------
    @property
    def loaded(self) -> bool:
        return self._loaded

    def load(self) -> "Runner":
        """Make the runner ready; BackendUnavailable(reason) when it cannot be. Loading twice is a no-op."""
        if not self._loaded:
            self._load()
            self._loaded = True
        return self

    def close(self) -> None:
        """Release what load() took (sessions, engines, device memory). Safe to call at any time."""
        try:
            self._close()
        finally:
            self._loaded = False

    @abstractmethod
    def _load(self) -> None:
        """Import the library, open the artifact, check the device. Raise BackendUnavailable(reason) if not possible."""

    def _close(self) -> None:
        """Release what _load() took; nothing by default."""

    def __enter__(self) -> "Runner":
        return self.load()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inference --------------------------------------------------------------------------------------
    def stage(self, x: np.ndarray) -> Any:
        """Put an input batch (B, 3, H, W) float32 where run() reads it. CPU backends: nothing to do."""
        return x

    @abstractmethod
    def run(self, staged: Any) -> Any:
        """Compute on a staged input; returns when the result is complete (GPU work synchronized)."""

    def timed_run(self, staged: Any) -> float:
        """Milliseconds one run() takes. Wall clock; GPU runners with their own stream time it with CUDA events."""
        t0 = time.perf_counter()
        self.run(staged)
        return (time.perf_counter() - t0) * 1e3

    def fetch(self, out: Any) -> np.ndarray:
        """Bring an output to the host as float32 (B, C)."""
        return np.asarray(out, dtype=np.float32)

    def infer(self, x: np.ndarray) -> np.ndarray:
        if not self.loaded:
            raise BackendUnavailable(f"{self.name} is not loaded.")
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 4:
            raise ValueError(f"expected a (B, C, H, W) batch, got shape {x.shape}")
        return self.fetch(self.run(self.stage(x)))

    def infer_all(self, x: np.ndarray, chunk: int = 8) -> np.ndarray:
        """Outputs for every input, in chunks the runner accepts (an engine's batch range included)."""
        return infer_in_chunks(self.infer, x, chunk, self.batch_range, self.name)

    def synchronize(self) -> None:
        """Wait for queued device work (GPU backends)."""


def infer_in_chunks(infer: Callable[[np.ndarray], np.ndarray], x: np.ndarray, chunk: int = 8,
                    batch_range: tuple[int, int] | None = None, name: str = "the backend") -> np.ndarray:
    """infer() on every input, `chunk` at a time, staying inside `batch_range` (min, max) when there is one."""
    lo, hi = batch_range or (1, chunk)
    chunk = max(lo, min(chunk, hi))
    if len(x) < lo:
        raise VitexportError(f"{name} needs batches of at least {lo}, the data has {len(x)} inputs")
    outs = []
    for i in range(0, len(x), chunk):
        piece = x[i:i + chunk]
        if len(piece) < lo:  # a short last piece: run the last `lo` inputs and keep the new ones
            outs.append(infer(x[len(x) - lo:])[lo - len(piece):])
        else:
            outs.append(infer(piece))
    return np.concatenate(outs)
