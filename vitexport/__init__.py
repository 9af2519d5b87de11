"""vitexport: Vision Transformers from checkpoint to ONNX, FP16/INT8 and TensorRT, with proof of parity.

From Python (docs/API.md): `vitexport.export(...)`, `vitexport.quantize(...)`; errors are `VitexportError` and its
subclasses. Importing the package loads no numeric library: each function imports what it needs when called.
"""

from typing import TYPE_CHECKING, Any

from .errors import BackendUnavailable, ParityError, VitexportError
from .version import __version__

_API = ("export", "quantize", "bench", "ExportResult", "QuantizeResult", "BenchResult", "BenchRow", "Parity")
__all__ = [*_API, "VitexportError", "ParityError", "BackendUnavailable", "__version__"]

if TYPE_CHECKING:
    from .api import BenchResult, BenchRow, ExportResult, Parity, QuantizeResult, bench, export, quantize


def __getattr__(name: str) -> Any:
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'vitexport' has no attribute {name!r}")
