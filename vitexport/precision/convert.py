"""The two graph conversions: FP32 -> mixed FP16, and FP32 -> INT8 Q/DQ from calibration data."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import VitexportError
from ..paths import atomic_path
from .settings import DEFAULT_KEEP_FP32, Int8Settings

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
LINEAR_OPS = ("MatMul", "Gemm", "Conv")


def graph_precision(path: Path) -> str:
    """'int8' if the graph has Q/DQ nodes, 'fp16' if it computes in float16, else 'fp32'."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # protobuf's DecodeError, onnx's parse errors, OSError
        raise VitexportError(f"{path} is not a readable ONNX model.") from None
    ops = {n.op_type for n in model.graph.node}
    if ops & set(QDQ_OPS):
        return "int8"
    if any(init.data_type == onnx.TensorProto.FLOAT16 for init in model.graph.initializer) or \
            any(n.op_type == "Cast" and any(a.name == "to" and a.i == onnx.TensorProto.FLOAT16 for a in n.attribute)
                for n in model.graph.node):
        return "fp16"
    return "fp32"


def convert_fp16(src: Path, dst: Path, keep_fp32: tuple[str, ...] = DEFAULT_KEEP_FP32) -> None:
    """Mixed FP16 with FP32 inputs/outputs; ops in keep_fp32 stay FP32 (LayerNorm overflows in FP16)."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(src))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("onnxruntime.transformers.float16").setLevel(logging.ERROR)
        fp16 = convert_float_to_float16(model, keep_io_types=True, op_block_list=list(keep_fp32),
                                        disable_shape_infer=False)
    _drop_duplicate_nodes(fp16.graph)
    onnx.save_model(fp16, str(dst))


def _drop_duplicate_nodes(graph) -> None:
    """The converter inserts one Cast per consumer of a shared initializer, all with the same name and output
    (the exporter shares identical initializers, e.g. LayerNorm weights before training). Keep the first."""
    seen: set[tuple] = set()
    keep = []
    for node in graph.node:
        key = (node.name, node.op_type, tuple(node.input), tuple(node.output))
        if node.op_type == "Cast" and key in seen:
            continue
        seen.add(key)
        keep.append(node)
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)


class _Reader:
    """Feeds preprocessed inputs to ONNX Runtime's calibrator, ticking a progress callback.

    One sample per run: the histogram calibrators stack per-run outputs and fail on a short last batch.
    """

    def __init__(self, x: np.ndarray, input_name: str, batch: int, tick: Callable[[int], None] | None):
        self.x, self.name, self.batch, self.tick = x, input_name, batch, tick
        self.i = 0

    def get_next(self):
        if self.i >= len(self.x):
            return None
        chunk = self.x[self.i:self.i + self.batch]
        self.i += len(chunk)
        if self.tick:
            self.tick(len(chunk))
        return {self.name: chunk}

    def __len__(self) -> int:
        return (len(self.x) + self.batch - 1) // self.batch

    def rewind(self) -> None:
        self.i = 0


def nodes_to_exclude(model_path: Path, settings: Int8Settings) -> list[str]:
    """Resolve --exclude-node / --exclude-block to node names of the graph; unknown names are an error."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    names = [n.name for n in graph.node]
    out = []
    if not settings.quantize_attention:
        # onnxruntime's QDQ quantizer ignores its MatMulConstBOnly option, so the attention products
        # (Q.K^T and A.V: MatMuls whose B is an activation) are kept in float here, by name
        constants = {i.name for i in graph.initializer} | {o for n in graph.node if n.op_type == "Constant"
                                                           for o in n.output}
        out += [n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] not in constants]
    for name in settings.exclude_nodes:
        if name not in names:
            close = [n for n in names if name in n][:3]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise VitexportError(f"No node named {name!r} in the graph{hint}.")
        out.append(name)
    for b in settings.exclude_blocks:
        block = [n for n in names if n.startswith(f"blocks.{b}.") or n.startswith(f"blocks.{b}/")]
        if not block:
            raise VitexportError(f"The graph has no block {b}.")
        out += block
    return sorted(set(out))


def quantize_int8(src: Path, dst: Path, x: np.ndarray, input_name: str, settings: Int8Settings,
                  cache_file: Path, tick: Callable[[int], None] | None = None) -> bool:
    """Symmetric per-channel INT8 Q/DQ (TensorRT-compatible). Returns True if the calibration cache was reused."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
              "percentile": CalibrationMethod.Percentile}[settings.method]
    if cache_file.is_file():
        try:
            json.loads(cache_file.read_text())
        except (OSError, ValueError):
            cache_file.unlink()  # damaged (e.g. an interrupted write): calibrate again
    reused = cache_file.is_file()
    exclude = nodes_to_exclude(src, settings)
    with tempfile.TemporaryDirectory(prefix="vitexport-quant-") as tmp:
        pre = Path(tmp) / "pre.onnx"
        logging.getLogger().setLevel(logging.ERROR)
        # shape inference only: ORT's graph optimizations could fuse into contrib ops TensorRT cannot parse
        quant_pre_process(str(src), str(pre), skip_optimization=True, skip_symbolic_shape=False)
        extra = {
            "ActivationSymmetric": True,  # TensorRT: zero points must be 0
            "WeightSymmetric": True,
            "MatMulConstBOnly": not settings.quantize_attention,  # honoured by QOperator only: see nodes_to_exclude
            "QuantizeBias": False,
            "DedicatedQDQPair": False,
            "ForceQuantizeNoInputCheck": False,
            "CalibTensorRangeSymmetric": True,
            "CalibPercentile": settings.percentile,
        }
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        # onnxruntime writes a new cache in place; let it write a temporary file, renamed when complete
        cache_arg = cache_file if reused else Path(tmp) / "calibration.json"
        # onnxruntime prints calibration chatter on stdout, which belongs to our results
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            quantize_static(
                str(pre), str(dst), _Reader(x, input_name, 1, tick),
                quant_format=QuantFormat.QDQ, op_types_to_quantize=list(LINEAR_OPS), per_channel=True,
                reduce_range=False, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                nodes_to_exclude=exclude, calibrate_method=method, extra_options=extra,
                calibration_cache_path=str(cache_arg),
            )
        if not reused:  # copy beside the cache (same file system), then rename: never a half-written cache
            with atomic_path(cache_file) as staged:
                shutil.copyfile(cache_arg, staged)
    return reused


def qdq_summary(path: Path) -> dict:
    """Counts and invariants of a Q/DQ model: zero points, per-channel weights."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    q = [n for n in model.graph.node if n.op_type in QDQ_OPS]
    nonzero, per_channel_weights, per_tensor_weights = 0, 0, 0
    for n in q:
        if len(n.input) > 2 and n.input[2] in inits:
            if np.any(numpy_helper.to_array(inits[n.input[2]]) != 0):
                nonzero += 1
        if n.op_type == "DequantizeLinear" and n.input[0] in inits:  # a weight's DequantizeLinear
            scale = numpy_helper.to_array(inits[n.input[1]])
            if scale.ndim == 1 and scale.size > 1:
                per_channel_weights += 1
            else:
                per_tensor_weights += 1
    quantized = sum(1 for n in model.graph.node if n.op_type in LINEAR_OPS
                    and any(i.endswith("_DequantizeLinear_Output") for i in n.input))
    return {"qdq_nodes": len(q), "nonzero_zero_points": nonzero, "per_channel_weights": per_channel_weights,
            "per_tensor_weights": per_tensor_weights, "quantized_linear_ops": quantized}
