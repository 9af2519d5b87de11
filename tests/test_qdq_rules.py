"""The Q/DQ rules of precision/qdq.py on small hand-made graphs, each against an independent oracle: which GEMMs
are chosen, each weight's channel axis, the quantized values against numpy's rounding, the graph ONNX Runtime runs
against the same integer arithmetic done in numpy, and the invariants counted on graphs built to break each one.
(test_qdq.py checks the same code on the trained digits model against real labels.)"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from vitexport.errors import VitexportError
from vitexport.precision.qdq import (
    CPU_WEIGHT_MAX,
    INT8_MAX,
    MIN_SCALE,
    TRT_INT8_OPSET,
    _weight_axis,
    activation_scale,
    insert_qdq,
    quantize_weight,
    trt_int8_invariants,
    write_trt_int8,
)
from vitexport.precision.selection import GemmSelection, is_matrix_vector, select_gemms
from vitexport.tensorrt_engine.fusion import quantized_gemms

RNG = np.random.default_rng(11)
W1 = RNG.standard_normal((8, 6)).astype(np.float32)  # (K, N) of a MatMul
W2 = RNG.standard_normal((4, 6)).astype(np.float32)  # (N_out, K) of a Gemm with transB=1


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def _model(nodes, inputs, outputs, inits, value_info=(), opset=18):
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()],
                              value_info=list(value_info))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def _mixed(opset=17):
    """x (b, 3, 8) -> fc (MatMul W1) -> h; h . h^T (attention-like); the mean over tokens (b, 6) -> head (Gemm,
    transB) -> g (b, 4) -> a MatMul with a Constant node's weight; an Add that is not linear. Opset 17: ReduceMean
    still takes its axes as an attribute."""
    const = helper.make_node("Constant", [], ["c"], name="const",
                             value=numpy_helper.from_array(RNG.standard_normal((4, 4)).astype(np.float32)))
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc"),
        helper.make_node("Transpose", ["h"], ["ht"], name="t", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["h", "ht"], ["att"], name="attn"),
        helper.make_node("ReduceMean", ["h"], ["pooled"], name="pool", axes=[1], keepdims=0),
        helper.make_node("Gemm", ["pooled", "w2"], ["g"], name="head", transB=1),
        const,
        helper.make_node("MatMul", ["g", "c"], ["gc"], name="const_mm"),
        helper.make_node("Add", ["gc", "g"], ["out"], name="add"),
    ]
    return _model(nodes, [_vi("x", ["b", 3, 8])], [_vi("out", ["b", 4]), _vi("att", ["b", 3, 3])],
                  {"w1": W1, "w2": W2}, [_vi("pooled", ["b", 6]), _vi("h", ["b", 3, 6]), _vi("g", ["b", 4])],
                  opset=opset)


def test_which_gemms_are_chosen():
    graph = _mixed().graph
    sel = select_gemms(graph, set())
    assert (sel.nodes, sel.activations) == (["fc", "head", "const_mm"], ["x", "pooled", "g"])
    sel = select_gemms(graph, set(), quantize_attention=True)  # the product of two activations too
    assert (sel.nodes, sel.activations) == (["fc", "attn", "head", "const_mm"], ["x", "h", "ht", "pooled", "g"])
    sel = select_gemms(graph, {"fc", "attn"}, quantize_attention=True)
    assert sel.nodes == ["head", "const_mm"]
    sel = select_gemms(graph, set(), skip_matrix_vector=True)  # (batch, K) products stay in float
    assert (sel.nodes, sel.activations) == (["fc"], ["x"])


def test_a_matrix_vector_product_is_a_gemm_or_a_matmul_of_a_rank_2_activation():
    graph = _mixed().graph
    kinds = {n.name: is_matrix_vector(graph, n) for n in graph.node}
    assert kinds == {"fc": False, "t": False, "attn": False, "pool": False, "head": True, "const": False,
                     "const_mm": True, "add": False}
    del graph.value_info[:]  # no shapes known: a MatMul is not taken for one
    assert not is_matrix_vector(graph, next(n for n in graph.node if n.name == "const_mm"))
    graph.input.append(_vi("g", ["b", 4]))  # shapes are also read from the graph's inputs and outputs
    assert is_matrix_vector(graph, next(n for n in graph.node if n.name == "const_mm"))


@pytest.mark.parametrize("node,shape,axis", [
    (helper.make_node("Conv", ["x", "w"], ["y"]), (16, 3, 4, 4), 0),
    (helper.make_node("Gemm", ["x", "w"], ["y"], transB=1), (4, 6), 0),
    (helper.make_node("Gemm", ["x", "w"], ["y"], transB=0), (6, 4), 1),
    (helper.make_node("Gemm", ["x", "w"], ["y"]), (6, 4), 1),
    (helper.make_node("Gemm", ["x", "w"], ["y"], alpha=2.0), (6, 4), 1),
    (helper.make_node("MatMul", ["x", "w"], ["y"]), (8, 6), 1),
    (helper.make_node("MatMul", ["x", "w"], ["y"]), (2, 8, 6), 2),
])
def test_the_output_channel_axis_of_each_weight(node, shape, axis):
    assert _weight_axis(node, shape) == axis


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("qmax", [INT8_MAX, CPU_WEIGHT_MAX])
def test_weights_are_rounded_with_the_stored_scale(dtype, qmax):
    w = RNG.standard_normal((5, 7)).astype(np.float32) * np.float32(3)
    w[:, 2] = 0  # a channel of zeros still gets a usable scale
    q, scale = quantize_weight(w, 1, dtype, qmax)
    assert scale.dtype == dtype and scale.shape == (7,) and q.dtype == np.int8
    amax = np.abs(w).max(0)
    np.testing.assert_array_equal(scale, np.maximum(amax / qmax, MIN_SCALE).astype(dtype))
    want = np.clip(np.rint(w / scale.astype(np.float32)[None, :]), -qmax, qmax)  # the scale as stored
    np.testing.assert_array_equal(q, want)
    assert np.abs(q).max() == qmax and not q[:, 2].any() and scale[2] == np.asarray(MIN_SCALE, dtype)


def test_a_one_dimensional_weight_has_a_scale_per_element():
    w = np.array([0.5, -2.0, 4.0], np.float32)
    q, scale = quantize_weight(w, 0, np.float32)
    np.testing.assert_allclose(scale, np.abs(w) / INT8_MAX)
    np.testing.assert_array_equal(q, [127, -127, 127])


@pytest.mark.parametrize("amax,want", [(0.0, MIN_SCALE), (127.0, 1.0), (12.7, 0.1), (1e-9, MIN_SCALE)])
def test_activation_scales(amax, want):
    s = activation_scale(amax, np.float32)
    assert s.dtype == np.float32 and s.shape == () and float(s) == pytest.approx(want, rel=1e-6)
    assert activation_scale(amax).dtype == np.float16


def _fake_quant(x, scale, qmax=INT8_MAX):
    """QuantizeLinear then DequantizeLinear (zero point 0), as ONNX defines them, in numpy."""
    return np.clip(np.rint(x / scale), -128, 127).astype(np.float32) * scale


def _copy(model):
    return onnx.load_from_string(model.SerializeToString())


def test_the_cpu_graph_computes_the_integer_arithmetic_numpy_does():
    model = _mixed()
    x = RNG.standard_normal((5, 3, 8)).astype(np.float32)
    h = x @ W1
    pooled = h.mean(1)
    g = pooled @ W2.T
    c = numpy_helper.to_array(next(n for n in model.graph.node if n.name == "const").attribute[0].t)
    amax = {"x": float(np.abs(x).max()), "pooled": float(np.abs(pooled).max()), "g": float(np.abs(g).max())}
    sel = select_gemms(model.graph, set())
    q = insert_qdq(model, _copy(model), sel, amax, np.float32, weight_max=CPU_WEIGHT_MAX)
    onnx.checker.check_model(q, full_check=True)
    assert q.opset_import[0].version == 17  # FP32 scales: the opset is left alone
    assert "w1" not in {i.name for i in q.graph.initializer} and "w2" not in {i.name for i in q.graph.initializer}

    def wq(w, axis):
        qw, s = quantize_weight(w, axis, np.float32, CPU_WEIGHT_MAX)
        return qw.astype(np.float32) * (s[None, :] if axis == 1 else s[:, None])

    s = {k: np.float32(activation_scale(v, np.float32)) for k, v in amax.items()}
    h_q = _fake_quant(x, s["x"]) @ wq(W1, 1)
    g_q = _fake_quant(h_q.mean(1), s["pooled"]) @ wq(W2, 0).T
    out_q = _fake_quant(g_q, s["g"]) @ c + g_q  # the Constant weight is an activation-side input: not a DQ'd weight
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # each Q/DQ as its own op
    got, att = ort.InferenceSession(q.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got, out_q, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(att, h_q @ h_q.transpose(0, 2, 1), rtol=1e-4, atol=1e-4)  # float between GEMMs
    ref = (h @ h.transpose(0, 2, 1), g @ c + g)
    assert np.abs(got - ref[1]).max() < 0.1 * np.abs(ref[1]).max()  # and close to FP32: not a wrong graph


def test_q_and_dq_sit_on_gemm_inputs_only_one_pair_per_tensor():
    model = _mixed()
    amax = {"x": 1.0, "h": 2.0, "ht": 2.0, "pooled": 1.5, "g": 3.0}
    sel = select_gemms(model.graph, set(), quantize_attention=True)
    q = insert_qdq(model, _copy(model), sel, amax, np.float32)
    nodes = {n.name: n for n in q.graph.node}
    inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    assert list(nodes["fc"].input) == ["x_act_dq", "w1_int8_dq"]
    assert list(nodes["attn"].input) == ["h_act_dq", "ht_act_dq"]
    assert list(nodes["head"].input) == ["pooled_act_dq", "w2_int8_dq"]
    assert list(nodes["const_mm"].input) == ["g_act_dq", "c"]  # a Constant node's output is not requantized
    assert nodes["x_act/Q"].op_type == "QuantizeLinear" and nodes["x_act/DQ"].op_type == "DequantizeLinear"
    assert list(nodes["x_act/Q"].output) == ["x_act_q"] and list(nodes["x_act/DQ"].input)[0] == "x_act_q"
    assert [a.i for a in nodes["w2_int8/DQ"].attribute if a.name == "axis"] == [0]  # transB: rows are channels
    assert [a.i for a in nodes["w1_int8/DQ"].attribute if a.name == "axis"] == [1]
    assert float(inits["g_act_scale"]) == pytest.approx(3.0 / INT8_MAX)
    assert inits["g_act_zero_point"].dtype == np.int8 and not inits["g_act_zero_point"].any()
    assert inits["w1_int8_zero_point"].shape == (6,) and not inits["w1_int8_zero_point"].any()
    assert sum(n.op_type == "QuantizeLinear" for n in q.graph.node) == 5  # one per activation, none on outputs
    inv = trt_int8_invariants(q)
    # h and g come straight out of a GEMM into the next one here (no Reshape/Add between, unlike a ViT's)
    assert (inv["q_on_gemm_output"], inv["outputs_from_dq"], inv["nonzero_zero_points"]) == (2, 0, 0)
    assert inv["qdq_nodes"] == 5 * 2 + 2 and inv["dq_nodes"] == 7 and inv["dq_feeding_only_gemms"] == 7
    assert quantized_gemms(q) == ["fc", "attn", "head", "const_mm"] and quantized_gemms(model) == []
    with pytest.raises(VitexportError) as e:
        insert_qdq(model, _copy(model), sel, {k: v for k, v in amax.items() if k != "pooled"}, np.float32)
    assert str(e.value) == "No calibrated range for 'pooled' (input of head)."


def test_a_weight_read_along_two_axes_gets_two_int8_copies_and_a_float_weight_still_read_stays():
    w = RNG.standard_normal((6, 6)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),  # channels along axis 1
             helper.make_node("Gemm", ["a", "w"], ["b"], name="gemm", transB=1),  # along axis 0
             helper.make_node("Add", ["b", "w"], ["y"], name="add")]  # reads the float weight itself
    model = _model(nodes, [_vi("x", ["n", 6])], [_vi("y", ["n", 6])], {"w": w})
    q = insert_qdq(model, _copy(model), GemmSelection(["mm", "gemm"], ["x", "a"]), {"x": 1.0, "a": 1.0},
                   np.float32)
    names = {i.name for i in q.graph.initializer}
    assert {"w_int8", "w_int8_axis0", "w"} <= names
    onnx.checker.check_model(q, full_check=True)


def test_fp16_scales_raise_the_opset_to_19_but_never_lower_it():
    model = _mixed()
    sel = select_gemms(model.graph, set())
    amax = {"x": 1.0, "pooled": 1.0, "g": 1.0}
    for opset, want in ((17, TRT_INT8_OPSET), (18, TRT_INT8_OPSET), (21, 21)):
        model.opset_import[0].version = opset
        q = insert_qdq(model, _copy(model), sel, amax, np.float16)
        assert q.opset_import[0].version == want
        reduce_mean = next(n for n in q.graph.node if n.op_type == "ReduceMean")
        # below 18 the converter moves the axes to an input (opset 18's form); from 18 on the graph is left as it is
        assert (len(reduce_mean.input), len(reduce_mean.attribute) == 2) == ((2, False) if opset == 17 else (1, True))
        assert {numpy_helper.to_array(i).dtype for i in q.graph.initializer if i.name.endswith("_scale")} == \
            {np.dtype(np.float16)}


def test_the_tensorrt_file_is_fp16_between_int8_gemms_and_valid(tmp_path):
    src, dst = tmp_path / "fp32.onnx", tmp_path / "int8.trt.onnx"
    model = _mixed()
    onnx.save(model, str(src))
    x = RNG.standard_normal((4, 3, 8)).astype(np.float32)
    pooled = (x @ W1).mean(1)
    amax = {"x": float(np.abs(x).max()), "pooled": float(np.abs(pooled).max()),
            "g": float(np.abs(pooled @ W2.T).max())}
    written = write_trt_int8(src, dst, select_gemms(model.graph, set()), amax)
    onnx.checker.check_model(onnx.load(str(dst)), full_check=True)
    inv = trt_int8_invariants(written)
    assert inv["scale_types"] == ["FLOAT16"] and inv["float_tensors"]["FLOAT16"] > inv["float_tensors"]["FLOAT"]
    assert inv["casts_after_dq"] == 0 and inv["q_on_gemm_output"] == 1  # g: the head's output into const_mm
    assert [i.type.tensor_type.elem_type for i in written.graph.input] == [TensorProto.FLOAT]  # FP32 at the edges
    got = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.abs(got - ref).max() < 0.1 * np.abs(ref).max()


def test_each_invariant_counts_what_breaks_it():
    """A graph that breaks every rule once: Q on a GEMM output, a graph output from a DQ, a nonzero zero point,
    a Cast after a DQ, a DQ that also feeds a non-GEMM, FP32 and FP16 scales."""
    z8, nz8 = np.zeros((), np.int8), np.ones((), np.int8)
    nodes = [
        helper.make_node("DequantizeLinear", ["w8", "s32"], ["wd"], name="dq_no_zero_point"),  # zero point optional
        helper.make_node("MatMul", ["x", "wd"], ["m2"], name="mm2"),
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("QuantizeLinear", ["m", "s32", "z"], ["mq"], name="q_out"),  # on a GEMM's output
        helper.make_node("DequantizeLinear", ["mq", "s32", "nz"], ["y"], name="dq_out"),  # graph output; zp 1
        helper.make_node("QuantizeLinear", ["x", "s16", "z"], ["xq"], name="q_in"),
        helper.make_node("DequantizeLinear", ["xq", "s16", "z"], ["xd"], name="dq_in"),
        helper.make_node("Cast", ["xd"], ["xc"], name="cast", to=TensorProto.FLOAT),  # after a DQ
        helper.make_node("Relu", ["xd"], ["r"], name="relu"),  # a DQ feeding a non-GEMM
    ]
    model = _model(nodes, [_vi("x", ["n", 4])], [_vi("y", ["n", 4]), _vi("xc", ["n", 4]), _vi("r", ["n", 4]),
                                                 _vi("m2", ["n", 4])],
                   {"w": np.eye(4, dtype=np.float32), "s32": np.float32(0.1), "s16": np.float16(0.1), "z": z8,
                    "nz": nz8, "w8": np.eye(4, dtype=np.int8)},
                   [_vi("m", ["n", 4]), _vi("wd", [4, 4]), _vi("xd", ["n", 4], TensorProto.FLOAT16)], opset=19)
    inv = trt_int8_invariants(model)
    assert inv == {"qdq_nodes": 5, "q_on_gemm_output": 1, "outputs_from_dq": 1, "scale_types": ["FLOAT", "FLOAT16"],
                   "nonzero_zero_points": 1, "dq_feeding_only_gemms": 1, "dq_nodes": 3, "casts_after_dq": 1,
                   "float_tensors": {"FLOAT": 4, "FLOAT16": 2}}


def test_a_bias_stays_float_and_skipping_matrix_vector_products_goes_on_past_them():
    rng = np.random.default_rng(12)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="head_first", transB=1),  # (n, K): skipped
             helper.make_node("Unsqueeze", ["h", "ax"], ["h3"], name="u"),
             helper.make_node("MatMul", ["h3", "w3"], ["y"], name="after")]  # (n, 1, K): quantized
    model = _model(nodes, [_vi("x", ["n", 6])], [_vi("y", ["n", 1, 5])],
                   {"w": rng.standard_normal((6, 6)).astype(np.float32), "b": np.ones(6, np.float32),
                    "ax": np.array([1], np.int64), "w3": rng.standard_normal((6, 5)).astype(np.float32)},
                   [_vi("h", ["n", 6]), _vi("h3", ["n", 1, 6])])
    assert select_gemms(model.graph, set(), skip_matrix_vector=True).nodes == ["after"]
    sel = select_gemms(model.graph, set())
    q = insert_qdq(model, _copy(model), sel, {"x": 1.0, "h3": 1.0}, np.float32)
    gemm = next(n for n in q.graph.node if n.name == "head_first")
    assert list(gemm.input) == ["x_act_dq", "w_int8_dq", "b"]  # the bias is added in float, never quantized
    onnx.checker.check_model(q, full_check=True)


def test_a_graph_the_converter_cannot_raise_to_opset_19_is_one_sentence(monkeypatch):
    from onnx import version_converter

    def fails(model, version):
        raise RuntimeError("No Adapter For Foo\nmore lines")

    monkeypatch.setattr(version_converter, "convert_version", fails)
    model = _mixed()
    with pytest.raises(VitexportError) as e:
        insert_qdq(model, _copy(model), select_gemms(model.graph, set()), {"x": 1.0, "pooled": 1.0, "g": 1.0})
    assert str(e.value) == ("The graph's opset 17 could not be converted to opset 19, which FP16 Q/DQ scales need "
                            "(No Adapter For Foo); export it again with --opset 19.")

