"""OpenVINO on the CPU: the ONNX files vitexport writes (or an OpenVINO IR made from them), read as they are.

The inference precision is a compile option of OpenVINO's CPU plugin, not a property of the file: the FP32
ONNX runs with the `f32` hint (`openvino cpu fp32`) or the `bf16` hint (`openvino cpu bf16`, only on CPUs that
OpenVINO says have BF16 or AMX). The INT8 Q/DQ ONNX (`openvino cpu int8`) runs its quantized GEMMs in INT8 and
the rest in bf16 where the CPU has BF16 (measured fastest there: docs/BENCHMARKS.md), else in f32, and in f32
where the bf16 plan leaves a quantization step unfused after a RoPE kernel (`bf16_unfuses_quantization`); its
parity is judged by the INT8 thresholds either way. The hint is always set: on a CPU with BF16, OpenVINO's
default is bf16, which would make an "fp32" row bf16.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..environment import openvino_cpu
from ..errors import BackendUnavailable
from .base import Runner

INSTALL_COMMAND = "pip install openvino"
HINTS = {"f32": "fp32", "bf16": "bf16"}  # OpenVINO's INFERENCE_PRECISION_HINT value -> our precision name
DEFAULT_HINT = {"fp32": "f32", "bf16": "bf16", "fp16": "f32", "int8": None}  # per row; None: bf16 if the CPU has it


def import_openvino() -> Any:
    """The openvino module, or BackendUnavailable with the install line."""
    try:
        import openvino
    except Exception as e:  # ImportError, or OSError from a broken install's shared libraries
        raise BackendUnavailable(f"openvino is not importable ({e.__class__.__name__}); install it with "
                                 f"`{INSTALL_COMMAND}`") from None
    return openvino


def cpu_capabilities(core: Any = None) -> list[str]:
    """What OpenVINO's CPU plugin reports it can do here: 'FP32', 'BF16', 'INT8', ... ([] without openvino)."""
    ov = openvino_cpu(core)
    return [] if ov is None else ov["cpu_capabilities"]


def has_bf16(capabilities: list[str]) -> bool:
    """BF16 arithmetic in hardware (AVX512_BF16 or AMX), as OpenVINO reports it."""
    return any(c.upper() == "BF16" or "AMX" in c.upper() for c in capabilities)


def bf16_unfuses_quantization(compiled: Any) -> bool:
    """Whether OpenVINO's compiled plan converts a RoPE kernel's bf16 output back to f32 for a quantization step.

    OpenVINO's RoPE kernel takes no quantization after it: with bf16 for the float layers, the rotated query and key
    of a graph whose attention products are INT8 each pay a bf16 -> f32 Reorder and an unfused FakeQuantize, and the
    graph runs slower than with f32 (DINOv3-S/16 at 256, batch 8: 243 ms against 187 ms; docs/BENCHMARKS.md). Read
    from the plan itself, so a plugin that fuses them keeps bf16."""
    def layer(node: Any) -> str:
        info = node.get_rt_info()
        return info["layerType"].astype(str) if "layerType" in info else ""

    for op in compiled.get_runtime_model().get_ops():
        if layer(op) == "FakeQuantize" and op.get_input_size():
            src = op.input_value(0).get_node()
            if layer(src) == "Reorder" and src.get_input_size() and layer(src.input_value(0).get_node()) == "RoPE":
                return True
    return False


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    # OpenVINO's messages carry "Exception from <file>:<line>" and "Check '...' failed at ..." lines around the reason
    lines = [ln.strip() for ln in text.splitlines()
             if ln.strip() and not ln.lstrip().startswith(("Check ", "Exception from "))]
    return (lines[-1] if lines else type(e).__name__)[:300]


class OpenVinoRunner(Runner):
    backend = "openvino"
    device = "cpu"

    def __init__(self, path: Path | str, precision: str, threads: int | None = None, hint: str | None = None,
                 input_name: str = "pixel_values", output_name: str = "logits") -> None:
        super().__init__()
        self.path, self.precision, self.threads = Path(path), precision, threads
        self.hint = hint or DEFAULT_HINT[precision]  # 'f32' | 'bf16' | None: decided by load()
        if self.hint is not None and self.hint not in HINTS:
            raise ValueError(f"unknown OpenVINO inference precision {self.hint!r}")
        self.provider = f"CPU plugin, {self.hint or 'bf16 or f32'} inference precision"
        self.input_name, self.output_name = input_name, output_name
        self._request: Any = None
        self._output: Any = None

    def _load(self) -> None:
        ov = import_openvino()
        if not self.path.is_file():
            raise BackendUnavailable(f"{self.path.name} does not exist")
        core = ov.Core()
        caps = cpu_capabilities(core)
        if self.hint == "bf16" and not has_bf16(caps):
            raise BackendUnavailable(f"this CPU has no BF16 arithmetic (OpenVINO reports {', '.join(caps) or 'nothing'})")
        hint = self.hint or ("bf16" if has_bf16(caps) else "f32")
        self.provider = f"CPU plugin, {hint} inference precision"
        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY"}
        if self.threads:
            config["INFERENCE_NUM_THREADS"] = int(self.threads)
        try:
            model = core.read_model(str(self.path))
            compiled = core.compile_model(model, "CPU", config)
            if self.hint is None and hint == "bf16" and bf16_unfuses_quantization(compiled):
                hint = config["INFERENCE_PRECISION_HINT"] = "f32"
                self.provider = f"CPU plugin, {hint} inference precision (bf16 leaves RoPE's quantization unfused)"
                compiled = core.compile_model(model, "CPU", config)
        except Exception as e:  # OpenVINO raises RuntimeError (and its own subclasses) for unreadable models
            raise BackendUnavailable(f"OpenVINO could not load {self.path.name}: {first_line(e)}") from None
        self._input = _port(compiled.inputs, self.input_name, self.path)
        self._output = _port(compiled.outputs, self.output_name, self.path)
        self._request = compiled.create_infer_request()
        self.info = {"openvino": ov.__version__, "file": self.path.name,
                     "inference_precision": _type_name(compiled.get_property("INFERENCE_PRECISION_HINT")),
                     "performance_hint": str(compiled.get_property("PERFORMANCE_HINT")),
                     "threads": int(compiled.get_property("INFERENCE_NUM_THREADS")),
                     "cpu_capabilities": caps}

    def _close(self) -> None:
        self._request, self._output = None, None

    def run(self, staged: Any) -> Any:
        # share_inputs: OpenVINO reads the caller's contiguous float32 batch in place; outputs are copied,
        # so two results never alias one buffer
        return self._request.infer({self._input: staged}, share_inputs=True)[self._output]


def _type_name(t: Any) -> str:
    """OpenVINO's element type as it spells it in options ('f32', 'bf16')."""
    return t.to_string() if hasattr(t, "to_string") else str(t)


def _port(ports: list[Any], name: str, path: Path) -> Any:
    """The model's input/output of that name; its only one when the name differs (an IR saved by other tools)."""
    for port in ports:
        if name in port.get_names():
            return port
    if len(ports) == 1:
        return ports[0]
    have = ", ".join(sorted(n for p in ports for n in p.get_names()))
    raise BackendUnavailable(f"{path.name} has no tensor named {name!r} (it has {have})")
