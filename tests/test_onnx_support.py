"""TensorRT's ONNX parser, op by op (tensorrt_engine.onnx_support): small hand-made graphs it must take and ones it
must refuse, each refusal naming the restriction of the support matrix or importer it breaks; the graphs vitexport
exports for a tiny ViT at a fixed and at a dynamic size hold nothing the parser refuses (but the antialiased
Resize of a dynamic size, which `vitexport trt` refuses itself)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from vitexport.tensorrt_engine.graph_rules import describe, parser_refusals
from vitexport.tensorrt_engine.onnx_support import ANTIALIAS, OPS, SOURCE, unsupported

F, F16, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64


def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def graph_of(nodes, inputs, inits=None, opset=18, outputs=("y",), functions=()):
    """A model of `nodes`: inputs {name: (type, shape)}, constants {name: array} as initializers; the outputs' types
    are left to shape inference."""
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()]
    outs = [helper.make_value_info(o, onnx.TypeProto()) for o in outputs]
    g = helper.make_graph(nodes, "g", [vi(k, t, s) for k, (t, s) in inputs.items()], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("local", 1)],
                             ir_version=10, functions=list(functions))


def why(model, **kw) -> str:
    """The one line `unsupported` gives (asserted to be one)."""
    lines = unsupported(model, **kw)
    assert len(lines) == 1, lines
    return lines[0]


X4 = {"x": (F, [1, 8, 4, 4])}


def resize(**attrs):
    return helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="rs", **attrs)


# -- graphs the parser takes ----------------------------------------------------------------------------------------

ACCEPTED = {
    "resize-cubic-sizes-tensor": graph_of([resize(mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1)],
                                          {**X4, "sizes": (I64, [4])}),
    "resize-linear-align-corners-scales": graph_of(
        [helper.make_node("Resize", ["x", "", "s"], ["y"], mode="linear",
                          coordinate_transformation_mode="align_corners")],
        X4, {"s": np.array([1, 1, 2, 2], np.float32)}),
    "resize-nearest-asymmetric": graph_of(
        [helper.make_node("Resize", ["x", "", "s"], ["y"], mode="nearest", coordinate_transformation_mode="asymmetric",
                          nearest_mode="floor")], X4, {"s": np.array([1, 1, 3, 3], np.float32)}),
    "einsum-lowercase": graph_of([helper.make_node("Einsum", ["a", "b"], ["y"], equation="bqc, bqhw -> bchw")],
                                 {"a": (F, [1, 3, 5]), "b": (F, [1, 3, 4, 4])}),
    "einsum-ellipsis-and-diagonal": graph_of([helper.make_node("Einsum", ["a"], ["y"], equation="...ii->...i")],
                                             {"a": (F, [2, 3, 3])}),
    "depthwise-conv-tensor-weights": graph_of([helper.make_node("Conv", ["x", "w"], ["y"], group=8)],
                                              {**X4, "w": (F, [8, 1, 3, 3])}),
    "conv-transpose-tensor-weights-grouped": graph_of(
        [helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], group=2, strides=[2, 2])],
        {**X4, "w": (F, [8, 4, 2, 2]), "b": (F, [8])}),
    "batchnorm-tensor-statistics": graph_of(
        [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])],
        {**X4, **{k: (F, [8]) for k in "sbmv"}}),
    "pad-reflect-tensor-pads": graph_of([helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect")],
                                        {**X4, "p": (I64, [8])}),
    "slice-negative-steps-tensor-axes": graph_of([helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"])],
                                                 {**X4, "ax": (I64, [1])},
                                                 {"st": [-1], "en": [-100], "sp": [-1]}),
    "topk-tensor-k": graph_of([helper.make_node("TopK", ["x", "k"], ["y", "i"])], {**X4, "k": (I64, [1])},
                              outputs=("y", "i")),
    "argmax-last-index": graph_of([helper.make_node("ArgMax", ["x"], ["y"], axis=1, select_last_index=1)], X4),
    "where-greater-sigmoid": graph_of(
        [helper.make_node("Greater", ["x", "z"], ["c"]), helper.make_node("Sigmoid", ["x"], ["s"]),
         helper.make_node("Where", ["c", "s", "x"], ["y"])], X4, {"z": np.float32(0)}),
    "shape-gather-range-expand": graph_of(
        [helper.make_node("Shape", ["x"], ["sh"]), helper.make_node("Gather", ["sh", "i"], ["n"], axis=0),
         helper.make_node("Range", ["zero", "n", "one"], ["r"]), helper.make_node("Concat", ["one1", "n1"], ["t"],
                                                                                 axis=0),
         helper.make_node("Unsqueeze", ["n", "a0"], ["n1"]), helper.make_node("Expand", ["r", "t"], ["y"])],
        X4, {"i": np.int64(2), "zero": np.int64(0), "one": np.int64(1), "one1": np.array([1], np.int64),
             "a0": np.array([0], np.int64)}),
    "layernorm-softmax-erf-fp16-matmul": graph_of(
        [helper.make_node("LayerNormalization", ["h", "g", "b"], ["n"], axis=-1),
         helper.make_node("Softmax", ["n"], ["s"], axis=1), helper.make_node("Erf", ["s"], ["e"]),
         helper.make_node("MatMul", ["e", "w"], ["y"])],
        {"h": (F16, [2, 3, 4]), "g": (F16, [4]), "b": (F16, [4]), "w": (F16, [4, 4])}),
    "casts-to-and-from-fp16": graph_of(
        [helper.make_node("Cast", ["x"], ["h"], to=F16), helper.make_node("Cast", ["h"], ["y"], to=F)], X4),
    "qdq-int8-per-tensor-and-per-channel": graph_of(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
         helper.make_node("DequantizeLinear", ["w8", "sc", "zc"], ["w"], axis=0),
         helper.make_node("Conv", ["d", "w"], ["y"])], X4,
        {"s": np.float32(0.1), "z": np.int8(0), "w8": np.ones((8, 8, 1, 1), np.int8),
         "sc": np.full(8, 0.1, np.float32), "zc": np.zeros(8, np.int8)}),
    "qdq-fp8": graph_of(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])], X4,
        {"s": np.float32(0.1)}),
    "dq-int4-blocked": graph_of(
        [helper.make_node("DequantizeLinear", ["w4", "s"], ["w"], axis=1, block_size=4),
         helper.make_node("MatMul", ["a", "w"], ["y"])], {"a": (F, [2, 8])},
        {"s": np.full((8, 2), 0.1, np.float32)}, opset=21),
    "reduce-mean-initializer-axes": graph_of([helper.make_node("ReduceMean", ["x", "ax"], ["y"])], X4,
                                             {"ax": np.array([2, 3], np.int64)}),
}
# a zero point of FP8 E4M3FN and an INT4 weight: numpy has no such types, so they are made by helper
ACCEPTED["qdq-fp8"].graph.initializer.append(helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0.0]))
ACCEPTED["dq-int4-blocked"].graph.initializer.append(helper.make_tensor("w4", TensorProto.INT4, [8, 8], [1] * 64))


@pytest.mark.parametrize("name", ACCEPTED)
def test_the_parser_takes(name):
    assert unsupported(ACCEPTED[name]) == []


def test_the_table_holds_what_vitexport_writes():
    written = ("Add Cast Concat Conv ConvTranspose DequantizeLinear Div Erf Expand Gather Gemm Greater "
               "LayerNormalization MatMul Mul Neg Pow QuantizeLinear Relu Reshape Resize Shape Sigmoid Slice Softmax "
               "Split Squeeze Tanh Transpose Unsqueeze Where")
    assert set(written.split()) <= set(OPS), set(written.split()) - set(OPS)
    assert "onnx/onnx-tensorrt" in SOURCE and "dd0a3a9f8794ae4f0316ed07ea68cda9b944bb3c" in SOURCE


# -- graphs the parser refuses, each for the restriction it names ---------------------------------------------------

def single(op, inputs, inits=None, outputs=("y",), opset=18, **attrs):
    """A graph of one node of `op` over `inputs` (all of them: inputs, then constants), named 'n'."""
    names = list(inputs) + list(inits or {})
    return graph_of([helper.make_node(op, names, list(outputs), name="n", **attrs)], inputs, inits, opset, outputs)


def local_function(body_op, **attrs):
    """A graph calling a local function whose body is one `body_op` node."""
    f = helper.make_function("local", "Body", ["a"], ["b"], [helper.make_node(body_op, ["a"], ["b"], **attrs)],
                             [helper.make_opsetid("", 18)])
    return graph_of([helper.make_node("Body", ["x"], ["y"], domain="local", name="call")], X4, functions=[f])


def if_graph(then_node):
    """An If whose then-branch runs `then_node` (x -> out), its else-branch an Identity."""
    def branch(node):
        return helper.make_graph([node], "b", [], [helper.make_value_info("out", onnx.TypeProto())])
    return graph_of([helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch(then_node),
                                      else_branch=branch(helper.make_node("Identity", ["x"], ["out"])))],
                    {**X4, "c": (TensorProto.BOOL, [])})


REFUSED = [
    ("resize-antialias", single("Resize", {**X4, "sizes": (I64, [4])}, mode="cubic", antialias=1), ANTIALIAS),
    ("resize-half-pixel-symmetric", single("Resize", {**X4, "sizes": (I64, [4])},
                                           coordinate_transformation_mode="half_pixel_symmetric"),
     "coordinate_transformation_mode 'half_pixel_symmetric'"),
    ("resize-keep-aspect-ratio", single("Resize", {**X4, "sizes": (I64, [4])}, keep_aspect_ratio_policy="not_larger"),
     "keep_aspect_ratio_policy must be stretch"),
    ("resize-linear-batch-axis", single("Resize", X4, {"roi": np.zeros(0, np.float32),
                                                       "s": np.array([2, 1, 1, 1], np.float32)}, mode="linear"),
     "outside the 3 innermost"),
    ("resize-cubic-channels", single("Resize", X4, {"roi": np.zeros(0, np.float32),
                                                    "s": np.array([1, 2, 2, 1], np.float32)}, mode="cubic"),
     "cubic resize of an axis outside the 2 innermost"),
    ("resize-tensor-scales-some-axes", single("Resize", {**X4, "roi": (F, [0]), "s": (F, [2])}, axes=[2, 3]),
     "scales as a tensor with axes"),
    ("einsum-upper-case", single("Einsum", {"a": (F, [2, 3]), "b": (F, [3, 4])}, equation="AB,BC->AC"),
     "labels a-z only"),
    ("einsum-int64", single("Einsum", {"a": (I64, [2, 3])}, equation="ij->ji"), "input type INT64"),
    ("conv-4d-spatial", single("Conv", {"x": (F, [1, 2, 3, 3, 3, 3]), "w": (F, [2, 2, 1, 1, 1, 1])}),
     "TensorRT convolves 1, 2 or 3 spatial axes"),
    ("conv-transpose-negative-pre-padding", single("ConvTranspose", {"x": (F, [1, 8, 4, 4]), "w": (F, [8, 8, 2, 2])},
                                                   strides=[2, 2], output_shape=[12, 12]), "negative pre-padding"),
    ("batchnorm-training", single("BatchNormalization", {**X4, **{k: (F, [8]) for k in "sbmv"}}, training_mode=1),
     "training_mode=1"),
    ("batchnorm-running-stats-outputs", single("BatchNormalization", {**X4, **{k: (F, [8]) for k in "sbmv"}},
                                               outputs=("y", "rm", "rv"), training_mode=0),
     "only the first output"),
    ("pad-vector-value", single("Pad", X4, {"p": np.zeros(8, np.int64), "v": np.zeros(2, np.float32)}),
     "constant_value must be a scalar"),
    ("topk-unsorted", single("TopK", X4, {"k": np.array([2], np.int64)}, outputs=("y", "i"), sorted=0),
     "sorted=0"),
    ("topk-large-k", single("TopK", {"x": (F, [1, 5000])}, {"k": np.array([4000], np.int64)}, outputs=("y", "i")),
     "K < 3840"),
    ("range-fp16", single("Range", {"a": (F16, []), "b": (F16, []), "c": (F16, [])}), "input type FLOAT16"),
    ("range-mixed-types", single("Range", {"a": (I64, []), "b": (TensorProto.INT32, []), "c": (I64, [])}),
     "the importer requires one type"),
    ("layernorm-mean-output", single("LayerNormalization", {"h": (F, [2, 4]), "g": (F, [4])},
                                     outputs=("y", "mean")), "only the first output"),
    ("cast-to-int8", single("Cast", X4, to=TensorProto.INT8), "a cast to INT8"),
    ("cast-to-fp8", single("Cast", X4, to=TensorProto.FLOAT8E4M3FN), "quantized types come from QuantizeLinear"),
    ("quantize-uint8", single("QuantizeLinear", X4, {"s": np.float32(0.1), "z": np.uint8(128)}),
     "quantizes to UINT8"),
    ("quantize-nonzero-zero-point", single("QuantizeLinear", X4, {"s": np.float32(0.1), "z": np.int8(3)}),
     "y_zero_point must be 0"),
    ("quantize-negative-scale", single("QuantizeLinear", X4, {"s": np.float32(-0.1), "z": np.int8(0)}),
     "scale coefficients must all be positive"),
    ("dequantize-int32-bias", single("DequantizeLinear", {}, {"b": np.ones(8, np.int32), "s": np.float32(0.1)}),
     "input type INT32"),
    ("dequantize-uint8", single("DequantizeLinear", {}, {"w": np.ones(8, np.uint8), "s": np.float32(0.1)}),
     "input type UINT8"),
    ("dequantize-scale-rank", single("DequantizeLinear", {}, {"w": np.ones((2, 4, 4), np.int8),
                                                              "s": np.full((2, 4), 0.1, np.float32)}),
     "a 2-D scale for a 3-D input"),
    ("dequantize-two-blocked-axes", single("DequantizeLinear", {}, {"w": np.ones((8, 8), np.int8),
                                                                    "s": np.full((2, 2), 0.1, np.float32)},
                                           opset=21, axis=1, block_size=4), "block exactly one axis"),
    ("dequantize-channels", single("DequantizeLinear", {}, {"w": np.ones((8, 4), np.int8),
                                                            "s": np.full(5, 0.1, np.float32)}, axis=0),
     "5 scales for 8 channels"),
    ("matmul-int64", single("MatMul", {"a": (I64, [2, 3]), "b": (I64, [3, 2])}), "input type INT64"),
    ("sqrt-int64", single("Sqrt", {"a": (I64, [2])}), "input type INT64"),
    ("where-uint8", single("Where", {"c": (TensorProto.BOOL, [2]), "a": (TensorProto.UINT8, [2]),
                                     "b": (TensorProto.UINT8, [2])}), "input type UINT8"),
    ("reduce-tensor-axes", single("ReduceMean", {**X4, "ax": (I64, [1])}), "axes must be an initializer"),
    ("squeeze-dynamic-no-axes", single("Squeeze", {"x": (F, ["n", 1, 4])}), "no axes on a dynamic shape"),
    ("dropout-training", single("Dropout", X4, {"r": np.float32(0.5), "t": np.bool_(True)}, outputs=("y",)),
     "training_mode is true"),
    ("maxpool-indices", single("MaxPool", X4, outputs=("y", "i"), kernel_shape=[2, 2]), "only the first output"),
    ("maxpool-dilated", single("MaxPool", X4, kernel_shape=[2, 2], dilations=[2, 2]), "dilations other than 1"),
    ("gelu-unknown-approximation", single("Gelu", X4, opset=20, approximate="erf"), "approximate='erf'"),
    ("constant-string", graph_of([helper.make_node("Constant", [], ["y"], name="n", value_string="a")], {}),
     "value_string is unsupported"),
    ("unknown-op", single("FooBar", X4), "not in TensorRT's ONNX operator support matrix"),
    ("matrix-n-op", single("Unique", X4), "the support matrix marks it unsupported"),
    ("custom-domain", graph_of([helper.make_node("FusedMatMul", ["x", "x"], ["y"], name="n",
                                                 domain="com.microsoft")], X4), "domain 'com.microsoft'"),
    ("local-function-body", local_function("Cast", to=TensorProto.INT8), "node call/"),
    ("if-branch", if_graph(helper.make_node("Cast", ["x"], ["out"], name="c8", to=TensorProto.INT8)),
     "node if/then_branch/c8 (Cast): a cast to INT8"),
    ("opset-25", single("Relu", X4, opset=25), "model (opset 25): TensorRT's parser reads opsets 9 to 24"),
    ("rms-norm-before-10.15", single("RMSNormalization", {"h": (F, [2, 4]), "g": (F, [4])}, opset=23),
     "imports it from 10.15 on"),
]


@pytest.mark.parametrize("name, model, restriction", REFUSED, ids=[r[0] for r in REFUSED])
def test_the_parser_refuses(name, model, restriction):
    line = why(model)
    assert restriction in line, line
    assert line.startswith(("node ", "model (opset"))


def test_a_line_names_the_node_and_its_op():
    assert why(REFUSED[0][1]) == f"node n (Resize): {ANTIALIAS}"


def test_what_a_later_release_adds_counts_from_it():
    model = single("RMSNormalization", {"h": (F, [2, 4]), "g": (F, [4])}, opset=23)
    assert unsupported(model, trt_version=(10, 15)) == []
    attention = single("Attention", {"q": (F, [1, 2, 4, 8]), "k": (F, [1, 2, 4, 8]), "v": (F, [1, 2, 4, 8])},
                       outputs=("y",), opset=23)
    assert "from 10.14 on" in why(attention) and unsupported(attention, trt_version=(10, 14)) == []


def test_a_version_below_the_floor_is_refused():
    with pytest.raises(ValueError, match="10.12 and newer"):
        unsupported(ACCEPTED["einsum-lowercase"], trt_version=(10, 11))


def test_a_local_function_the_parser_takes_gives_nothing():
    assert unsupported(local_function("Relu")) == []


def test_weights_left_in_external_data_are_read_as_far_as_the_graph_holds_them(tmp_path):
    model = ACCEPTED["qdq-int8-per-tensor-and-per-channel"]
    onnx.save(model, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=0)
    assert unsupported(onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)) == []


def test_parser_refusals_adds_the_forbidden_ops_and_leaves_antialias_to_the_build():
    flagged = parser_refusals(if_graph(helper.make_node("Cast", ["x"], ["out"], name="c8", to=TensorProto.INT8)))
    assert flagged[0] == "if (If)" and flagged[1].startswith("node if/then_branch/c8 (Cast)") and len(flagged) == 2
    assert describe(flagged).startswith("2 nodes TensorRT's parser refuses (if (If), node if/then_branch/c8 (Cast)")
    assert parser_refusals(REFUSED[0][1]) == []


# -- what vitexport exports ------------------------------------------------------------------------------------------

TINY = dict(img_size=(32, 32), patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10)
EXPORTS = {"fixed": {}, "dynamic-bicubic": dict(dynamic_img_size=True, pos_embed_interp="bicubic"),
           "dynamic-bilinear-corners": dict(dynamic_img_size=True, pos_embed_interp="bilinear-corners"),
           "dynamic-bicubic-antialias": dict(dynamic_img_size=True, pos_embed_interp="bicubic-antialias")}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny ViT exported at a fixed size and at a dynamic one with each way of resampling its position table."""
    from vitexport.exporter.to_onnx import export_onnx
    from vitexport.model.build import build_model
    from vitexport.model.config import ViTConfig

    root = tmp_path_factory.mktemp("onnx-support")
    graphs = {}
    for name, extra in EXPORTS.items():
        model = build_model(ViTConfig(**TINY, **extra)).eval()
        path = export_onnx(model, root / f"{name}.onnx", img_size_range=((16, 16), (64, 64)) if extra else None)
        graphs[name] = onnx.load(str(path), load_external_data=False)
    return graphs


@pytest.mark.parametrize("name", [n for n in EXPORTS if "antialias" not in n])
def test_a_vitexport_graph_holds_nothing_the_parser_refuses(exported, name):
    graph = exported[name]
    assert unsupported(graph) == [] and parser_refusals(graph) == []
    assert {"Conv", "LayerNormalization", "MatMul", "Softmax", "Erf"} <= {n.op_type for n in graph.graph.node}
    assert ("Resize" in {n.op_type for n in graph.graph.node}) == (name != "fixed")


def test_an_antialiased_position_table_is_the_one_refusal_and_left_to_the_build(exported):
    graph = exported["dynamic-bicubic-antialias"]
    resize = next(n for n in graph.graph.node if n.op_type == "Resize")
    assert unsupported(graph) == [f"node {resize.name} (Resize): {ANTIALIAS}"]
    assert parser_refusals(graph) == []
