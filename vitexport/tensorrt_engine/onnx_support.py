"""TensorRT's ONNX parser op by op, checked without TensorRT: which ops it imports, the element types it takes, and
the restrictions its operator support matrix and its importers state (SOURCE).

`unsupported(model)` gives one line per node the parser of TensorRT 10.12 or newer refuses: "node NAME (OP): why".
The table is the 10.15 release's matrix; the ops its changelog adds after 10.12 (Attention in 10.14;
RMSNormalization, RotaryEmbedding and TensorScatter in 10.15) count from their release on. Where the matrix and the
importer disagree, the importer decides: Resize takes `cubic` (the matrix names nearest and linear only), Range takes
FP32, INT32 and INT64 only, Equal takes BOOL. A "constant" below is what the parser reads as weights: an initializer,
a Constant node's output, or an Identity of either. An input of unknown type or shape is not held against a node.

What needs no initializer in 10.x: Conv and ConvTranspose take weights and bias as tensors (any group, depthwise
included), BatchNormalization takes tensor statistics, Slice takes tensor axes and any steps, Pad tensor pads and
axes, TopK a tensor K, Einsum ellipses, diagonals and broadcasting (since 10.12); ArgMax, Where, Expand, Gather and
Softmax (any axis) have no restriction beyond their types.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Collection, Iterable, Iterator

import onnx
from onnx import TensorProto, helper

from .onnx_restrictions import ANTIALIAS, CHECKS, TYPE_NAMES, Check, GraphFacts, attribute_values, type_name
from .options import MIN_TENSORRT

__all__ = ["ANTIALIAS", "OPS", "OPSETS", "SOURCE", "OpSupport", "unsupported"]

SOURCE = ("github.com/onnx/onnx-tensorrt, release 10.15 GA: docs/operators.md (commit "
          "fa5aa9f61e7781d2ca8f5351d42c1f19525a6124), onnxOpCheckers.cpp, onnxOpImporters.cpp and docs/Changelog.md "
          "(commit dd0a3a9f8794ae4f0316ed07ea68cda9b944bb3c), importerUtils.cpp (commit fa5aa9f6)")
OPSETS = range(9, 25)  # "TensorRT 10.15 supports operators in the inclusive range of opset 9 to opset 24"
_FLOAT, _NUM, _ANY = "FP32 FP16 BF16", "FP32 FP16 BF16 INT32 INT64", "FP32 FP16 BF16 INT32 INT64 BOOL"
# the matrix's "Supported Types" column (DOUBLE is read as FP32: the parser casts it down), op names by type set
_MATRIX = {
    _FLOAT: "Acos Acosh Asin Asinh Atan Atanh AveragePool BatchNormalization Ceil Celu Clip Conv ConvTranspose Cos "
            "Cosh CumSum Dropout Einsum Elu Erf Exp Floor Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool "
            "GroupNormalization GRU HardSigmoid HardSwish Hardmax ImageScaler InstanceNormalization IsInf "
            "LayerNormalization LeakyRelu Log LogSoftmax LRN LSTM LpNormalization LpPool MatMul MaxPool "
            "MeanVarianceNormalization ParametricSoftplus PRelu QuantizeLinear RandomNormal RandomNormalLike "
            "RandomUniform RandomUniformLike Reciprocal Resize RMSNormalization RNN RotaryEmbedding Round "
            "ScaledTanh Scan Selu Sigmoid Sin Sinh Softmax Softplus Softsign Sqrt Tan Tanh ThresholdedRelu Upsample",
    _NUM: "Abs Add ArgMax ArgMin DepthToSpace Div Greater GreaterOrEqual IsNaN Less LessOrEqual Max Min Mod Mul Neg "
          "Pad Pow ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd "
          "ReduceSum ReduceSumSquare Relu Scatter ScatterElements ScatterND Shrink Sign SpaceToDepth Sub Sum TopK",
    _ANY: "Concat Equal Expand EyeLike Flatten Gather GatherElements GatherND Identity If Loop OneHot Reshape "
          "ReverseSequence Shape Size Slice Split Squeeze Tile Transpose Trilu Unsqueeze Where",
    "BOOL": "And Not Or Xor",
    "FP32 FP16": "BlackmanWindow DeformConv GridSample HammingWindow HannWindow Mish NonMaxSuppression NonZero "
                 "RoiAlign",
    "FP32": "STFT",
    "FP32 INT32 INT64": "Range",
    "FP32 FP16 BF16 INT32 INT64 UINT8 BOOL": "Cast CastLike",
    "FP32 FP16 BF16 FP8 FP4 INT4 INT32 INT64 BOOL": "Constant ConstantOfShape",
    "INT8 FP8 FP4 INT4": "DequantizeLinear",
    "FP32 FP16 BF16 INT8 INT32 INT64": "Gelu",
    "FP32 FP16 BF16 FP8 INT32 INT64": "Mean",
    "FP32 FP16 BF16 INT8 FP8": "Attention",
    "FP32 FP16 BF16 INT32": "TensorScatter",
}
# the rows the matrix marks "N"
_REFUSED = set("AffineGrid Bernoulli BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor Col2Im CenterCropPad Compress "
               "ConcatFromSequence ConvInteger DFT Det DynamicQuantizeLinear ImageDecoder MatMulInteger MaxRoiPool "
               "MaxUnpool MelWeightMatrix Multinomial NegativeLogLikelihoodLoss Optional OptionalGetElement "
               "OptionalHasElement QLinearConv QLinearMatMul RegexFullMatch SequenceAt SequenceConstruct "
               "SequenceEmpty SequenceErase SequenceInsert SequenceLength SequenceMap SoftmaxCrossEntropyLoss "
               "SplitToSequence StringConcat StringNormalizer StringSplit TfIdfVectorizer Unique".split())
_SINCE = {"Attention": (10, 14), "RMSNormalization": (10, 15), "RotaryEmbedding": (10, 15), "TensorScatter": (10, 15)}
# which input the type column is about (the first one where not listed; None: no input's type is checked)
_TYPED_INPUT = {"Where": 1, "Constant": None, "ConstantOfShape": None, "Scan": None, "RandomUniformLike": None,
                "RandomNormalLike": None}


@dataclass(frozen=True)
class OpSupport:
    """One row of the matrix: the element types of the typed input, the first release that imports the op, and the
    check of the restrictions the matrix or the importer state."""

    types: frozenset[int]
    type_names: str
    since: tuple[int, int] = (10, 0)
    typed_input: int | None = 0
    check: Check | None = None


def _types(names: str) -> frozenset[int]:
    return frozenset(t for n in names.split() for t in TYPE_NAMES[n])


def _table() -> dict[str, OpSupport]:
    ops = {op: OpSupport(_types(names), names.replace(" ", ", ")) for names, row in _MATRIX.items()
           for op in row.split()}
    for op, i in _TYPED_INPUT.items():
        ops[op] = replace(ops[op], typed_input=i)
    for op, since in _SINCE.items():
        ops[op] = replace(ops[op], since=since)
    for op, check in CHECKS.items():
        ops[op] = replace(ops[op], check=check)
    return ops


OPS: dict[str, OpSupport] = _table()  # the ops of the ONNX domain TensorRT's parser imports


def _reasons(node: onnx.NodeProto, g: GraphFacts, version: tuple[int, int]) -> Iterator[str]:
    """Why the parser refuses a node, if it does."""
    if node.domain not in ("", "ai.onnx"):
        yield (f"domain {node.domain!r} is not ONNX's: the parser would need a plugin of that name, and vitexport "
               "registers none")
        return
    spec = OPS.get(node.op_type)
    if spec is None:
        yield ("the support matrix marks it unsupported" if node.op_type in _REFUSED
               else "not in TensorRT's ONNX operator support matrix")
        return
    if version < spec.since:
        yield f"TensorRT's parser imports it from {spec.since[0]}.{spec.since[1]} on"
        return
    t = g.elem(node, spec.typed_input) if spec.typed_input is not None else None
    if t is not None and t not in spec.types:
        yield f"input type {type_name(t)} (supported: {spec.type_names})"
    yield from attribute_values(node)
    if spec.check is not None:
        yield from spec.check(node, g)


Functions = dict[tuple[str, str], onnx.FunctionProto]  # the model's local functions by (domain, name)


def _graph_lines(nodes: Iterable[onnx.NodeProto], g: GraphFacts, functions: Functions, version: tuple[int, int],
                 skip: Collection[str], prefix: str) -> list[str]:
    """The lines of a list of nodes, and of the subgraphs and local functions they hold."""
    lines = []
    for node in nodes:
        name = prefix + (node.name or (node.output[0] if node.output else node.op_type))
        function = functions.get((node.domain, node.op_type))
        if function is not None:  # a local function: the parser imports its body
            body = onnx.GraphProto()
            body.node.extend(function.node)
            inner = {k: f for k, f in functions.items() if f is not function}
            lines += _graph_lines(function.node, GraphFacts(body, g.opset), inner, version, skip, name + "/")
            continue
        why = [r for r in _reasons(node, g, version) if r not in skip]
        if why:
            lines.append(f"node {name} ({node.op_type}): {'; '.join(why)}")
        for a in node.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                lines += _graph_lines(sub.node, GraphFacts(sub, g.opset, g), functions, version, skip,
                                      f"{name}/{a.name}/")
    return lines


def _inferred(model: onnx.ModelProto) -> onnx.GraphProto | None:
    """The graph after ONNX's shape inference, run on a copy that keeps only the small initializers' values."""
    light = onnx.ModelProto(ir_version=model.ir_version)
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    for field in ("node", "input", "output", "value_info"):
        getattr(light.graph, field).extend(getattr(model.graph, field))
    inputs = {i.name for i in model.graph.input}
    for t in model.graph.initializer:
        if t.data_location != TensorProto.EXTERNAL and t.ByteSize() <= 4096:
            light.graph.initializer.append(t)
        elif t.name not in inputs:
            light.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    try:
        return onnx.shape_inference.infer_shapes(light).graph
    except Exception:  # noqa: BLE001 -- the checks then read what the graph states
        return None


def unsupported(model_proto: onnx.ModelProto, trt_version: tuple[int, ...] = MIN_TENSORRT, *,
                skip: Collection[str] = ()) -> list[str]:
    """One line per node TensorRT's ONNX parser (of `trt_version`, 10.12 or newer) refuses, in graph order:
    "node NAME (OP): why"; nodes of subgraphs and local functions are named under their parent. A graph of an opset
    the parser does not read is one more line. Weights may be left in external data: values are read only where the
    graph holds them. `skip`: reasons not to report (such as ANTIALIAS)."""
    version = (int(trt_version[0]), int(trt_version[1]))
    if version < MIN_TENSORRT:
        raise ValueError(f"the table describes TensorRT {MIN_TENSORRT[0]}.{MIN_TENSORRT[1]} and newer, "
                         f"not {version[0]}.{version[1]}")
    opset = next((o.version for o in model_proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    lines = [] if opset in OPSETS else [f"model (opset {opset}): TensorRT's parser reads opsets 9 to 24"]
    g = GraphFacts(model_proto.graph, opset)
    if not g.known(o for n in model_proto.graph.node for o in n.output):
        if (inferred := _inferred(model_proto)) is not None:
            g.read(inferred)
    functions = {(f.domain, f.name): f for f in model_proto.functions}
    return lines + _graph_lines(model_proto.graph.node, g, functions, version, skip, "")
