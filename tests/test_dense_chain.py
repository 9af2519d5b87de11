"""Every step after the export for the dense models, at tiny sizes: a Depth Anything V2 folder (spread taps), an
EoMT folder and a SamModel folder go through `quantize --int8 --target all`, `--fp16 --target all`, `--fp8`, `openvino --precision int8`
and `triton`; each precision's held-out check records the task's figures (AbsRel and delta1, pixel agreement and
mIoU) and passes or says it cannot decide, every graph passes onnx.checker's full check and the TensorRT op rule,
the head stays in float under INT8, SAM's checks report mask IoU, and Triton's config is its ModelConfig with the
graph's outputs (dynamic H and W for a dynamic-size export; SAM's decoder as a second model). Marked e2e: CI runs them after the suite.
"""

import json

import onnx
import pytest
from click.testing import CliRunner

from vitexport.cli import cli
from vitexport.tensorrt_engine.graph_rules import rule_breakers

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.e2e

PRECISIONS = (["--int8", "--target", "all"], ["--fp16", "--target", "all"], ["--fp8"])
FIGURES = {"depth": ("absrel", "delta1"), "segmentation": ("pixel_agree", "miou"), "masks": ("mask_iou",)}
TASKS = {"depth-anything-v2": "depth", "eomt": "segmentation", "sam": "masks"}
SAID = {"depth": "AbsRel", "segmentation": "pixel agreement", "masks": "mask IoU"}


@pytest.fixture(scope="module", params=list(TASKS))
def dense_folder(request, tmp_path_factory):
    from test_dense_depth import CASES, save_depth_anything
    from test_dense_eomt import TINY, save_eomt
    from test_sam import save_sam

    tmp = tmp_path_factory.mktemp(request.param)
    if request.param == "eomt":
        save_eomt(tmp / "saved", TINY)
    elif request.param == "sam":
        save_sam(tmp / "saved", seed=3)
    else:
        save_depth_anything(tmp / "saved", CASES["relative"])
    r = CliRunner().invoke(cli, ["onnx", "-c", str(tmp / "saved"), "-o", str(tmp / "out"), "-q"])
    assert r.exit_code == 0, r.output
    return request.param, tmp / "out"


def test_every_precision_is_made_and_judged_by_its_task(dense_folder):
    kind, folder = dense_folder
    for args in PRECISIONS:
        r = CliRunner().invoke(cli, ["quantize", str(folder), *args])
        assert r.exit_code == 0, (args, r.output)
        assert SAID[TASKS[kind]] in " ".join(r.output.split())
    manifest = json.loads((folder / "manifest.json").read_text())
    task = TASKS[kind]
    for name, record in manifest["precisions"].items():
        check = record["check"]
        assert check["dense"] == task and check["data"], name
        for figure in FIGURES[task]:
            lo, hi = check[f"{figure}_ci"]
            assert lo <= check[figure] <= hi, (name, figure)
        assert not check["failures"], (name, check["failures"])
    for path in sorted(folder.glob("*.onnx")):
        onnx.checker.check_model(str(path), full_check=True)
        graph = onnx.load(str(path), load_external_data=False).graph
        assert rule_breakers(onnx.load(str(path), load_external_data=False)) == [], path.name
        if path.name.startswith("model.int8"):  # the head's convolutions read no quantized input
            quantized = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear"}
            heads = [n for n in graph.node if n.name.startswith(("neck.", "head.")) and n.op_type == "Conv"]
            assert not any(n.input[0] in quantized for n in heads), path.name


def test_the_ir_and_triton(dense_folder, tmp_path):
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from google.protobuf import text_format

    kind, folder = dense_folder
    r = CliRunner().invoke(cli, ["openvino", str(folder), "--precision", "int8", "-q"])
    assert r.exit_code == 0, r.output
    record = json.loads((folder / "manifest.json").read_text())["precisions"]["openvino-int8"]
    assert record["check"]["passed"] and record["check"]["dense"], record["check"]
    r = CliRunner().invoke(cli, ["triton", str(folder), "-o", str(tmp_path / "repo"), "-q"])
    assert r.exit_code == 0, r.output
    entries = sorted((tmp_path / "repo").glob("*/config.pbtxt"))
    assert [p.parent.name.endswith("-decoder") for p in entries] == ([False, True] if kind == "sam" else [False])
    cfg = text_format.Parse(entries[0].read_text(), model_config_pb2.ModelConfig())
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    assert [o.name for o in cfg.output] == [o.name for o in graph.output]
    shapes = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim][1:] for o in graph.output}
    assert {o.name: list(o.dims) for o in cfg.output} == shapes
    if kind == "sam":  # the decoder's entry: whole tensors, its graph's inputs and outputs
        dec = text_format.Parse(entries[1].read_text(), model_config_pb2.ModelConfig())
        graph = onnx.load(str(folder / "decoder.onnx")).graph
        assert dec.max_batch_size == 0 and [i.name for i in dec.input] == [i.name for i in graph.input]
        assert [len(i.dims) for i in dec.input] == [len(i.type.tensor_type.shape.dim) for i in graph.input]


def test_a_dynamic_size_export_serves_any_size(tmp_path):
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from google.protobuf import text_format
    from test_dense_depth import CASES, save_depth_anything

    save_depth_anything(tmp_path / "saved", CASES["relative"])
    r = CliRunner().invoke(cli, ["onnx", "-c", str(tmp_path / "saved"), "-o", str(tmp_path / "out"),
                                 "--dynamic-img-size", "-q"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["triton", str(tmp_path / "out"), "-o", str(tmp_path / "repo"), "-q"])
    assert r.exit_code == 0, r.output
    cfg = text_format.Parse(next((tmp_path / "repo").glob("*/config.pbtxt")).read_text(),
                            model_config_pb2.ModelConfig())
    assert list(cfg.input[0].dims) == [3, -1, -1] and list(cfg.output[0].dims) == [-1, -1]


def test_pytorchs_compiled_int8_package_is_judged_by_its_task(dense_folder):
    """`vitexport aoti --precision int8`: the dense model (backbone and head) through torch.export, PT2E and
    AOTInductor, its check against the FP32 export judged by the task's figures as every other file."""
    pytest.importorskip("torchao")
    kind, folder = dense_folder
    r = CliRunner().invoke(cli, ["aoti", str(folder), "--precision", "int8", "-q"])
    assert r.exit_code == 0, r.output
    check = json.loads((folder / "manifest.json").read_text())["precisions"]["aoti-int8"]["check"]
    assert check["passed"] and check["dense"] == TASKS[kind]
    for figure in FIGURES[TASKS[kind]]:
        assert check[figure] is not None, figure
