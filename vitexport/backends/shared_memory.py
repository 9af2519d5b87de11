"""System shared memory for a served model on the same host (`bench --endpoint URL --shared-memory system`).

Inputs and outputs travel through POSIX shared memory regions registered with the server (Triton's
shared-memory extension) instead of the request body: what perf_analyzer's `--shared-memory system` measures.
One input region holds the batch every request in flight reads; each request in flight writes its answer to an
output region of its own, taken from a pool that grows to the concurrency. Every region is unregistered and
unlinked when the runner closes.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

import numpy as np


class SystemSharedMemory:
    def __init__(self, client: Any) -> None:
        import tritonclient.utils.shared_memory as shm

        self._shm, self._client = shm, client
        self._tag = f"vitexport_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        self._regions: dict[str, Any] = {}  # name -> handle, every region registered
        self._input: tuple[str, int] | None = None  # (name, capacity in bytes)
        self._outputs: asyncio.Queue | None = None  # free (name, capacity) output regions
        self._count = 0

    async def _region(self, nbytes: int) -> str:
        self._count += 1
        name = f"{self._tag}_{self._count}"
        handle = self._shm.create_shared_memory_region(name, f"/{name}", nbytes)
        self._regions[name] = handle
        await self._client.register_system_shared_memory(name, f"/{name}", nbytes)
        return name

    async def _drop(self, name: str) -> None:
        handle = self._regions.pop(name)
        try:
            await self._client.unregister_system_shared_memory(name)
        finally:
            self._shm.destroy_shared_memory_region(handle)

    async def put_input(self, data: np.ndarray) -> str:
        """The input batch written to the input region (made larger when the batch is); its name."""
        if self._input is None or self._input[1] < data.nbytes:
            if self._input is not None:
                await self._drop(self._input[0])
            self._input = (await self._region(data.nbytes), data.nbytes)
        self._shm.set_shared_memory_region(self._regions[self._input[0]], [np.ascontiguousarray(data)])
        return self._input[0]

    async def take_output(self, nbytes: int) -> tuple[str, int]:
        """A free output region of at least `nbytes` (made when none is free)."""
        if self._outputs is None:
            self._outputs = asyncio.Queue()
        while not self._outputs.empty():
            name, size = self._outputs.get_nowait()
            if size >= nbytes:
                return name, size
            await self._drop(name)
        return await self._region(nbytes), nbytes

    def give_back(self, region: tuple[str, int]) -> None:
        assert self._outputs is not None
        self._outputs.put_nowait(region)

    def read(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        return np.array(self._shm.get_contents_as_numpy(self._regions[name], dtype, shape), copy=True)

    async def close(self) -> None:
        for name in list(self._regions):
            try:
                await self._drop(name)
            except Exception:  # the server is gone: its registrations went with it; unlink ours all the same
                pass
