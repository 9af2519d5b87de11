"""A stand-in `tensorrt` module: just the names vitexport calls, checking and recording what it is given.

Injected into sys.modules by tests (`install(monkeypatch)`), so trt_build and the TensorRT runner run on a machine
without TensorRT. It mirrors the Python API's shape (names as in TensorRT 10.12/11.1 python/src/infer/pyCore.cpp),
and enough of its behaviour that a wrong call shows:

- the build calls the progress monitor for `STEPS` steps and returns `PLAN` (or what `on_build` returns), and
  records each build's profile, workspace limit, cleared flags and timing cache in `builds`; a profile whose
  min <= opt <= max does not hold is refused as TensorRT refuses it (add_optimization_profile returns -1);
- the parser fails with `PARSE_ERRORS` when a test sets them; `TIMING_CACHE` = 'corrupt' makes reading a cache
  raise, 'foreign' makes the builder reject it, as TensorRT does for another GPU or version;
- arguments are checked as TensorRT's pybind11 binding checks them: a wrong type (None where an object, a path or
  a buffer is expected) or a missing argument raises TypeError, an input index out of range gives None;
- an execution context runs only on buffers a test registered (`register(tensor)`, as its stand-in CUDA stream
  allocates them) of the shapes the engine expects at the input and output addresses, and writes
  `logits_of(input)` into the output buffer: swapped or stale addresses fail instead of passing unnoticed.
"""

from __future__ import annotations

import enum
import importlib
import os
import sys
import types
from typing import Any, Callable

__version__ = "10.13.0.35"


class _Severity(enum.IntEnum):
    INTERNAL_ERROR = 0
    ERROR = 1
    WARNING = 2
    INFO = 3
    VERBOSE = 4


def _require(value: Any, kind: type | tuple[type, ...], what: str) -> None:
    """pybind11's argument check: TypeError for a value of another type (None included)."""
    if not isinstance(value, kind):
        raise TypeError(f"{what}: incompatible function arguments ({type(value).__name__} given)")


class ILogger:
    Severity = _Severity

    def __init__(self) -> None:
        _require(self, ILogger, "ILogger.__init__")


class IProgressMonitor:
    def __init__(self) -> None:
        _require(self, IProgressMonitor, "IProgressMonitor.__init__")


class NetworkDefinitionCreationFlag(enum.IntEnum):
    STRONGLY_TYPED = 5


class MemoryPoolType(enum.IntEnum):
    WORKSPACE = 0


class BuilderFlag(enum.IntEnum):
    TF32 = 7


class ProfilingVerbosity(enum.IntEnum):
    LAYER_NAMES_ONLY = 0
    NONE = 1
    DETAILED = 2


class LayerInformationFormat(enum.IntEnum):
    ONELINE = 0
    JSON = 1


class DataType(enum.IntEnum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    FP8 = 6
    BF16 = 7
    INT64 = 8

    def __str__(self) -> str:  # as pybind11 spells its enums
        return f"DataType.{self.name}"


class TensorIOMode(enum.IntEnum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


def Dims(shape: Any) -> tuple[int, ...]:  # noqa: N802 -- TensorRT's name
    return tuple(shape)


# -- what a test may change ----------------------------------------------------------------------------------
STEPS = 6  # progress steps a build reports
PLAN = b"fake-plan"
on_build: Callable[[Any, Any], Any] | None = None  # (logger, monitor) -> plan bytes or None, instead of the default
on_step: Callable[[int], None] | None = None  # called before each step is reported
ENGINE_INFO = '{"Layers": [], "Bindings": []}'
PARSE_ERRORS: list[str] = []  # the parser's errors: parse_from_file fails with them
TIMING_CACHE = "ok"  # 'corrupt': create_timing_cache raises on a file's bytes; 'foreign': set_timing_cache refuses
ENGINE_PROFILE = ((1, 3, 32, 32), (4, 3, 32, 32), (8, 3, 32, 32))  # what a deserialized engine reports
NETWORK_INPUTS: list[tuple[str, tuple[int, ...]]] = [("pixel_values", (-1, 3, 32, 32))]  # what the parser made
PARSE_RESULT = True  # what parse_from_file returns when PARSE_ERRORS is empty
PROFILE_REJECTED = False  # add_optimization_profile refuses every profile (returns -1)
# a deserialized engine's I/O tensors: name -> (mode, data type)
ENGINE_TENSORS: dict[str, tuple[int, int]] = {"pixel_values": (1, 0), "logits": (2, 0)}
DESERIALIZE_ERRORS: list[str] = []  # logged by deserialize_cuda_engine, which then returns None
NO_CONTEXT = False  # create_execution_context returns None (TensorRT's answer when GPU memory is short)
created: dict[str, list[Any]] = {"builders": [], "parsers": [], "runtimes": [], "contexts": []}
builds: list[dict[str, Any]] = []  # per build_serialized_network: what the builder config held
buffers: dict[int, Any] = {}  # data_ptr -> tensor: device memory, as the test's stand-in stream allocated it


def register(tensor: Any) -> Any:
    """Make `tensor` a buffer an execution context may be given (by its data_ptr())."""
    buffers[int(tensor.data_ptr())] = tensor
    return tensor


def logits_of(x: Any) -> Any:
    """What the stand-in engine computes for a (B, 3, H, W) batch: (B, 10) float32 that depend on every image."""
    import numpy as np

    flat = np.asarray(x, np.float64).reshape(len(x), -1)
    return (flat.mean(1)[:, None] * np.arange(1, 11) + flat.std(1)[:, None]).astype(np.float32)


class _Tensor:
    def __init__(self, name: str, shape: tuple[int, ...]) -> None:
        self.name, self.shape = name, shape


class _Network:
    num_outputs = 1

    @property
    def num_inputs(self) -> int:
        return len(NETWORK_INPUTS)

    def get_input(self, i: int) -> _Tensor | None:
        _require(i, int, "INetworkDefinition.get_input")
        return _Tensor(*NETWORK_INPUTS[i]) if 0 <= i < len(NETWORK_INPUTS) else None

    def get_output(self, i: int) -> _Tensor | None:
        _require(i, int, "INetworkDefinition.get_output")
        return _Tensor("logits", (-1, 10)) if 0 <= i < self.num_outputs else None


class _TimingCache:
    def __init__(self, data: bytes = b"") -> None:
        self.data = data

    def serialize(self) -> bytes:
        return b"timing-cache"


class _Config:
    def __init__(self) -> None:
        self.progress_monitor: Any = None
        self.profiling_verbosity = ProfilingVerbosity.LAYER_NAMES_ONLY
        self.builder_optimization_level = 3
        self.cleared: list[Any] = []
        self.pool_limits: dict[Any, int] = {}
        self.profiles: list[_Profile] = []
        self.timing_cache: _TimingCache | None = None

    def set_memory_pool_limit(self, pool: Any, size: int) -> None:
        self.pool_limits[pool] = size

    def clear_flag(self, flag: Any) -> None:
        self.cleared.append(flag)

    def add_optimization_profile(self, profile: _Profile) -> int:
        _require(profile, _Profile, "IBuilderConfig.add_optimization_profile")
        if PROFILE_REJECTED or not profile.valid():
            return -1  # TensorRT: an invalid profile is not added
        self.profiles.append(profile)
        return len(self.profiles) - 1

    def create_timing_cache(self, data: bytes) -> _TimingCache:
        memoryview(data)  # a py::buffer: TypeError for None or a str
        if data and TIMING_CACHE == "corrupt":
            raise RuntimeError("TimingCache: corrupted serialized cache")
        return _TimingCache(bytes(data))

    def set_timing_cache(self, cache: _TimingCache, ignore_mismatch: bool) -> bool:  # both required
        _require(cache, _TimingCache, "IBuilderConfig.set_timing_cache")
        if cache.data and TIMING_CACHE == "foreign" and not ignore_mismatch:
            return False
        self.timing_cache = cache
        return True

    def get_timing_cache(self) -> _TimingCache:
        assert self.timing_cache is not None, "get_timing_cache before set_timing_cache"
        return self.timing_cache


class _Profile:
    shapes: tuple[str, tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None = None

    def set_shape(self, name: str, mn: Any, op: Any, mx: Any) -> None:
        self.shapes = (name, tuple(mn), tuple(op), tuple(mx))

    def valid(self) -> bool:
        if self.shapes is None:
            return False
        _, mn, op, mx = self.shapes
        return len(mn) == len(op) == len(mx) and all(a <= b <= c for a, b, c in zip(mn, op, mx))


class _HostMemory:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self.nbytes = len(data)

    def __bytes__(self) -> bytes:
        return self._data


class Builder:
    def __init__(self, logger: ILogger) -> None:
        _require(logger, ILogger, "Builder.__init__")
        self.logger = logger
        created["builders"].append(self)

    def create_network(self, flags: int) -> _Network:
        assert flags == 1 << int(NetworkDefinitionCreationFlag.STRONGLY_TYPED)
        return _Network()

    def create_builder_config(self) -> _Config:
        self.config = _Config()
        return self.config

    def create_optimization_profile(self) -> _Profile:
        return _Profile()

    def build_serialized_network(self, network: _Network, config: _Config) -> _HostMemory | None:
        _require(network, _Network, "Builder.build_serialized_network")
        _require(config, _Config, "Builder.build_serialized_network")
        assert config.profiles, "a network with a dynamic batch axis needs an optimization profile"
        builds.append({"profile": config.profiles[0].shapes, "workspace": config.pool_limits.get(
            MemoryPoolType.WORKSPACE), "cleared": list(config.cleared), "timing_cache": config.timing_cache,
            "opt_level": config.builder_optimization_level})
        monitor = config.progress_monitor
        if on_build is not None:
            plan = on_build(self.logger, monitor)
            return None if plan is None else _HostMemory(plan)
        monitor.phase_start("Building engine", None, STEPS)
        for step in range(STEPS):
            if on_step is not None:
                on_step(step)
            if not monitor.step_complete("Building engine", step):  # the binding: False cancels the build
                monitor.phase_finish("Building engine")
                return None
        monitor.phase_finish("Building engine")
        return _HostMemory(PLAN)


class _ParserError:
    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


class OnnxParser:
    def __init__(self, network: _Network, logger: ILogger) -> None:
        _require(network, _Network, "OnnxParser.__init__")
        _require(logger, ILogger, "OnnxParser.__init__")
        self.logger = logger
        self.parsed: list[str] = []
        self.errors: list[str] = []
        created["parsers"].append(self)

    @property
    def num_errors(self) -> int:
        return len(self.errors)

    def parse_from_file(self, model: str) -> bool:
        _require(model, str, "OnnxParser.parse_from_file")
        self.parsed.append(model)
        self.errors = list(PARSE_ERRORS) if os.path.isfile(model) else [f"Failed to open file: {model}"]
        return PARSE_RESULT and not self.errors

    def get_error(self, i: int) -> _ParserError:
        return _ParserError(self.errors[i])


class _Context:
    def __init__(self) -> None:
        self.enqueued_on: list[int] = []
        self.addresses: dict[str, int] = {}
        self.input_shape: tuple[int, ...] | None = None
        created["contexts"].append(self)

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        mn, _, mx = ENGINE_PROFILE
        if name != "pixel_values" or len(shape) != 4 or not all(a <= b <= c for a, b, c in zip(mn, shape, mx)):
            return False  # outside the engine's profile: TensorRT refuses the shape
        self.input_shape = tuple(shape)
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        assert self.input_shape is not None, "get_tensor_shape before set_input_shape"
        if name == "pixel_values":
            return self.input_shape
        return (self.input_shape[0], 10 if name == "logits" else 16)  # any other output: (batch, 16) features

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        _require(name, str, "IExecutionContext.set_tensor_address")
        _require(ptr, int, "IExecutionContext.set_tensor_address")
        self.addresses[name] = ptr
        return True

    def execute_async_v3(self, stream_handle: int) -> bool:
        _require(stream_handle, int, "IExecutionContext.execute_async_v3")
        """Run on the registered buffers at the addresses given: False (TensorRT's failure) when one is not a
        buffer of the right shape, as a swapped or stale address would be."""
        import torch

        self.enqueued_on.append(stream_handle)
        x = buffers.get(self.addresses.get("pixel_values", -1))
        if x is None or self.input_shape is None or tuple(x.shape) != self.input_shape or \
                str(x.dtype) != _TORCH_DTYPES.get(ENGINE_TENSORS["pixel_values"][1]):
            return False
        logits = logits_of(x.float().numpy())
        for name, (mode, dtype) in ENGINE_TENSORS.items():  # every output needs a buffer of its shape and type
            if mode != 2:
                continue
            out = buffers.get(self.addresses.get(name, -1))
            if out is None or tuple(out.shape) != self.get_tensor_shape(name) or str(out.dtype) != \
                    _TORCH_DTYPES.get(dtype):
                return False  # no address, a swapped or stale one, or another type: garbage on a real GPU
            out.copy_(torch.from_numpy(logits if name == "logits" else logits[:, :1].repeat(16, axis=1)))
        return True


class _Inspector:
    def get_engine_information(self, fmt: Any) -> str:
        assert fmt == LayerInformationFormat.JSON
        return ENGINE_INFO


_TORCH_DTYPES = {DataType.FLOAT: "torch.float32", DataType.HALF: "torch.float16", DataType.BF16: "torch.bfloat16",
                 DataType.INT8: "torch.int8", DataType.INT32: "torch.int32", DataType.INT64: "torch.int64"}


class _Engine:
    num_profiles = 1

    @property
    def num_io_tensors(self) -> int:
        return len(ENGINE_TENSORS)

    def get_tensor_name(self, i: int) -> str:
        _require(i, int, "ICudaEngine.get_tensor_name")
        return list(ENGINE_TENSORS)[i]

    def _tensor(self, name: str) -> tuple[int, int]:
        _require(name, str, "ICudaEngine")
        if name not in ENGINE_TENSORS:
            raise RuntimeError(f"no tensor named {name!r} in the engine")  # TensorRT logs an error, returns junk
        return ENGINE_TENSORS[name]

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        return TensorIOMode(self._tensor(name)[0])

    def get_tensor_profile_shape(self, name: str, profile: int) -> tuple[tuple[int, ...], ...]:
        _require(profile, int, "ICudaEngine.get_tensor_profile_shape")
        if self._tensor(name)[0] != TensorIOMode.INPUT or not 0 <= profile < self.num_profiles:
            raise RuntimeError(f"no profile {profile} for {name!r}")
        return ENGINE_PROFILE

    def get_tensor_dtype(self, name: str) -> DataType:
        return DataType(self._tensor(name)[1])

    def create_execution_context(self) -> _Context | None:
        return None if NO_CONTEXT else _Context()

    def create_engine_inspector(self) -> _Inspector:
        return _Inspector()


class Runtime:
    def __init__(self, logger: ILogger) -> None:
        _require(logger, ILogger, "Runtime.__init__")
        self.logger = logger
        created["runtimes"].append(self)

    def deserialize_cuda_engine(self, plan: bytes) -> _Engine | None:
        memoryview(plan)  # a py::buffer
        if plan.startswith(b"bad"):
            self.logger.log(ILogger.Severity.ERROR, "Serialization assertion failed: magic tag mismatch")
            return None
        if DESERIALIZE_ERRORS:
            for e in DESERIALIZE_ERRORS:
                self.logger.log(ILogger.Severity.ERROR, e)
            return None
        return _Engine()


def install(monkeypatch: Any) -> types.ModuleType:
    """Make `import tensorrt` give this module (reset) and re-import trt_build against it; returns trt_build."""
    this = sys.modules[__name__]
    this.on_build = this.on_step = None
    this.PLAN, this.STEPS = b"fake-plan", 6
    this.ENGINE_INFO = '{"Layers": [], "Bindings": []}'
    this.PARSE_ERRORS, this.TIMING_CACHE, this.PARSE_RESULT, this.PROFILE_REJECTED = [], "ok", True, False
    this.NETWORK_INPUTS = [("pixel_values", (-1, 3, 32, 32))]
    this.ENGINE_TENSORS = {"pixel_values": (1, 0), "logits": (2, 0)}
    this.DESERIALIZE_ERRORS, this.NO_CONTEXT = [], False
    this.ENGINE_PROFILE = ((1, 3, 32, 32), (4, 3, 32, 32), (8, 3, 32, 32))
    for v in created.values():
        v.clear()
    builds.clear()
    buffers.clear()
    name = "vitexport.tensorrt_engine.trt_build"
    monkeypatch.setitem(sys.modules, "tensorrt", this)
    monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module(name)
    monkeypatch.setitem(sys.modules, name, module)  # gone again (or the earlier one back) after the test
    return module
