"""The GPU runners' plumbing, checked on the CPU: the TensorRT runner enqueues, copies, synchronizes and times on its
own stream (never the current one) with the process's one logger; CudaStream records its events on that stream; the
bench times what timed_run() says; ONNX Runtime's IOBinding path gives the same outputs as the plain one."""

from __future__ import annotations

import json
from pathlib import Path

import fake_tensorrt
import numpy as np
import pytest
import torch
from test_engine_info import INT8_10X
from test_tensorrt_engine import H200, _sidecar

from vitexport.artifacts.folder import ModelFolder
from vitexport.artifacts.sidecar import write_sidecar
from vitexport.backends import cuda_stream as cuda_stream_module
from vitexport.backends import tensorrt as trt_runner_module
from vitexport.backends.base import Runner
from vitexport.backends.tensorrt import TensorRTRunner
from vitexport.bench.latency import measure_latency
from vitexport.errors import BackendUnavailable
from vitexport.tensorrt_engine.options import BuildOptions


class RecordingStream:
    """CudaStream's interface on the CPU, recording the order of what the runner asks of it."""

    device = "cpu"
    handle = 0x5EED

    def __init__(self) -> None:
        self.calls: list[str] = []

    def upload(self, x, dtype):
        self.calls.append("upload")
        return fake_tensorrt.register(torch.from_numpy(np.ascontiguousarray(x)).to(dtype).clone())

    def empty(self, shape, dtype):
        self.calls.append("empty")
        return fake_tensorrt.register(torch.full(shape, float("nan"), dtype=dtype))

    def download(self, tensor):
        self.calls.append("download")
        return tensor.float().numpy()

    def synchronize(self):
        self.calls.append("sync")

    def timed(self, enqueue):
        self.calls.append("start-event")
        enqueue()
        self.calls.append("end-event")
        return 1.25


def _loaded_runner(tmp_path, monkeypatch, plan=b"PLAN"):
    trt_build = fake_tensorrt.install(monkeypatch)
    fake_tensorrt.ENGINE_INFO = json.dumps(INT8_10X)
    monkeypatch.setattr(trt_runner_module, "require_trt_and_gpu", lambda: ("10.13.0.35", dict(H200)))
    monkeypatch.setattr(trt_runner_module, "CudaStream", RecordingStream)

    def no_current_stream(*a, **k):
        raise AssertionError("the runner must not use the current CUDA stream")

    monkeypatch.setattr(torch.cuda, "current_stream", no_current_stream)
    path = ModelFolder(tmp_path).plan("int8")
    path.write_bytes(plan)
    write_sidecar(ModelFolder(tmp_path).sidecar("int8"), _sidecar(tmp_path, precision="int8", plan=plan))
    return TensorRTRunner(path), trt_build


def test_tensorrt_runner_works_on_its_own_stream(tmp_path, monkeypatch):
    runner, trt_build = _loaded_runner(tmp_path, monkeypatch)
    with runner:
        stream = runner._stream
        x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
        out = runner.infer(x)
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, fake_tensorrt.logits_of(x), rtol=1e-6)  # the engine ran on this input
        assert stream.calls == ["upload", "empty", "sync", "download"]
        context = fake_tensorrt.created["contexts"][0]
        assert context.enqueued_on == [RecordingStream.handle]
        staged = runner.stage(np.ones((4, 3, 32, 32), np.float32))
        assert runner.timed_run(staged) == 1.25  # the stream's event timing, not the wall clock
        assert stream.calls[-4:] == ["upload", "start-event", "empty", "end-event"]
        assert context.enqueued_on == [RecordingStream.handle] * 2
        assert runner.info["timer"] == "CUDA events on the runner's stream"
        assert runner.info["layer_precisions"] == {"layout": "10.x", "layers": 3, "gemm": {"int8": 2, "fp16": 1},
                                                   "attention": {}, "opaque": 0}
        assert [f.precision for f in runner.engine_layers().of_kind("gemm")] == ["int8", "int8", "fp16"]
    assert fake_tensorrt.created["runtimes"][0].logger is trt_build.LOGGER  # the process's one logger
    assert runner._stream is None


def test_runner_and_build_share_the_logger(tmp_path, monkeypatch):
    runner, trt_build = _loaded_runner(tmp_path, monkeypatch)
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"onnx")
    with runner:
        trt_build.build_engine(onnx, BuildOptions())
    loggers = {id(o.logger) for k in ("builders", "parsers", "runtimes") for o in fake_tensorrt.created[k]}
    assert loggers == {id(trt_build.LOGGER)}


def test_a_plan_tensorrt_cannot_read_names_the_errors_of_this_load(tmp_path, monkeypatch):
    runner, trt_build = _loaded_runner(tmp_path, monkeypatch, plan=b"bad plan")
    trt_build.LOGGER.log(fake_tensorrt.ILogger.Severity.ERROR, "an error from an earlier build")
    with pytest.raises(BackendUnavailable) as e:
        runner.load()
    assert "magic tag mismatch" in str(e.value) and "earlier build" not in str(e.value)
    assert "rebuild with `vitexport trt" in str(e.value)


# -- CudaStream against a stand-in torch.cuda ------------------------------------------------------------------------

class _FakeStream:
    cuda_stream = 77

    def __init__(self, log):
        self.log = log

    def synchronize(self):
        self.log.append("stream.synchronize")


class _FakeEvent:
    def __init__(self, log, enable_timing=False):
        assert enable_timing
        self.log, self.stream = log, None

    def record(self, stream):
        self.log.append(f"record on {stream.cuda_stream}")
        self.stream = stream

    def synchronize(self):
        self.log.append("event.synchronize")

    def elapsed_time(self, end):
        assert self.stream is end.stream
        return 3.5


def test_cuda_stream_times_with_events_on_its_own_stream(monkeypatch):
    log: list[str] = []
    current: list[object] = []

    class _StreamContext:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            current.append(self.stream)

        def __exit__(self, *exc):
            current.pop()

    monkeypatch.setattr(torch.cuda, "Stream", lambda: _FakeStream(log))
    monkeypatch.setattr(torch.cuda, "Event", lambda enable_timing=False: _FakeEvent(log, enable_timing))
    monkeypatch.setattr(torch.cuda, "stream", _StreamContext)
    s = cuda_stream_module.CudaStream()
    assert s.handle == 77
    ms = s.timed(lambda: log.append("enqueue"))
    assert ms == 3.5 and log == ["record on 77", "enqueue", "record on 77", "event.synchronize"]

    s.device = "cpu"  # the copies themselves need a GPU; what matters is the stream they are made under
    seen = []
    real_from_numpy = torch.from_numpy
    monkeypatch.setattr(torch, "from_numpy", lambda x: (seen.append(list(current)), real_from_numpy(x))[1])
    staged = s.upload(np.ones((1, 2), np.float32), torch.float16)
    assert staged.dtype == torch.float16 and seen == [[s.stream]] and log[-1] == "stream.synchronize"
    assert s.download(staged).dtype == np.float32


# -- the bench times timed_run() ----------------------------------------------------------------------------------

class _Timed(Runner):
    def _load(self):
        pass

    def run(self, staged):
        return staged

    def timed_run(self, staged):
        return 4.0


def test_latency_is_what_timed_run_reports():
    lat = measure_latency(_Timed().load(), np.zeros((2, 3, 4, 4), np.float32), iterations=3, min_time=0, warmup=1)
    assert lat.iterations == 3 and lat.mean_ms == lat.p99_ms == 4.0 and lat.throughput == 500.0


def test_cpu_runners_keep_the_wall_clock(monkeypatch):
    import types

    import vitexport.backends.base as base

    now, ran = [100.0], []
    monkeypatch.setattr(base, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))  # a clock the test moves

    class Slow(_Timed):
        timed_run = Runner.timed_run

        def run(self, staged):
            ran.append(staged)
            now[0] += 0.0025  # the run takes 2.5 ms of wall clock
            return staged

    runner = Slow().load()
    now[0] += 7.0  # time before the run is not counted
    assert runner.timed_run("x") == pytest.approx(2.5) and ran == ["x"]


# -- ONNX Runtime IOBinding ---------------------------------------------------------------------------------------------

def test_onnxruntime_iobinding_gives_the_plain_outputs(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from vitexport.backends.ort_backend import OrtRunner

    x_info = helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, 2, 2])
    y_info = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3, 2, 2])
    graph = helper.make_graph([helper.make_node("Relu", ["pixel_values"], ["logits"])], "g", [x_info], [y_info])
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    x = np.random.default_rng(0).standard_normal((2, 3, 2, 2)).astype(np.float32)

    with OrtRunner(Path(path), "fp32") as plain:
        assert plain._io_device is None and plain.info["io_binding"] == "none"  # the CPU provider: unchanged
        expected = plain.infer(x)
        assert isinstance(plain.run(plain.stage(x)), np.ndarray)
    with OrtRunner(Path(path), "fp32") as bound:
        bound._io_device = "cpu"  # the CUDA/TensorRT providers' path, on the only device here
        staged = bound.stage(x)
        out = bound.run(staged)
        assert not isinstance(out, np.ndarray)  # the binding: the output stays where it was bound
        np.testing.assert_array_equal(bound.fetch(out), expected)
        np.testing.assert_array_equal(bound.infer(x), np.maximum(x, 0))
    assert OrtRunner(Path(path), "fp16", ep="cuda")._io_device == "cuda"
    assert OrtRunner(Path(path), "fp16", ep="tensorrt")._io_device == "cuda"
