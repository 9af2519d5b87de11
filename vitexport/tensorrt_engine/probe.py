"""Whether TensorRT can run here: a recent enough TensorRT and a CUDA GPU (probed by vitexport.environment).

Importing this module imports neither tensorrt nor torch; the probes do, inside the call.
"""

from __future__ import annotations

from typing import Any

from ..environment import cuda_gpu, tensorrt_version
from .options import EngineUnavailable, check_trt_version


def require_trt_and_gpu() -> tuple[str, dict[str, Any]]:
    """(TensorRT version, GPU) or EngineUnavailable: exit 4 without a usable TensorRT, 5 without a CUDA GPU."""
    version = tensorrt_version()
    if version is None:
        raise EngineUnavailable.no_tensorrt()
    check_trt_version(version)
    gpu = cuda_gpu()
    if gpu is None:
        raise EngineUnavailable.no_gpu()
    return version, gpu


def current_env(version: str, gpu: dict[str, Any]) -> dict[str, Any]:
    """This machine in the shape check_compatibility compares with a sidecar."""
    return {"tensorrt": version, "gpu": gpu}
