"""The restrictions TensorRT's ONNX parser states op by op (onnx-tensorrt's support matrix, onnxOpCheckers.cpp and
its importers, release 10.15; see onnx_support.SOURCE), as checks on a node that read what the graph states of its
inputs (`GraphFacts`): each yields one reason per broken restriction, nothing for a node the parser takes.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ANTIALIAS = "antialias=1 (onnxOpCheckers.cpp: \"Antialiasing is not supported currently\")"

# the matrix's type names (DOUBLE counts as FP32: the parser casts it down)
TYPE_NAMES = {"FP32": (TensorProto.FLOAT, TensorProto.DOUBLE), "FP16": (TensorProto.FLOAT16,),
              "BF16": (TensorProto.BFLOAT16,), "INT32": (TensorProto.INT32,), "INT64": (TensorProto.INT64,),
              "INT8": (TensorProto.INT8,), "UINT8": (TensorProto.UINT8,), "BOOL": (TensorProto.BOOL,),
              "FP8": (TensorProto.FLOAT8E4M3FN,), "FP4": (TensorProto.FLOAT4E2M1,), "INT4": (TensorProto.INT4,)}
# op: {attribute: (its default, the values the parser takes)}
_ATTRIBUTES: dict[str, dict[str, tuple[Any, tuple]]] = {
    "Gelu": {"approximate": ("none", ("none", "tanh"))},
    "Upsample": {"mode": ("nearest", ("nearest", "linear", "bilinear"))},
    "RoiAlign": {"mode": ("avg", ("avg", "max")),
                 "coordinate_transformation_mode": ("half_pixel", ("half_pixel", "output_half_pixel"))},
    "ScatterND": {"reduction": ("none", ("none",))},
    "LpNormalization": {"p": (2, (1, 2))},
    "LpPool": {"p": (2, (1, 2))},
    "LSTM": {"input_forget": (0, (0,)), "layout": (0, (0,))},
    "BatchNormalization": {"training_mode": (0, (0,))},
    "TopK": {"sorted": (1, (1,))},
    "TensorScatter": {"mode": ("linear", ("linear",))},
    "Attention": {"softcap": (0.0, (0.0,)), "qk_matmul_output_mode": (0, (0,))},
}

Check = Callable[[onnx.NodeProto, "GraphFacts"], Iterator[str]]


class GraphFacts:
    """What the checks read of a graph: its constants, and the element types and shapes of its values."""

    def __init__(self, graph: onnx.GraphProto, opset: int, outer: "GraphFacts | None" = None) -> None:
        self.opset = opset
        self.consts: dict[str, TensorProto] = dict(outer.consts) if outer else {}
        self.types: dict[str, int] = dict(outer.types) if outer else {}
        self.shapes: dict[str, tuple] = dict(outer.shapes) if outer else {}
        self.read(graph)

    def read(self, graph: onnx.GraphProto) -> None:
        """Note the initializers, Constant nodes and value infos of a graph."""
        for t in graph.initializer:
            self._tensor(t.name, t)
        for vi in [*graph.input, *graph.output, *graph.value_info]:
            tt = vi.type.tensor_type
            if tt.elem_type:
                self.types[vi.name] = tt.elem_type
            if tt.HasField("shape"):
                self.shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
        for node in graph.node:
            if node.op_type == "Constant" and node.output and (t := _constant_tensor(node)) is not None:
                self._tensor(node.output[0], t)
            elif node.op_type == "Identity" and node.input and node.input[0] in self.consts:
                self._tensor(node.output[0], self.consts[node.input[0]])

    def _tensor(self, name: str, t: TensorProto) -> None:
        self.consts[name], self.types[name], self.shapes[name] = t, t.data_type, tuple(t.dims)

    def known(self, names: Iterable[str]) -> bool:
        """Whether every named value has a known element type."""
        return all(n in self.types for n in names if n)

    def value(self, name: str) -> np.ndarray | None:
        """A constant's values, where the graph holds them (not for weights left in external data)."""
        t = self.consts.get(name)
        if t is None or t.data_location == TensorProto.EXTERNAL:
            return None
        try:
            return numpy_helper.to_array(t)
        except Exception:  # noqa: BLE001 -- data not loaded, or a type numpy cannot hold
            return None

    def elem(self, node: onnx.NodeProto, i: int) -> int | None:
        """The element type of a node's input `i`, if known."""
        return self.types.get(node.input[i]) if i < len(node.input) and node.input[i] else None

    def rank(self, name: str) -> int | None:
        """The rank of a value, if known."""
        return len(self.shapes[name]) if name in self.shapes else None


def _constant_tensor(node: onnx.NodeProto) -> TensorProto | None:
    """The tensor a Constant node holds (None for sparse and string values, which TensorRT refuses)."""
    for a in node.attribute:
        if a.name == "value":
            return a.t
        if a.name in ("value_float", "value_floats", "value_int", "value_ints"):
            kind = TensorProto.FLOAT if "float" in a.name else TensorProto.INT64
            vals = helper.get_attribute_value(a)
            return helper.make_tensor("c", kind, [len(vals)] if isinstance(vals, list) else [],
                                      vals if isinstance(vals, list) else [vals])
    return None


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    """A node's attribute value (strings decoded), or `default`."""
    for a in node.attribute:
        if a.name == name:
            v = helper.get_attribute_value(a)
            return v.decode() if isinstance(v, bytes) else v
    return default


def type_name(t: int) -> str:
    """ONNX's name of an element type ('FLOAT16')."""
    return TensorProto.DataType.Name(t)


def _resize(node: onnx.NodeProto, g: GraphFacts) -> Iterator[str]:
    """onnxOpCheckers.cpp and the Resize importer: modes, coordinate transformations, antialias, the aspect ratio
    policy, unique axes; cubic_coeff_a and exclude_outside are passed to the layer as they are."""
    mode = _attr(node, "mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        yield f"mode {mode!r} (the importer takes nearest, linear and cubic)"
    ctm = _attr(node, "coordinate_transformation_mode", "half_pixel")
    if g.opset >= 11 and ctm not in ("half_pixel", "pytorch_half_pixel", "tf_half_pixel_for_nn", "asymmetric",
                                     "align_corners"):
        yield (f"coordinate_transformation_mode {ctm!r} (supported: half_pixel, pytorch_half_pixel, "
               "tf_half_pixel_for_nn, asymmetric, align_corners)")
    if ctm == "tf_half_pixel_for_nn" and _attr(node, "nearest_mode", "round_prefer_floor") != "round_prefer_floor":
        yield "tf_half_pixel_for_nn takes nearest_mode round_prefer_floor only"
    if _attr(node, "antialias", 0):
        yield ANTIALIAS
    if _attr(node, "keep_aspect_ratio_policy", "stretch") != "stretch":
        yield "keep_aspect_ratio_policy must be stretch"
    rank = g.rank(node.input[0])
    axes = [a + rank if a < 0 and rank else a for a in _attr(node, "axes", [])]
    if len(set(axes)) != len(axes):
        yield f"axes {axes} are not unique"
    yield from _resize_scales(node, g, mode, axes, rank)


def _resize_scales(node: onnx.NodeProto, g: GraphFacts, mode: str, axes: list[int], rank: int | None) -> Iterator[str]:
    """Scales: a constant one resizes linear on the 3 innermost axes and cubic on the 2 innermost only; a tensor
    one takes no `axes` other than all of them in order. Output sizes (input 3) have no such limit."""
    if len(node.input) > 3 and node.input[3] and g.opset >= 11:
        return
    i = 2 if g.opset >= 11 else 1
    if len(node.input) <= i or not node.input[i]:
        return
    name = node.input[i]
    if name not in g.consts:
        if axes and rank is not None and axes != list(range(rank)):
            yield "scales as a tensor with axes other than all of them in order"
        return
    scales = g.value(name)
    if scales is None:
        return
    if scales.ndim != 1:
        yield "scales must be 1-D"
        return
    full = scales.tolist()
    if axes and rank is not None:
        full = [1.0] * rank
        for a, s in zip(axes, scales.tolist()):
            full[a] = s
    inner = {"linear": 3, "cubic": 2}.get(mode)
    if inner and any(s != 1 for s in full[:-inner]):
        yield f"{mode} resize of an axis outside the {inner} innermost (scales {full})"


def _einsum(node: onnx.NodeProto, g: GraphFacts) -> Iterator[str]:
    """onnxOpCheckers.cpp: the equation holds lower-case labels, '->', '...', ',' and spaces only."""
    eq = _attr(node, "equation", "")
    bad = sorted({c for c in eq if not ("a" <= c <= "z" or c in "->., ")})
    if bad:
        yield f"equation {eq!r} holds {''.join(bad)!r} (the parser takes labels a-z only)"


def _conv(node: onnx.NodeProto, g: GraphFacts) -> Iterator[str]:
    """TensorRT convolves 1 (as 2-D), 2 or 3 spatial axes; weights and bias may be tensors, groups any."""
    rank = g.rank(node.input[1]) if len(node.input) > 1 else None
    if rank is not None and not 3 <= rank <= 5:
        yield f"a {rank - 2}-D convolution (TensorRT convolves 1, 2 or 3 spatial axes)"


def _conv_transpose(node: onnx.NodeProto, g: GraphFacts) -> Iterator[str]:
    """The ConvTranspose importer: a 3-D to 5-D input, and no output_shape that asks for negative pre-padding."""
    shape = g.shapes.get(node.input[0])
    if shape is not None and not 3 <= len(shape) <= 5:
        yield f"a {len(shape)}-D input (the importer takes 3-D to 5-D)"
    out, kernel = _attr(node, "output_shape"), g.shapes.get(node.input[1], ())
    if not out or _attr(node, "auto_pad", "NOTSET") != "NOTSET" or shape is None or len(shape) != len(kernel):
        return
    n = len(shape) - 2
    k = _attr(node, "kernel_shape", list(kernel[2:]))
    s, d = _attr(node, "strides", [1] * n), _attr(node, "dilations", [1] * n)
    op = _attr(node, "output_padding", [0] * n)
    for i in range(n):
        if None in (shape[2 + i], k[i]):
            continue
        total = s[i] * (shape[2 + i] - 1) + op[i] + (k[i] - 1) * d[i] + 1 - out[len(out) - n + i]
        if int(total / 2) < 0:
            yield f"output_shape {out} needs negative pre-padding, which the importer refuses"
            return


def _first_output_only(node: onnx.NodeProto, g: GraphFacts) -> Iterator[str]:
    """onnxOpCheckers.cpp: only the first output (the others are training outputs or MaxPool's indices)."""
    if any(node.output[1:]):
        yield "only the first output is supported"


def _batchnorm(node: onnx.NodeProto, g: GraphFacts) -> Iterator[str]:
    """The BatchNormalization importer: inference mode, the first output, statistics of shape (C,)."""
    yield from _first_output_only(node, g)
    for name in node.input[1:5]:
        if g.rank(name) not in (None, 1):
            yield f"{name} is not 1-D (the importer takes scale, bias, mean and var of shape (C,))"


def _pad(node: onnx.NodeProto, g: GraphFacts) -> Iterator[str]:
    """The Pad importer: modes constant, reflect, edge, wrap; 1-D pads; a scalar constant_value."""
    mode = _attr(node, "mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        yield f"mode {mode!r}"
    if len(node.input) > 1 and g.rank(node.input[1]) not in (None, 1):
        yield "pads must be 1-D"
    if len(node.input) > 2 and (v := g.value(node.input[2])) is not None and v.size != 1:
        yield "constant_value must be a scalar"


def _slice(node: onnx.NodeProto, g: GraphFacts) -> Iterator[str]:
    """onnxOpCheckers.cpp: 3 to 5 inputs from opset 10 on (starts and ends, optional axes and steps: any steps)."""
    if g.opset >= 10 and not 3 <= len(node.input) <= 5:
        yield "the checker takes 3 to 5 inputs"


def _topk(node: onnx.NodeProto, g: GraphFacts) -> Iterator[str]:
    """The matrix: K < 3840 (a tensor K is taken; its value is checked where it is a constant)."""
    k = g.value(node.input[1]) if len(node.input) > 1 else np.array(_attr(node, "k", 0))
    if k is not None and k.size and int(k.max()) >= 3840:
        yield f"K = {int(k.max())} (the matrix requires K < 3840)"


def _range(node: onnx.NodeProto, g: GraphFacts) -> Iterator[str]:
    """The Range importer: start, limit and delta of one type (FP32, INT32 or INT64: the type column)."""
    types = {g.elem(node, i) for i in range(3)} - {None}
    if len(types) > 1:
        yield "start, limit and delta differ in type (the importer requires one type)"


def _pool(node: onnx.NodeProto, g: GraphFacts) -> Iterator[str]:
    """Pooling: 1-D (as 2-D), 2-D or 3-D kernels, dilations all ones, MaxPool without its Indices output."""
    if node.op_type == "MaxPool":
        yield from _first_output_only(node, g)
    if not 1 <= len(_attr(node, "kernel_shape", [1, 1])) <= 3:
        yield "TensorRT pools 1, 2 or 3 spatial axes"
    if any(d != 1 for d in _attr(node, "dilations", [])):
        yield "dilations other than 1 (the matrix requires all ones)"


def _squeeze(node: onnx.NodeProto, g: GraphFacts) -> Iterator[str]:
    """The Squeeze importer: without axes, the input's shape must be static."""
    no_axes = (len(node.input) < 2 or not node.input[1]) if g.opset >= 13 else _attr(node, "axes") is None
    shape = g.shapes.get(node.input[0])
    if no_axes and shape is not None and None in shape:
        yield "no axes on a dynamic shape (the importer cannot infer which axes to squeeze)"


def _constant(node: onnx.NodeProto, g: GraphFacts) -> Iterator[str]:
    """The matrix: no sparse_value, value_string or value_strings."""
    bad = [a.name for a in node.attribute if a.name in ("sparse_value", "value_string", "value_strings")]
    if bad:
        yield f"{bad[0]} is unsupported"


def _attention(node: onnx.NodeProto, g: GraphFacts) -> Iterator[str]:
    """The matrix: no past_key, past_value or nonpad_kv_seqlen input, one output, no softmax_precision."""
    if any(node.input[4:]) or any(node.output[1:]):
        yield "past_key, past_value, nonpad_kv_seqlen, present_* and qk_matmul_output are unsupported"
    if _attr(node, "softmax_precision") is not None:
        yield "softmax_precision is unsupported"


def _grid_sample(node: onnx.NodeProto, g: GraphFacts) -> Iterator[str]:
    """The matrix: a 4-D input."""
    if g.rank(node.input[0]) not in (None, 4):
        yield "the matrix requires a 4-D input"


def _tensor_scatter(node: onnx.NodeProto, g: GraphFacts) -> Iterator[str]:
    """The matrix: 4-D past_cache and update, axis -2."""
    if any(g.rank(x) not in (None, 4) for x in node.input[:2]) or _attr(node, "axis", -2) not in (-2, 2):
        yield "the matrix requires a 4-D past_cache and update, and axis -2"


def _initializer_inputs(names: dict[int, str]) -> Check:
    """A check that each given input (index: name) is a constant: the matrix's "must be an initializer"."""
    def check(node: onnx.NodeProto, g: GraphFacts) -> Iterator[str]:
        for i, what in names.items():
            if len(node.input) > i and node.input[i] and node.input[i] not in g.consts:
                yield f"{what} must be an initializer"
    return check


def _dropout(node: onnx.NodeProto, g: GraphFacts) -> Iterator[str]:
    """The matrix: is_training (training_mode) an initializer, and false."""
    yield from _initializer_inputs({2: "training_mode"})(node, g)
    if len(node.input) > 2 and (v := g.value(node.input[2])) is not None and v.any():
        yield "training_mode is true (the importer runs Dropout in inference mode only)"


_QUANTIZED = frozenset({TensorProto.INT8, TensorProto.FLOAT8E4M3FN, TensorProto.INT4, TensorProto.FLOAT4E2M1})
_CASTABLE = frozenset(t for n in "FP32 FP16 BF16 INT32 INT64 UINT8 BOOL".split() for t in TYPE_NAMES[n])


def _cast(node: onnx.NodeProto, g: GraphFacts) -> Iterator[str]:
    """The matrix's types for the target too (DOUBLE is cast as FP32); the importer passes no quantized type."""
    to = _attr(node, "to")
    if to is not None and to not in _CASTABLE:
        yield (f"a cast to {type_name(to)} (the matrix casts to FP32, FP16, BF16, INT32, INT64, UINT8 and BOOL; "
               "quantized types come from QuantizeLinear)")


def _quantize_linear(node: onnx.NodeProto, g: GraphFacts) -> Iterator[str]:
    """QuantizeLinear: to INT8, FP8 (E4M3FN), INT4 or FP4 (the zero point's type, else output_dtype, else INT8:
    the parser's default, where ONNX's is UINT8); UINT8 only on DLA."""
    zp = node.input[2] if len(node.input) > 2 and node.input[2] else ""
    to = g.types.get(zp) if zp else _attr(node, "output_dtype", 0) or TensorProto.INT8
    if to is not None and to not in _QUANTIZED:
        yield f"quantizes to {type_name(to)} (TensorRT quantizes to INT8, FP8 E4M3FN, INT4 and FP4)"
    yield from _qdq_params(node, g, "y_zero_point", to)


def _dequantize_linear(node: onnx.NodeProto, g: GraphFacts) -> Iterator[str]:
    """DequantizeLinear: from INT8, FP8, FP4 or INT4 (the type column; UINT8 only on DLA) to FP32, FP16 or BF16."""
    out = _attr(node, "output_dtype", 0)
    if out and out not in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16):
        yield f"output_dtype {type_name(out)} (the importer dequantizes to FP32, FP16 and BF16)"
    yield from _qdq_params(node, g, "x_zero_point", g.elem(node, 0))


def _qdq_params(node: onnx.NodeProto, g: GraphFacts, zero: str, qtype: int | None) -> Iterator[str]:
    """Positive scales, a zero point of 0 (the matrix), and the scale shapes the importer takes."""
    scale = g.value(node.input[1]) if len(node.input) > 1 else None
    if scale is not None and (scale.size == 0 or not (scale.astype(np.float32) > 0).all()):
        yield "scale coefficients must all be positive"
    zp = g.value(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if zp is not None and zp.astype(np.float32).any():
        yield f"{zero} must be 0"
    x = g.shapes.get(node.input[0])
    s = g.shapes.get(node.input[1]) if len(node.input) > 1 else None
    if qtype in (TensorProto.INT4, TensorProto.FLOAT4E2M1) and x and None not in x and int(np.prod(x)) % 2:
        yield "4-bit quantization needs an even number of elements"
    if s is None or None in s or int(np.prod(s)) == 1 or x is None:
        return
    if len(s) == 1:
        axis = _attr(node, "axis", 1)
        dim = x[axis + len(x) if axis < 0 else axis] if -len(x) <= axis < len(x) else None
        if dim is not None and dim != s[0]:
            yield f"{s[0]} scales for {dim} channels on axis {axis}"
    elif len(s) != len(x):
        yield f"a {len(s)}-D scale for a {len(x)}-D input (per-tensor, per-axis 1-D, or blocked of the input's rank)"
    elif None not in x and 0 not in s and sum(a // b == 1 for a, b in zip(x, s)) != len(x) - 1:
        yield "blocked quantization must block exactly one axis"
    elif None not in x and int(np.prod(x)) % int(np.prod(s)):
        yield "the block size is not a whole number"


def attribute_values(node: onnx.NodeProto) -> Iterator[str]:
    """The attributes of a node that hold a value the parser does not take (_ATTRIBUTES)."""
    for name, (default, allowed) in _ATTRIBUTES.get(node.op_type, {}).items():
        value = _attr(node, name, default)
        if value not in allowed:
            yield f"{name}={value!r} (supported: {', '.join(map(str, allowed))})"


_REDUCE = "ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum " \
          "ReduceSumSquare"
CHECKS: dict[str, Check] = {
    "Resize": _resize, "Einsum": _einsum, "Conv": _conv, "ConvTranspose": _conv_transpose,
    "BatchNormalization": _batchnorm, "LayerNormalization": _first_output_only, "Pad": _pad, "Slice": _slice,
    "TopK": _topk, "Range": _range, "Cast": _cast, "QuantizeLinear": _quantize_linear,
    "DequantizeLinear": _dequantize_linear, "Dropout": _dropout, "AveragePool": _pool, "MaxPool": _pool,
    "LpPool": _pool, "Squeeze": _squeeze, "Constant": _constant, "Attention": _attention,
    "GridSample": _grid_sample, "TensorScatter": _tensor_scatter,
    "STFT": _initializer_inputs({1: "frame_step", 2: "window"}),
    **{op: _initializer_inputs({1: "axes"}) for op in _REDUCE.split()},
}
