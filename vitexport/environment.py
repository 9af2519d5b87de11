"""This machine: library versions, the CPU, and the CUDA GPU (one probe, used by the export, bench and TensorRT).

Importing this module imports none of the libraries it reports on; each probe does, inside the call.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from pathlib import Path
from typing import Any

from .version import __version__


def versions(with_python: bool = False, with_tensorrt: bool = False) -> dict[str, str | None]:
    """The versions that decide what an artifact is: recorded in manifests and bench reports."""
    import onnx
    import onnxruntime
    import torch

    out: dict[str, str | None] = {"vitexport": __version__, "torch": torch.__version__, "onnx": onnx.__version__,
                                  "onnxruntime": onnxruntime.__version__}
    if with_python:
        out["python"] = platform.python_version()
    if with_tensorrt:
        out["tensorrt"] = tensorrt_version()
    return out


def usable_cores() -> int:
    """The cores this process may run on (its affinity, as set by taskset or a container's cpuset), which may be fewer
    than the machine's: the default thread count of every runtime vitexport starts, so that a process pinned to one
    core does not run two spinning ONNX Runtime threads on it (PyTorch and OpenVINO follow the affinity already)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def ort_threads() -> int:
    """ONNX Runtime's intra-op thread count when none is asked for: the usable cores when the process may use fewer
    than the machine has (ONNX Runtime would size its pool by the machine's physical cores), else 0, its own choice
    (the physical cores: on a machine with SMT, fewer than the logical ones)."""
    cores = usable_cores()
    return cores if cores < (os.cpu_count() or cores) else 0


def tensorrt_version() -> str | None:
    """The installed TensorRT's version string ('10.13.0.35'), or None when it cannot be imported."""
    try:
        import tensorrt
    except Exception:  # ImportError, or OSError/RuntimeError from a placeholder wheel or missing libraries
        return None
    version = getattr(tensorrt, "__version__", None)
    return str(version) if version else "unknown"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# CPU features CPU inference speed depends on (INT8 dot products, BF16 arithmetic, AMX tiles), as Linux names them
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def cpu_flags() -> list[str]:
    """Which of CPU_FLAGS this CPU has (Linux; [] elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return [f for f in CPU_FLAGS if f in have]
    except OSError:
        pass
    return []


# x86 INT8 dot products that sum u8 x s8 products in int32 (AVX-512 VNNI, AVX-VNNI, AMX); without one the runtimes
# add pairs of products in int16 (VPMADDUBSW), which saturates with 8-bit weights (precision/qdq.py)
EXACT_INT8_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
X86_MACHINES = ("x86_64", "amd64", "i386", "i686", "x86")


def cpu_sums_int8_exactly() -> bool:
    """Whether this CPU's INT8 kernels sum u8 x s8 products without saturating, so a CPU INT8 graph may have 8-bit
    weights: an x86 CPU with VNNI or AMX, or another architecture (Arm's INT8 products are widened before they are
    summed). False on an x86 CPU where /proc/cpuinfo cannot tell (not Linux): 7-bit weights are right on any CPU."""
    if platform.machine().lower() not in X86_MACHINES:
        return True
    return any(f in EXACT_INT8_FLAGS for f in cpu_flags())


def cpu_has_bf16() -> bool | None:
    """Whether this CPU does BF16 arithmetic (x86: AVX512_BF16 or AMX-BF16; Arm: the bf16 feature); None when
    /proc/cpuinfo does not say (not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    have = {f for line in text.splitlines() if line.startswith(("flags", "Features"))
            for f in line.split(":", 1)[1].split()}
    return bool(have & {"avx512_bf16", "amx_bf16", "bf16"}) if have else None


def openvino_cpu(core: Any = None) -> dict[str, Any] | None:
    """OpenVINO's version and what its CPU plugin says the CPU can do ('FP32', 'BF16', 'INT8', ...); None when
    openvino cannot be imported or has no CPU device."""
    try:
        import openvino

        caps = (core or openvino.Core()).get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    except Exception:  # ImportError, or OpenVINO's RuntimeError for a missing CPU plugin
        return None
    return {"version": openvino.__version__, "cpu_capabilities": [str(c) for c in caps]}


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


def environment(threads: int) -> dict[str, Any]:
    """Where a benchmark ran, as its report records it."""
    import onnxruntime

    gpu, ov = cuda_gpu(), openvino_cpu()
    return {
        "cpu": cpu_model(), "cores": os.cpu_count(), "threads": threads, "platform": platform.platform(),
        "python": platform.python_version(), "cpu_flags": cpu_flags(),
        "versions": {**versions(with_tensorrt=True), "openvino": ov and ov["version"]},
        "openvino_cpu_capabilities": ov and ov["cpu_capabilities"],
        "onnxruntime_providers": onnxruntime.get_available_providers(),
        "gpu": None if gpu is None else {"name": gpu["name"],
                                         "capability": [int(v) for v in gpu["compute_capability"].split(".")],
                                         "cuda_runtime": gpu["cuda_runtime"], "driver": gpu["driver"]},
    }
