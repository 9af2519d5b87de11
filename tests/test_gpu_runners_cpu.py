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
from test_tensorrt_engine import H100, H200, _sidecar

from vitexport.artifacts.folder import ModelFolder
from vitexport.artifacts.sidecar import write_sidecar
from vitexport.backends import cuda_stream as cuda_stream_module
from vitexport.backends import tensorrt as trt_runner_module
from vitexport.backends.base import Runner
from vitexport.backends.tensorrt import TensorRTRunner
from vitexport.benchmark.latency import measure_latency
from vitexport.errors import BackendUnavailable, VitexportError
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
        context = fake_tensorrt.created["contexts"][-1]
        self.calls.append("start-event")
        self.bound_at_start = (context.input_shape, dict(context.addresses))  # what was set before the event
        enqueue()
        self.calls.append("end-event")
        return 1.25


def _loaded_runner(tmp_path, monkeypatch, plan=b"PLAN", gpu=H200, sidecar_gpu=H200):
    trt_build = fake_tensorrt.install(monkeypatch)
    fake_tensorrt.ENGINE_INFO = json.dumps(INT8_10X)
    monkeypatch.setattr(trt_runner_module, "require_trt_and_gpu", lambda: ("10.13.0.35", dict(gpu)))
    monkeypatch.setattr(trt_runner_module, "CudaStream", RecordingStream)

    def no_current_stream(*a, **k):
        raise AssertionError("the runner must not use the current CUDA stream")

    monkeypatch.setattr(torch.cuda, "current_stream", no_current_stream)
    path = ModelFolder(tmp_path).plan("int8")
    path.write_bytes(plan)
    write_sidecar(ModelFolder(tmp_path).sidecar("int8"), _sidecar(tmp_path, precision="int8", plan=plan,
                                                                  gpu=sidecar_gpu))
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
        assert stream.calls[-4:] == ["upload", "empty", "start-event", "end-event"]
        shape, addresses = stream.bound_at_start  # the events time the inference, not the host-side setup
        assert shape == (4, 3, 32, 32) and addresses["pixel_values"] == staged.data_ptr()
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


def test_what_a_loaded_runner_reports(tmp_path, monkeypatch):
    runner, _ = _loaded_runner(tmp_path, monkeypatch, sidecar_gpu=H100)
    with runner:
        info = dict(runner.info)
        assert runner.batch_range == (1, 8)  # the engine's own profile (ENGINE_PROFILE), not the sidecar's
    assert runner.precision == "int8"
    compat = info.pop("compatibility")
    assert compat.startswith("model.int8.plan was built on NVIDIA H100 80GB HBM3, not on this NVIDIA H200")
    not_checked = ("the ONNX it was built from (model.int8.trt.onnx) is not beside it, so its layers cannot be "
                   "checked against that graph")
    assert info.pop("engine_problems") == [not_checked]
    assert runner.warnings == [compat, f"model.int8.plan: {not_checked}"]
    sidecar = _sidecar(tmp_path, precision="int8")
    expected = {"plan": str(ModelFolder(tmp_path).plan("int8")), "plan_sha256": sidecar["plan_sha256"],
                "tensorrt": "10.13.0.35", "gpu": "NVIDIA H200", "compute_capability": "9.0",
                "profile": sidecar["profile"], "source_onnx_sha256": "ab" * 32, "input": "pixel_values",
                "output": "logits", "batch_range": [1, 8], "io_dtypes": ["DataType.FLOAT", "DataType.FLOAT"],
                "timer": "CUDA events on the runner's stream"}
    assert {k: info[k] for k in expected} == expected


def test_a_dynamic_size_engine_reports_its_image_range_and_a_fixed_one_does_not(tmp_path, monkeypatch):
    runner, _ = _loaded_runner(tmp_path, monkeypatch)
    with runner:
        assert "image_range" not in runner.info
    fake_tensorrt.ENGINE_PROFILE = ((1, 3, 16, 24), (4, 3, 32, 32), (8, 3, 64, 48))
    with runner:
        assert runner.info["image_range"] == [[16, 24], [64, 48]]


def test_the_precision_comes_from_the_sidecar_when_the_plan_name_does_not_say(tmp_path, monkeypatch):
    runner, _ = _loaded_runner(tmp_path, monkeypatch)
    plain = tmp_path / "engine.plan"
    ModelFolder(tmp_path).plan("int8").rename(plain)
    ModelFolder(tmp_path).sidecar("int8").rename(tmp_path / "engine.plan.json")
    runner = TensorRTRunner(plain)
    assert runner.precision == "fp32"  # nothing says otherwise yet
    with runner:
        assert runner.precision == "int8"  # what the sidecar recorded
    missing = TensorRTRunner(tmp_path / "other.plan")
    with pytest.raises(BackendUnavailable) as e:
        missing.load()
    assert str(e.value) == f"{tmp_path / 'other.plan'} does not exist; build it with `vitexport trt {tmp_path} --fp32`."


def test_without_a_source_name_in_the_sidecar_the_folders_source_for_the_precision_is_checked(tmp_path, monkeypatch):
    runner, _ = _loaded_runner(tmp_path, monkeypatch)
    side = ModelFolder(tmp_path).sidecar("int8")
    record = json.loads(side.read_text())
    del record["source_onnx"]
    side.write_text(json.dumps(record))
    ModelFolder(tmp_path).plan_source("fp32").write_bytes(b"another graph")  # not what an INT8 plan is built from
    source = ModelFolder(tmp_path).plan_source("int8")
    source.write_bytes(b"a newer graph")  # its digest is not the sidecar's
    with pytest.raises(BackendUnavailable) as e:
        runner.load()
    assert str(e.value) == (f"model.int8.plan was built from an earlier {source.name}; rebuild it with "
                            f"`vitexport trt {tmp_path} --int8`.")
    record["source_onnx"] = "../outside.onnx"
    side.write_text(json.dumps(record))
    with pytest.raises(BackendUnavailable, match="model.int8.plan.json"):  # the record that named it
        TensorRTRunner(ModelFolder(tmp_path).plan("int8")).load()


@pytest.mark.parametrize("errors,why", [
    (["Version tag does not match", "  Engine deserialization failed  "],
     "Version tag does not match; Engine deserialization failed"),
    ([], "it logged no error"),
])
def test_a_plan_tensorrt_cannot_deserialize_is_one_sentence(tmp_path, monkeypatch, errors, why):
    runner, _ = _loaded_runner(tmp_path, monkeypatch)
    fake_tensorrt.DESERIALIZE_ERRORS = errors
    if not errors:  # None without a word
        monkeypatch.setattr(fake_tensorrt.Runtime, "deserialize_cuda_engine", lambda self, plan: None)
    with pytest.raises(BackendUnavailable) as e:
        runner.load()
    assert str(e.value) == (f"TensorRT could not deserialize model.int8.plan ({why}); rebuild with "
                            f"`vitexport trt {tmp_path} --int8`.")


@pytest.mark.parametrize("tensors,sentence", [
    ({"pixel_values": (1, 0), "mask": (1, 0), "logits": (2, 0)},
     "model.int8.plan has inputs ['pixel_values', 'mask'] and outputs ['logits']; a ViT engine has one image input "
     "and one output (or several, and the name of the one judged)."),
    ({"pixel_values": (1, 0)},
     "model.int8.plan has inputs ['pixel_values'] and outputs []; a ViT engine has one image input and one "
     "output (or several, and the name of the one judged)."),
    ({"pixel_values": (1, 0), "pooled": (2, 0), "features": (2, 0)},  # several outputs, none of them the one asked
     "model.int8.plan has inputs ['pixel_values'] and outputs ['pooled', 'features']; a ViT engine has one image "
     "input and one output (or several, and the name of the one judged)."),
    ({"pixel_values": (1, 1), "logits": (2, 6)},
     "model.int8.plan has I/O types DataType.HALF / DataType.FP8, which this runner cannot bind."),
    ({"pixel_values": (1, 4), "logits": (2, 1)},
     "model.int8.plan has I/O types DataType.BOOL / DataType.HALF, which this runner cannot bind."),
])
def test_an_engine_the_runner_cannot_bind_is_refused(tmp_path, monkeypatch, tensors, sentence):
    runner, _ = _loaded_runner(tmp_path, monkeypatch)
    fake_tensorrt.ENGINE_TENSORS = tensors
    with pytest.raises(BackendUnavailable) as e:
        runner.load()
    assert str(e.value) == sentence


def test_an_engine_with_several_outputs_binds_each_and_answers_with_the_one_asked(tmp_path, monkeypatch):
    """Every output needs an address to run (the stand-in fails without one); the row gets the output it judges."""
    runner, _ = _loaded_runner(tmp_path, monkeypatch)
    fake_tensorrt.ENGINE_TENSORS = {"pixel_values": (1, 0), "pooled": (2, 0), "logits": (2, 0)}
    x = np.random.default_rng(2).standard_normal((3, 3, 32, 32)).astype(np.float32)
    for name, width in (("logits", 10), ("pooled", 16)):
        named = TensorRTRunner(runner.plan_path, output_name=name)
        with named:
            out = named.infer_all(x)
        assert out.shape == (3, width), name
        if name == "logits":
            np.testing.assert_allclose(out, fake_tensorrt.logits_of(x), rtol=1e-6)
    with pytest.raises(BackendUnavailable, match="and the output 'patch'"):
        TensorRTRunner(runner.plan_path, output_name="patch").load()


def test_no_execution_context_is_one_sentence(tmp_path, monkeypatch):
    runner, _ = _loaded_runner(tmp_path, monkeypatch)
    fake_tensorrt.NO_CONTEXT = True
    with pytest.raises(BackendUnavailable) as e:
        runner.load()
    assert str(e.value) == ("TensorRT could not create an execution context for model.int8.plan "
                            "(out of GPU memory?).")


def test_half_precision_io_is_bound_as_half(tmp_path, monkeypatch):
    runner, _ = _loaded_runner(tmp_path, monkeypatch)
    fake_tensorrt.ENGINE_TENSORS = {"pixel_values": (1, 1), "logits": (2, 1)}  # the stand-in checks the buffer types
    x = np.random.default_rng(1).standard_normal((3, 3, 32, 32)).astype(np.float32)
    with runner:
        staged = runner.stage(x)
        assert staged.dtype == torch.float16
        out = runner.run(staged)
        assert out.dtype == torch.float16 and runner.run(staged) is out  # one output buffer per shape, reused
        np.testing.assert_allclose(runner.fetch(out), fake_tensorrt.logits_of(staged.float().numpy()), rtol=2e-3)
        assert runner.info["io_dtypes"] == ["DataType.HALF", "DataType.HALF"]


def test_inputs_the_engine_cannot_take_are_one_sentence_each(tmp_path, monkeypatch):
    runner, _ = _loaded_runner(tmp_path, monkeypatch)
    with runner:
        with pytest.raises(VitexportError) as e:
            runner.stage(np.zeros((9, 3, 32, 32), np.float32))
        assert str(e.value) == ("Batch 9 is outside the range 1-8 that model.int8.plan was built for; rebuild it with "
                                "--min-batch/--max-batch covering 9.")
        with pytest.raises(VitexportError) as e:
            runner.stage(np.zeros((2, 3, 64, 64), np.float32))
        assert str(e.value) == "model.int8.plan takes images of shape (3, 32, 32), got (3, 64, 64)."
        big = fake_tensorrt.register(torch.zeros((9, 3, 32, 32)))  # not made by stage(): run() checks it too
        with pytest.raises(VitexportError) as e:
            runner.run(big)
        assert str(e.value).startswith("Batch 9 is outside the range 1-8 that model.int8.plan was built for")
        wrong = fake_tensorrt.register(torch.zeros((2, 3, 16, 16)))
        with pytest.raises(VitexportError) as e:
            runner.run(wrong)
        assert str(e.value) == "TensorRT rejected the input shape (2, 3, 16, 16) for model.int8.plan."
        unknown = torch.zeros((2, 3, 32, 32))  # memory the stand-in never allocated: the engine cannot run on it
        with pytest.raises(VitexportError) as e:
            runner.run(unknown)
        assert str(e.value) == "TensorRT failed to run model.int8.plan at batch 2."


def test_an_unloaded_or_closed_runner_says_so(tmp_path, monkeypatch):
    runner, _ = _loaded_runner(tmp_path, monkeypatch)
    for _ in range(2):  # before load(), and after close()
        runner.synchronize()  # nothing queued: nothing to wait for
        for call in (lambda: runner.stage(np.zeros((2, 3, 32, 32), np.float32)), runner.engine_layers):
            with pytest.raises(BackendUnavailable) as e:
                call()
            assert str(e.value) == f"{runner.name} is not loaded."
        runner.load()
        runner.close()


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


def test_pytorchs_compiled_rows_are_cuda_rows_named_apart_and_say_why_they_cannot_run():
    """`pytorch cuda fp16 (compiled)` / `bf16 (compiled)`: on a machine without a GPU, unavailable for that reason
    (one line with the other CUDA rows); asked of a CPU, one sentence naming the CPU's compiled path."""
    from vitexport.backends.torch_backend import TorchRunner
    from vitexport.environment import cuda_gpu

    rows = [TorchRunner(torch.nn.Identity(), p, "cuda", compiled=True, example=lambda: (3, 32, 32)) for p in ("fp16", "bf16")]
    assert [r.name for r in rows] == ["pytorch cuda fp16 (compiled)", "pytorch cuda bf16 (compiled)"]
    assert {r.provider for r in rows} == {"compiled"}
    if cuda_gpu() is None:
        for r in rows:
            with pytest.raises(BackendUnavailable, match="no CUDA GPU visible"):
                r.load()
    with pytest.raises(BackendUnavailable, match="vitexport aoti"):
        TorchRunner(torch.nn.Identity(), "bf16", "cpu", compiled=True, example=lambda: (3, 32, 32)).load()
