"""TensorRT engines for the digits ViT, built and run for real, checked against ONNX Runtime running the FP32 ONNX,
and read back with TensorRT's engine inspector to prove that each engine computes in the precision it claims.

Each test says what it needs: TensorRT (>= 10.12) and a CUDA GPU (`tensorrt`), or only a CUDA GPU (`gpu`: ONNX
Runtime's CUDA provider), and is skipped with the reason otherwise. Run: pytest -m "tensorrt or gpu" -q
None of these has run on a GPU yet (docs/TENSORRT.md, "What was checked how").
"""

from __future__ import annotations

import numpy as np
import pytest

from vitexport.artifacts.sidecar import read_sidecar
from vitexport.environment import cuda_gpu, tensorrt_version
from vitexport.tensorrt_engine.options import BuildOptions

_TRT = tensorrt_version()
_GPU = cuda_gpu()


def needs_gpu(test):
    """A CUDA GPU (ONNX Runtime's CUDA provider, torch): runs on a GPU machine without TensorRT too."""
    return pytest.mark.gpu(pytest.mark.skipif(_GPU is None, reason="no CUDA GPU")(test))


def needs_tensorrt(test):
    """TensorRT and a CUDA GPU."""
    return pytest.mark.tensorrt(pytest.mark.skipif(_TRT is None, reason="TensorRT not installed")(needs_gpu(test)))

VARIANT = "vit_digits_patch4_32"
BATCHES = (1, 3, 8)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from vitexport.ensure import ensure_artifact
    from vitexport.model.spec import ModelSpec

    out = tmp_path_factory.mktemp("trt") / f"{VARIANT}-32x32"
    return ensure_artifact(out, "fp32", spec=ModelSpec(variant=VARIANT), fresh=True).folder.path


@pytest.fixture(scope="module")
def inputs(model_dir):
    """Held-out digit images when shipped (what INT8 was calibrated for), else deterministic noise."""
    from vitexport.artifacts.folder import ModelFolder
    from vitexport.data.images import load_folder
    from vitexport.paths import default_heldout_dir

    heldout = default_heldout_dir(VARIANT)
    if heldout.is_dir():
        return load_folder(heldout, ModelFolder(model_dir).read_manifest().preprocess, limit=max(BATCHES)).x
    return np.random.default_rng(0).standard_normal((max(BATCHES), 3, 32, 32)).astype(np.float32)


@pytest.fixture(scope="module")
def reference(model_dir, inputs):
    from vitexport.artifacts.folder import ModelFolder
    from vitexport.backends.ort_session import create_session

    sess = create_session(ModelFolder(model_dir).onnx("fp32"))
    name = sess.get_inputs()[0].name
    return {b: sess.run(None, {name: inputs[:b]})[0] for b in BATCHES}


def _build(model_dir, precision):
    from vitexport.ensure import build_plan

    opts = BuildOptions(precision=precision, min_batch=1, opt_batch=4, max_batch=8,
                        timing_cache=model_dir / "timing.cache")
    return build_plan(model_dir, opts)


@pytest.fixture(scope="module")
def built(model_dir):
    """One build per precision for the tests that only read the engine."""
    cache = {}

    def get(precision):
        if precision not in cache:
            cache[precision] = _build(model_dir, precision)
        return cache[precision]

    return get


@needs_tensorrt
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_engine_matches_onnxruntime_at_three_batches(built, inputs, reference, precision):
    from vitexport.backends.tensorrt import TensorRTRunner
    from vitexport.parity.accumulate import compare
    from vitexport.parity.compare import judge

    res = built(precision)
    assert res.plan_path.name == f"model.{precision}.plan"
    side = read_sidecar(res.sidecar_path)
    assert side["tensorrt"] == _TRT and side["gpu"]["name"] == _GPU["name"]
    assert side["profile"]["min"][0] == 1 and side["profile"]["max"][0] == 8
    assert side["build_options"]["timing_cache_saved"]

    with TensorRTRunner(res.plan_path) as runner:
        assert runner.precision == precision
        for b in BATCHES:
            out = runner.infer(inputs[:b])
            assert out.shape == reference[b].shape and out.dtype == np.float32
            verdict = judge(compare(reference[b], out), precision)  # the bench's bounds: compare.DEFAULT_THRESHOLDS
            assert verdict.passed, (precision, b, verdict.failures, verdict.stats)
        with pytest.raises(Exception, match="outside the range 1-8"):
            runner.infer(np.zeros((9, 3, 32, 32), np.float32))


@needs_tensorrt
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_the_engine_computes_its_gemms_in_its_precision(built, precision):
    """INT8 GEMMs in the INT8 engine, FP16 GEMMs in the FP16 engine, no FP32 GEMM (or attention) in either, and
    the four attention blocks fused in both (their source graphs keep Softmax in FP16 between the products)."""
    from vitexport.backends.tensorrt import TensorRTRunner
    from vitexport.tensorrt_engine.engine_info import engine_problems
    from vitexport.tensorrt_engine.fusion import plan_expectations

    res = built(precision)
    with TensorRTRunner(res.plan_path) as runner:
        layers = runner.engine_layers()
        assert runner.info["engine_problems"] == runner.engine_problems()
    quantized, sites = plan_expectations(res.onnx_path)
    assert len(sites) == 4 and (precision == "fp16") == (not quantized)  # the digits model: 4 blocks
    # every GEMM the graph quantized in INT8 (not just one of them), every attention fused, no FP32 GEMM
    problems = engine_problems(layers, precision, quantized, sites)
    assert not problems, (layers.summary(), problems)


@needs_tensorrt
def test_the_runner_enqueues_and_times_on_its_own_stream(built, inputs):
    import torch

    from vitexport.backends.tensorrt import TensorRTRunner

    with TensorRTRunner(built("fp16").plan_path) as runner:
        handle = runner._stream.handle
        assert handle not in (0, torch.cuda.current_stream().cuda_stream, torch.cuda.default_stream().cuda_stream)
        staged = runner.stage(inputs[:4])
        ms = [runner.timed_run(staged) for _ in range(5)]
        assert all(0 < t < 10_000 for t in ms), ms
        assert runner.info["timer"] == "CUDA events on the runner's stream"
        assert runner.info["layer_precisions"]["gemm"], runner.info["layer_precisions"]


@needs_tensorrt
def test_second_build_reuses_the_timing_cache(model_dir):
    first = _build(model_dir, "fp16")
    second = _build(model_dir, "fp16")
    assert second.sidecar["build_options"]["timing_cache_loaded"] is True
    assert first.sidecar["source_onnx_sha256"] == second.sidecar["source_onnx_sha256"]


@needs_tensorrt
def test_fp32_engine_is_the_reference(model_dir, inputs, reference):
    from vitexport.backends.tensorrt import TensorRTRunner
    from vitexport.parity.accumulate import compare
    from vitexport.parity.compare import judge

    res = _build(model_dir, "fp32")
    assert res.sidecar["build_options"]["tf32"] is False
    with TensorRTRunner(res.plan_path) as runner:
        stats = compare(reference[8], runner.infer(inputs[:8]))
    verdict = judge(stats, "fp32")  # max abs <= 1e-3, min cosine >= 0.99999
    assert verdict.passed and stats.top1_agree == 1.0, (verdict.failures, stats)


@needs_gpu
@pytest.mark.parametrize("ep", ["cuda", "tensorrt"])
def test_onnxruntime_gpu_providers_bind_inputs_and_outputs_on_the_device(model_dir, inputs, reference, ep):
    from vitexport.artifacts.folder import ModelFolder
    from vitexport.backends.ort_backend import OrtRunner
    from vitexport.errors import BackendUnavailable
    from vitexport.parity.accumulate import compare
    from vitexport.parity.compare import judge

    runner = OrtRunner(ModelFolder(model_dir).onnx("fp32"), "fp32", ep=ep)
    try:
        runner.load()
    except BackendUnavailable as e:
        pytest.skip(f"ONNX Runtime {ep} provider: {e}")
    try:
        assert runner.info["io_binding"] == "cuda"
        staged = runner.stage(inputs[:8])
        out = runner.run(staged)
        assert not isinstance(out, np.ndarray)  # stays on the device until fetch()
        # the TensorRT provider keeps TF32 on for FP32 graphs (only `vitexport trt --fp32` clears it): FP16's bounds
        verdict = judge(compare(reference[8], runner.fetch(out)), "fp16" if ep == "tensorrt" else "fp32")
        assert verdict.passed, verdict.failures
    finally:
        runner.close()
