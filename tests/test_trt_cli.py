"""`vitexport trt` where TensorRT or a GPU is missing: the precision step still runs, then exit 4/5 with one sentence."""

import importlib.util
import shutil

import onnx
import pytest
from click.testing import CliRunner
from conftest import copy_export

from vitexport.artifacts.folder import LOCK_NAME
from vitexport.cli import cli
from vitexport.precision.qdq import trt_int8_invariants
from vitexport.tensorrt_engine.fusion import attention_sites, why_not_fused

HAVE_TRT = importlib.util.find_spec("tensorrt") is not None


@pytest.fixture(scope="module")
def digits(tmp_path_factory, digits_export):
    out = tmp_path_factory.mktemp("trtcli") / "model"
    copy_export(digits_export, out)
    return out


@pytest.mark.skipif(HAVE_TRT, reason="TensorRT is installed here: the engine tests cover this machine")
@pytest.mark.parametrize("flag,made", [("--int8", "model.int8.trt.onnx"), ("--fp16", "model.fp16.trt.onnx")])
def test_trt_without_tensorrt_prepares_onnx_then_exits_4(digits, tmp_path, flag, made):
    folder = tmp_path / "m"
    shutil.copytree(digits, folder)
    assert not (folder / made).exists()
    r = CliRunner().invoke(cli, ["trt", flag, str(folder), "-q"])
    assert r.exit_code == 4, r.output
    assert (folder / made).is_file()
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("Error: TensorRT is not installed") and "vitexport[trt]" in last
    assert not list(folder.glob("*.plan")) and [p.name for p in folder.glob(".*")] == [LOCK_NAME]  # nothing partial
    onnx.checker.check_model(str(folder / made), full_check=True)
    if flag == "--int8":  # the graph TensorRT fuses: Q/DQ on GEMM inputs only, FP16 everywhere else
        inv = trt_int8_invariants(onnx.load(str(folder / made)))
        assert inv["q_on_gemm_output"] == 0 and inv["outputs_from_dq"] == 0 and inv["casts_after_dq"] == 0
        assert inv["scale_types"] == ["FLOAT16"] and inv["nonzero_zero_points"] == 0 and inv["dq_nodes"] > 0
        assert inv["float_tensors"]["FLOAT16"] > 0.9 * sum(inv["float_tensors"].values())
    else:  # every op in FP16: no Cast but the input's and the output's, LayerNorm one op, attention fusable
        model = onnx.load(str(folder / made))
        casts = [n for n in model.graph.node if n.op_type == "Cast"]
        assert [c.input[0] for c in casts[:1]] == [model.graph.input[0].name] and len(casts) == 2
        assert casts[-1].output[0] == model.graph.output[0].name
        assert all(s.dtype == "fp16" and why_not_fused(s) is None for s in attention_sites(model))
        assert len(attention_sites(model)) == 4


def test_bad_profile_rejected_before_any_work(digits, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(digits, folder)
    r = CliRunner().invoke(cli, ["trt", "--int8", str(folder), "--opt-batch", "64", "-q"])
    assert r.exit_code == 2 and "--opt-batch" in r.output
    assert not (folder / "model.int8.onnx").exists()


# -- with a stand-in tensorrt: the TensorRT log options, a failed build, Ctrl-C -------------------------------------

def _fake_machine(monkeypatch):
    import fake_tensorrt

    from vitexport.tensorrt_engine import compiler

    fake_tensorrt.install(monkeypatch)
    monkeypatch.setattr(compiler, "require_trt_and_gpu", lambda: ("10.13.0.35", {
        "name": "NVIDIA H200", "compute_capability": "9.0", "driver": "13.0", "cuda_runtime": "13.0"}))
    return fake_tensorrt


def test_verbose_options_are_parsed_and_checked_before_any_work(digits, tmp_path):
    r = CliRunner().invoke(cli, ["trt", "--fp32", str(digits), "--verbose-log", str(tmp_path)])
    assert r.exit_code == 2 and "--verbose-log" in r.output and "is a folder" in r.output
    r = CliRunner().invoke(cli, ["trt", "--fp32", str(digits), "--verbose-log", str(tmp_path / "no" / "t.log")])
    assert r.exit_code == 2 and "does not exist" in r.output


def test_verbose_log_gets_tensorrts_messages_and_the_failure_points_at_it(digits, tmp_path, monkeypatch):
    fake = _fake_machine(monkeypatch)
    folder = tmp_path / "m"
    shutil.copytree(digits, folder)

    def failing(logger, monitor):
        logger.log(fake.ILogger.Severity.VERBOSE, "Tactic 0x1 timing")
        logger.log(fake.ILogger.Severity.INFO, "Total memory 12 MiB")
        logger.log(fake.ILogger.Severity.ERROR, "out of device memory")
        return None

    fake.on_build = failing
    log = tmp_path / "trt.log"
    r = CliRunner().invoke(cli, ["trt", "--fp32", str(folder), "-q", "--verbose", "--verbose-log", str(log)])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "out of device memory" in r.output and f"TensorRT's full log is in {log}" in r.output
    assert "[TensorRT I] Total memory 12 MiB" in r.output  # --verbose: on stderr
    assert log.read_text().splitlines() == ["[TensorRT V] Tactic 0x1 timing", "[TensorRT I] Total memory 12 MiB",
                                            "[TensorRT E] out of device memory"]
    assert not list(folder.glob("*.plan"))


def test_without_verbose_the_failure_says_how_to_see_the_log(digits, tmp_path, monkeypatch):
    fake = _fake_machine(monkeypatch)
    folder = tmp_path / "m"
    shutil.copytree(digits, folder)
    fake.on_build = lambda logger, monitor: None  # TensorRT gave up and logged nothing
    r = CliRunner().invoke(cli, ["trt", "--fp32", str(folder), "-q"])
    assert r.exit_code == 2, r.output
    assert "logged no error; run `vitexport trt` again with --verbose (or --verbose-log FILE)" in r.output


def test_ctrl_c_during_the_build_exits_130_and_keeps_nothing(digits, tmp_path, monkeypatch, ctrl_c):
    import _thread
    import time

    fake = _fake_machine(monkeypatch)
    folder = tmp_path / "m"
    shutil.copytree(digits, folder)
    fake.STEPS = 400
    fake.on_step = lambda i: (_thread.interrupt_main() if i == 2 else None, time.sleep(0.01))
    r = CliRunner().invoke(cli, ["trt", "--fp32", str(folder), "-q"])
    assert r.exit_code == 130, r.output
    assert "Interrupted" in r.output and "Traceback" not in r.output
    assert not list(folder.glob("*.plan")) and not list(folder.glob("*.plan.json"))
