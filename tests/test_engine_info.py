"""Per-layer precision from TensorRT's engine inspector JSON, in the 10.x and the 11.x layout, without TensorRT.

The samples are shaped like real output: 10.x Myelin layers (`"LayerType": "gemm"`, `"Format/Datatype": "Half"`,
NVIDIA/TensorRT#4397; alpha/beta scalars as in samples/sampleEditableTimingCache/README.md), 10.x Cask layers
(`"Thirty-two wide channel vectorized row major Int8 format"`, #3737; `"Row major linear FP32"`, #4020), and the
11.x layout of the TensorRT 11.0 migration guide (`"I/O Tensors"` instead of `"Bindings"`, `Format` and `DataType`
split).
"""

from __future__ import annotations

import json

import pytest

from vitexport.errors import VitexportError
from vitexport.tensorrt_engine.engine_info import dtype_of, parse_engine_information, precision_problems


def _t(name, dims, fmt, key="Format/Datatype"):
    return {"Name": name, "Location": "Device", "Dimensions": dims, key: fmt}


def _gemm_10x(name, act, weight_dims=(768, 768), scalar_type="Float", tactic=""):
    return {"Name": name, "LayerType": "gemm",
            "Inputs": [_t("act", [8, 197, 768], act), _t("w", list(weight_dims), act),
                       _t("alpha", [1], scalar_type), _t("beta", [1], scalar_type)],
            "Outputs": [_t("out", [8, 197, 768], act)], "TacticName": tactic, "StreamId": 0,
            "Metadata": "[ONNX Layer: /blocks.0/mlp/fc1/MatMul]"}


FP16_10X = {"Layers": [
    {"Name": "Reformatting CopyNode for Input Tensor 0", "LayerType": "Reformat",
     "Inputs": [_t("pixel_values", [8, 3, 224, 224], "Row major linear FP32")],
     "Outputs": [_t("r", [8, 3, 224, 224], "Row major linear FP16 format")], "ParameterType": "Reformat"},
    {"Name": "/patch_embed/proj/Conv", "LayerType": "CaskConvolution", "ParameterType": "Convolution",
     "Inputs": [_t("r", [8, 3, 224, 224], "Channel major FP16 format where channel % 8 == 0")],
     "Outputs": [_t("p", [8, 768, 14, 14], "Channel major FP16 format where channel % 8 == 0")],
     "TacticName": "sm90_xmma_fprop_implicit_gemm_f16f16_f16f16_f16_nhwckrsc_nhwc"},
    _gemm_10x("/blocks_0/mlp/fc1/MatMul_myl0_7", "Half",
              tactic="sm90_xmma_gemm_f16f16_f16f16_f16_nn_n_tilesize128x128x64"),
    {"Name": "__myl_AddCastMeanSubMulMeanAddSqrtDivMulCastMulAdd_myl0_8", "LayerType": "kgen",
     "Inputs": [_t("a", [8, 197, 768], "Half")], "Outputs": [_t("b", [8, 197, 768], "Float")]},
], "Bindings": ["pixel_values", "logits"]}

INT8_10X = {"Layers": [
    _gemm_10x("/blocks_0/attn/qkv/MatMul_myl0_3", "Int8", tactic="sm90_xmma_gemm_i8i8_i8i32_f32_tn_n"),
    {"Name": "/patch_embed/proj/Conv", "LayerType": "CaskConvolution", "ParameterType": "Convolution",
     "Inputs": [_t("x", [8, 3, 224, 224], "Thirty-two wide channel vectorized row major Int8 format")],
     "Outputs": [_t("y", [8, 768, 14, 14], "Thirty-two wide channel vectorized row major Int8 format")],
     "Weights": {"Type": "Int8", "Count": 589824}},
    _gemm_10x("/head/MatMul_myl0_90", "Half", tactic="sm90_xmma_gemm_f16f16_f16f16_f16_nn_n"),
], "Bindings": ["pixel_values", "logits"]}


def _t11(name, dims, dtype, fmt, dtype_key="DataType"):
    return {"Name": name, "Location": "Device", "Dimensions": dims, dtype_key: dtype, "Format": fmt}


def _int8_11x(dtype_key):
    return {
        "Layers": [
            {"Name": "/blocks_0/mlp/fc2/MatMul_myl0_12", "LayerType": "gemm",
             "Inputs": [_t11("a", [8, 197, 3072], "Int8", "Row major linear INT8 format (kLINEAR)", dtype_key),
                        _t11("s", [768], "Float", "Row major linear FP32 format (kLINEAR)", dtype_key)],
             "Outputs": [_t11("o", [8, 197, 768], "Half", "Row major linear FP16 format (kLINEAR)", dtype_key)],
             "TacticName": "sm90_xmma_gemm_i8i8_i8i32_f32_tn_n", "StreamId": 0},
            {"Name": "/blocks_0/attn/MatMul_myl0_5", "LayerType": "mha",
             "Inputs": [_t11("q", [8, 12, 197, 64], "Half", "Row major linear FP16 format (kLINEAR)", dtype_key)],
             "Outputs": [_t11("o", [8, 12, 197, 64], "Half", "Row major linear FP16 format (kLINEAR)", dtype_key)],
             "TacticName": "_gemm_mha_v2_fp16"},
        ],
        "I/O Tensors": [{"Name": "pixel_values", "IOMode": "Input", "DataType": "Float",
                         "Dimensions": [-1, 3, 224, 224], "Location": "Device", "IsShapeInferenceIO": False}],
    }


@pytest.mark.parametrize("text,expected", [
    ("Half", "fp16"), ("Int8", "int8"), ("Float", "fp32"), ("BFloat16", "bf16"),
    ("Row major linear FP16 format", "fp16"), ("Row major linear FP32", "fp32"),
    ("Thirty-two wide channel vectorized row major Int8 format", "int8"),
    ("Channel major FP16 format where channel % 8 == 0", "fp16"), ("Row major linear BFloat16 format", "bf16"),
    ("Row major linear FP32 format (kLINEAR)", "fp32"), ("Row major linear Int64 format", "int64"),
    ("FP4E2M1", "fp4"), ("Unknown format", None), (None, None), (3, None),
])
def test_type_words(text, expected):
    assert dtype_of(text) == expected


def test_fp16_engine_in_the_10x_layout():
    engine = parse_engine_information(json.dumps(FP16_10X))
    assert engine.layout == "10.x"
    kinds = {f.name: (f.kind, f.precision) for f in engine.layers}
    assert kinds["/patch_embed/proj/Conv"] == ("gemm", "fp16")
    assert kinds["/blocks_0/mlp/fc1/MatMul_myl0_7"] == ("gemm", "fp16")  # FP32 alpha/beta scalars do not count
    assert kinds["Reformatting CopyNode for Input Tensor 0"][0] == "other"
    assert engine.summary() == {"layout": "10.x", "layers": 4, "gemm": {"fp16": 2}, "attention": {}, "opaque": 0}
    assert precision_problems(engine, "fp16") == []
    assert precision_problems(engine, "int8") == ["no int8 GEMM (GEMM precisions: {'fp16': 2})"]


def test_int8_engine_in_the_10x_layout():
    engine = parse_engine_information(INT8_10X)
    assert [f.precision for f in engine.of_kind("gemm")] == ["int8", "int8", "fp16"]
    assert precision_problems(engine, "int8") == []


@pytest.mark.parametrize("dtype_key", ["DataType", "Datatype"])
def test_int8_engine_in_the_11x_layout(dtype_key):
    engine = parse_engine_information(json.dumps(_int8_11x(dtype_key)))
    assert engine.layout == "11.x"
    gemm, mha = engine.layers
    assert (gemm.kind, gemm.precision, gemm.output_types) == ("gemm", "int8", ("fp16",))  # FP32 scale vector: wider
    assert (mha.kind, mha.precision) == ("attention", "fp16")
    assert precision_problems(engine, "int8") == []


def test_an_fp32_gemm_is_named():
    layers = {"Layers": [_gemm_10x("fc1_myl0_1", "Int8"), _gemm_10x("head_myl0_2", "Float",
                                                                    tactic="sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n")]}
    problems = precision_problems(parse_engine_information(layers), "int8")
    assert len(problems) == 1 and problems[0].startswith("gemm 'head_myl0_2' runs in fp32")


def test_the_tactic_name_decides_when_tensors_carry_no_type():
    layer = {"Name": "fc", "LayerType": "gemm", "Inputs": [{"Name": "a", "Dimensions": [8, 768]}],
             "Outputs": [], "TacticName": "sm80_xmma_gemm_i8i8_i8i32_f32_tn_n_tilesize64x64x64"}
    assert parse_engine_information([layer]).layers[0].precision == "int8"


def test_an_opaque_myelin_node_is_a_problem():
    layers = {"Layers": [{"Name": "{ForeignNode[/blocks.0/norm1/LayerNormalization.../head/Gemm]}",
                          "LayerType": "Myelin", "Inputs": [], "Outputs": []}], "Bindings": []}
    engine = parse_engine_information(layers)
    assert engine.layers[0].kind == "opaque"
    assert precision_problems(engine, "fp16") == ["no GEMM layer found among 1 layers",
                                                  "1 layer(s) are opaque Myelin nodes, e.g. "
                                                  "'{ForeignNode[/blocks.0/norm1/LayerNormalization.../head/Gemm]}'"]


@pytest.mark.parametrize("info,match", [
    ('{"Layers": ["fc1", "fc2"], "Bindings": []}', "layer names only"),  # built without DETAILED verbosity
    ("{}", "listed no layers"), ("[]", "listed no layers"), ("not json", "not JSON"),
])
def test_unusable_inspector_output_is_one_sentence(info, match):
    with pytest.raises(VitexportError, match=match):
        parse_engine_information(info)


# --- the reading rules one at a time, on hand-made layers -------------------------------------------------------

def _fact(**layer):
    return parse_engine_information([layer]).layers[0]


def _operand(dims, fmt="Int8"):
    return {"Name": "x", "Dimensions": dims, "Format/Datatype": fmt}


@pytest.mark.parametrize("dims,counts", [
    ([1], False), ([], False), ([1, 1, 1], False), ([0], False), ([0, 768], False),  # no more than one element
    ([2], True), ([2, 2], True), ([768, 1], True), ([1, 768], True),
    ([-1], True), ([-1, 197, 768], True),  # a symbolic axis may hold any number of elements
    (["batch", 768], True),  # a non-numeric axis is not read as a size
])
def test_only_operands_with_more_than_one_element_say_what_a_gemm_ran_in(dims, counts):
    # an FP32 activation and an INT8 operand of these dimensions: the INT8 one decides only if it is not a scalar
    fact = _fact(Name="fc", LayerType="gemm", Inputs=[_operand([8, 197, 768], "Float"), _operand(dims, "Int8")],
                 Outputs=[_operand([8, 197, 768], "Float")])
    assert fact.precision == ("int8" if counts else "fp32")


def test_an_operand_without_dimensions_is_not_taken_for_a_scalar():
    fact = _fact(Name="fc", LayerType="gemm", Inputs=[{"Name": "a", "Format/Datatype": "Int8"}],
                 Constants=[_operand([1], "Float")], Outputs=[_operand([8, 768], "Float")])
    assert fact.precision == "int8"


def test_constants_count_as_operands_but_scalar_constants_do_not():
    # TensorRT lists a GEMM's weights as constants: INT8 weights with FP16 activations ran as an INT8 GEMM
    fact = _fact(Name="fc", LayerType="gemm", Inputs=[_operand([8, 197, 768], "Half")],
                 Constants=[_operand([768, 768], "Int8")], Outputs=[_operand([8, 197, 768], "Half")])
    assert fact.precision == "int8"
    fact = _fact(Name="fc", LayerType="gemm", Inputs=[_operand([8, 197, 768], "Half")],
                 Constants=[_operand([1], "Int8")], Outputs=[_operand([8, 197, 768], "Half")])
    assert fact.precision == "fp16"


def test_tensor_types_given_as_plain_strings_are_read():
    fact = _fact(Name="fc", LayerType="gemm", Inputs=["Half", "Row major linear FP16 format"], Outputs=["Float"])
    assert (fact.precision, fact.input_types, fact.output_types) == ("fp16", ("fp16", "fp16"), ("fp32",))


def test_types_the_inspector_reports_win_over_the_tactic_name():
    fact = _fact(Name="fc", LayerType="gemm", Inputs=[_operand([8, 768], "Float")],
                 TacticName="sm90_xmma_gemm_i8i8_i8i32_f32_tn_n")
    assert fact.precision == "fp32"


def test_a_gemm_without_operand_types_falls_back_to_the_tactic_then_to_its_outputs():
    no_types = [{"Name": "a", "Dimensions": [8, 768]}]
    fact = _fact(Name="mha", LayerType="mha", Inputs=no_types, TacticName="sm90_fmha_v2_flash_attention_fp16_64")
    assert (fact.kind, fact.precision) == ("attention", "fp16")
    fact = _fact(Name="fc", LayerType="gemm", Inputs=no_types, Outputs=[{"Name": "o"}, _operand([8, 768], "Half")],
                 TacticName="sm90_xmma_gemm_nn_n_tilesize128x128x64")  # no precision in the tactic name
    assert (fact.precision, fact.output_types) == ("fp16", ("unknown", "fp16"))
    fact = _fact(Name="fc", LayerType="gemm", Inputs=no_types, Outputs=[{"Name": "o"}])
    assert (fact.precision, fact.input_types, fact.output_types) == ("unknown", ("unknown",), ("unknown",))


def test_the_tactic_is_read_from_any_of_its_three_keys_and_kept():
    for key in ("TacticName", "Tactic", "TacticValue"):
        fact = _fact(Name="fc", LayerType="gemm", **{key: "sm80_xmma_gemm_i8i8_i8i32_f32_tn_n"})
        assert (fact.tactic, fact.precision) == ("sm80_xmma_gemm_i8i8_i8i32_f32_tn_n", "int8"), key
    fact = _fact(LayerType="Reformat")
    assert (fact.name, fact.tactic, fact.precision) == ("", "", "unknown")


@pytest.mark.parametrize("layer,kind,layer_type", [
    ({"LayerType": "Myelin"}, "opaque", "Myelin"),
    ({"Name": "{ForeignNode[/blocks.0/norm1/LayerNormalization]}", "LayerType": ""}, "opaque", ""),
    ({"LayerType": "mha"}, "attention", "mha"),
    ({"LayerType": "kgen", "TacticName": "FMHA_V2_FLASH_ATTENTION"}, "attention", "kgen"),
    ({"LayerType": "kgen", "ParameterType": "MatrixMultiply"}, "gemm", "kgen"),
    ({"ParameterType": "FullyConnected"}, "gemm", "FullyConnected"),
    ({"TacticName": "sm80_xmma_gemm_f16f16_f16f16_f16_nn_n"}, "gemm", ""),  # nothing but a GEMM tactic
    ({"TacticName": "copy_kernel"}, "other", ""),
    ({"LayerType": "Reformat", "TacticName": "gemm_like_reformat"}, "other", "Reformat"),
    ({"LayerType": "CaskGemmMatrixMultiply", "ParameterType": "MatrixMultiply"}, "gemm", "CaskGemmMatrixMultiply"),
    # a GEMM fused with its epilogue by Myelin (NVIDIA/TensorRT#4397), by its tactic or by its name
    ({"Name": "__myl_Fc_myl0_69", "LayerType": "fusion",
      "TacticName": "sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize128x128x32_by_fusion_tactic"}, "gemm", "fusion"),
    ({"Name": "__myl_Fc_myl0_70", "LayerType": "fusion", "TacticName": "0x1f2e"}, "gemm", "fusion"),
    ({"Name": "__myl_AddMulGelu_myl0_71", "LayerType": "fusion", "TacticName": "0x1f2f"}, "other", "fusion"),
])
def test_what_kind_of_layer_it_is(layer, kind, layer_type):
    fact = _fact(**{"Name": "layer", **layer})
    assert (fact.kind, fact.layer_type) == (kind, layer_type)


@pytest.mark.parametrize("info,layout", [
    ({"Layers": [{"Name": "a"}], "Bindings": []}, "10.x"),
    ({"Layers": [{"Name": "a"}], "I/O Tensors": []}, "11.x"),
    ({"Layers": [{"Name": "a"}]}, "unknown"),
    ({"layers": [{"Name": "a"}]}, "unknown"),
    ([{"Name": "a"}], "unknown"),
])
def test_the_layout_and_where_the_layers_are(info, layout):
    engine = parse_engine_information(info)
    assert (engine.layout, [f.name for f in engine.layers]) == (layout, ["a"])


@pytest.mark.parametrize("info,sentence", [
    ('{"Layers": ["fc1", "fc2"], "Bindings": []}',
     "The engine inspector listed layer names only: the plan was built without ProfilingVerbosity.DETAILED; "
     "rebuild it with this vitexport."),
    ("{}", "The engine inspector listed no layers."),
])
def test_the_inspector_sentences_word_for_word(info, sentence):
    with pytest.raises(VitexportError) as e:
        parse_engine_information(info)
    assert str(e.value) == sentence


def test_an_fp32_attention_layer_is_a_problem_and_a_missing_tactic_is_shown_as_such():
    engine = parse_engine_information([_gemm_10x("fc", "Int8"),
                                       {"Name": "attn", "LayerType": "mha", "Inputs": [_operand([8, 12, 197, 64],
                                                                                               "Float")]}])
    assert precision_problems(engine, "int8") == ["attention 'attn' runs in fp32 (inputs ['fp32'], tactic ?)"]


def test_a_fused_gemm_that_fell_back_to_fp16_is_counted_as_an_fp16_gemm():
    """fc1 + GELU fused into a Myelin `fusion` layer that runs FP16 while the other GEMMs are INT8: the check that
    counted only `gemm` layers did not see it at all."""
    fused = {"Name": "__myl_Fc_myl0_69", "LayerType": "fusion", "Metadata": "[ONNX Layer: /blocks.0/mlp/fc1/MatMul]",
             "Inputs": [_t("a", [8, 197, 768], "Half"), _t("w", [768, 3072], "Half")],
             "Outputs": [_t("o", [8, 197, 3072], "Half")],
             "TacticName": "sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize128x128x32_by_fusion_tactic"}
    engine = parse_engine_information({"Layers": [_gemm_10x("qkv_myl0_1", "Int8"), fused], "Bindings": []})
    assert [(f.kind, f.precision) for f in engine.layers] == [("gemm", "int8"), ("gemm", "fp16")]
    assert engine.summary()["gemm"] == {"int8": 1, "fp16": 1}



# -- every quantized GEMM in INT8: the layers' Metadata maps them back to the ONNX nodes ---------------------------

QUANTIZED = ["blocks.0.attn.qkv/MatMul", "blocks.0.attn.proj/MatMul", "blocks.0.mlp.fc1/MatMul",
             "blocks.0.mlp.fc2/MatMul"]


def _int8_engine(layout, fc1=("Int8", "sm90_xmma_gemm_i8i8_i8i32_f32_tn_n")):
    """A TensorRT dump of one block: qkv, proj and fc2 as INT8 GEMMs, fc1 fused with GELU (its type given)."""
    def layer(name, node, dtype, tactic, layer_type="gemm"):
        if layout == "11.x":
            ins = [_t11("a", [8, 197, 768], dtype, "Row major linear format (kLINEAR)"),
                   _t11("w", [768, 768], dtype, "Row major linear format (kLINEAR)")]
        else:
            ins = [_t("a", [8, 197, 768], dtype), _t("w", [768, 768], dtype)]
        return {"Name": name, "LayerType": layer_type, "Inputs": ins, "Outputs": [], "TacticName": tactic,
                "Metadata": f"[ONNX Layer: {node}]\x1f[ONNX Layer: {node.rsplit('/', 1)[0]}/Add]"}

    layers = [layer("__myl_MatMul_myl0_1", QUANTIZED[0], "Int8", "sm90_xmma_gemm_i8i8_i8i32_f32_tn_n"),
              {"Name": "_gemm_mha_v2_myl0_2", "LayerType": "mha", "Inputs": [], "Outputs": [], "TacticName":
               "fmha_v2_fp16", "Metadata": "[ONNX Layer: blocks.0.attn/MatMul]\x1f[ONNX Layer: blocks.0.attn/Softmax]"},
              layer("__myl_MatMul_myl0_3", QUANTIZED[1], "Int8", "sm90_xmma_gemm_i8i8_i8i32_f32_tn_n"),
              layer("__myl_Fc_myl0_4", QUANTIZED[2], fc1[0], fc1[1], layer_type="fusion"),
              layer("__myl_MatMul_myl0_5", QUANTIZED[3], "Int8", "sm90_xmma_gemm_i8i8_i8i32_f32_tn_n")]
    key = "I/O Tensors" if layout == "11.x" else "Bindings"
    return parse_engine_information(json.dumps({"Layers": layers, key: []}))  # \x1f: TensorRT's separator


@pytest.mark.parametrize("layout", ["10.x", "11.x"])
def test_every_quantized_gemm_in_int8_passes(layout):
    from vitexport.tensorrt_engine.engine_info import selection_problems

    engine = _int8_engine(layout)
    assert engine.layout == layout and engine.layers[0].onnx_nodes == (QUANTIZED[0], "blocks.0.attn.qkv/Add")
    assert selection_problems(engine, QUANTIZED, "int8") == []


@pytest.mark.parametrize("layout", ["10.x", "11.x"])
def test_one_quantized_gemm_left_in_fp16_fails_although_most_are_int8(layout):
    from vitexport.tensorrt_engine.engine_info import selection_problems

    engine = _int8_engine(layout, fc1=("Half", "sm90_xmma_gemm_f16f16_f16f32_f32_nn_n_by_fusion_tactic"))
    assert precision_problems(engine, "int8") == []  # the engine-wide check sees INT8 GEMMs and no FP32 one
    assert selection_problems(engine, QUANTIZED, "int8") == [
        "quantized GEMM 'blocks.0.mlp.fc1/MatMul' runs in fp16 in '__myl_Fc_myl0_4' "
        "(tactic sm90_xmma_gemm_f16f16_f16f32_f32_nn_n_by_fusion_tactic)"]


def test_a_quantized_gemm_missing_or_fused_into_a_non_gemm_is_named():
    from vitexport.tensorrt_engine.engine_info import selection_problems

    engine = _int8_engine("10.x")
    assert selection_problems(engine, [*QUANTIZED, "head/Gemm"], "int8") == [
        "quantized GEMM 'head/Gemm' is in no layer's metadata"]
    pointwise = parse_engine_information([{"Name": "__myl_AddMul_myl0_9", "LayerType": "kgen",
                                           "Metadata": "[ONNX Layer: head/Gemm]"}])
    assert selection_problems(pointwise, ["head/Gemm"], "int8") == [
        "quantized GEMM 'head/Gemm' runs in other layer '__myl_AddMul_myl0_9' (kgen), not in a GEMM"]
    bare = parse_engine_information([{"Name": "fc", "LayerType": "gemm"}])
    assert selection_problems(bare, QUANTIZED, "int8") == [
        "no layer names its ONNX nodes (Metadata), so the 4 quantized GEMMs cannot be found; the plan must be built "
        "with ProfilingVerbosity.DETAILED"]
    assert selection_problems(bare, [], "int8") == []
