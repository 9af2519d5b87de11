"""PyTorch eager: FP32, bf16 autocast on CPU, FP16 (and FP32) on CUDA; and on CUDA `torch.compile` (Inductor) in FP16
and bf16, compiled when loaded so that the compile time is reported apart from latency (info['compile_s']). On a
CPU, PyTorch's compiled path is the AOTInductor package's row (backends.aoti_backend)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..environment import cpu_has_bf16, cuda_gpu
from ..errors import BackendUnavailable
from .base import Runner


class TorchRunner(Runner):
    backend = "pytorch"

    def __init__(self, model, precision: str = "fp32", device: str = "cpu", compiled: bool = False,
                 example: Callable[[], tuple[int, ...]] | None = None):
        super().__init__()
        self.model, self.precision, self.device, self.compiled = model, precision, device, compiled
        self.example = example  # () -> (3, H, W): the input a compiled row is compiled with when it loads
        self.provider = "compiled" if compiled else "eager" if precision in ("fp32", "fp16") else "autocast"

    @property
    def name(self) -> str:
        return super().name + (" (compiled)" if self.compiled else "")

    def _load(self) -> None:
        import torch

        if self.model is None:
            raise BackendUnavailable("the PyTorch model could not be rebuilt from the manifest")
        if self.device == "cuda" and cuda_gpu() is None:
            raise BackendUnavailable("no CUDA GPU visible to PyTorch")
        if self.compiled:
            return self._load_compiled()
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

    def _load_compiled(self) -> None:
        """The model in the row's precision (weights cast: FP16 or bf16), compiled by Inductor and run once on a batch
        of `example`, which is when the compiling happens; its seconds recorded apart."""
        import time

        import torch

        if self.device != "cuda" or self.precision not in ("fp16", "bf16") or self.example is None:
            raise BackendUnavailable("a compiled PyTorch row is FP16 or bf16 on CUDA (on a CPU: `vitexport aoti`)")
        m = self.model.eval().to("cuda")
        m.set_fused_attn(True)
        dtype = torch.float16 if self.precision == "fp16" else torch.bfloat16
        self._model = torch.compile(m.to(dtype))
        t0 = time.perf_counter()
        self.run(self.stage(np.zeros((1, *self.example()), np.float32)))
        self.info = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                     "compile_s": round(time.perf_counter() - t0, 1)}

    def _close(self) -> None:
        if self.compiled and getattr(self, "_model", None) is not None:
            self.model.float().cpu()  # cast in place; the compiled wrapper goes with _model
        elif self.device == "cuda" and getattr(self, "_model", None) is not None:
            self.model = self._model.float().cpu()
        self._model = None

    def stage(self, x: np.ndarray) -> Any:
        import torch

        t = torch.from_numpy(np.ascontiguousarray(x))
        if self.device == "cuda":
            t = t.to("cuda", non_blocking=False)
            torch.cuda.synchronize()
        if self.compiled and self.precision == "bf16":
            return t.bfloat16()
        return t.half() if self.precision == "fp16" else t

    def run(self, staged: Any) -> Any:
        import torch

        with torch.inference_mode():
            if self.precision == "bf16" and not self.compiled:
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
