"""PyTorch eager: FP32, bf16 autocast on CPU, FP16 (and FP32) on CUDA."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..environment import cpu_has_bf16, cuda_gpu
from ..errors import BackendUnavailable
from .base import Runner


class TorchRunner(Runner):
    backend = "pytorch"

    def __init__(self, model, precision: str = "fp32", device: str = "cpu"):
        super().__init__()
        self.model, self.precision, self.device = model, precision, device
        self.provider = "eager" if precision in ("fp32", "fp16") else "autocast"

    def _load(self) -> None:
        import torch

        if self.model is None:
            raise BackendUnavailable("the PyTorch model could not be rebuilt from the manifest")
        if self.device == "cuda" and cuda_gpu() is None:
            raise BackendUnavailable("no CUDA GPU visible to PyTorch")
        if self.precision == "bf16" and self.device != "cpu":
            raise BackendUnavailable("bf16 autocast is measured on CPU only")
        if self.precision == "bf16" and cpu_has_bf16() is False:  # emulated: slower than FP32, says nothing
            raise BackendUnavailable("this CPU has no BF16 arithmetic (AVX512_BF16 or AMX); PyTorch would emulate "
                                     "it, slower than FP32")
        if self.precision == "fp16" and self.device != "cuda":
            raise BackendUnavailable("FP16 eager needs CUDA (CPU FP16 matmuls are emulated)")
        m = self.model.eval().to(self.device)
        m.set_fused_attn(True)
        self._model = m.half() if self.precision == "fp16" else m
        self.info = {"threads": torch.get_num_threads(), "torch": torch.__version__}
        if self.device == "cuda":
            self.info["gpu"] = torch.cuda.get_device_name()

    def _close(self) -> None:
        if self.device == "cuda" and getattr(self, "_model", None) is not None:
            self.model = self._model.float().cpu()
        self._model = None

    def stage(self, x: np.ndarray) -> Any:
        import torch

        t = torch.from_numpy(np.ascontiguousarray(x))
        if self.device == "cuda":
            t = t.to("cuda", non_blocking=False)
            torch.cuda.synchronize()
        return t.half() if self.precision == "fp16" else t

    def run(self, staged: Any) -> Any:
        import torch

        with torch.inference_mode():
            if self.precision == "bf16":
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out = self._model(staged)
            else:
                out = self._model(staged)
        if self.device == "cuda":
            torch.cuda.synchronize()
        return out

    def fetch(self, out: Any) -> np.ndarray:
        return out.float().cpu().numpy()

    def synchronize(self) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
