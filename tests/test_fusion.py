"""The graphs TensorRT plans are built from, and the engine checks read against them, on the trained digits model.

The FP16 and INT8 plans are built from graphs that differ only in the GEMMs' precision (model.fp16.trt.onnx, and
model.int8.trt.onnx: the same graph with Q/DQ), whose attention TensorRT can fuse. Engine descriptions are made from
the real graph's node names in both inspector layouts (TensorRT 10.x: `Bindings`, `Format/Datatype`; 11.x:
`I/O Tensors`, `DataType`), with Myelin's names for fused attention (`_gemm_mha_v2_myl3_6`, NVIDIA/TensorRT#3620
profiles) and for the unfused products (`[MATRIX_MULTIPLY]_[scaled_dot_product_attention]_...`, #3665).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import ROOT, copy_export

from vitexport.backends.ort_backend import provider_nvinfer_major, trt_provider_mismatch
from vitexport.data.images import load_folder
from vitexport.model.variants import DIGITS_VARIANT, VARIANTS
from vitexport.precision.calibrate import calibrate
from vitexport.precision.convert import convert_fp16
from vitexport.precision.qdq import write_trt_int8
from vitexport.precision.selection import select_gemms
from vitexport.tensorrt_engine.engine_info import engine_problems, parse_engine_information
from vitexport.tensorrt_engine.fusion import (
    LINEAR_OPS,
    AttentionSite,
    attention_sites,
    plan_expectations,
    why_not_fused,
)

CALIB = ROOT / "calibration" / "digits" / "calib"
HELDOUT = ROOT / "calibration" / "digits" / "heldout"
QDQ = ("QuantizeLinear", "DequantizeLinear")


@pytest.fixture(scope="module")
def graphs(tmp_path_factory, digits_export):
    """model.onnx, model.fp16.onnx (CPU), model.fp16.trt.onnx, and two TensorRT INT8 graphs (attention products
    quantized or not), from one export and one calibration."""
    out = copy_export(digits_export, tmp_path_factory.mktemp("fusion") / "digits")
    fp32 = out / "model.onnx"
    convert_fp16(fp32, out / "model.fp16.onnx")
    convert_fp16(fp32, out / "model.fp16.trt.onnx", ())
    pp = VARIANTS[DIGITS_VARIANT].preprocess()
    data = load_folder(CALIB, pp)
    graph = onnx.load(str(fp32)).graph
    every = select_gemms(graph, set(), quantize_attention=True)
    amax = calibrate(fp32, every.activations, (data.x[i:i + 16] for i in range(0, len(data), 16)), "pixel_values",
                     "percentile").amax
    paths = {"fp32": fp32, "fp16": out / "model.fp16.onnx", "fp16-trt": out / "model.fp16.trt.onnx"}
    for name, attention in (("int8-trt", False), ("int8-trt-attn", True)):
        sel = select_gemms(graph, set(), quantize_attention=attention, skip_matrix_vector=True)
        paths[name] = out / f"{name}.onnx"
        write_trt_int8(fp32, paths[name], sel, amax)
    return paths


def _load(path):
    return onnx.load(str(path))


def test_the_tensorrt_fp16_graph_computes_every_op_in_fp16_and_matches_fp32(graphs):
    model = _load(graphs["fp16-trt"])
    onnx.checker.check_model(str(graphs["fp16-trt"]), full_check=True)
    casts = [n for n in model.graph.node if n.op_type == "Cast"]
    assert len(casts) == 2 and casts[0].input[0] == "pixel_values" and casts[-1].output[0] == "logits"
    assert all(i.data_type == onnx.TensorProto.FLOAT16 for i in model.graph.initializer
               if i.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16))
    layer_norms = [n for n in model.graph.node if n.op_type == "LayerNormalization"]
    assert len(layer_norms) == 9 and all(a.i == 1 for n in layer_norms for a in n.attribute if a.name == "stash_type")
    # against FP32 in ONNX Runtime, on the labelled held-out digits
    held = load_folder(HELDOUT, VARIANTS[DIGITS_VARIANT].preprocess())
    outs = [np.concatenate([ort.InferenceSession(str(graphs[k]), providers=["CPUExecutionProvider"])
                            .run(None, {"pixel_values": held.x[i:i + 60]})[0] for i in range(0, len(held), 60)])
            for k in ("fp32", "fp16-trt")]
    cos = (outs[0] * outs[1]).sum(1) / np.linalg.norm(outs[0], axis=1) / np.linalg.norm(outs[1], axis=1)
    assert cos.min() > 0.999 and (outs[0].argmax(1) == outs[1].argmax(1)).mean() > 0.99
    assert (outs[1].argmax(1) == held.labels).mean() > 0.95


def test_the_int8_graph_is_the_fp16_graph_with_qdq_on_the_gemm_inputs(graphs):
    """What the FP16 and INT8 plans are timed from differs only in the GEMMs' precision."""
    fp16, int8 = _load(graphs["fp16-trt"]), _load(graphs["int8-trt"])
    assert sorted((n.name, n.op_type) for n in int8.graph.node if n.op_type not in QDQ) == \
        sorted((n.name, n.op_type) for n in fp16.graph.node)
    types16 = {v.name: v.type.tensor_type.elem_type for v in fp16.graph.value_info}
    types8 = {v.name: v.type.tensor_type.elem_type for v in int8.graph.value_info}
    shared = types16.keys() & types8.keys()
    assert len(shared) > 0.9 * len(types16) and all(types16[k] == types8[k] for k in shared)
    dq = {o for n in int8.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    changed = [n for n in int8.graph.node if n.op_type not in QDQ and any(i in dq for i in n.input)]
    assert changed and all(n.op_type in LINEAR_OPS for n in changed)


def test_attention_sites_in_each_graph(graphs):
    fp32 = attention_sites(_load(graphs["fp32"]))
    assert [s.nodes for s in fp32] == [(f"blocks.{b}.attn/MatMul", f"blocks.{b}.attn/Softmax",
                                        f"blocks.{b}.attn/MatMul_1") for b in range(4)]
    assert {(s.dtype, s.head_size, s.seq_len) for s in fp32} == {("fp32", 16, 65)}  # 64 wide, 4 heads, 8x8+1 tokens
    assert all("fp32" in why_not_fused(s) for s in fp32)
    assert attention_sites(_load(graphs["fp16"])) == []  # Softmax in FP32 between Casts: nothing TensorRT fuses
    for kind, dtype in (("fp16-trt", "fp16"), ("int8-trt", "fp16"), ("int8-trt-attn", "int8")):
        sites = attention_sites(_load(graphs[kind]))
        assert [s.nodes for s in sites] == [s.nodes for s in fp32], kind
        assert {s.dtype for s in sites} == {dtype} and all(why_not_fused(s) is None for s in sites), kind


def test_plan_expectations_read_the_graph_a_plan_is_built_from(graphs):
    assert plan_expectations(graphs["fp16-trt"]) == ([], attention_sites(_load(graphs["fp16-trt"])))
    quantized, sites = plan_expectations(graphs["int8-trt"])
    assert len(sites) == 4 and len(quantized) == 1 + 4 * 4  # the patch embedding and 4 GEMMs a block, not the head
    assert quantized[0] == "patch_embed.proj/Conv" and not any("head" in n for n in quantized)
    quantized_attn, _ = plan_expectations(graphs["int8-trt-attn"])
    assert set(quantized_attn) - set(quantized) == {n for s in sites for n in (s.bmm1, s.bmm2)}


@pytest.mark.parametrize("dtype,head,seq,fused", [
    ("fp16", 64, 197, True), ("fp16", 16, 65, True), ("fp16", 256, 4097, True), ("bf16", 72, 197, True),
    ("fp16", 8, 197, False), ("fp16", 264, 197, False), ("fp16", 20, 197, False), ("fp16", None, 197, False),
    ("int8", 64, 197, True), ("int8", 32, 512, True), ("int8", 48, 197, False), ("int8", 64, 577, False),
    ("int8", 64, None, False), ("fp8", 64, 577, True), ("fp32", 64, 197, False), ("unknown", 64, 197, False),
])
def test_which_sites_tensorrt_can_fuse(dtype, head, seq, fused):
    site = AttentionSite("q", "s", "v", dtype, head, seq)
    assert (why_not_fused(site) is None) == fused


# -- engine descriptions built from the graph's own node names -------------------------------------------------

def _tensor(layout, dims, dtype):
    if layout == "11.x":
        return {"Name": "t", "Dimensions": dims, "DataType": dtype, "Format": "Row major linear format (kLINEAR)"}
    return {"Name": "t", "Dimensions": dims, "Format/Datatype": dtype}


def _engine(model, layout, *, gemm_type="Half", unfused=(), fp16_gemms=()):
    """An inspector dump of an engine built from `model`: one layer per GEMM (and its bias Add) in `gemm_type`,
    one fused attention layer per site, except the sites of the blocks in `unfused` (products as separate GEMMs, a
    Softmax between) and the GEMMs named in `fp16_gemms` (fallen back to FP16)."""
    consts = {i.name for i in model.graph.initializer}
    layers = []
    for i, node in enumerate(model.graph.node):
        if node.op_type in LINEAR_OPS and any(x in consts or "_dq" in x for x in node.input[1:2]):
            dtype = "Half" if node.name in fp16_gemms else gemm_type
            tactic = ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n" if dtype == "Half"
                      else "sm90_xmma_gemm_i8i8_i8i32_f32_tn_n")
            layers.append({"Name": f"__myl_MatMul_myl0_{i}", "LayerType": "gemm", "TacticName": tactic,
                           "Inputs": [_tensor(layout, [8, 65, 64], dtype), _tensor(layout, [64, 64], dtype),
                                      _tensor(layout, [1], "Float")],
                           "Outputs": [_tensor(layout, [8, 65, 64], "Half")],
                           "Metadata": f"[ONNX Layer: {node.name}]\x1f[ONNX Layer: {node.name[:-6]}Add]"})
    for b, site in enumerate(attention_sites(model)):
        ins = [_tensor(layout, [8, 4, 65, 16], "Half")]
        if b in unfused:
            layers += [{"Name": f"[MATRIX_MULTIPLY]_[scaled_dot_product_attention]_[x{b}]_matrix_multiply",
                        "LayerType": "gemm", "Inputs": ins, "TacticName": "sm90_xmma_gemm_f16f16_f16f16_f16_nn_n",
                        "Metadata": f"[ONNX Layer: {node}]"} for node in (site.bmm1, site.bmm2)]
            layers.append({"Name": f"__myl_Softmax_myl0_{b}", "LayerType": "kgen", "Inputs": ins,
                           "Metadata": f"[ONNX Layer: {site.softmax}]"})
        else:
            layers.append({"Name": f"_gemm_mha_v2_myl3_{b}", "LayerType": "gemm" if layout == "10.x" else "mha",
                           "Inputs": ins, "TacticName": "" if layout == "10.x" else "_gemm_mha_v2_sm90_fp16",
                           "Metadata": "\x1f".join(f"[ONNX Layer: {n}]" for n in site.nodes)})
    io = {"Bindings": ["pixel_values", "logits"]} if layout == "10.x" else {
        "I/O Tensors": [{"Name": "pixel_values", "IOMode": "Input", "DataType": "Float", "Dimensions": [-1, 3, 32, 32]},
                        {"Name": "logits", "IOMode": "Output", "DataType": "Float", "Dimensions": [-1, 10]}]}
    return parse_engine_information(json.dumps({"Layers": layers, **io}))


@pytest.mark.parametrize("layout", ["10.x", "11.x"])
def test_complete_engines_pass(graphs, layout):
    for kind, precision, gemm_type in (("fp16-trt", "fp16", "Half"), ("int8-trt", "int8", "Int8")):
        model = _load(graphs[kind])
        engine = _engine(model, layout, gemm_type=gemm_type)
        assert engine.layout == layout and engine.summary()["attention"] == {"fp16": 4}
        quantized, sites = plan_expectations(graphs[kind])
        assert engine_problems(engine, precision, quantized, sites) == [], kind


@pytest.mark.parametrize("layout", ["10.x", "11.x"])
def test_an_unfused_attention_fails(graphs, layout):
    model = _load(graphs["fp16-trt"])
    quantized, sites = plan_expectations(graphs["fp16-trt"])
    problems = engine_problems(_engine(model, layout, unfused=(2,)), "fp16", quantized, sites)
    assert problems == ["attention 'blocks.2.attn/MatMul' -> 'blocks.2.attn/MatMul_1' is not fused into one attention "
                        "layer (gemm '[MATRIX_MULTIPLY]_[scaled_dot_product_attention]_[x2]_matrix_multiply'; gemm "
                        "'[MATRIX_MULTIPLY]_[scaled_dot_product_attention]_[x2]_matrix_multiply')"]


@pytest.mark.parametrize("layout", ["10.x", "11.x"])
@pytest.mark.parametrize("fallen", ["blocks.0.attn.qkv/MatMul", "blocks.3.mlp.fc2/MatMul", "patch_embed.proj/Conv"])
def test_any_quantized_gemm_in_fp16_fails(graphs, layout, fallen):
    model = _load(graphs["int8-trt"])
    quantized, sites = plan_expectations(graphs["int8-trt"])
    engine = _engine(model, layout, gemm_type="Int8", fp16_gemms=(fallen,))
    problems = engine_problems(engine, "int8", quantized, sites)
    assert len(problems) == 1 and problems[0].startswith(f"quantized GEMM {fallen!r} runs in fp16 in '__myl_MatMul")
    # an engine with every GEMM in FP16 fails for each of them, and the engine-wide check says there is no INT8
    problems = engine_problems(_engine(model, layout, gemm_type="Half"), "int8", quantized, sites)
    assert problems[0].startswith("no int8 GEMM") and len(problems) == 1 + len(quantized)


def test_an_fp32_gemm_fails_even_where_nothing_was_quantized(graphs):
    model = _load(graphs["fp16-trt"])
    _, sites = plan_expectations(graphs["fp16-trt"])
    engine = _engine(model, "11.x", fp16_gemms=(), gemm_type="Float")
    problems = engine_problems(engine, "fp16", [], sites)
    # the patch embedding, 4 GEMMs a block and the head: each named
    assert problems[0] == "no fp16 GEMM (GEMM precisions: {'fp32': 18})" and len(problems) == 1 + 18
    assert problems[-1].startswith("gemm '__myl_MatMul_myl0_") and " runs in fp32 " in problems[-1]


# -- onnxruntime's TensorRT provider against the installed TensorRT ----------------------------------------------

def test_the_tensorrt_major_the_provider_links_against(tmp_path):
    lib = tmp_path / "libonnxruntime_providers_tensorrt.so"
    lib.write_bytes(b"\x7fELF\0\0libcudart.so.12\0libnvinfer_plugin.so.10\0libnvinfer.so.10\0")
    assert provider_nvinfer_major(lib) == 10
    lib.write_bytes(b"\x7fELF\0libcudart.so.12\0")
    assert provider_nvinfer_major(lib) is None
    assert provider_nvinfer_major(tmp_path / "absent.so") is None
    assert provider_nvinfer_major(tmp_path) is None  # a folder: unreadable as a file


@pytest.mark.parametrize("needed,installed,skipped", [
    (10, "11.1.0.5", True), (10, "10.13.0.35", False), (11, "10.13.0.35", True), (None, "11.1.0", False),
    (10, None, False), (10, "unknown", False),
])
def test_provider_rows_are_skipped_when_the_majors_differ(needed, installed, skipped):
    why = trt_provider_mismatch(needed, installed, "1.31.1")
    assert (why is not None) == skipped
    if skipped:
        assert why == (f"onnxruntime 1.31.1's TensorRT provider is built against TensorRT {needed} "
                       f"(libnvinfer.so.{needed}); this machine has TensorRT {installed}, so its rows are skipped "
                       f"(vitexport's own TensorRT rows run it)")


# -- ModelOpt's INT8 placement (--placement modelopt) -------------------------------------------------------------

def test_modelopt_placement_adds_attention_layernorm_and_residual_inputs(graphs, tmp_path):
    """The rules read from ModelOpt 0.47's INT8 output on this model (docs/TENSORRT.md): both attention products,
    the residual stream where it enters a block's LayerNorm, the GEMM branch of the residual Adds but the first."""
    from vitexport.precision.placement import modelopt_selection
    from vitexport.precision.qdq import insert_qdq_from, qdq_sources

    fp32 = _load(graphs["fp32"])
    sel = modelopt_selection(fp32, set())
    ops = {n.name: n for n in fp32.graph.node}
    norms = {n for n in sel.nodes if ops[n].op_type == "LayerNormalization"}
    adds = {n for n in sel.nodes if ops[n].op_type == "Add"}
    assert norms == {f"blocks.{b}.norm2/LayerNormalization" for b in range(4)} | \
        {f"blocks.{b}.norm1/LayerNormalization" for b in range(1, 4)}  # not block 0's norm1, not the final norm
    assert adds == {f"blocks.{b}/Add_1" for b in range(4)} | {f"blocks.{b}/Add" for b in range(1, 4)}
    for name in adds:  # the input that comes from the block's last GEMM (through its bias Add), not the skip
        (k,) = sel.inputs[name]
        branch = ops[name].input[k]
        producer = next(n for n in fp32.graph.node if branch in n.output)
        assert producer.name.endswith(("attn.proj/Add", "mlp.fc2/Add")), (name, producer.name)
    products = {n for s in attention_sites(fp32) for n in (s.bmm1, s.bmm2)}
    assert products <= set(sel.nodes) and all(n not in sel.inputs for n in products)  # both inputs
    # written: the TensorRT FP16 graph plus Q/DQ, valid, and the engine check expects the products in INT8
    amax = {t: 1.0 for t in sel.activations}
    gemms, model16 = qdq_sources(graphs["fp32"], sel, fp16=True)
    model = insert_qdq_from(gemms, model16, sel, amax)
    onnx.save(model, tmp_path / "mo.onnx")
    onnx.checker.check_model(str(tmp_path / "mo.onnx"), full_check=True)
    fp16 = _load(graphs["fp16-trt"])
    assert sorted((n.name, n.op_type) for n in model.graph.node if n.op_type not in QDQ) == \
        sorted((n.name, n.op_type) for n in fp16.graph.node)
    quantized, sites = plan_expectations(tmp_path / "mo.onnx")
    assert products <= set(quantized) and {s.dtype for s in sites} == {"int8"}
    dq = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    for name in norms:  # the norm reads the quantized stream; the skip input of the next residual Add does not
        assert next(n for n in model.graph.node if n.name == name).input[0] in dq


def test_the_placement_is_recorded_and_a_change_remakes_the_graph(graphs):
    from vitexport.artifacts.folder import ModelFolder
    from vitexport.precision.currency import stale_reason
    from vitexport.precision.prepare import run_quantize
    from vitexport.precision.settings import CalibOptions, Int8Settings

    folder = ModelFolder(graphs["fp32"].parent)  # the export of the module's fixture
    mo = CalibOptions(samples=16, check=False, int8=Int8Settings(placement="modelopt"))
    default = CalibOptions(samples=16, check=False)
    run_quantize(folder, "int8-trt", mo)
    assert folder.read_manifest().precisions["int8-trt"].qdq["placement"] == "modelopt"
    assert stale_reason(folder, "int8-trt", mo) is None
    assert stale_reason(folder, "int8-trt", default) == \
        "model.int8.trt.onnx was made with other options: making it again."
    run_quantize(folder, "int8-trt", default)
    record = folder.read_manifest().precisions["int8-trt"]
    assert record.qdq["placement"] == "vitexport" and record.qdq["quantized_gemms"] == 17
    import json

    from vitexport.precision.int8 import CACHE_FORMAT

    entries = [json.loads(p.read_text()) for p in folder.calib_cache("x").parent.glob("*.json")]
    # ModelOpt's tensors: their own entry (beside them, the FP16 remainder's tensor ranges: precision.ranges)
    assert sum(e.get("format") == CACHE_FORMAT for e in entries) == 2
