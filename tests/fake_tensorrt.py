"""A stand-in `tensorrt` module: just the names vitexport calls, recording what it is given.

Injected into sys.modules by tests (`install(monkeypatch)`), so trt_build and the TensorRT runner run on a machine
without TensorRT. It mirrors the Python API's shape (names as in TensorRT 10.12/11.1 python/src/infer/pyCore.cpp),
not its behaviour: the build calls the progress monitor for `STEPS` steps and returns `PLAN`, or what `on_build`
returns.
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
created: dict[str, list[Any]] = {"builders": [], "parsers": [], "runtimes": [], "contexts": []}


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
    def serialize(self) -> bytes:
        return b"timing-cache"


class _Config:
    def __init__(self) -> None:
        self.progress_monitor: Any = None
        self.profiling_verbosity = ProfilingVerbosity.LAYER_NAMES_ONLY
        self.builder_optimization_level = 3
        self.cleared: list[Any] = []

    def set_memory_pool_limit(self, pool: Any, size: int) -> None:
        pass

    def clear_flag(self, flag: Any) -> None:
        self.cleared.append(flag)

    def add_optimization_profile(self, profile: Any) -> int:
        return 0

    def create_timing_cache(self, data: bytes) -> _TimingCache:
        return _TimingCache()

    def set_timing_cache(self, cache: Any, ignore_mismatch: bool = False) -> bool:
        return True

    def get_timing_cache(self) -> _TimingCache:
        return _TimingCache()


class _Profile:
    def set_shape(self, name: str, mn: Any, op: Any, mx: Any) -> None:
        self.shapes = (name, mn, op, mx)


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


class OnnxParser:
    num_errors = 0

    def __init__(self, network: _Network, logger: ILogger) -> None:
        self.logger = logger
        created["parsers"].append(self)

    def parse_from_file(self, path: str) -> bool:
        return True

    def get_error(self, i: int) -> str:
        return ""


class _Context:
    def __init__(self) -> None:
        self.enqueued_on: list[int] = []
        self.addresses: dict[str, int] = {}
        self.batch = 1
        created["contexts"].append(self)

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        self.batch = shape[0]
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return (self.batch, 10)

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        self.addresses[name] = ptr
        return True

    def execute_async_v3(self, stream_handle: int) -> bool:
        self.enqueued_on.append(stream_handle)
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
        return (1, 3, 32, 32), (4, 3, 32, 32), (8, 3, 32, 32)

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
    for v in created.values():
        v.clear()
    name = "vitexport.tensorrt_engine.trt_build"
    monkeypatch.setitem(sys.modules, "tensorrt", this)
    monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module(name)
    monkeypatch.setitem(sys.modules, name, module)  # gone again (or the earlier one back) after the test
    return module
