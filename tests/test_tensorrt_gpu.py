"""TensorRT engines for the digits ViT, built and run for real, checked against ONNX Runtime running the FP32 ONNX.

Needs TensorRT (>= 10.1) and a CUDA GPU; skipped with the reason otherwise. Run: pytest -m tensorrt -q
"""

from __future__ import annotations

import numpy as np
import pytest

from vitexport.compare import DEFAULT_THRESHOLDS
from vitexport.environment import cuda_gpu, tensorrt_version
from vitexport.tensorrt_engine.options import BuildOptions
from vitexport.tensorrt_engine.sidecar import read_sidecar

_TRT = tensorrt_version()
_GPU = cuda_gpu() if _TRT else None

pytestmark = [
    pytest.mark.tensorrt,
    pytest.mark.skipif(_TRT is None, reason="TensorRT not installed"),
    pytest.mark.skipif(_TRT is not None and _GPU is None, reason="no CUDA GPU"),
]

VARIANT = "vit_digits_patch4_32"
BATCHES = (1, 3, 8)
# the same per-precision bounds the bench applies (docs/PARITY.md)
COS_MIN = {p: DEFAULT_THRESHOLDS[p].cos_min for p in ("fp16", "int8")}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from vitexport.ensure import ensure_artifact
    from vitexport.spec import ModelSpec

    out = tmp_path_factory.mktemp("trt") / f"{VARIANT}-32x32"
    return ensure_artifact(out, "fp32", spec=ModelSpec(variant=VARIANT), fresh=True).folder.path


@pytest.fixture(scope="module")
def inputs(model_dir):
    """Held-out digit images when shipped (what INT8 was calibrated for), else deterministic noise."""
    from vitexport.data import load_folder
    from vitexport.folder import ModelFolder
    from vitexport.paths import default_heldout_dir

    heldout = default_heldout_dir(VARIANT)
    if heldout.is_dir():
        return load_folder(heldout, ModelFolder(model_dir).read_manifest().preprocess, limit=max(BATCHES)).x
    return np.random.default_rng(0).standard_normal((max(BATCHES), 3, 32, 32)).astype(np.float32)


@pytest.fixture(scope="module")
def reference(model_dir, inputs):
    from vitexport.backends.ort_session import create_session

    from vitexport.folder import ModelFolder

    sess = create_session(ModelFolder(model_dir).onnx("fp32"))
    name = sess.get_inputs()[0].name
    return {b: sess.run(None, {name: inputs[:b]})[0] for b in BATCHES}


def _build(model_dir, precision):
    from vitexport.ensure import build_plan

    opts = BuildOptions(precision=precision, min_batch=1, opt_batch=4, max_batch=8,
                        timing_cache=model_dir / "timing.cache")
    return build_plan(model_dir, opts)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_engine_matches_onnxruntime_at_three_batches(model_dir, inputs, reference, precision):
    from vitexport.backends.tensorrt import TensorRTRunner
    from vitexport.compare import compare

    res = _build(model_dir, precision)
    assert res.plan_path.name == f"model.{precision}.plan"
    side = read_sidecar(res.sidecar_path)
    assert side["tensorrt"] == _TRT and side["gpu"]["name"] == _GPU["name"]
    assert side["profile"]["min"][0] == 1 and side["profile"]["max"][0] == 8
    assert side["build_options"]["timing_cache_saved"] and (model_dir / "timing.cache").stat().st_size > 0

    with TensorRTRunner(res.plan_path) as runner:
        assert runner.precision == precision
        for b in BATCHES:
            out = runner.infer(inputs[:b])
            assert out.shape == reference[b].shape and out.dtype == np.float32
            stats = compare(reference[b], out)
            assert stats.cos_min >= COS_MIN[precision], (precision, b, stats)
        with pytest.raises(Exception, match="outside the range 1-8"):
            runner.infer(np.zeros((9, 3, 32, 32), np.float32))


def test_second_build_reuses_the_timing_cache(model_dir):
    first = _build(model_dir, "fp16")
    second = _build(model_dir, "fp16")
    assert second.sidecar["build_options"]["timing_cache_loaded"] is True
    assert first.sidecar["source_onnx_sha256"] == second.sidecar["source_onnx_sha256"]


def test_fp32_engine_is_the_reference(model_dir, inputs, reference):
    from vitexport.backends.tensorrt import TensorRTRunner
    from vitexport.compare import compare

    res = _build(model_dir, "fp32")
    assert res.sidecar["build_options"]["tf32"] is False
    with TensorRTRunner(res.plan_path) as runner:
        stats = compare(reference[8], runner.infer(inputs[:8]))
    assert stats.max_abs < 1e-3 and stats.top1_agree == 1.0, stats
