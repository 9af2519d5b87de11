"""The TensorRT engine's decisions, tested without TensorRT or a GPU: options, profiles, names, sidecars,
compatibility verdicts, the version floor, the exit-4/5 paths, and that nothing imports tensorrt early."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from vitexport.artifacts.folder import ModelFolder, precision_from_plan_name
from vitexport.artifacts.sidecar import check_compatibility, read_sidecar, write_sidecar
from vitexport.backends.tensorrt import TensorRTRunner
from vitexport.errors import BackendUnavailable, VitexportError
from vitexport.tensorrt_engine import compiler, probe
from vitexport.tensorrt_engine.compiler import make_sidecar
from vitexport.tensorrt_engine.options import (
    EXIT_NO_GPU,
    EXIT_NO_TENSORRT,
    BuildOptions,
    EngineUnavailable,
    check_batch,
    check_trt_version,
    input_chw,
    parse_failure_message,
    profile_shapes,
)

H200 = {"name": "NVIDIA H200", "compute_capability": "9.0", "driver": "13.0", "cuda_runtime": "13.0"}
H100 = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "driver": "12.8", "cuda_runtime": "12.8"}
A100 = {"name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0", "driver": "12.8", "cuda_runtime": "12.8"}


# -- options ----------------------------------------------------------------------------------------------------

def test_defaults_are_valid_and_fp16():
    opts = BuildOptions().validate()
    assert (opts.precision, opts.min_batch, opts.opt_batch, opts.max_batch) == ("fp16", 1, 8, 32)


@pytest.mark.parametrize("mn,op,mx", [(1, 1, 1), (1, 8, 32), (4, 4, 8), (2, 16, 16)])
def test_good_profiles_pass(mn, op, mx):
    BuildOptions(min_batch=mn, opt_batch=op, max_batch=mx).validate()


@pytest.mark.parametrize("mn,op,mx", [(8, 1, 32),   # min > opt
                                      (1, 64, 32),  # opt > max
                                      (32, 8, 1),   # reversed
                                      (16, 16, 8)])  # min > max
def test_bad_orderings_are_rejected_with_the_numbers(mn, op, mx):
    with pytest.raises(VitexportError, match=f"{mn} / {op} / {mx}") as e:
        BuildOptions(min_batch=mn, opt_batch=op, max_batch=mx).validate()
    assert "--min-batch <= --opt-batch <= --max-batch" in str(e.value)


@pytest.mark.parametrize("field,flag", [("min_batch", "--min-batch"), ("opt_batch", "--opt-batch"),
                                        ("max_batch", "--max-batch")])
@pytest.mark.parametrize("value", [0, -1])
def test_zero_or_negative_batches_are_rejected(field, flag, value):
    with pytest.raises(VitexportError, match=f"{flag} must be at least 1, got {value}"):
        BuildOptions(**{field: value}).validate()


@pytest.mark.parametrize("kwargs,match", [
    ({"precision": "bf16"}, "Unknown precision 'bf16'"),
    ({"max_batch": 8.5}, "--max-batch must be a whole number"),
    ({"min_batch": True}, "--min-batch must be a whole number"),
    ({"workspace_gib": 0}, "--workspace must be a positive"),
    ({"workspace_gib": float("nan")}, "--workspace must be a positive"),
    ({"opt_level": 6}, "--opt-level must be one of 0-5"),
    ({"opt_level": -1}, "--opt-level must be one of 0-5"),
    ({"opt_level": 3.0}, "--opt-level must be one of 0-5"),
])
def test_other_bad_options(kwargs, match):
    with pytest.raises(VitexportError, match=match):
        BuildOptions(**kwargs).validate()


def test_timing_cache_that_is_a_folder_is_rejected(tmp_path):
    with pytest.raises(VitexportError, match="is not a file"):
        BuildOptions(timing_cache=tmp_path).validate()
    BuildOptions(timing_cache=tmp_path / "new.cache").validate()  # absent: created after the build


def test_workspace_bytes():
    assert BuildOptions(workspace_gib=1.5).workspace_bytes == 3 * 2**29
    assert BuildOptions().workspace_bytes is None


# -- profile ------------------------------------------------------------------------------------------------------

def test_profile_shapes_vary_only_the_batch():
    mn, op, mx = profile_shapes(BuildOptions(min_batch=2, opt_batch=4, max_batch=16), (3, 224, 160))
    assert (mn, op, mx) == ((2, 3, 224, 160), (4, 3, 224, 160), (16, 3, 224, 160))


def test_profile_shapes_reject_a_bad_image_shape():
    with pytest.raises(VitexportError, match="three positive sizes"):
        profile_shapes(BuildOptions(), (3, 224))
    with pytest.raises(VitexportError, match="three positive sizes"):
        profile_shapes(BuildOptions(), (3, -1, 224))


def test_input_chw_from_the_onnx_input():
    assert input_chw([-1, 3, 32, 32], "pixel_values", BuildOptions()) == (3, 32, 32)
    with pytest.raises(VitexportError, match="symbolic image size"):
        input_chw([-1, 3, -1, -1], "pixel_values", BuildOptions())
    with pytest.raises(VitexportError, match="fixed batch of 1"):
        input_chw([1, 3, 32, 32], "pixel_values", BuildOptions())
    assert input_chw([4, 3, 32, 32], "x", BuildOptions(min_batch=4, opt_batch=4, max_batch=4)) == (3, 32, 32)
    with pytest.raises(VitexportError, match=r"\(batch, channels, height, width\)"):
        input_chw([-1, 3, 32], "x", BuildOptions())


def test_a_dynamic_size_profile_and_its_checks():
    opts = BuildOptions(min_batch=2, opt_batch=4, max_batch=8, img_size=(224, 160), img_size_range=((112, 96), (448, 320)))
    assert input_chw([-1, 3, -1, -1], "pixel_values", opts.validate()) == (3, 224, 160)
    assert profile_shapes(opts, (3, 224, 160)) == ((2, 3, 112, 96), (4, 3, 224, 160), (8, 3, 448, 320))
    no_opt = BuildOptions(img_size_range=((112, 112), (448, 448)))
    assert input_chw([-1, 3, -1, -1], "x", no_opt) == (3, 112, 112)  # without a default size: the smallest
    for size, rng in (((500, 160), ((112, 96), (448, 320))), ((224, 160), ((300, 96), (200, 320)))):
        with pytest.raises(VitexportError, match="image size profile needs min <= opt <= max"):
            BuildOptions(img_size=size, img_size_range=rng).validate()


def test_an_antialiased_resize_is_refused_before_tensorrt_is_needed(tmp_path):
    from onnx import TensorProto, helper, save

    from vitexport.tensorrt_engine.options import antialiased_resizes, refuse_antialias

    def graph(antialias):
        node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="pos_embed/Resize", mode="cubic",
                                antialias=antialias)
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 7, 7]),
                                            helper.make_tensor_value_info("sizes", TensorProto.INT64, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        path = tmp_path / f"a{antialias}.onnx"
        save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(path))
        return path

    assert antialiased_resizes(graph(0)) == [] and antialiased_resizes(graph(1)) == ["pos_embed/Resize"]
    refuse_antialias(graph(0))
    with pytest.raises(VitexportError) as e:
        refuse_antialias(graph(1))
    assert str(e.value) == ("a1.onnx resamples its position embedding with an antialiased Resize (pos_embed/Resize), "
                            "which TensorRT's ONNX parser does not support; export it again with `vitexport onnx "
                            "--dynamic-img-size --pos-embed-interp bicubic` (or bilinear).")


def test_check_batch():
    check_batch(1, 1, 32, "model.fp16.plan")
    check_batch(32, 1, 32, "model.fp16.plan")
    with pytest.raises(VitexportError, match="Batch 33 is outside the range 1-32 that model.fp16.plan"):
        check_batch(33, 1, 32, "model.fp16.plan")
    with pytest.raises(VitexportError, match="Batch 1 is outside the range 2-8"):
        check_batch(1, 2, 8, "model.fp16.plan")


# -- names ----------------------------------------------------------------------------------------------------------

def test_output_naming(tmp_path):
    folder = ModelFolder(tmp_path)
    for p in ("fp32", "fp16", "int8", "fp8"):
        plan, side = folder.plan(p), folder.sidecar(p)
        assert plan == tmp_path / f"model.{p}.plan"
        assert side == tmp_path / f"model.{p}.plan.json"
        assert precision_from_plan_name(plan) == p
    assert folder.plan_source("fp32") == tmp_path / "model.onnx"
    assert folder.plan_source("fp16") == tmp_path / "model.fp16.trt.onnx"  # every op FP16: what TensorRT fuses
    assert folder.plan_source("int8") == tmp_path / "model.int8.trt.onnx"  # the INT8 graph shaped for TensorRT
    assert folder.plan_source("fp8") == tmp_path / "model.fp8.onnx"
    assert precision_from_plan_name(Path("weird.plan")) is None
    with pytest.raises(VitexportError, match="Unknown precision"):
        folder.plan("int4")
    with pytest.raises(VitexportError, match="Unknown precision"):
        folder.plan_source("bf16")


# -- sidecar ----------------------------------------------------------------------------------------------------------

def _sidecar(tmp_path, trt="10.13.0.35", gpu=H200, precision="fp16", plan=b"PLAN"):
    opts = BuildOptions(precision=precision, min_batch=1, opt_batch=4, max_batch=16, workspace_gib=2.0,
                        timing_cache=tmp_path / "t.cache", opt_level=3)
    folder = ModelFolder(tmp_path)
    return make_sidecar(plan_path=folder.plan(precision), plan_sha256=hashlib.sha256(plan).hexdigest(),
                        plan_bytes=len(plan), onnx_path=folder.plan_source(precision), onnx_sha256="ab" * 32, opts=opts,
                        input_name="pixel_values", chw=(3, 32, 32), output_names=["logits"],
                        tensorrt_version=trt, gpu=gpu, build_seconds=12.3456,
                        build_info={"timing_cache_loaded": False, "timing_cache_saved": True, "other": 1})


def test_sidecar_contents(tmp_path):
    s = _sidecar(tmp_path)
    assert s["plan"] == "model.fp16.plan" and s["precision"] == "fp16"
    assert s["tensorrt"] == "10.13.0.35"
    assert s["gpu"] == {"name": "NVIDIA H200", "compute_capability": "9.0", "cuda_driver": "13.0",
                        "cuda_runtime": "13.0"}
    assert s["profile"] == {"input": "pixel_values", "min": [1, 3, 32, 32], "opt": [4, 3, 32, 32],
                            "max": [16, 3, 32, 32]}
    assert s["source_onnx"] == "model.fp16.trt.onnx" and s["source_onnx_sha256"] == "ab" * 32
    assert s["plan_sha256"] == hashlib.sha256(b"PLAN").hexdigest() and s["plan_bytes"] == 4
    bo = s["build_options"]
    assert (bo["workspace_gib"], bo["opt_level"], bo["timing_cache"]) == (2.0, 3, str(tmp_path / "t.cache"))
    assert bo["strongly_typed"] is True and bo["tf32"] is True and bo["timing_cache_saved"] is True
    assert "other" not in bo
    assert s["build_seconds"] == 12.346
    assert _sidecar(tmp_path, precision="fp32")["build_options"]["tf32"] is False


def test_sidecar_round_trip(tmp_path):
    s = _sidecar(tmp_path)
    path = ModelFolder(tmp_path).sidecar("fp16")
    write_sidecar(path, s)
    assert read_sidecar(path) == s
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left behind


def test_read_sidecar_errors(tmp_path):
    path = tmp_path / "model.fp16.plan.json"
    with pytest.raises(VitexportError, match="is missing, so nothing says where model.fp16.plan was built"):
        read_sidecar(path)
    path.write_text("{not json")
    with pytest.raises(VitexportError, match="is not valid JSON .*rebuild the engine with `vitexport trt`"):
        read_sidecar(path)
    path.write_text("[1, 2]")
    with pytest.raises(VitexportError, match="holds a JSON list"):
        read_sidecar(path)
    path.write_text(json.dumps({"tensorrt": "10.13", "gpu": {"name": "x"}, "precision": "fp16", "profile": {},
                                "plan_sha256": "0"}))
    with pytest.raises(VitexportError, match="lacks gpu.name/gpu.compute_capability"):
        read_sidecar(path)


# -- compatibility ------------------------------------------------------------------------------------------------

def here(trt="10.13.0.35", gpu=H200):
    return probe.current_env(trt, gpu)


def test_same_machine_is_compatible(tmp_path):
    v = check_compatibility(_sidecar(tmp_path), here())
    assert (v.ok, v.kind, v.message, v.differences) == (True, "same", "", ())


def test_other_tensorrt_version(tmp_path):
    v = check_compatibility(_sidecar(tmp_path, trt="10.8.0.43"), here(), folder="models/m-32x32")
    assert not v.ok and v.kind == "other_tensorrt" and v.differences == ("other_tensorrt",)
    assert v.message == ("model.fp16.plan cannot run here: it was built for TensorRT 10.8.0.43 (plan) vs 10.13.0.35 "
                         "(here); rebuild with `vitexport trt models/m-32x32 --fp16` on this machine.")


def test_other_compute_capability(tmp_path):
    v = check_compatibility(_sidecar(tmp_path, gpu=A100, precision="int8"), here())
    assert not v.ok and v.kind == "other_compute_capability"
    assert v.message == ("model.int8.plan cannot run here: it was built for compute capability 8.0 on "
                         "NVIDIA A100-SXM4-80GB (plan) vs 9.0 on NVIDIA H200 (here); rebuild with "
                         "`vitexport trt --int8` on this machine.")


def test_other_tensorrt_and_compute_capability_both_named(tmp_path):
    v = check_compatibility(_sidecar(tmp_path, trt="11.1.0.5", gpu=A100), here())
    assert not v.ok and v.kind == "other_tensorrt"
    assert v.differences == ("other_tensorrt", "other_compute_capability")
    assert "TensorRT 11.1.0.5 (plan) vs 10.13.0.35 (here); compute capability 8.0" in v.message


def test_other_gpu_same_compute_capability_runs_with_a_message(tmp_path):
    v = check_compatibility(_sidecar(tmp_path, gpu=H100), here())
    assert v.ok and v.kind == "other_gpu"
    assert v.message == ("model.fp16.plan was built on NVIDIA H100 80GB HBM3, not on this NVIDIA H200 (same compute "
                         "capability 9.0): it runs, with kernels tuned for the other GPU; rebuild with "
                         "`vitexport trt --fp16` on this machine for full speed.")


# -- TensorRT version ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version,expected", [("10.12.0.36", (10, 12)), ("10.13.0.35", (10, 13)), ("11.0.0", (11, 0)),
                                              ("11.1.0.5", (11, 1)), ("12.0", (12, 0))])
def test_supported_tensorrt_versions(version, expected):
    assert check_trt_version(version) == expected


@pytest.mark.parametrize("version", ["8.6.1", "9.3.0.1", "10.0.1.6", "10.1.0.27", "10.11.0.33", "10.2"])
def test_tensorrt_before_10_12_is_rejected_with_the_reason(version):
    with pytest.raises(EngineUnavailable) as e:
        check_trt_version(version)
    assert str(e.value) == (f"TensorRT {version} is installed, but vitexport needs TensorRT 10.12 or newer (strongly "
                            f"typed networks are complete from TensorRT 10.12 on); upgrade it with "
                            f"`pip install -U 'vitexport[trt]'`.")
    assert e.value.exit_code == EXIT_NO_TENSORRT


def test_the_package_extra_asks_for_the_same_floor():
    import re

    from vitexport.tensorrt_engine.options import MIN_TENSORRT

    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert re.search(r'^trt = \["tensorrt>=(\d+)\.(\d+)"\]', pyproject, re.M).groups() == tuple(map(str, MIN_TENSORRT))


def test_unreadable_version_is_rejected():
    with pytest.raises(EngineUnavailable, match="cannot read") as e:
        check_trt_version("unknown")
    assert e.value.exit_code == 4


# -- availability -----------------------------------------------------------------------------------------------------

def test_exit_codes_are_documented_values():
    assert (EXIT_NO_TENSORRT, EXIT_NO_GPU) == (4, 5)
    assert issubclass(EngineUnavailable, VitexportError)


def test_tensorrt_version_probe(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # makes `import tensorrt` raise ImportError
    assert probe.tensorrt_version() is None
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__="10.13.0.35"))
    assert probe.tensorrt_version() == "10.13.0.35"


def test_require_without_tensorrt_exits_4(monkeypatch):
    monkeypatch.setattr(probe, "tensorrt_version", lambda: None)
    monkeypatch.setattr(probe, "cuda_gpu", lambda: dict(H200))
    with pytest.raises(EngineUnavailable) as e:
        probe.require_trt_and_gpu()
    assert e.value.exit_code == 4
    assert str(e.value) == ("TensorRT is not installed; install it with `pip install 'vitexport[trt]'` on a machine "
                            "with an NVIDIA GPU.")


def test_require_with_old_tensorrt_exits_4(monkeypatch):
    monkeypatch.setattr(probe, "tensorrt_version", lambda: "8.6.1")
    monkeypatch.setattr(probe, "cuda_gpu", lambda: dict(H200))
    with pytest.raises(EngineUnavailable, match="TensorRT 8.6.1 is installed") as e:
        probe.require_trt_and_gpu()
    assert e.value.exit_code == 4


def test_require_without_gpu_exits_5(monkeypatch):
    monkeypatch.setattr(probe, "tensorrt_version", lambda: "10.13.0.35")
    monkeypatch.setattr(probe, "cuda_gpu", lambda: None)
    with pytest.raises(EngineUnavailable) as e:
        probe.require_trt_and_gpu()
    assert e.value.exit_code == 5
    assert str(e.value).startswith("No CUDA GPU is visible")


def test_require_with_both(monkeypatch):
    monkeypatch.setattr(probe, "tensorrt_version", lambda: "11.1.0.5")
    monkeypatch.setattr(probe, "cuda_gpu", lambda: dict(H200))
    assert probe.require_trt_and_gpu() == ("11.1.0.5", H200)


def test_cuda_gpu_probe_matches_torch():
    import torch

    gpu = probe.cuda_gpu()
    if not torch.cuda.is_available():
        assert gpu is None
    else:
        assert gpu["name"] == torch.cuda.get_device_name() and gpu["compute_capability"].count(".") == 1


# -- compiler ---------------------------------------------------------------------------------------------------------

def _fake_prepare(tmp_path, calls):
    def prepare(precision):
        calls.append(precision)
        path = ModelFolder(tmp_path).plan_source(precision)
        path.write_bytes(b"onnx-" + precision.encode())
        return path
    return prepare


def test_run_trt_prepares_the_onnx_before_failing_without_tensorrt(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    calls = []
    with pytest.raises(EngineUnavailable) as e:
        compiler.run_trt(tmp_path, BuildOptions(precision="int8"), prepare_onnx=_fake_prepare(tmp_path, calls))
    assert e.value.exit_code == 4 and "pip install 'vitexport[trt]'" in str(e.value)
    assert calls == ["int8"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.int8.trt.onnx"]  # the ONNX stays, no plan


def test_run_trt_validates_options_before_preparing(tmp_path):
    calls = []
    with pytest.raises(VitexportError, match="--min-batch <= --opt-batch"):
        compiler.run_trt(tmp_path, BuildOptions(min_batch=4, opt_batch=2), prepare_onnx=_fake_prepare(tmp_path, calls))
    assert calls == []


def test_run_trt_without_the_onnx_says_how_to_make_it(tmp_path):
    with pytest.raises(VitexportError, match="model.fp16.trt.onnx does not exist; make it with `vitexport onnx` and "
                                             "`vitexport quantize --fp16 --target tensorrt` first"):
        compiler.run_trt(tmp_path, BuildOptions())


def _available(monkeypatch, trt="10.13.0.35", gpu=H200):
    monkeypatch.setattr(compiler, "require_trt_and_gpu", lambda: (trt, dict(gpu)))


def test_run_trt_writes_plan_and_sidecar(tmp_path, monkeypatch):
    _available(monkeypatch)
    seen = {}

    def fake_build(onnx_path, opts, log):
        seen["onnx"] = onnx_path
        return b"\x00plan-bytes", {"input_name": "pixel_values", "chw": [3, 32, 32], "output_names": ["logits"],
                                   "tensorrt_version": "10.13.0.35"}

    res = compiler.run_trt(tmp_path, BuildOptions(precision="fp32", max_batch=8),
                           prepare_onnx=_fake_prepare(tmp_path, []), build=fake_build)
    assert seen["onnx"] == tmp_path / "model.onnx"
    assert res.plan_path.read_bytes() == b"\x00plan-bytes"  # the plan is the builder's bytes, nothing prefixed
    side = read_sidecar(res.sidecar_path)
    assert side == res.sidecar
    assert side["plan_sha256"] == hashlib.sha256(b"\x00plan-bytes").hexdigest()
    assert side["source_onnx_sha256"] == hashlib.sha256(b"onnx-fp32").hexdigest()
    assert side["profile"]["max"] == [8, 3, 32, 32] and side["precision"] == "fp32"
    assert side["gpu"]["name"] == "NVIDIA H200" and side["build_seconds"] >= 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.fp32.plan", "model.fp32.plan.json", "model.onnx"]


def test_a_failed_build_keeps_the_previous_engine(tmp_path, monkeypatch):
    _available(monkeypatch)
    plan, side = ModelFolder(tmp_path).plan("fp16"), ModelFolder(tmp_path).sidecar("fp16")
    plan.write_bytes(b"old"), side.write_text("{}")

    def failing_build(onnx_path, opts, log):
        raise VitexportError("TensorRT could not build an engine from model.fp16.trt.onnx:\n  boom")

    with pytest.raises(VitexportError, match="boom"):
        compiler.run_trt(tmp_path, BuildOptions(), prepare_onnx=_fake_prepare(tmp_path, []), build=failing_build)
    assert plan.read_bytes() == b"old" and side.read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.fp16.plan", "model.fp16.plan.json",
                                                             "model.fp16.trt.onnx"]


def test_parse_failure_lists_every_error():
    msg = parse_failure_message(Path("m/model.int8.onnx"), ["In node 3 (Gelu): unsupported", "In node 9: bad scale"])
    assert msg.splitlines() == ["TensorRT could not parse model.int8.onnx (2 errors):",
                                "  1. In node 3 (Gelu): unsupported", "  2. In node 9: bad scale",
                                "Run `vitexport trt` again with --verbose (or --verbose-log FILE) to see TensorRT's "
                                "full log."]


# -- runner refusals before TensorRT sees the plan ------------------------------------------------------------------

def test_runner_without_tensorrt_is_unavailable(tmp_path, monkeypatch):
    monkeypatch.setattr("vitexport.backends.tensorrt.require_trt_and_gpu", probe.require_trt_and_gpu)
    monkeypatch.setattr(probe, "tensorrt_version", lambda: None)
    runner = TensorRTRunner(tmp_path / "model.int8.plan")
    assert runner.precision == "int8" and runner.backend == "tensorrt" and runner.device == "cuda"
    with pytest.raises(BackendUnavailable, match="TensorRT is not installed") as e:
        runner.load()
    assert e.value.exit_code == 4


def _runner_env(monkeypatch, trt="10.13.0.35", gpu=H200):
    monkeypatch.setattr("vitexport.backends.tensorrt.require_trt_and_gpu", lambda: (trt, dict(gpu)))


def test_runner_refuses_a_plan_from_another_tensorrt(tmp_path, monkeypatch):
    _runner_env(monkeypatch, trt="10.14.1.48")
    plan, side = ModelFolder(tmp_path).plan("fp16"), ModelFolder(tmp_path).sidecar("fp16")
    plan.write_bytes(b"PLAN")
    write_sidecar(side, _sidecar(tmp_path))
    with pytest.raises(BackendUnavailable) as e:
        TensorRTRunner(plan).load()
    assert str(e.value) == (f"model.fp16.plan cannot run here: it was built for TensorRT 10.13.0.35 (plan) vs "
                            f"10.14.1.48 (here); rebuild with `vitexport trt {tmp_path} --fp16` on this machine.")


def test_runner_refuses_a_plan_without_sidecar_or_with_other_bytes(tmp_path, monkeypatch):
    _runner_env(monkeypatch)
    plan, side = ModelFolder(tmp_path).plan("fp16"), ModelFolder(tmp_path).sidecar("fp16")
    with pytest.raises(BackendUnavailable, match=f"model.fp16.plan does not exist; build it with `vitexport trt {tmp_path} --fp16`"):
        TensorRTRunner(plan).load()
    plan.write_bytes(b"PLAN")
    with pytest.raises(BackendUnavailable, match="is missing, so nothing says where model.fp16.plan was built"):
        TensorRTRunner(plan).load()
    write_sidecar(side, _sidecar(tmp_path, plan=b"OTHER"))
    with pytest.raises(BackendUnavailable, match="is not the plan its sidecar model.fp16.plan.json describes"):
        TensorRTRunner(plan).load()


def test_runner_accepts_a_plan_from_a_sibling_gpu_with_a_warning(tmp_path):
    plan, side = ModelFolder(tmp_path).plan("int8"), ModelFolder(tmp_path).sidecar("int8")
    plan.write_bytes(b"PLAN")
    write_sidecar(side, _sidecar(tmp_path, gpu=H100, precision="int8"))
    runner = TensorRTRunner(plan)
    assert runner._check_plan("10.13.0.35", dict(H200)) == b"PLAN"  # the checks TensorRT never sees
    assert runner.warnings and "built on NVIDIA H100 80GB HBM3, not on this NVIDIA H200" in runner.warnings[0]
    assert runner.info["plan_sha256"] == hashlib.sha256(b"PLAN").hexdigest()


def test_runner_checks_the_source_onnx_its_sidecar_names(tmp_path):
    """An export made with `-o dir/custom.onnx`: the FP32 plan's staleness check reads custom.onnx, as the sidecar
    records it, not a recomputed model.onnx."""
    source = tmp_path / "custom.onnx"
    source.write_bytes(b"onnx-v1")
    plan, side = ModelFolder(tmp_path).plan("fp32"), ModelFolder(tmp_path).sidecar("fp32")
    plan.write_bytes(b"PLAN")
    sidecar = _sidecar(tmp_path, precision="fp32")
    sidecar.update(source_onnx="custom.onnx", source_onnx_sha256=hashlib.sha256(b"onnx-v1").hexdigest())
    write_sidecar(side, sidecar)
    assert TensorRTRunner(plan)._check_plan("10.13.0.35", dict(H200)) == b"PLAN"
    source.write_bytes(b"onnx-v2")  # re-exported since the plan was built
    with pytest.raises(BackendUnavailable, match="model.fp32.plan was built from an earlier custom.onnx"):
        TensorRTRunner(plan)._check_plan("10.13.0.35", dict(H200))


def test_runner_infer_before_load_is_refused(tmp_path):
    with pytest.raises(BackendUnavailable, match="not loaded"):
        TensorRTRunner(tmp_path / "model.fp16.plan").infer(np.zeros((1, 3, 32, 32), np.float32))


# -- import hygiene ---------------------------------------------------------------------------------------------------

def test_importing_vitexport_and_the_engine_modules_does_not_import_tensorrt():
    code = ("import sys, vitexport, vitexport.tensorrt_engine.compiler, vitexport.tensorrt_engine.probe, "
            "vitexport.tensorrt_engine.options, vitexport.artifacts.sidecar, vitexport.backends.tensorrt; "
            "assert 'tensorrt' not in sys.modules, 'tensorrt was imported'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
