"""INT8 Q/DQ graphs: the two INT8 files written from one calibration (`selection.py` picks the GEMMs).

Both put Q/DQ only on the *inputs* of the weight GEMMs (activations per tensor, weights per output channel,
symmetric, zero point 0), never on their outputs; the logits, LayerNorm, Softmax, the attention products (by
default) and matrix-vector products (the head) stay unquantized. They differ in what lies between the GEMMs
and in the weights' range:

- ``model.int8.onnx`` (CPU runtimes): FP32 between the INT8 GEMMs, weights in [-127, 127] or [-63, 63]
  (`CPU_WEIGHT_MAX`, 7 bits). x86 CPUs without VNNI multiply u8 x s8 pairs with VPMADDUBSW, whose int16 sum of two
  products saturates above 32767; with 8-bit weights (2 x 255 x 127) a ViT's logits came out far off (digits: min
  cosine 0.92 on ONNX Runtime, 0.42 on OpenVINO, against 0.99 with exact INT8 math). Seven-bit weights
  (2 x 255 x 63 = 32130) cannot saturate, so that file is right on every CPU (ONNX Runtime's `reduce_range`, NNCF's
  overflow fix); but the lost bit costs a ViT-B/16 a quarter of its INT8 error (min cosine 0.9974 against 0.9989).
  CPUs with VNNI or AMX sum in int32, exactly: made on one, the graph has 8-bit weights (int8.cpu_weight_max,
  `--weight-bits`), and a CPU that would saturate them takes it as stale (artifacts/verify.py) and makes its own.
- ``model.int8.trt.onnx`` (TensorRT): the placement NVIDIA's ModelOpt uses for TensorRT, full [-127, 127]
  weights (TensorRT's INT8 kernels accumulate in int32); every other op runs in FP16 with FP16 scales (opset
  19), so under strong typing TensorRT fuses the DequantizeLinear into the GEMM and keeps the rest in FP16.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import ml_dtypes
import numpy as np

from ..artifacts.folder import CPU_INT8_WEIGHT_MAX
from ..errors import VitexportError, first_line
from ..tensorrt_engine.fusion import LINEAR_OPS, constant_names
from .convert import (fp32_weights, inferred_types, load_weights, save_checked, to_fp16, topological_sort,
                      with_inferred_types)
from .graphs import read_graph, take_graph
from .selection import GemmSelection

TRT_INT8_OPSET = 19  # FP16 scales in QuantizeLinear/DequantizeLinear need opset 19
# FP8: from 21 on, Reshape/Squeeze/Transpose take FP8 tensors, which ONNX Runtime's Q/DQ propagation makes when it
# moves a Q above them (at 19 it then rejects its own graph); ModelOpt's FP8 graphs are opset 21 too
FP8_OPSET = 21
# ops whose meaning changed from 19 to 21 (DFT-20 takes its axis as an input, GridSample-20 renamed its modes): a
# graph with one goes through onnx's converter instead of having its opset number raised
CHANGED_BY_21 = ("DFT", "GridSample")
BUMPABLE_FROM = 18  # from this opset on the number is raised to 19 in place; below, onnx's converter converts
INT8_MAX = 127  # symmetric: [-127, 127], so -x quantizes to -q (TensorRT's convention)
CPU_WEIGHT_MAX = CPU_INT8_WEIGHT_MAX  # 7-bit weights, whose VPMADDUBSW pair sums cannot saturate (any CPU)
MIN_SCALE = 2.0 ** -14  # smallest normal FP16: a zero range still gets a representable scale
FP8_MAX = 448.0  # the largest finite FLOAT8E4M3FN


@dataclass(frozen=True)
class QFormat:
    """The element type a Q/DQ pair quantizes to: symmetric, zero point 0, scale = amax / qmax."""

    name: str  # 'int8' | 'fp8': names the initializers it writes
    qmax: float  # the largest magnitude it represents
    zero_dtype: Any  # the numpy type of its zero points and quantized weights

    def quantize(self, x: np.ndarray, qmax: float | None = None) -> np.ndarray:
        """x already divided by its scale -> the stored values: INT8 rounds to the nearest integer, FP8 to the
        nearest E4M3 (ties to even), both saturating at +-qmax."""
        m = self.qmax if qmax is None else qmax
        if self.name == "int8":
            return np.clip(np.rint(x), -m, m).astype(np.int8)
        return np.clip(x, -m, m).astype(self.zero_dtype)


INT8 = QFormat("int8", INT8_MAX, np.int8)
FP8 = QFormat("fp8", FP8_MAX, ml_dtypes.float8_e4m3fn)  # E4M3, as TensorRT's FP8 GEMMs read (ModelOpt's fp8 mode)


# -- helpers -----------------------------------------------------------------------------------------------

def _weight_axis(node, weight_shape: tuple[int, ...]) -> int:
    """The output-channel axis of a GEMM's weight: per-channel scales run along it."""
    if node.op_type == "Conv":
        return 0
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    return len(weight_shape) - 1  # MatMul: (K, N)


def quantize_weight(w: np.ndarray, axis: int, dtype=np.float16, qmax: float = INT8_MAX,
                    fmt: QFormat = INT8) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel symmetric quantization in [-qmax, qmax]: (quantized weight in `fmt`, scale per channel along
    `axis`, of the given float type)."""
    w = np.asarray(w, dtype=np.float32)
    reduce = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.abs(w).max(axis=reduce) if reduce else np.abs(w)
    scale = np.maximum(amax / qmax, MIN_SCALE).astype(dtype)  # rounded first: q uses the stored scale
    shape = [1] * w.ndim
    shape[axis] = -1
    return fmt.quantize(w / scale.astype(np.float32).reshape(shape), qmax), scale


def activation_scale(amax: float, dtype=np.float16, fmt: QFormat = INT8) -> np.ndarray:
    return np.asarray(max(float(amax) / fmt.qmax, MIN_SCALE), dtype=dtype)


# -- the TensorRT-shaped graph ------------------------------------------------------------------------------

@dataclass
class FloatGemms:
    """What the Q/DQ writer needs of the FP32 graph, its weights already quantized: so the FP32 model (the whole of
    its weights) can be let go before the graph that gets the Q/DQ is loaded and converted."""

    inputs: dict[str, list[str]]  # selected node -> its FP32 input names
    weights: dict[str, dict[int, tuple[np.ndarray, np.ndarray]]]  # weight -> axis -> (quantized weight, scale)
    fmt: QFormat = INT8
    replaced: frozenset[str] = frozenset()  # weights only selected GEMMs read: their float form is never needed


def _replaced(graph, gemms: "FloatGemms", chosen: set[str]) -> frozenset[str]:
    readers: dict[str, set[str]] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, set()).add(n.name)
    outputs = {o.name for o in graph.output}
    return frozenset(w for w in gemms.weights if readers.get(w, set()) <= chosen and w not in outputs)


def float_gemms(fp32_model, selection: GemmSelection, scale_dtype=np.float16,
                weight_max: float = INT8_MAX, fmt: QFormat = INT8, base_dir: Path | None = None) -> FloatGemms:
    """The selected GEMMs' FP32 input names, and their weights quantized per output channel (one weight at a time
    is read out of the model as an array; from external data beside the model in `base_dir` when it has some)."""
    from onnx import numpy_helper

    inits = {i.name: i for i in fp32_model.graph.initializer}
    chosen = set(selection.nodes)
    out = FloatGemms({}, {}, fmt)
    for node in fp32_model.graph.node:
        if node.name not in chosen:
            continue
        out.inputs[node.name] = list(node.input)
        if node.op_type not in LINEAR_OPS:  # a LayerNorm's or an Add's activation: no weight to quantize
            continue
        for t in (node.input[k] for k in selection.picked(node)):
            if t in inits:
                axis = _weight_axis(node, tuple(inits[t].dims))
                if axis not in out.weights.setdefault(t, {}):
                    w = numpy_helper.to_array(inits[t], base_dir=str(base_dir or ""))
                    out.weights[t][axis] = quantize_weight(w, axis, scale_dtype, weight_max, fmt)
    out.replaced = _replaced(fp32_model.graph, out, chosen)
    return out


def qdq_sources(fp32_path: Path, selection: GemmSelection, fp16: bool, scale_dtype=np.float16,
                weight_max: float = INT8_MAX, fmt: QFormat = INT8, keep_float: bool = False,
                keep_nodes: tuple[str, ...] = ()):
    """(the selected GEMMs with their weights quantized, the graph the Q/DQ go into: the FP32 model with the other
    weights in FP16 when fp16, but the nodes `keep_nodes` in FP32), each read one weight at a time: the FP32 weights
    are never all in memory, whatever the model's size (external data included). keep_float: the quantized
    weights' float form is loaded too."""
    fp32_path = Path(fp32_path)
    types = inferred_types(read_graph(fp32_path)) if fp16 else None  # the converter's, before the graph is taken
    model = take_graph(fp32_path)  # one parse: the weights are quantized from it, then it becomes the remainder
    gemms = float_gemms(model, selection, scale_dtype, weight_max, fmt, fp32_path.parent)
    model = load_weights(fp32_path, frozenset() if keep_float else gemms.replaced, fp16,
                         fp32_weights(fp32_path, keep_nodes, model.graph) if fp16 else frozenset(), model=model)
    return gemms, (to_fp16(model, keep_fp32=(), types=types, keep_nodes=keep_nodes) if fp16 else model)


def insert_qdq(fp32_model, model16, selection: GemmSelection, amax: dict[str, float], scale_dtype=np.float16,
               weight_max: int = INT8_MAX):
    """Put Q/DQ on the inputs of the selected GEMMs of `model16` (the FP16 model, or an FP32 copy with
    scale_dtype float32), with weights in [-weight_max, weight_max] and ranges taken from the FP32 model."""
    return insert_qdq_from(float_gemms(fp32_model, selection, scale_dtype, weight_max), model16, selection, amax,
                           scale_dtype)


def insert_qdq_from(fp32: FloatGemms, model16, selection: GemmSelection, amax: dict[str, float],
                    scale_dtype=np.float16, writer: "Callable[..., QDQWriter] | None" = None):
    """insert_qdq with the FP32 side read beforehand (float_gemms); `writer`: a QDQWriter subclass (sensitivity's
    switched graph)."""

    opset = FP8_OPSET if fp32.fmt is FP8 else TRT_INT8_OPSET
    if scale_dtype == np.float16 and (_opset(model16) < BUMPABLE_FROM or (
            opset > TRT_INT8_OPSET and {n.op_type for n in model16.graph.node} & set(CHANGED_BY_21))):
        model16 = _converted(model16, opset)
    w = (writer or QDQWriter)(fp32, model16.graph, amax, scale_dtype)
    for node in list(model16.graph.node):
        if node.name in selection.nodes:
            src = fp32.inputs[node.name]
            for k in selection.picked(node):
                w.quantize_input(node, k, src[k])
    w.finish()
    topological_sort(model16.graph)
    if scale_dtype == np.float16:
        _set_opset(model16, opset)
    return with_inferred_types(model16)  # value_info is stale after the rewiring


class QDQWriter:
    """The Q/DQ nodes and initializers added to one graph; a tensor feeding several GEMMs gets one pair."""

    def __init__(self, fp32: FloatGemms, graph, amax: dict[str, float], scale_dtype) -> None:
        self.weights, self.fmt = fp32.weights, fp32.fmt
        self.graph, self.amax, self.dtype = graph, amax, scale_dtype
        self.consts = constant_names(graph)
        self.inits, self.nodes = [], []
        self.done: dict[tuple, str] = {}  # (tensor, axis) -> the DQ output that replaces it

    def quantize_input(self, node, k: int, t32: str) -> None:
        t16 = node.input[k]
        if t32 in self.weights:  # a weight: stored as INT8 with a per-channel DequantizeLinear
            node.input[k] = self._weight(node, t32)
        elif t16 not in self.consts:  # an activation: per-tensor scale from calibration
            if t32 not in self.amax:
                raise VitexportError(f"No calibrated range for {t32!r} (input of {node.name}).")
            node.input[k] = self._activation(t16, t32)

    def _weight(self, node, t32: str) -> str:
        from onnx import helper, numpy_helper

        by_axis = self.weights[t32]
        axis = _weight_axis(node, next(iter(by_axis.values()))[0].shape)
        if (t32, axis) not in self.done:
            q, scale = by_axis[axis]
            kind = self.fmt.name
            base = f"{t32}_{kind}" if not any(t == t32 for t, _ in self.done) else f"{t32}_{kind}_axis{axis}"
            self.inits += [numpy_helper.from_array(q, base), numpy_helper.from_array(scale, f"{base}_scale"),
                           numpy_helper.from_array(np.zeros(scale.shape, self.fmt.zero_dtype), f"{base}_zero_point")]
            self.nodes.append(helper.make_node("DequantizeLinear", [base, f"{base}_scale", f"{base}_zero_point"],
                                               [f"{base}_dq"], name=f"{base}/DQ", axis=axis))
            self.done[(t32, axis)] = f"{base}_dq"
        return self.done[(t32, axis)]

    def _activation(self, t16: str, t32: str) -> str:
        from onnx import helper, numpy_helper

        if (t16, None) not in self.done:
            base = f"{t32}_act"
            self.inits += [numpy_helper.from_array(activation_scale(self.amax[t32], self.dtype, self.fmt),
                                                   f"{base}_scale"),
                           numpy_helper.from_array(np.zeros((), self.fmt.zero_dtype), f"{base}_zero_point")]
            self.nodes += [
                helper.make_node("QuantizeLinear", [t16, f"{base}_scale", f"{base}_zero_point"], [f"{base}_q"],
                                 name=f"{base}/Q"),
                helper.make_node("DequantizeLinear", [f"{base}_q", f"{base}_scale", f"{base}_zero_point"],
                                 [f"{base}_dq"], name=f"{base}/DQ")]
            self.done[(t16, None)] = f"{base}_dq"
        return self.done[(t16, None)]

    def finish(self) -> None:
        """Add the new nodes and initializers; drop float weights no node reads any more."""
        self.graph.initializer.extend(self.inits)
        self.graph.node.extend(self.nodes)
        used = {i for n in self.graph.node for i in n.input} | {o.name for o in self.graph.output}
        unused = [i for i in self.graph.initializer if i.name not in used]
        for init in unused:
            self.graph.initializer.remove(init)


def _opset(model) -> int:
    return max((op.version for op in model.opset_import if op.domain in ("", "ai.onnx")), default=0)


def _set_opset(model, version: int) -> None:
    """Raise the default domain's opset in place: from 18 (BUMPABLE_FROM) on, every operator that changed in 19
    only gained types or attributes with defaults, so the graph means what it meant."""
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx") and op.version < version:
            op.version = version


def _converted(model, version: int):
    """A graph below opset 18 through onnx's version converter (opset 18 moved the Reduce ops' axes and Split's
    sizes to inputs); one it cannot convert is one sentence."""
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, version)
    except Exception as e:  # the converter raises RuntimeError/ValueError/its own errors
        raise VitexportError(f"The graph's opset {_opset(model)} could not be converted to opset {version}, which "
                             f"FP16 Q/DQ scales need ({first_line(e)}); export it again with --opset {version}.") \
            from None


def write_qdq(fp32_path: Path, dst: Path, selection: GemmSelection, amax: dict[str, float], what: str, *,
              fp16: bool = True, weight_max: float = INT8_MAX, fmt: QFormat = INT8, keep_nodes: tuple[str, ...] = ()):
    """model.onnx + calibrated ranges -> a Q/DQ ONNX at `dst` (checked by onnx.checker), read one weight at a time
    (qdq_sources); FP16 remainder (but keep_nodes) and scales when fp16, else FP32. Returns the graph written."""
    scale_dtype = np.float16 if fp16 else np.float32
    gemms, model = qdq_sources(fp32_path, selection, fp16, scale_dtype, weight_max, fmt, keep_nodes=keep_nodes)
    model = insert_qdq_from(gemms, model, selection, amax, scale_dtype)
    save_checked(model, dst, what)
    return model


def write_trt_int8(fp32_path: Path, dst: Path, selection: GemmSelection, amax: dict[str, float]):
    """model.onnx + calibrated ranges -> the TensorRT-shaped INT8 ONNX at `dst`; returns the graph written."""
    return write_qdq(fp32_path, dst, selection, amax, "TensorRT INT8")


# -- invariants (what tests and `vitexport info` check) ------------------------------------------------------

def trt_int8_invariants(model) -> dict:
    """Facts about a Q/DQ graph that TensorRT's INT8 GEMM fusion depends on."""
    import onnx
    from onnx import numpy_helper

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    q_on_gemm_output = sum(1 for n in graph.node if n.op_type == "QuantizeLinear"
                           and n.input[0] in producer and producer[n.input[0]].op_type in LINEAR_OPS)
    outputs_from_dq = sum(1 for o in graph.output if o.name in producer
                          and producer[o.name].op_type == "DequantizeLinear")
    dq = [n for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    scale_types = {onnx.TensorProto.DataType.Name(inits[n.input[1]].data_type) for n in dq if n.input[1] in inits}
    zero_points_nonzero = sum(1 for n in dq if len(n.input) > 2 and n.input[2] in inits
                              and np.any(numpy_helper.to_array(inits[n.input[2]]) != 0))
    dq_into_gemm = sum(1 for n in graph.node if n.op_type == "DequantizeLinear" and consumers.get(n.output[0])
                       and all(c.op_type in LINEAR_OPS for c in consumers[n.output[0]]))
    cast_between = sum(1 for n in graph.node if n.op_type == "Cast" and n.input[0] in producer
                       and producer[n.input[0]].op_type == "DequantizeLinear")
    float_types = _float_tensor_types(model)
    return {"qdq_nodes": len(dq), "q_on_gemm_output": q_on_gemm_output, "outputs_from_dq": outputs_from_dq,
            "scale_types": sorted(scale_types), "nonzero_zero_points": zero_points_nonzero,
            "dq_feeding_only_gemms": dq_into_gemm,
            "dq_nodes": sum(1 for n in dq if n.op_type == "DequantizeLinear"), "casts_after_dq": cast_between,
            "float_tensors": float_types}


def _float_tensor_types(model) -> dict[str, int]:
    """How many float tensors (value_info + initializers) are FP32 vs FP16."""
    import onnx

    counts = {"FLOAT": 0, "FLOAT16": 0}
    for vi in model.graph.value_info:
        name = onnx.TensorProto.DataType.Name(vi.type.tensor_type.elem_type)
        if name in counts:
            counts[name] += 1
    for init in model.graph.initializer:
        name = onnx.TensorProto.DataType.Name(init.data_type)
        if name in counts:
            counts[name] += 1
    return counts
