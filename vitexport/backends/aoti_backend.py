"""PyTorch's compiled CPU path: an AOTInductor package of the folder (`vitexport aoti`), loaded and run without
the model's Python code. Rows: 'pytorch cpu fp32 (aoti)', 'pytorch cpu bf16 (compiled)', 'pytorch cpu int8 (pt2e)'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..environment import cpu_has_bf16
from ..errors import BackendUnavailable, first_line
from .base import Runner

ROW_SUFFIX = {"fp32": "aoti", "bf16": "compiled", "int8": "pt2e"}


def _missing(module: str) -> bool:
    """Whether `module` cannot be imported, asked without importing it (torchao's import takes seconds and speaks)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # a None entry in sys.modules (tests), or a broken package
        return True


class AotiRunner(Runner):
    backend = "pytorch"
    provider = "aoti"

    def __init__(self, path: Path | str, precision: str, output_name: str | None = None) -> None:
        super().__init__()
        self.path, self.precision = Path(path), precision
        self.output_name = output_name  # the output asked for; a package answers with its export's judged one

    @property
    def name(self) -> str:
        return f"pytorch cpu {self.precision} ({ROW_SUFFIX[self.precision]})"

    def _load(self) -> None:
        import torch

        if not self.path.is_file():
            need = ""
            if self.precision == "int8" and _missing("torchao"):
                need = "; PT2E INT8 needs torchao: pip install 'vitexport[torch]'"
            raise BackendUnavailable(f"no package {self.path.name} (`vitexport aoti --precision {self.precision}`, "
                                     f"or `bench --aoti`, makes it{need})")
        record = self._record()
        if self.output_name is not None and record.get("output_name", self.output_name) != self.output_name:
            raise BackendUnavailable(f"the package answers with {record['output_name']}, not {self.output_name}")
        if record.get("float_parts") == "bf16" and cpu_has_bf16() is False:
            raise BackendUnavailable("this CPU has no BF16 arithmetic (AVX512_BF16 or AMX); the package's bf16 "
                                     "parts would be emulated, slower than FP32")
        try:
            self._run = torch._inductor.aoti_load_package(str(self.path))
        except Exception as e:  # noqa: BLE001 - a package of another torch, CPU or build: the row says why
            raise BackendUnavailable(f"PyTorch could not load {self.path.name}: {first_line(e)[:300]}") from None
        self.info = {"threads": torch.get_num_threads(), "torch": torch.__version__, "package": self.path.name}

    def _record(self) -> dict:
        """The package's record in its folder's manifest (vitexport.aoti.make) with the export's judged output, or
        {} where there is none to read."""
        from ..artifacts.folder import ModelFolder
        from ..errors import VitexportError

        try:
            manifest = ModelFolder(self.path.parent).read_manifest()
        except VitexportError:
            return {}
        rec = next((r for r in manifest.precisions.values() if r.file == self.path.name), None)
        return {"output_name": manifest.output_name, **((rec.extra.get("aoti") or {}) if rec is not None else {})}

    def _close(self) -> None:
        self._run = None

    def stage(self, x: np.ndarray) -> Any:
        import torch

        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))

    def run(self, staged: Any) -> Any:
        import torch

        with torch.inference_mode():
            return self._run(staged)

    def fetch(self, out: Any) -> np.ndarray:
        return out.float().numpy()
