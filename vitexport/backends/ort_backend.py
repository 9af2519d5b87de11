"""ONNX Runtime on the CPU, CUDA or TensorRT execution provider, for any of the FP32/FP16/INT8 ONNX files.

On the CUDA and TensorRT providers the runner uses IOBinding (onnxruntime.ai, "I/O Binding"): stage() copies the
input to the device once, run() binds it and an output on the device, so the timed run is the model alone, as for
the TensorRT runner, instead of a host->device copy, the model and a device->host copy. fetch() brings the output
back. The CPU provider runs as before: numpy in, numpy out.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from ..environment import cuda_gpu
from ..errors import BackendUnavailable, VitexportError
from .base import Runner

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}


class OrtRunner(Runner):
    backend = "onnxruntime"

    def __init__(self, path: Path, precision: str, ep: str = "cpu", threads: int | None = None,
                 input_name: str = "pixel_values", output_name: str = "logits", kind: str | None = None):
        super().__init__()
        self.path, self.precision, self.ep, self.threads = Path(path), precision, ep, threads
        self.kind = kind or precision  # the folder's artifact kind ('int8-trt'): names the row
        # the TensorRT-shaped INT8 and FP8 graphs compute in FP16 between their GEMMs (FP8 itself is fake
        # quantization there): on the CPU provider that is emulated, so their rows give accuracy, not speed
        self.timed = not (ep == "cpu" and self.kind in ("int8-trt", "fp8"))
        self.device = "cpu" if ep == "cpu" else "cuda"
        self.provider = PROVIDERS[ep].replace("ExecutionProvider", "")
        self.input_name, self.output_name = input_name, output_name
        self._io_device: str | None = None if ep == "cpu" else "cuda"  # where IOBinding keeps inputs and outputs

    @property
    def name(self) -> str:
        return f"{self.backend} {self.where} {self.kind}"

    @property
    def where(self) -> str:
        return {"cpu": "cpu", "cuda": "cuda", "tensorrt": "trt-ep"}[self.ep]

    def _load(self) -> None:
        try:
            import onnxruntime as ort
        except ImportError as e:
            raise BackendUnavailable(f"onnxruntime is not importable ({e})") from None
        if not self.path.is_file():
            raise BackendUnavailable(f"{self.path.name} does not exist")
        wanted = PROVIDERS[self.ep]
        if wanted not in ort.get_available_providers():
            raise BackendUnavailable(f"{wanted} is not in this onnxruntime build")
        if self.ep != "cpu":
            # ask before trying: onnxruntime prints a page of "EP Error" and falls back when it cannot start
            if cuda_gpu() is None:
                raise BackendUnavailable(f"no CUDA GPU visible, so {wanted} cannot start")
            if self.ep == "tensorrt" and not _tensorrt_libraries():
                raise BackendUnavailable("the TensorRT libraries (libnvinfer) are not installed")
            if self.ep == "tensorrt":
                from ..environment import tensorrt_version

                why = trt_provider_mismatch(provider_nvinfer_major(), tensorrt_version(), ort.__version__)
                if why:
                    raise BackendUnavailable(why)
        from .ort_session import create_session, optimization_for

        providers = [wanted] if self.ep == "cpu" else [wanted, "CPUExecutionProvider"]
        try:
            self.session = create_session(self.path, providers, self.threads,
                                          optimize=optimization_for(self.precision))
        except VitexportError as e:
            raise BackendUnavailable(str(e)) from None
        active = self.session.get_providers()
        # onnxruntime-gpu silently falls back to the CPU when CUDA or TensorRT cannot start
        if active[0] != wanted:
            raise BackendUnavailable(f"{wanted} did not activate (session runs on {active[0]})")
        self.info = {"providers": active, "threads": self.threads or 0, "onnxruntime": ort.__version__,
                     "file": self.path.name, "io_binding": self._io_device or "none"}

    def _close(self) -> None:
        self.session = None

    def stage(self, x: np.ndarray) -> Any:
        """CPU provider: the array itself. CUDA/TensorRT providers: an OrtValue on the device, copied once."""
        if self._io_device is None:
            return x
        import onnxruntime as ort

        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(x, dtype=np.float32), self._io_device, 0)

    def run(self, staged: Any) -> Any:
        """CPU provider: the output array. Otherwise the IOBinding, whose output stays on the device until fetch()."""
        if self._io_device is None:
            return self.session.run([self.output_name], {self.input_name: staged})[0]
        binding = self.session.io_binding()
        binding.bind_ortvalue_input(self.input_name, staged)
        binding.bind_output(self.output_name, self._io_device, 0)
        self.session.run_with_iobinding(binding)
        binding.synchronize_outputs()  # complete when run() returns, like every runner's run()
        return binding

    def fetch(self, out: Any) -> np.ndarray:
        if self._io_device is None:
            return np.asarray(out, dtype=np.float32)
        return np.asarray(out.copy_outputs_to_cpu()[0], dtype=np.float32)


def _tensorrt_libraries() -> bool:
    import ctypes.util
    import importlib.util

    return importlib.util.find_spec("tensorrt_libs") is not None or importlib.util.find_spec("tensorrt") is not None \
        or ctypes.util.find_library("nvinfer") is not None


_NVINFER_SONAME = re.compile(rb"libnvinfer\.so\.(\d+)")


def provider_nvinfer_major(lib: Path | None = None) -> int | None:
    """The TensorRT major version onnxruntime's TensorRT provider library links against (the `libnvinfer.so.N` it
    names), or None when the library is absent or names none. Read from its bytes: nothing is loaded."""
    import mmap

    if lib is None:
        import onnxruntime

        lib = Path(onnxruntime.__file__).parent / "capi" / "libonnxruntime_providers_tensorrt.so"
    try:
        with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            found = _NVINFER_SONAME.search(m)  # type: ignore[call-overload]  # mmap is a bytes-like buffer
            return int(found.group(1)) if found else None
    except (OSError, ValueError):
        return None


def trt_provider_mismatch(needed_major: int | None, installed: str | None, ort_version: str) -> str | None:
    """Why onnxruntime's TensorRT provider cannot run with the installed TensorRT (built against TensorRT 10, it
    cannot load TensorRT 11's libnvinfer.so.11), or None when the majors agree or either is unknown."""
    if needed_major is None or not installed or not installed.split(".")[0].isdigit():
        return None
    have = int(installed.split(".")[0])
    if have == needed_major:
        return None
    return (f"onnxruntime {ort_version}'s TensorRT provider is built against TensorRT {needed_major} "
            f"(libnvinfer.so.{needed_major}); this machine has TensorRT {installed}, so its rows are skipped "
            f"(vitexport's own TensorRT rows run it)")
