"""ONNX Runtime on the CPU, CUDA or TensorRT execution provider, for any of the FP32/FP16/INT8 ONNX files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..environment import cuda_gpu
from ..errors import BackendUnavailable, VitexportError
from .base import Runner

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}


class OrtRunner(Runner):
    backend = "onnxruntime"

    def __init__(self, path: Path, precision: str, ep: str = "cpu", threads: int | None = None,
                 input_name: str = "pixel_values", output_name: str = "logits"):
        super().__init__()
        self.path, self.precision, self.ep, self.threads = Path(path), precision, ep, threads
        self.device = "cpu" if ep == "cpu" else "cuda"
        self.provider = PROVIDERS[ep].replace("ExecutionProvider", "")
        self.input_name, self.output_name = input_name, output_name

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
        from .ort_session import create_session

        providers = [wanted] if self.ep == "cpu" else [wanted, "CPUExecutionProvider"]
        try:
            self.session = create_session(self.path, providers, self.threads)
        except VitexportError as e:
            raise BackendUnavailable(str(e)) from None
        active = self.session.get_providers()
        # onnxruntime-gpu silently falls back to the CPU when CUDA or TensorRT cannot start
        if active[0] != wanted:
            raise BackendUnavailable(f"{wanted} did not activate (session runs on {active[0]})")
        self.info = {"providers": active, "threads": self.threads or 0, "onnxruntime": ort.__version__,
                     "file": self.path.name}

    def _close(self) -> None:
        self.session = None

    def run(self, staged: Any) -> Any:
        return self.session.run([self.output_name], {self.input_name: staged})[0]


def _tensorrt_libraries() -> bool:
    import ctypes.util
    import importlib.util

    return importlib.util.find_spec("tensorrt_libs") is not None or importlib.util.find_spec("tensorrt") is not None \
        or ctypes.util.find_library("nvinfer") is not None
