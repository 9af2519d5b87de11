"""A served model as a backend: a Triton Inference Server (or any KServe v2 / Open Inference Protocol server, such
as OpenVINO Model Server) answering over HTTP or gRPC.

The runner sends the bench's own preprocessed inputs and judges the answers like any other row. Before anything is
sent, the server's model metadata and configuration are checked against the model folder (input and output names,
data types, shapes, the largest batch): a server serving something else is one sentence. Every call is bounded by
`timeout` seconds, so an unreachable, stuck or dying server ends the row instead of hanging the bench.

Calls go through tritonclient's asyncio clients (`tritonclient.http.aio`, `tritonclient.grpc.aio`) on the runner's
own event loop: the parity pass runs one request at a time, and bench/load.py keeps N requests in flight on the
same loop. A model whose input is uint8 pixels (`vitexport triton --uint8-input`) is sent the pixels the inputs
were normalised from: (x * std + mean) * 255, rounded, gives them back exactly.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BackendUnavailable, VitexportError
from .base import Runner

PROTOCOLS = ("http", "grpc")
DEFAULT_TIMEOUT = 30.0  # seconds, per call
PRECISIONS = ("fp32", "fp16", "int8")
_SUFFIX = re.compile(r"-(fp32|fp16|int8)(?:-plan)?(?:-uint8)?$")  # the names `vitexport triton` gives


class EndpointError(VitexportError):
    """The server cannot be reached, does not serve the model asked for, or answered wrongly."""


def parse_endpoint(url: str) -> tuple[str, str]:
    """'http://HOST:PORT' or 'grpc://HOST:PORT' -> (protocol, 'HOST:PORT'); one sentence otherwise."""
    m = re.fullmatch(r"(\w+)://([^/\s:]+|\[[0-9a-fA-F:]+\]):(\d{1,5})/?", url.strip())
    if not m or m.group(1).lower() not in PROTOCOLS or not 0 < int(m.group(3)) < 65536:
        raise VitexportError(f"--endpoint {url!r} is not http://HOST:PORT or grpc://HOST:PORT.")
    return m.group(1).lower(), f"{m.group(2)}:{m.group(3)}"


def served_precision(model_name: str) -> str:
    """The precision a name `vitexport triton` gave says ('vit_base_patch16_224-int8' -> 'int8'); else fp32."""
    m = _SUFFIX.search(model_name)
    return m.group(1) if m else "fp32"


@dataclass(frozen=True)
class Expected:
    """What the model folder says the served model takes and gives."""

    input_name: str
    output_name: str
    input_shape: tuple[int, int, int]  # (3, H, W)
    output_shape: tuple[int, ...]  # the judged output's shape of one image: (classes,), (C, h, w) for a dense map
    mean: tuple[float, float, float]
    std: tuple[float, float, float]


@dataclass(frozen=True)
class Interface:
    """What the server says it serves, once checked: the batches it takes and the input's data type."""

    batch_range: tuple[int, int] | None  # None: any batch
    input_dtype: str  # 'FP32' | 'UINT8'
    output_dtype: str  # 'FP32' | 'FP16'
    max_batch_size: int
    platform: str


def _batch_of(shape: tuple[int, ...], n: int | str = "batch") -> str:
    return f"[{', '.join(map(str, (n, *shape)))}]"


def _dims(values) -> list[int]:
    return [int(v) for v in values]


def check_interface(meta: dict, config: dict, want: Expected, where: str) -> Interface:
    """The server's model metadata and configuration against the folder; one sentence naming the first mismatch."""
    ins, outs = meta.get("inputs") or [], meta.get("outputs") or []
    inp = next((t for t in ins if t.get("name") == want.input_name), None)
    out = next((t for t in outs if t.get("name") == want.output_name), None)
    if len(ins) != 1 or inp is None:
        raise EndpointError(f"{where} takes the input(s) {', '.join(t.get('name', '?') for t in ins) or 'none'}, "
                            f"not the one input {want.input_name!r} of this model folder.")
    if out is None:
        raise EndpointError(f"{where} gives the output(s) {', '.join(t.get('name', '?') for t in outs) or 'none'}, "
                            f"not {want.output_name!r} of this model folder.")
    if inp.get("datatype") not in ("FP32", "UINT8") or out.get("datatype") not in ("FP32", "FP16"):
        raise EndpointError(f"{where} takes {inp.get('datatype')} and gives {out.get('datatype')}; this model "
                            f"folder's model takes FP32 (or UINT8 pixels) and gives FP32 or FP16.")
    max_batch = int(config.get("max_batch_size", 0) or 0)
    in_shape, out_shape = _dims(inp.get("shape") or []), _dims(out.get("shape") or [])
    want_in, want_out = [*want.input_shape], [*want.output_shape]
    batched = max_batch > 0
    body_in, body_out = (in_shape[1:], out_shape[1:]) if batched or len(in_shape) == 4 else (in_shape, out_shape)
    if body_in != want_in or body_out != want_out or len(in_shape) != 4:
        raise EndpointError(f"{where} takes {inp.get('name')} of shape {in_shape} and gives {out.get('name')} of "
                            f"shape {out_shape}; this model folder's model takes [batch, {', '.join(map(str, want_in))}]"
                            f" and gives {_batch_of(want.output_shape)}.")
    fixed = in_shape[0]
    batch_range = (1, max_batch) if batched else (None if fixed < 0 else (fixed, fixed))
    return Interface(batch_range, inp["datatype"], out["datatype"], max_batch,
                     str(meta.get("platform") or config.get("backend") or "?"))


def _int(v: Any) -> int:
    return int(v or 0)  # gRPC's JSON gives int64 as strings and leaves zero fields out


def server_counts(stats: dict, name: str, version: str) -> dict[str, int]:
    """The statistics extension's cumulative counters of one model: requests, images, and nanoseconds spent
    queued and computing (input, infer, output), summed over the versions asked for."""
    total = {"requests": 0, "inferences": 0, "executions": 0, "queue_ns": 0, "compute_ns": 0, "failed": 0}
    for m in stats.get("model_stats") or []:
        if m.get("name") != name or (version and str(m.get("version")) != version):
            continue
        s = m.get("inference_stats") or {}
        total["requests"] += _int((s.get("success") or {}).get("count"))
        total["failed"] += _int((s.get("fail") or {}).get("count"))
        total["inferences"] += _int(m.get("inference_count"))
        total["executions"] += _int(m.get("execution_count"))
        total["queue_ns"] += _int((s.get("queue") or {}).get("ns"))
        total["compute_ns"] += sum(_int((s.get(k) or {}).get("ns"))
                                   for k in ("compute_input", "compute_infer", "compute_output"))
    return total


def to_pixels(x: np.ndarray, mean, std) -> np.ndarray:
    """Normalised float inputs back to the uint8 pixels they came from."""
    m = np.asarray(mean, np.float64).reshape(1, 3, 1, 1)
    s = np.asarray(std, np.float64).reshape(1, 3, 1, 1)
    return np.clip(np.rint((x.astype(np.float64) * s + m) * 255.0), 0, 255).astype(np.uint8)


class EndpointRunner(Runner):
    """One model on one server. `device` is the URL; the row is 'endpoint URL/NAME PRECISION'."""

    backend = "endpoint"
    endpoint = True  # bench/run.py: required (a failure fails the bench), timed under concurrent load

    def __init__(self, url: str, model: str, want: Expected, version: str = "", precision: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, shared_memory: bool = False) -> None:
        super().__init__()
        self.protocol, self.address = parse_endpoint(url)
        self.url, self.model, self.version, self.want, self.timeout = url.rstrip("/"), model, version, want, timeout
        self.precision = precision or served_precision(model)
        self.device, self.provider = self.url, "triton-client"
        self.interface: Interface | None = None
        self.answered = 0  # images answered so far: a row that fails says how far it got
        self.shared_memory = shared_memory  # inputs and outputs through system shared memory (same host)
        self._shm: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None
        self._lib: Any = None
        self._exception: type[Exception] = Exception

    @property
    def where(self) -> str:
        return f"{self.url}/{self.model}" + (f"/{self.version}" if self.version else "")

    # -- calls, each bounded by the timeout ------------------------------------------------------------------
    def call(self, coro, what: str, bounded: bool = True):
        """Run one coroutine on the runner's loop, at most `timeout` seconds (unless it bounds its own calls);
        a failure is one EndpointError."""
        assert self._loop is not None
        try:
            return self._loop.run_until_complete(asyncio.wait_for(coro, self.timeout) if bounded else coro)
        except Exception as e:
            raise self.failure(e, what) from None

    def failure(self, e: BaseException, what: str) -> EndpointError:
        if isinstance(e, EndpointError):
            return e
        if isinstance(e, (asyncio.TimeoutError, TimeoutError)):
            return EndpointError(f"{self.where} did not answer {what} within {self.timeout:g} s (--timeout).")
        message = getattr(e, "message", None)  # tritonclient's InferenceServerException: a method
        text = (message() if callable(message) else None) or str(e)
        text = " ".join(text.split())[:300] or type(e).__name__
        return EndpointError(f"{self.where} failed {what}: {text}.")

    async def _open(self) -> Any:
        if self.protocol == "http":
            return self._lib.InferenceServerClient(self.address, conn_timeout=self.timeout)
        return self._lib.InferenceServerClient(self.address)

    async def _describe(self) -> tuple[dict, dict]:
        c, grpc = self._client, self.protocol == "grpc"
        if not await c.is_server_live():
            raise EndpointError(f"{self.url} is not live.")
        if not await c.is_model_ready(self.model, self.version):
            raise EndpointError(f"{self.url} has no model {self.model!r}"
                                f"{f' version {self.version}' if self.version else ''} ready (--endpoint-model, "
                                "--endpoint-version).")
        kw = {"as_json": True} if grpc else {}
        meta = await c.get_model_metadata(self.model, self.version, **kw)
        try:  # Triton's model configuration extension; a plain KServe v2 server (OpenVINO Model Server) lacks it
            config = await c.get_model_config(self.model, self.version, **kw)
        except self._exception:
            return meta, {}
        return meta, (config.get("config", config) if grpc else config)

    def _load(self) -> None:
        try:
            if self.protocol == "http":
                import tritonclient.http.aio as lib
            else:
                import tritonclient.grpc.aio as lib
        except (ImportError, RuntimeError):  # RuntimeError: tritonclient without this protocol's extra
            raise BackendUnavailable(f"benching {self.url} needs Triton's client for {self.protocol}: pip install "
                                     f"'tritonclient[{self.protocol}]' (or vitexport[endpoint])") from None
        from tritonclient.utils import InferenceServerException

        self._lib, self._exception, self._loop = lib, InferenceServerException, asyncio.new_event_loop()
        try:
            self._client = self.call(self._open(), "to a connection")
            meta, config = self.call(self._describe(), "the model's metadata")
            self.interface = check_interface(meta, config, self.want, self.where)
            if self.shared_memory:
                self._open_shared_memory()
        except BaseException:
            self._close()
            raise
        self.batch_range = self.interface.batch_range
        self.info = {"url": self.url, "model": self.model, "version": self.version or "latest",
                     "protocol": self.protocol, "platform": self.interface.platform,
                     "max_batch_size": self.interface.max_batch_size, "input_dtype": self.interface.input_dtype,
                     "timeout_s": self.timeout, "shared_memory": "system" if self.shared_memory else "none"}

    def _open_shared_memory(self) -> None:
        from .shared_memory import SystemSharedMemory

        self._shm = SystemSharedMemory(self._client)
        try:
            self.call(self._shm.put_input(np.zeros(1, np.float32)), "to a shared memory region")
        except EndpointError as e:
            raise EndpointError(f"{self.where} cannot read this host's shared memory (--shared-memory system needs "
                                f"the server on the same host): {e}") from None

    def _close(self) -> None:
        if self._loop is not None:
            if self._shm is not None:
                try:
                    self._loop.run_until_complete(asyncio.wait_for(self._shm.close(), self.timeout))
                except Exception:  # a dead server
                    pass
                self._shm = None
            if self._client is not None:
                try:
                    self._loop.run_until_complete(asyncio.wait_for(self._client.close(), self.timeout))
                except Exception:  # a dead server: nothing left to close politely
                    pass
            self._loop.close()
        self._loop, self._client = None, None

    # -- inference -------------------------------------------------------------------------------------------
    def stage(self, x: np.ndarray) -> Any:
        """The request's input tensor, made once per batch (pixels for a uint8-input model)."""
        assert self.interface is not None
        data = to_pixels(x, self.want.mean, self.want.std) if self.interface.input_dtype == "UINT8" else x
        data = np.ascontiguousarray(data)
        tensor = self._lib.InferInput(self.want.input_name, list(data.shape), self.interface.input_dtype)
        if self._shm is not None:
            tensor.set_shared_memory(self.call(self._shm.put_input(data), "to a shared memory region"), data.nbytes)
        else:
            tensor.set_data_from_numpy(data)
        return tensor, len(x)

    async def request(self, staged: Any) -> np.ndarray:
        """One inference; the answer checked for shape and data type."""
        tensor, n = staged
        wanted = self._lib.InferRequestedOutput(self.want.output_name)
        if self._shm is None:
            result = await self._client.infer(self.model, [tensor], self.version, outputs=[wanted])
            return self._checked(result.as_numpy(self.want.output_name), n)
        region = await self._shm.take_output(n * int(np.prod(self.want.output_shape)) * 4)
        try:
            wanted.set_shared_memory(*region)
            result = await self._client.infer(self.model, [tensor], self.version, outputs=[wanted])
            told = result.get_output(self.want.output_name)  # HTTP: a dict; gRPC: its protobuf message
            if isinstance(told, dict) or told is None:
                told = told or {}
                shape, dtype = tuple(int(d) for d in told.get("shape", ())), told.get("datatype")
            else:
                shape, dtype = tuple(int(d) for d in told.shape), told.datatype
            if shape != (n, *self.want.output_shape) or dtype not in ("FP32", "FP16"):
                raise EndpointError(f"{self.where} answered a batch of {n} with {self.want.output_name} of shape "
                                    f"{list(shape)} and type {dtype}, not {_batch_of(self.want.output_shape, n)} float.")
            return self._shm.read(region[0], np.dtype(np.float32 if dtype == "FP32" else np.float16), shape)
        finally:
            self._shm.give_back(region)

    def _checked(self, out: np.ndarray | None, n: int) -> np.ndarray:
        if out is None or out.shape != (n, *self.want.output_shape) or out.dtype not in (np.float32, np.float16):
            shape, dtype = (None, None) if out is None else (list(out.shape), out.dtype)
            raise EndpointError(f"{self.where} answered a batch of {n} with {self.want.output_name} of shape {shape} "
                                f"and type {dtype}, not {_batch_of(self.want.output_shape, n)} float.")
        return out

    def run(self, staged: Any) -> np.ndarray:
        out = self.call(self.request(staged), "a request")
        self.answered += staged[1]
        return out

    def statistics(self) -> dict[str, int] | None:
        """The server's counters for this model, or None where it offers no statistics extension."""
        kw = {"as_json": True} if self.protocol == "grpc" else {}
        try:
            raw = self.call(self._client.get_inference_statistics(self.model, self.version, **kw), "statistics")
        except EndpointError:
            return None
        return server_counts(raw, self.model, self.version)
