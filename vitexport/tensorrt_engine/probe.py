"""What this machine offers for TensorRT: its version and the CUDA GPU, probed lazily.

Importing this module imports neither tensorrt nor torch; the probes do, inside the call.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

from .options import EngineUnavailable, check_trt_version


def tensorrt_version() -> str | None:
    """The installed TensorRT's version string ('10.13.0.35'), or None when it cannot be imported."""
    try:
        import tensorrt
    except Exception:  # ImportError, or OSError/RuntimeError from a placeholder wheel or missing libraries
        return None
    version = getattr(tensorrt, "__version__", None)
    return str(version) if version else "unknown"


def cuda_driver_version() -> str | None:
    """The CUDA driver's version ('12.4'), read from the driver library itself; None when there is none."""
    names = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so", "libcuda.dylib")
    for name in names:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        v = ctypes.c_int(0)
        try:
            if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 and v.value > 0:
                return f"{v.value // 1000}.{(v.value % 1000) // 10}"
        except AttributeError:
            continue
    return None


def cuda_gpu() -> dict[str, Any] | None:
    """The current CUDA device as torch sees it: name, compute capability, driver and runtime versions; or None."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        index = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        name = torch.cuda.get_device_name(index)
    except Exception:  # a broken driver install raises from inside torch.cuda
        return None
    return {"name": name, "compute_capability": f"{major}.{minor}", "index": index,
            "driver": cuda_driver_version(), "cuda_runtime": torch.version.cuda}


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
