"""Q/DQ graphs on the trained digits model: the TensorRT-shaped INT8 graph's invariants and accuracy on real
labels, the CPU INT8 graph, weight quantization, and graph ordering."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import ROOT, copy_export

from vitexport.data.images import load_folder
from vitexport.model.variants import DIGITS_VARIANT, VARIANTS
from vitexport.precision.calibrate import calibrate
from vitexport.precision.convert import topological_sort
from vitexport.precision.qdq import (
    CPU_WEIGHT_MAX,
    INT8_MAX,
    LINEAR_OPS,
    insert_qdq,
    quantize_weight,
    trt_int8_invariants,
    write_trt_int8,
)
from vitexport.precision.selection import select_gemms

CALIB = ROOT / "calibration" / "digits" / "calib"
HELDOUT = ROOT / "calibration" / "digits" / "heldout"


@pytest.fixture(scope="module")
def digits(tmp_path_factory, digits_export):
    return copy_export(digits_export, tmp_path_factory.mktemp("qdq") / "digits") / "model.onnx"


@pytest.fixture(scope="module")
def pp():
    return VARIANTS[DIGITS_VARIANT].preprocess()


@pytest.fixture(scope="module")
def ranges(digits, pp):
    graph = onnx.load(str(digits)).graph
    data = load_folder(CALIB, pp)
    sel = select_gemms(graph, set(), quantize_attention=True)  # every activation any variant below needs
    return calibrate(digits, sel.activations, (data.x[i:i + 16] for i in range(0, len(data), 16)),
                     "pixel_values", "percentile").amax


@pytest.fixture(scope="module")
def heldout(pp):
    return load_folder(HELDOUT, pp)


def _top1(path, data):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    logits = np.concatenate([sess.run(None, {"pixel_values": data.x[i:i + 64]})[0] for i in range(0, len(data), 64)])
    return float((logits.argmax(1) == data.labels).mean()) * 100


def test_trt_graph_has_tensorrt_invariants_and_keeps_accuracy(digits, ranges, heldout, tmp_path):
    graph = onnx.load(str(digits)).graph
    sel = select_gemms(graph, set(), skip_matrix_vector=True)
    dst = tmp_path / "model.int8.trt.onnx"
    write_trt_int8(digits, dst, sel, ranges)
    onnx.checker.check_model(str(dst), full_check=True)
    model = onnx.load(str(dst))
    inv = trt_int8_invariants(model)
    assert inv["q_on_gemm_output"] == 0
    assert inv["outputs_from_dq"] == 0
    assert inv["scale_types"] == ["FLOAT16"]
    assert inv["nonzero_zero_points"] == 0
    assert inv["casts_after_dq"] == 0
    assert inv["dq_feeding_only_gemms"] == inv["dq_nodes"] > 0
    assert inv["float_tensors"]["FLOAT16"] > 0.9 * sum(inv["float_tensors"].values())
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 19
    # which GEMMs got INT8: every weight GEMM but the head; not the attention products
    fed = {n.name for n in model.graph.node if n.op_type in LINEAR_OPS
           and any(i.endswith("_dq") for i in n.input)}
    assert "head/Gemm" not in fed and not any(n.endswith("attn/MatMul") or n.endswith("attn/MatMul_1") for n in fed)
    assert "patch_embed.proj/Conv" in fed and sum(n.endswith("mlp.fc2/MatMul") for n in fed) == 4
    # the graph's I/O stay FP32 for callers
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    fp32_acc, acc = _top1(digits, heldout), _top1(dst, heldout)
    assert fp32_acc >= 95.0
    assert abs(fp32_acc - acc) <= 1.0, (fp32_acc, acc)


def test_cpu_graph_fp32_remainder_and_attention_option(digits, ranges, heldout, tmp_path):
    fp32 = onnx.load(str(digits))
    sel = select_gemms(fp32.graph, set(), quantize_attention=True)
    model = insert_qdq(onnx.load(str(digits)), onnx.load(str(digits)), sel, ranges, np.float32)
    onnx.checker.check_model(model, full_check=True)
    inv = trt_int8_invariants(model)
    assert inv["scale_types"] == ["FLOAT"] and inv["q_on_gemm_output"] == 0
    attn = [n for n in model.graph.node if n.name.endswith("attn/MatMul")]
    assert attn and all(all(i.endswith("_dq") for i in n.input) for n in attn)  # both activations quantized
    dst = tmp_path / "cpu.onnx"
    onnx.save_model(model, str(dst))
    assert abs(_top1(digits, heldout) - _top1(dst, heldout)) <= 1.0


def test_excluded_nodes_stay_float(digits):
    graph = onnx.load(str(digits)).graph
    everything = select_gemms(graph, set())
    fewer = select_gemms(graph, {"blocks.0.mlp.fc1/MatMul"})
    assert set(everything.nodes) - set(fewer.nodes) == {"blocks.0.mlp.fc1/MatMul"}


@pytest.mark.parametrize("axis", [0, 1])
def test_weight_quantization_error_is_at_most_half_a_step(axis):
    rng = np.random.default_rng(axis)
    w = rng.standard_normal((48, 40)).astype(np.float32) * rng.uniform(0.01, 3, size=(48, 1) if axis == 0 else (1, 40))
    q, scale = quantize_weight(w, axis, np.float32)
    s = scale.reshape((-1, 1) if axis == 0 else (1, -1))
    assert q.dtype == np.int8 and np.abs(q).max() == INT8_MAX
    assert np.all(np.abs(w - q.astype(np.float32) * s) <= s / 2 + 1e-6)
    # every channel uses its full range: per-channel, not per-tensor
    assert np.all(np.abs(q).max(axis=1 - axis) == INT8_MAX)


def test_topological_sort_restores_a_checkable_graph(digits):
    model = onnx.load(str(digits))
    nodes = list(model.graph.node)[::-1]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)
    topological_sort(model.graph)
    onnx.checker.check_model(model, full_check=True)


def test_a_weight_shared_by_two_gemms_is_quantized_once():
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="first"),
         helper.make_node("MatMul", ["y", "w"], ["z"], name="second")], "shared",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["b", 8])], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    amax = {"x": float(np.abs(x).max()), "y": float(np.abs(x @ w).max())}
    sel = select_gemms(model.graph, set())
    assert sel.nodes == ["first", "second"] and sel.activations == ["x", "y"]
    # the CPU graph's weight range: ONNX Runtime's fused u8 x s8 kernels saturate 8-bit weights on CPUs without VNNI
    q = insert_qdq(model, onnx.load_from_string(model.SerializeToString()), sel, amax, np.float32,
                   weight_max=CPU_WEIGHT_MAX)
    onnx.checker.check_model(q, full_check=True)
    names = [i.name for i in q.graph.initializer]
    assert len(names) == len(set(names)) and sum(n.endswith("_int8") for n in names) == 1 and "w" not in names
    sess = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = x @ w @ w
    got = sess.run(None, {"x": x})[0]
    assert np.abs(got - ref).max() < 0.05 * np.abs(ref).max()  # INT8 error, not a wrong graph


def _logits(model, data, fused: bool):
    so = ort.SessionOptions()
    if not fused:  # every QuantizeLinear/DequantizeLinear runs as its own op: exact INT8 arithmetic in float
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, {"pixel_values": data.x[i:i + 64]})[0] for i in range(0, len(data), 64)])


def _cos(a, b):
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("bits", [7, 8])
def test_cpu_graph_runs_fused_as_its_exact_int8_math_on_this_cpu(digits, ranges, heldout, tmp_path, bits):
    """ONNX Runtime and OpenVINO fuse DQ -> MatMul into integer kernels; on x86 CPUs without VNNI they multiply
    u8 x s8 pairs with VPMADDUBSW, which saturates 8-bit weights. The CPU graph's 7-bit weights must give, fused,
    what its unfused graph gives on any CPU; its 8-bit ones, which vitexport makes only on a CPU that
    environment.cpu_sums_int8_exactly() says sums them exactly, must do so on such a CPU."""
    from vitexport import environment
    from vitexport.backends.openvino_backend import OpenVinoRunner
    from vitexport.precision.int8 import WEIGHT_BITS

    if bits == 8 and not environment.cpu_sums_int8_exactly():
        pytest.skip("this CPU has no VNNI or AMX: vitexport makes no 8-bit CPU weights on it")
    fp32 = onnx.load(str(digits))
    sel = select_gemms(fp32.graph, set(), skip_matrix_vector=True)
    model = insert_qdq(fp32, onnx.load(str(digits)), sel, ranges, np.float32, weight_max=WEIGHT_BITS[bits])
    weights = [onnx.numpy_helper.to_array(i) for i in model.graph.initializer if i.data_type == onnx.TensorProto.INT8
               and len(i.dims) > 1]
    assert weights and max(int(np.abs(w).max()) for w in weights) == WEIGHT_BITS[bits] == 2 ** (bits - 1) - 1
    exact = _logits(model, heldout, fused=False)
    onnx.save(model, str(tmp_path / "int8.onnx"))
    ov = OpenVinoRunner(tmp_path / "int8.onnx", "int8", input_name="pixel_values", output_name="logits")
    ov.load()
    try:
        by_openvino = ov.infer_all(heldout.x, chunk=64)
    finally:
        ov.close()
    fused = _logits(model, heldout, fused=True)
    assert _cos(fused, exact).min() > 0.999
    assert (fused.argmax(1) == exact.argmax(1)).mean() == 1.0
    # OpenVINO runs the float layers in bf16 on a CPU with BF16 (min cosine 0.995 here, 7 or 8 bits); a saturated
    # sum is far below that (0.42)
    assert _cos(by_openvino, exact).min() > 0.99
    assert (by_openvino.argmax(1) == exact.argmax(1)).mean() >= 0.99
