"""`vitexport trt` where TensorRT or a GPU is missing: the precision step still runs, then exit 4/5 with one sentence."""

import importlib.util
import shutil

import onnx
import pytest
from click.testing import CliRunner

from vitexport.cli import cli
from vitexport.export import run_export
from vitexport.precision.qdq import trt_int8_invariants
from vitexport.spec import ModelSpec
from vitexport.variants import DIGITS_VARIANT

HAVE_TRT = importlib.util.find_spec("tensorrt") is not None


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    out = tmp_path_factory.mktemp("trtcli") / "model"
    run_export(ModelSpec(variant=DIGITS_VARIANT), output=out)
    return out


@pytest.mark.skipif(HAVE_TRT, reason="TensorRT is installed here: the engine tests cover this machine")
@pytest.mark.parametrize("flag,made", [("--int8", "model.int8.trt.onnx"), ("--fp16", "model.fp16.onnx")])
def test_trt_without_tensorrt_prepares_onnx_then_exits_4(digits, tmp_path, flag, made):
    folder = tmp_path / "m"
    shutil.copytree(digits, folder)
    assert not (folder / made).exists()
    r = CliRunner().invoke(cli, ["trt", flag, str(folder), "-q"])
    assert r.exit_code == 4, r.output
    assert (folder / made).is_file()
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("Error: TensorRT is not installed") and "vitexport[trt]" in last
    assert not list(folder.glob("*.plan")) and not list(folder.glob(".*"))
    onnx.checker.check_model(str(folder / made), full_check=True)
    if flag == "--int8":  # the graph TensorRT fuses: Q/DQ on GEMM inputs only, FP16 everywhere else
        inv = trt_int8_invariants(onnx.load(str(folder / made)))
        assert inv["q_on_gemm_output"] == 0 and inv["outputs_from_dq"] == 0 and inv["casts_after_dq"] == 0
        assert inv["scale_types"] == ["FLOAT16"] and inv["nonzero_zero_points"] == 0 and inv["dq_nodes"] > 0
        assert inv["float_tensors"]["FLOAT16"] > 0.9 * sum(inv["float_tensors"].values())


def test_bad_profile_rejected_before_any_work(digits, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(digits, folder)
    r = CliRunner().invoke(cli, ["trt", "--int8", str(folder), "--opt-batch", "64", "-q"])
    assert r.exit_code == 2 and "--opt-batch" in r.output
    assert not (folder / "model.int8.onnx").exists()
