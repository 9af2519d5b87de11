"""A stand-in `tensorrt` module: just the names vitexport calls, checking and recording what it is given.

Injected into sys.modules by tests (`install(monkeypatch)`), so trt_build and the TensorRT runner run on a machine
without TensorRT. It mirrors the Python API's shape (names as in TensorRT 10.12/11.1 python/src/infer/pyCore.cpp),
and enough of its behaviour that a wrong call shows:

- the build calls the progress monitor for `STEPS` steps and returns `PLAN` (or what `on_build` returns), and
  records each build's profile, workspace limit, cleared flags and timing cache in `builds`; a profile whose
  min <= opt <= max does not hold is refused as TensorRT refuses it (add_optimization_profile returns -1);
- the parser fails with `PARSE_ERRORS` when a test sets them; `TIMING_CACHE` = 'corrupt' makes reading a cache
  raise, 'foreign' makes the builder reject it, as TensorRT does for another GPU or version;
- an execution context runs only on buffers a test registered (`register(tensor)`, as its stand-in CUDA stream
  allocates them) of the shapes the engine expects at the input and output addresses, and writes
  `logits_of(input)` into the output buffer: swapped or stale addresses fail instead of passing unnoticed.
"""

from __future__ import annotations

import enum
import importlib
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


class ILogger:
    Severity = _Severity

    def __init__(self) -> None:
        pass


class IProgressMonitor:
    def __init__(self) -> None:
        pass


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
    BF16 = 7
    INT64 = 9


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
    num_inputs = 1
    num_outputs = 1

    def get_input(self, i: int) -> _Tensor:
        return _Tensor("pixel_values", (-1, 3, 32, 32))

    def get_output(self, i: int) -> _Tensor:
        return _Tensor("logits", (-1, 10))


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
        if not profile.valid():
            return -1  # TensorRT: an invalid profile is not added
        self.profiles.append(profile)
        return len(self.profiles) - 1

    def create_timing_cache(self, data: bytes) -> _TimingCache:
        if data and TIMING_CACHE == "corrupt":
            raise RuntimeError("TimingCache: corrupted serialized cache")
        return _TimingCache(bytes(data))

    def set_timing_cache(self, cache: _TimingCache, ignore_mismatch: bool = False) -> bool:
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
        self.logger = logger
        created["parsers"].append(self)

    @property
    def num_errors(self) -> int:
        return len(PARSE_ERRORS)

    def parse_from_file(self, path: str) -> bool:
        return not PARSE_ERRORS

    def get_error(self, i: int) -> _ParserError:
        return _ParserError(PARSE_ERRORS[i])


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
        return (self.input_shape[0], 10) if name == "logits" else self.input_shape

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        self.addresses[name] = ptr
        return True

    def execute_async_v3(self, stream_handle: int) -> bool:
        """Run on the registered buffers at the addresses given: False (TensorRT's failure) when one is not a
        buffer of the right shape, as a swapped or stale address would be."""
        import torch

        self.enqueued_on.append(stream_handle)
        x, out = buffers.get(self.addresses.get("pixel_values", -1)), buffers.get(self.addresses.get("logits", -1))
        if x is None or out is None or self.input_shape is None or tuple(x.shape) != self.input_shape or \
                tuple(out.shape) != (self.input_shape[0], 10):
            return False
        out.copy_(torch.from_numpy(logits_of(x.float().numpy())))
        return True


class _Inspector:
    def get_engine_information(self, fmt: Any) -> str:
        assert fmt == LayerInformationFormat.JSON
        return ENGINE_INFO


class _Engine:
    num_io_tensors = 2

    def get_tensor_name(self, i: int) -> str:
        return ("pixel_values", "logits")[i]

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        return TensorIOMode.INPUT if name == "pixel_values" else TensorIOMode.OUTPUT

    def get_tensor_profile_shape(self, name: str, profile: int) -> tuple[tuple[int, ...], ...]:
        return ENGINE_PROFILE

    def get_tensor_dtype(self, name: str) -> DataType:
        return DataType.FLOAT

    def create_execution_context(self) -> _Context:
        return _Context()

    def create_engine_inspector(self) -> _Inspector:
        return _Inspector()


class Runtime:
    def __init__(self, logger: ILogger) -> None:
        self.logger = logger
        created["runtimes"].append(self)

    def deserialize_cuda_engine(self, plan: bytes) -> _Engine | None:
        if plan.startswith(b"bad"):
            self.logger.log(ILogger.Severity.ERROR, "Serialization assertion failed: magic tag mismatch")
            return None
        return _Engine()


def install(monkeypatch: Any) -> types.ModuleType:
    """Make `import tensorrt` give this module (reset) and re-import trt_build against it; returns trt_build."""
    this = sys.modules[__name__]
    this.on_build = this.on_step = None
    this.PLAN, this.STEPS = b"fake-plan", 6
    this.ENGINE_INFO = '{"Layers": [], "Bindings": []}'
    this.PARSE_ERRORS, this.TIMING_CACHE = [], "ok"
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
