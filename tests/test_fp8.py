"""FP8 (E4M3) on the trained digits model: accuracy on real labels through ONNX Runtime, the graph's placement and
values checked against the FP32 weights and an independent calibration, `trt --fp8` without TensorRT, the GPU gate."""

from __future__ import annotations

import importlib.util

import ml_dtypes
import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from conftest import ROOT, copy_export
from onnx import numpy_helper

from vitexport.artifacts.folder import ModelFolder
from vitexport.backends.ort_backend import OrtRunner
from vitexport.backends.ort_session import create_session
from vitexport.cli import cli
from vitexport.data.images import load_folder
from vitexport.errors import VitexportError
from vitexport.model.variants import DIGITS_VARIANT, VARIANTS
from vitexport.precision.calibrate import calibrate
from vitexport.tensorrt_engine.fusion import attention_sites
from vitexport.tensorrt_engine.options import check_fp8_gpu

HELDOUT = ROOT / "calibration" / "digits" / "heldout"
CALIB = ROOT / "calibration" / "digits" / "calib"
HAVE_TRT = importlib.util.find_spec("tensorrt") is not None


@pytest.fixture(scope="module")
def folder(tmp_path_factory, digits_export):
    out = copy_export(digits_export, tmp_path_factory.mktemp("fp8") / "digits")
    r = CliRunner().invoke(cli, ["quantize", "--fp8", str(out)])
    assert r.exit_code == 0, r.output
    assert "Parity vs FP32: passed" in r.output
    return out


def _top1(path, data, optimize="all"):
    sess = create_session(path, optimize=optimize)
    logits = np.concatenate([sess.run(None, {"pixel_values": data.x[i:i + 60]})[0] for i in range(0, len(data), 60)])
    return logits, float((logits.argmax(1) == data.labels).mean()) * 100


def test_fp8_keeps_top1_within_half_a_point_on_the_labelled_digits(folder):
    held = load_folder(HELDOUT, VARIANTS[DIGITS_VARIANT].preprocess())
    ref, acc32 = _top1(folder / "model.onnx", held)
    out, acc8 = _top1(folder / "model.fp8.onnx", held, optimize="basic")
    assert abs(acc8 - acc32) <= 0.5, (acc32, acc8)
    cos = (ref * out).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(out, axis=1)
    assert cos.min() > 0.98
    record = ModelFolder(folder).read_manifest().precisions["fp8"]
    assert record.file == "model.fp8.onnx" and record.check.passed and record.calibration.samples == 200
    assert record.qdq["weight_max"] == 448 and record.qdq["quantized_gemms"] == 4 * 4 + 4 * 2


def test_the_graph_is_the_tensorrt_fp16_graph_with_fp8_qdq_where_modelopt_puts_it(folder):
    path = folder / "model.fp8.onnx"
    onnx.checker.check_model(str(path), full_check=True)
    model = onnx.load(str(path))
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) == 21
    inits = {i.name: i for i in model.graph.initializer}
    nodes = {n.name: n for n in model.graph.node}
    dq = {n.output[0]: n for n in model.graph.node if n.op_type == "DequantizeLinear"}
    qdq = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert {inits[n.input[2]].data_type for n in qdq} == {onnx.TensorProto.FLOAT8E4M3FN}
    assert {inits[n.input[1]].data_type for n in qdq} == {onnx.TensorProto.FLOAT16}
    readers = {n.name for n in model.graph.node if any(i in dq for i in n.input)}
    sites = attention_sites(model)
    products = {n for s in sites for n in (s.bmm1, s.bmm2)}
    weight_gemms = {f"blocks.{b}.{m}/MatMul" for b in range(4) for m in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")}
    assert readers == weight_gemms | products  # not the patch embedding's Conv, not the head
    assert len(sites) == 4 and {s.dtype for s in sites} == {"fp8"}
    for name in readers:  # both inputs: an activation and an FP8 weight, or two activations (Softmax's included)
        sources = [dq[i].input[0] for i in nodes[name].input[:2] if i in dq]
        weights = [s for s in sources if s in inits]
        assert len(sources) == 2 and len(weights) == (0 if name in products else 1), name
    assert not any(o.name in dq for o in model.graph.output)
    # otherwise the graph TensorRT's FP16 plan is built from, node for node
    convert = pytest.importorskip("vitexport.precision.convert")
    convert.convert_fp16(folder / "model.onnx", folder / "fp16-trt-copy.onnx", ())
    fp16 = onnx.load(str(folder / "fp16-trt-copy.onnx"))
    assert sorted((n.name, n.op_type) for n in model.graph.node if n not in qdq) == \
        sorted((n.name, n.op_type) for n in fp16.graph.node)


def test_weights_are_e4m3_per_output_channel_and_activation_scales_are_amax_over_448(folder):
    fp32 = onnx.load(str(folder / "model.onnx"))
    model = onnx.load(str(folder / "model.fp8.onnx"))
    w32 = {i.name: numpy_helper.to_array(i) for i in fp32.graph.initializer}
    inits = {i.name: i for i in model.graph.initializer}
    fp32_inputs = {n.name: list(n.input) for n in fp32.graph.node}
    dq = {n.output[0]: n for n in model.graph.node if n.op_type == "DequantizeLinear"}
    checked = 0
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.input[1] in dq and fp32_inputs[node.name][1] in w32:
            d = dq[node.input[1]]
            q = numpy_helper.to_array(inits[d.input[0]])
            assert q.dtype == ml_dtypes.float8_e4m3fn
            scale = numpy_helper.to_array(inits[d.input[1]]).astype(np.float32)
            w = w32[fp32_inputs[node.name][1]]
            assert scale.shape == (w.shape[1],)  # per output channel
            np.testing.assert_allclose(scale, np.abs(w).max(0) / 448, rtol=1e-3)  # FP16-rounded amax / 448
            back = q.astype(np.float32) * scale
            assert np.all(np.abs(back - w) <= np.abs(w) / 16 + scale * 2.0 ** -9)  # 3 mantissa bits, or subnormal
            checked += 1
    assert checked == 16
    # an activation's scale is its calibrated range / 448: calibrated here again, independently of the step
    pp = VARIANTS[DIGITS_VARIANT].preprocess()
    data = load_folder(CALIB, pp)
    tensor = fp32_inputs["blocks.1.mlp.fc2/MatMul"][0]
    amax = calibrate(folder / "model.onnx", [tensor], (data.x[i:i + 8] for i in range(0, len(data), 8)),
                     "pixel_values", "percentile").amax[tensor]
    scale = numpy_helper.to_array(inits[f"{tensor}_act_scale"])
    assert scale.dtype == np.float16 and abs(float(scale) - amax / 448) <= 1e-3 * amax / 448


def test_onnxruntime_rows_of_the_fp8_graph_give_accuracy_not_speed(folder):
    runner = OrtRunner(folder / "model.fp8.onnx", "fp8", "cpu", kind="fp8")
    assert runner.name == "onnxruntime cpu fp8" and not runner.timed
    with runner:  # the basic optimization level: the extended one breaks FP8 Q/DQ on the CPU provider
        x = np.zeros((2, 3, 32, 32), np.float32)
        assert runner.infer_all(x).shape == (2, 10)
    with pytest.raises(Exception, match="MatMulIntegerToFloat|Squeeze"):
        create_session(folder / "model.fp8.onnx", optimize="all")


def test_a_user_s_own_session_with_the_recorded_options_runs_the_fp8_graph(folder):
    """A user opening model.fp8.onnx in ONNX Runtime as usual gets its optimizer's type error: the manifest records
    the session options that run it, `vitexport info` says them in one line, and a plain session made from that
    record (no vitexport code) gives what vitexport's own runner gives."""
    import onnxruntime as ort

    from vitexport.artifacts.folder import ARTIFACTS
    from vitexport.backends.ort_session import session_options

    record = ModelFolder(folder).read_manifest().precisions["fp8"]
    assert record.onnxruntime == {"graph_optimization_level": "ORT_ENABLE_BASIC"}
    assert [k for k in ARTIFACTS if session_options(k) is not None] == ["fp8"]  # every other file: ORT's defaults
    so = ort.SessionOptions()
    for key, value in record.onnxruntime.items():
        setattr(so, key, getattr(ort.GraphOptimizationLevel, value))
    sess = ort.InferenceSession(str(folder / "model.fp8.onnx"), so, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((3, 3, 32, 32)).astype(np.float32)
    with OrtRunner(folder / "model.fp8.onnx", "fp8", "cpu", kind="fp8") as runner:
        np.testing.assert_array_equal(sess.run(None, {"pixel_values": x})[0], runner.infer_all(x))
    r = CliRunner().invoke(cli, ["info", str(folder)])
    line = [ln for ln in r.output.splitlines() if "model.fp8.onnx" in ln and "runtime" in ln]
    assert len(line) == 1 and "graph_optimization_level=ORT_ENABLE_BASIC" in line[0], r.output
    assert not any("runtime" in ln and "model.onnx" in ln for ln in r.output.splitlines())


@pytest.mark.skipif(HAVE_TRT, reason="TensorRT is installed here: the engine tests cover this machine")
def test_trt_fp8_without_tensorrt_exits_4_and_leaves_the_onnx(folder):
    (folder / "model.fp8.onnx").unlink()
    r = CliRunner().invoke(cli, ["trt", "--fp8", str(folder), "-q"])
    assert r.exit_code == 4, r.output
    assert r.output.strip().splitlines()[-1].startswith("Error: TensorRT is not installed")
    onnx.checker.check_model(str(folder / "model.fp8.onnx"), full_check=True)
    assert not list(folder.glob("*.plan"))


@pytest.mark.parametrize("cc,ok", [("8.9", True), ("9.0", True), ("10.0", True), ("8.6", False), ("7.5", False),
                                   (None, False)])
def test_an_fp8_engine_needs_compute_capability_8_9(cc, ok):
    gpu = {"name": "NVIDIA A100-SXM4-80GB", "compute_capability": cc}
    check_fp8_gpu("int8", gpu)  # other precisions: nothing to say
    if ok:
        check_fp8_gpu("fp8", gpu)
        return
    with pytest.raises(VitexportError) as e:
        check_fp8_gpu("fp8", gpu)
    assert e.value.exit_code == 5
    assert str(e.value) == (f"NVIDIA A100-SXM4-80GB has compute capability {cc or '0.0'}, and FP8 engines need 8.9 "
                            f"or newer (Ada, Hopper); build --int8 or --fp16 on it instead.")


def test_trt_fp8_on_an_older_gpu_stops_before_building(folder, monkeypatch):
    import vitexport.tensorrt_engine.compiler as compiler
    from vitexport.tensorrt_engine.options import BuildOptions

    monkeypatch.setattr(compiler, "require_trt_and_gpu",
                        lambda: ("10.13.0.35", {"name": "NVIDIA A100", "compute_capability": "8.0"}))
    built = []
    with pytest.raises(VitexportError, match="compute capability 8.0, and FP8 engines need 8.9"):
        compiler.run_trt(folder, BuildOptions(precision="fp8"), build=lambda *a: built.append(a))
    assert built == [] and not list(folder.glob("*.plan"))
