"""TensorRT runner: a plan built by `vitexport trt`, run on its own CUDA stream with torch tensors as buffers.

load() refuses, with the reason, before TensorRT sees the plan: no TensorRT / no GPU, a missing or unreadable
sidecar, a plan built with another TensorRT version or for another compute capability, or a plan whose bytes
are not the ones its sidecar describes. Device memory is plain torch CUDA tensors (no pycuda). Copies, the enqueue
and the timing all happen on one dedicated stream (cuda_stream.CudaStream); TensorRT messages go through the
process's one logger (tensorrt_engine.trt_build.LOGGER), and a failed load names the errors logged during it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..artifacts.folder import ModelFolder, onnx_digest, precision_from_plan_name, sidecar_for
from ..artifacts.sidecar import check_compatibility, read_sidecar, rebuild_command
from ..errors import BackendUnavailable, VitexportError
from ..tensorrt_engine.engine_info import EngineLayers, parse_engine_information
from ..tensorrt_engine.events import MESSAGES
from ..tensorrt_engine.options import EngineUnavailable, check_batch, check_image_shape
from ..tensorrt_engine.probe import current_env, require_trt_and_gpu
from .base import Runner
from .cuda_stream import CudaStream

if TYPE_CHECKING:
    import tensorrt as trt


class TensorRTRunner(Runner):
    backend = "tensorrt"
    device = "cuda"
    provider = ""

    def __init__(self, plan_path: Path | str, precision: str | None = None, output_name: str | None = None) -> None:
        super().__init__()
        self.output_name = output_name  # the output judged, of an engine with several (model.outputs)
        self.plan_path = Path(plan_path)
        self.sidecar_path = sidecar_for(self.plan_path)
        self.precision = precision or precision_from_plan_name(self.plan_path) or "fp32"
        self.warnings: list[str] = []
        self._runtime: trt.Runtime | None = None
        self._engine: trt.ICudaEngine | None = None
        self._context: trt.IExecutionContext | None = None
        self._input = ""
        self._output = ""
        self._outputs: list[str] = []  # every output: each needs an address to run
        self._batch_range = (1, 1)
        self._chw: tuple[int, ...] = ()  # the smallest (C, H, W) the engine takes
        self._chw_max: tuple[int, ...] = ()  # the largest: the same but for a dynamic-size engine
        self._in_dtype: Any = None
        self._out_dtypes: dict[str, Any] = {}
        self._out_buffers: dict[tuple[str, tuple[int, ...]], Any] = {}
        self._bound_batch = 0  # the batch _bind() set up last (for _execute's message)
        self._stream: Any = None  # a CudaStream, made by load()
        self._source: Path | None = None  # the ONNX the plan was built from (its sidecar says which)

    # -- lifecycle --------------------------------------------------------------------------------------
    def _check_plan(self, version: str, gpu: dict[str, Any]) -> bytes:
        """The plan's bytes, once its sidecar says it was built for this TensorRT and this GPU."""
        rebuild = rebuild_command(self.precision, self.plan_path.parent)
        if not self.plan_path.is_file():
            raise BackendUnavailable(f"{self.plan_path} does not exist; build it with `{rebuild}`.")
        try:
            sidecar = read_sidecar(self.sidecar_path)
        except VitexportError as e:
            raise BackendUnavailable(str(e)) from None
        compat = check_compatibility(sidecar, current_env(version, gpu), self.plan_path.parent)
        if not compat.ok:
            raise BackendUnavailable(compat.message)
        source = self._source = self._source_onnx(sidecar)
        if source.is_file() and sidecar.get("source_onnx_sha256") not in (None, onnx_digest(source)):
            raise BackendUnavailable(f"{self.plan_path.name} was built from an earlier {source.name}; rebuild it "
                                     f"with `{rebuild}`.")
        if compat.message:  # another GPU of the same compute capability: runs, tuned for the other one
            self.warnings.append(compat.message)
            self.info["compatibility"] = compat.message
        plan = self.plan_path.read_bytes()
        if hashlib.sha256(plan).hexdigest() != sidecar["plan_sha256"]:
            raise BackendUnavailable(f"{self.plan_path.name} is not the plan its sidecar {self.sidecar_path.name} "
                                     f"describes (sha256 differs); rebuild with `{rebuild}`.")
        self.precision = str(sidecar.get("precision", self.precision))
        self.info.update({"plan": str(self.plan_path), "plan_sha256": sidecar["plan_sha256"],
                          "tensorrt": version, "gpu": gpu.get("name"),
                          "compute_capability": gpu.get("compute_capability"),
                          "profile": sidecar.get("profile"), "source_onnx_sha256": sidecar.get("source_onnx_sha256")})
        return plan

    def _source_onnx(self, sidecar: dict[str, Any]) -> Path:
        """The ONNX the plan was built from, as its sidecar names it (else the folder's source for the precision)."""
        name, folder = sidecar.get("source_onnx"), ModelFolder(self.plan_path.parent)
        return folder.member(name, self.sidecar_path.name) if name else folder.plan_source(self.precision)

    def _load(self) -> None:
        try:
            version, gpu = require_trt_and_gpu()
        except EngineUnavailable as e:
            raise BackendUnavailable(str(e), e.exit_code) from None
        plan = self._check_plan(version, gpu)

        import tensorrt as trt
        import torch

        from ..tensorrt_engine.trt_build import LOGGER

        torch_dtypes = {trt.DataType.FLOAT: torch.float32, trt.DataType.HALF: torch.float16,
                        trt.DataType.BF16: torch.bfloat16, trt.DataType.INT8: torch.int8,
                        trt.DataType.INT32: torch.int32, trt.DataType.INT64: torch.int64}
        with MESSAGES.session() as messages:  # the errors of this load, not of an earlier build or load
            runtime = trt.Runtime(LOGGER)
            engine = runtime.deserialize_cuda_engine(plan)
        if messages.failure is not None:
            raise messages.failure  # a Ctrl-C that arrived in TensorRT's log callback
        if engine is None:
            why = "; ".join(e.strip() for e in messages.errors) or "it logged no error"
            raise BackendUnavailable(f"TensorRT could not deserialize {self.plan_path.name} ({why}); rebuild with "
                                     f"`{rebuild_command(self.precision, self.plan_path.parent)}`.")
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        want = self.output_name if self.output_name else outputs[0] if len(outputs) == 1 else None
        if len(inputs) != 1 or not outputs or want not in outputs:
            raise BackendUnavailable(
                f"{self.plan_path.name} has inputs {inputs} and outputs {outputs}; a ViT engine has one image input "
                + (f"and the output {self.output_name!r}." if self.output_name else
                   "and one output (or several, and the name of the one judged)."))
        self._input, self._output, self._outputs = inputs[0], want, outputs
        mn, _opt, mx = engine.get_tensor_profile_shape(self._input, 0)
        self._batch_range = (int(mn[0]), int(mx[0]))
        self.batch_range = self._batch_range
        self._chw = tuple(int(mn[i]) for i in range(1, len(mn)))
        self._chw_max = tuple(int(mx[i]) for i in range(1, len(mx)))
        in_dt, out_dts = engine.get_tensor_dtype(self._input), [engine.get_tensor_dtype(o) for o in outputs]
        out_dt = out_dts[outputs.index(self._output)]
        if in_dt not in torch_dtypes or any(d not in torch_dtypes for d in out_dts):
            raise BackendUnavailable(f"{self.plan_path.name} has I/O types {in_dt} / {', '.join(map(str, out_dts))}, "
                                     f"which this runner cannot bind.")
        self._in_dtype = torch_dtypes[in_dt]
        self._out_dtypes = {o: torch_dtypes[d] for o, d in zip(outputs, out_dts)}
        context = engine.create_execution_context()
        if context is None:
            raise BackendUnavailable(f"TensorRT could not create an execution context for {self.plan_path.name} "
                                     f"(out of GPU memory?).")
        self._runtime, self._engine, self._context = runtime, engine, context
        self._stream = CudaStream()
        self.info.update({"input": self._input, "output": self._output, "batch_range": list(self._batch_range),
                          "io_dtypes": [str(in_dt), str(out_dt)], "timer": "CUDA events on the runner's stream",
                          **({} if self._chw == self._chw_max else
                             {"image_range": [list(self._chw[1:]), list(self._chw_max[1:])]}),
                          **self._inspected()})
        self.warnings += [f"{self.plan_path.name}: {p}" for p in self.info["engine_problems"]]

    def engine_layers(self) -> EngineLayers:
        """Each layer's kind and precision, from the engine inspector (plans are built with DETAILED verbosity)."""
        import tensorrt as trt

        if self._engine is None:
            raise BackendUnavailable(f"{self.name} is not loaded.")
        inspector = self._engine.create_engine_inspector()
        return parse_engine_information(inspector.get_engine_information(trt.LayerInformationFormat.JSON))

    def engine_problems(self, layers: EngineLayers | None = None) -> list[str]:
        """Why the engine does not run as the ONNX it was built from asks (engine_info.engine_problems: an FP32
        GEMM, a quantized GEMM that fell back, an attention site left unfused); empty when it does. An FP32 plan
        is asked for nothing but its layers being readable. `layers`: the engine's, when already read."""
        from ..tensorrt_engine.engine_info import engine_problems
        from ..tensorrt_engine.fusion import plan_expectations

        if layers is None:
            try:
                layers = self.engine_layers()
            except VitexportError as e:
                return [str(e)]
        if self.precision == "fp32":
            return []
        if self._source is None or not self._source.is_file():
            return [f"the ONNX it was built from ({self._source.name if self._source else '?'}) is not beside it, "
                    f"so its layers cannot be checked against that graph"]
        quantized, sites = plan_expectations(self._source)
        return engine_problems(layers, self.precision, quantized, sites)

    def _inspected(self) -> dict[str, Any]:
        """The load's report of the engine's layers, read from the inspector once: their summary
        (`layer_precisions`) and the check against the source graph (`engine_problems`)."""
        try:
            layers = self.engine_layers()
        except VitexportError as e:  # an older plan, or an inspector layout this version cannot read
            return {"layer_precisions": f"unreadable: {e}", "engine_problems": [str(e)]}
        return {"layer_precisions": layers.summary(), "engine_problems": self.engine_problems(layers)}

    def _close(self) -> None:
        self._out_buffers.clear()
        self._context = self._engine = self._runtime = None
        self._stream = None

    # -- inference --------------------------------------------------------------------------------------
    def stage(self, x: np.ndarray) -> Any:
        stream = self._live_stream()  # first: before load() the batch range and image shape are not known
        check_batch(int(x.shape[0]), *self._batch_range, self.plan_path.name)
        check_image_shape(tuple(int(d) for d in x.shape[1:]), self._chw, self._chw_max, self.plan_path.name)
        return stream.upload(x, self._in_dtype)

    def _live_stream(self) -> Any:
        if self._stream is None or self._context is None:
            raise BackendUnavailable(f"{self.name} is not loaded.")
        return self._stream

    def _bind(self, staged: Any) -> Any:
        """Set the input shape and both addresses for one inference of `staged`; its output buffer (one per shape,
        reused). Host-side calls only: nothing is queued on the stream."""
        stream, context = self._live_stream(), self._context
        assert context is not None
        shape = tuple(int(d) for d in staged.shape)
        check_batch(shape[0], *self._batch_range, self.plan_path.name)
        if not context.set_input_shape(self._input, shape):
            raise VitexportError(f"TensorRT rejected the input shape {shape} for {self.plan_path.name}.")
        context.set_tensor_address(self._input, int(staged.data_ptr()))
        for name in self._outputs:  # every output gets an address (its buffer one per shape, reused)
            dims = context.get_tensor_shape(name)
            key = (name, tuple(int(dims[i]) for i in range(len(dims))))
            buf = self._out_buffers.get(key)
            if buf is None:
                buf = self._out_buffers[key] = stream.empty(key[1], self._out_dtypes[name])
            context.set_tensor_address(name, int(buf.data_ptr()))
            if name == self._output:
                out = buf
        self._bound_batch = shape[0]
        return out

    def _execute(self) -> None:
        """Queue the bound inference on the runner's stream."""
        stream, context = self._live_stream(), self._context
        assert context is not None
        if not context.execute_async_v3(stream.handle):
            raise VitexportError(f"TensorRT failed to run {self.plan_path.name} at batch {self._bound_batch}.")

    def run(self, staged: Any) -> Any:
        out = self._bind(staged)
        self._execute()
        self._live_stream().synchronize()
        return out  # a buffer reused by the next run() of this shape: fetch() copies it out

    def timed_run(self, staged: Any) -> float:
        """Milliseconds between CUDA events recorded on the runner's stream around the queued inference alone: the
        shape and addresses are set before the start event."""
        self._bind(staged)
        return self._live_stream().timed(self._execute)

    def fetch(self, out: Any) -> np.ndarray:
        return self._live_stream().download(out)

    def synchronize(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()
