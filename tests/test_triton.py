"""`vitexport triton`: every config.pbtxt parses against Triton's own ModelConfig schema and agrees with the model
file beside it; plans take their batch from the sidecar's profile; another model is never silently replaced."""

import hashlib
import os

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from conftest import ROOT, copy_export, fails_cleanly
from onnx import numpy_helper

from vitexport.artifacts.folder import ModelFolder, TritonModelFolder, onnx_digest
from vitexport.artifacts.sidecar import write_sidecar
from vitexport.cli import cli
from vitexport.data.images import load_image
from vitexport.model.labels import class_names
from vitexport.tensorrt_engine.compiler import make_sidecar
from vitexport.tensorrt_engine.options import BuildOptions

model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
from google.protobuf import text_format  # noqa: E402  (protobuf comes with onnx)

ONNX_TYPES = {onnx.TensorProto.FLOAT: "TYPE_FP32", onnx.TensorProto.FLOAT16: "TYPE_FP16",
              onnx.TensorProto.UINT8: "TYPE_UINT8"}
HELDOUT = ROOT / "calibration" / "digits" / "heldout"


@pytest.fixture(scope="module")
def digits(tmp_path_factory, digits_export):
    return ModelFolder(copy_export(digits_export, tmp_path_factory.mktemp("triton") / "digits"))


def parse(model: TritonModelFolder):
    return text_format.Parse(model.config.read_text(), model_config_pb2.ModelConfig())


def write_entry(folder, repo, name, *args):
    """`vitexport triton -q FOLDER -o REPO ARGS`, which must succeed: (its result, REPO/NAME, NAME's parsed config)."""
    r = CliRunner().invoke(cli, ["triton", "-q", str(folder), "-o", str(repo), *args])
    assert r.exit_code == 0, r.output
    model = TritonModelFolder(repo / name)
    return r, model, parse(model)


def assert_agrees_with_onnx(cfg, onnx_path, batched=True):
    """Names, data types and dims (without the batch axis) of the config are the graph's."""
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    for declared, actual in ((cfg.input, graph.input), (cfg.output, graph.output)):
        assert [t.name for t in declared] == [v.name for v in actual]
        for t, v in zip(declared, actual):
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim]
            assert v.type.tensor_type.shape.dim[0].dim_param  # a symbolic batch axis ...
            assert list(t.dims) == (dims[1:] if batched else dims)  # ... that the config leaves out
            assert model_config_pb2.DataType.Name(t.data_type) == ONNX_TYPES[v.type.tensor_type.elem_type]


def test_onnx_repository(digits, tmp_path):
    repo = tmp_path / "repo"
    r, model, cfg = write_entry(digits.path, repo, "vit_digits_patch4_32-fp32", "--max-batch", "16", "--instances", "2")
    assert cfg.name == model.name and cfg.platform == "onnxruntime_onnx" and cfg.max_batch_size == 16
    assert cfg.HasField("dynamic_batching")
    assert [(g.count, model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind)) for g in cfg.instance_group] == \
        [(2, "KIND_AUTO")]
    assert model.model("onnx").read_bytes() == digits.onnx().read_bytes()
    assert_agrees_with_onnx(cfg, model.model("onnx"))
    assert cfg.output[0].label_filename == model.labels.name
    assert model.labels.read_text().splitlines() == class_names(digits.read_manifest()) == [str(i) for i in range(10)]
    assert sorted(p.name for p in repo.iterdir()) == [model.name]  # no staging folder left behind
    # the model file in the repository runs with the shapes the config declares
    import onnxruntime as ort

    x = np.zeros((cfg.max_batch_size, *cfg.input[0].dims), np.float32)
    out = ort.InferenceSession(str(model.model("onnx")), providers=["CPUExecutionProvider"]).run(None, {cfg.input[0].name: x})[0]
    assert out.shape == (cfg.max_batch_size, *cfg.output[0].dims)
    # the printed instructions start the server on this repository and ask this model
    assert f"-v {repo.resolve()}:/models" in r.stdout and f'client.infer("{model.name}"' in r.stdout


def test_openvino_repository_serves_the_int8_graph_on_the_cpu(digits_export, tmp_path, monkeypatch):
    """--format openvino: the folder's INT8 graph as model.onnx on Triton's OpenVINO backend (backend, not platform;
    the file named, as that backend reads model.xml by default), CPU instances, parsed against Triton's ModelConfig;
    OpenVINO runs the copied file at the shapes the config declares, with ONNX Runtime's answers. A graph with 8-bit
    weights (made on a CPU that sums them exactly), and only such a graph, gets a usage that says which server CPUs
    compute them right."""
    import openvino as ov
    import onnxruntime as ort

    from vitexport import environment

    digits = ModelFolder(copy_export(digits_export, tmp_path / "digits"))
    for f in digits.path.glob("model.int8*"):  # made here (calibrated, checked), whatever another test left
        f.unlink()
    repo = tmp_path / "repo"
    r, model, cfg = write_entry(digits.path, repo, "vit_digits_patch4_32-int8-openvino", "--format", "openvino",
                                "--precision", "int8")
    assert cfg.backend == "openvino" and not cfg.platform and cfg.default_model_filename == "model.onnx"
    assert [model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind) for g in cfg.instance_group] == ["KIND_CPU"]
    assert model.model("onnx").read_bytes() == digits.onnx("int8").read_bytes()
    assert_agrees_with_onnx(cfg, model.model("onnx"))
    x = np.stack([load_image(f, digits.read_manifest().preprocess) for f in sorted(HELDOUT.rglob("*.png"))[:8]])
    got = ov.Core().compile_model(str(model.model("onnx")), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})(x)[0]
    want = ort.InferenceSession(str(model.model("onnx")), providers=["CPUExecutionProvider"]).run(
        None, {cfg.input[0].name: x})[0]
    assert got.shape == (8, *cfg.output[0].dims) and (got.argmax(1) == want.argmax(1)).all()
    assert "OpenVINO's backend serves on the CPU" in r.stdout and f'client.infer("{model.name}"' in r.stdout

    def weight_top(path) -> int:
        return max(int(np.abs(numpy_helper.to_array(i)).max()) for i in onnx.load(str(path)).graph.initializer
                   if i.data_type == onnx.TensorProto.INT8 and len(i.dims) > 1)

    assert ("Its INT8 weights have 8 bits" in r.stdout) == (weight_top(model.model("onnx")) == 127)  # this CPU's
    # each width made explicitly (8 as on a CPU that sums them exactly; unchecked: this one may not), then served
    monkeypatch.setattr(environment, "cpu_sums_int8_exactly", lambda: True)
    for bits, noted in (("8", True), ("7", False)):
        made = CliRunner().invoke(cli, ["quantize", str(digits.path), "--int8", "--weight-bits", bits, "--no-check",
                                        "-q"])
        assert made.exit_code == 0, made.output
        r, model, cfg = write_entry(digits.path, repo, "vit_digits_patch4_32-int8-openvino", "--format", "openvino",
                                    "--precision", "int8", "--force")
        assert model.model("onnx").read_bytes() == digits.onnx("int8").read_bytes()
        assert weight_top(model.model("onnx")) == 2 ** (int(bits) - 1) - 1
        assert ("Its INT8 weights have 8 bits" in r.stdout) == noted, r.stdout


def _fake_plan(folder: ModelFolder, precision: str, min_batch: int, max_batch: int) -> bytes:
    """A plan and its sidecar as `vitexport trt` writes them (TensorRT is not needed to package one)."""
    plan = os.urandom(256)
    source = folder.onnx("fp32")
    folder.plan(precision).write_bytes(plan)
    opts = BuildOptions(precision=precision, min_batch=min_batch, opt_batch=min_batch, max_batch=max_batch)
    write_sidecar(folder.sidecar(precision), make_sidecar(
        plan_path=folder.plan(precision), plan_sha256=hashlib.sha256(plan).hexdigest(), plan_bytes=len(plan),
        onnx_path=source, onnx_sha256=onnx_digest(source), opts=opts, input_name="pixel_values", chw=(3, 32, 32),
        output_names=["logits"], tensorrt_version="10.13.0", gpu={"name": "GPU", "compute_capability": "9.0"},
        build_seconds=1.0))
    return plan


def test_plan_repository_takes_the_profile_max(digits, tmp_path):
    plan = _fake_plan(digits, "fp32", 1, 24)
    repo = tmp_path / "repo"
    r, model, cfg = write_entry(digits.path, repo, "digits_trt", "--format", "plan", "--name", "digits_trt")
    assert cfg.platform == "tensorrt_plan" and cfg.max_batch_size == 24
    assert model_config_pb2.ModelInstanceGroup.Kind.Name(cfg.instance_group[0].kind) == "KIND_GPU"
    assert model.model("plan").read_bytes() == plan
    assert_agrees_with_onnx(cfg, digits.onnx("fp32"))
    # a larger batch than the profile takes, and a profile that does not start at 1, are refused
    r = CliRunner().invoke(cli, ["triton", str(digits.path), "-o", str(repo), "--format", "plan", "--max-batch", "64"])
    fails_cleanly(r, "takes batches up to 24")
    _fake_plan(digits, "fp32", 2, 24)
    r = CliRunner().invoke(cli, ["triton", str(digits.path), "-o", str(tmp_path / "r2"), "--format", "plan"])
    fails_cleanly(r, "--min-batch 1")


def test_another_model_needs_force(digits, tiny_default, tmp_path):
    repo = tmp_path / "repo"
    tiny = tiny_default / "models" / "vit_tiny_patch16_224-32x32"
    ok = CliRunner().invoke(cli, ["triton", "-q", str(digits.path), "-o", str(repo), "--name", "m"])
    assert ok.exit_code == 0, ok.output
    again = CliRunner().invoke(cli, ["triton", "-q", str(digits.path), "-o", str(repo), "--name", "m",
                                     "--instances", "3"])
    assert again.exit_code == 0, again.output  # the same model: rewritten in place
    assert parse(TritonModelFolder(repo / "m")).instance_group[0].count == 3
    r = CliRunner().invoke(cli, ["triton", "-q", str(tiny), "-o", str(repo), "--name", "m"])
    fails_cleanly(r, "already holds another model")
    assert len(r.output.strip().splitlines()) == 1 and r.exit_code == 2
    assert parse(TritonModelFolder(repo / "m")).input[0].dims == [3, 32, 32]  # untouched
    r = CliRunner().invoke(cli, ["triton", "-q", str(tiny), "-o", str(repo), "--name", "m", "--force"])
    assert r.exit_code == 0, r.output
    cfg = parse(TritonModelFolder(repo / "m"))
    assert_agrees_with_onnx(cfg, TritonModelFolder(repo / "m").model("onnx"))
    assert list(cfg.output[0].dims) == [1000]
    assert (repo / "m" / "labels.txt").read_text().splitlines()[0].startswith("tench")
    assert sorted(p.name for p in repo.iterdir()) == ["m"]


def test_uint8_input_normalises_inside_the_graph(digits, tmp_path):
    """Raw pixels into the uint8 graph give the logits the float graph gives on vitexport's preprocessing."""
    import onnxruntime as ort
    from PIL import Image

    from vitexport.data.images import load_image, resize_and_crop

    repo = tmp_path / "repo"
    r, model, cfg = write_entry(digits.path, repo, "vit_digits_patch4_32-fp32-uint8", "--uint8-input")
    assert model_config_pb2.DataType.Name(cfg.input[0].data_type) == "TYPE_UINT8"
    assert_agrees_with_onnx(cfg, model.model("onnx"))
    onnx.checker.check_model(str(model.model("onnx")), full_check=True)  # a graph we wrote: valid for onnx itself
    pp = digits.read_manifest().preprocess
    files = sorted(HELDOUT.rglob("*.png"))[::40]
    pixels = np.stack([np.asarray(resize_and_crop(Image.open(f), pp)).transpose(2, 0, 1) for f in files])
    floats = np.stack([load_image(f, pp) for f in files])
    assert pixels.dtype == np.uint8
    raw = ort.InferenceSession(str(model.model("onnx")), providers=["CPUExecutionProvider"])
    ref = ort.InferenceSession(str(digits.onnx()), providers=["CPUExecutionProvider"])
    got, want = raw.run(None, {"pixel_values": pixels})[0], ref.run(None, {"pixel_values": floats})[0]
    assert np.abs(got - want).max() < 1e-4 and (got.argmax(1) == want.argmax(1)).all()
    r = CliRunner().invoke(cli, ["triton", str(digits.path), "-o", str(repo), "--uint8-input", "--format", "plan"])
    fails_cleanly(r, "--uint8-input is for --format onnx")


@pytest.mark.parametrize("args,needle", [
    (["--name", "../escape"], "cannot be a Triton model name"),
    (["--format", "plan", "--precision", "fp16"], "TensorRT"),  # no plan, and no TensorRT or GPU here: exit 4/5
])
def test_bad_triton_input(digits, tmp_path, args, needle):
    r = CliRunner().invoke(cli, ["triton", "-q", str(digits.path), "-o", str(tmp_path / "repo"), *args])
    fails_cleanly(r, needle)
    assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").iterdir())


def test_a_plan_that_is_not_its_sidecars_is_not_copied_into_the_repository(digits, tmp_path):
    plan = _fake_plan(digits, "fp32", 1, 24)
    digits.plan("fp32").write_bytes(plan + b"tampered")  # the sidecar's plan_sha256 no longer matches
    repo = tmp_path / "repo"
    r = CliRunner().invoke(cli, ["triton", str(digits.path), "-o", str(repo), "--format", "plan", "--name", "p"])
    # it is rebuilt instead, which needs TensorRT here: refused in one sentence, nothing written
    assert r.exit_code in (4, 5) and "Rebuilding model.fp32.plan" in r.output, r.output
    assert not (repo / "p").exists()
