"""A dedicated CUDA stream for one GPU runner: its copies, its work, its synchronization and its timing.

Not the current (normally the legacy default) stream: TensorRT's enqueueV3 warns that "Using default stream may
lead to performance issues due to additional cudaDeviceSynchronize() calls by TensorRT" (NvInferRuntime.h, 10.12
and 11.1); NVIDIA's samples create a stream (cudaStreamCreate) and Polygraphy's TrtRunner owns one. Buffers are
allocated while this stream is current, so PyTorch's caching allocator ties them to it.

torch is imported when a stream is made, never when this module is imported.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np


class CudaStream:
    device = "cuda"

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self.stream = torch.cuda.Stream()

    @property
    def handle(self) -> int:
        """The cudaStream_t TensorRT enqueues on."""
        return int(self.stream.cuda_stream)

    def upload(self, x: np.ndarray, dtype: Any) -> Any:
        """A device copy of `x` (cast to `dtype`), made on this stream and complete when this returns."""
        torch = self._torch
        with torch.cuda.stream(self.stream):
            staged = torch.from_numpy(np.ascontiguousarray(x)).to(device=self.device, dtype=dtype).contiguous()
        self.stream.synchronize()
        return staged

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        torch = self._torch
        with torch.cuda.stream(self.stream):
            return torch.empty(shape, dtype=dtype, device=self.device)

    def download(self, tensor: Any) -> np.ndarray:
        """The tensor on the host as float32, copied on this stream (after the work queued on it)."""
        torch = self._torch
        with torch.cuda.stream(self.stream):
            host = tensor.float().cpu()
        return host.numpy()

    def synchronize(self) -> None:
        self.stream.synchronize()

    def timed(self, enqueue: Callable[[], None]) -> float:
        """Milliseconds between CUDA events recorded on this stream around what `enqueue` queues; waits for it."""
        torch = self._torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(self.stream)
        enqueue()
        end.record(self.stream)
        end.synchronize()
        return float(start.elapsed_time(end))
