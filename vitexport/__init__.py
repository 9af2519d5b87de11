"""vitexport: Vision Transformers from checkpoint to ONNX, FP16/INT8 and TensorRT, with proof of parity.

From Python (docs/API.md): `vitexport.export(...)`, `quantize`, `bench`, `openvino`, `trt`, `triton`, `predict`; errors are `VitexportError` and its
subclasses. Importing the package loads no numeric library: each function imports what it needs when called.
"""

from typing import TYPE_CHECKING, Any

from .errors import BackendUnavailable, ParityError, VitexportError
from .version import __version__

# a plain list: a type checker reads it as what the package exports (`mypy --strict` refuses a computed one)
__all__ = ["export", "quantize", "bench", "openvino", "trt", "triton", "predict", "ExportResult", "QuantizeResult",
           "BenchResult", "BenchRow", "OpenVinoResult", "TrtResult", "TritonResult", "Prediction", "Parity",
           "VitexportError", "ParityError", "BackendUnavailable", "__version__"]
_API = frozenset(__all__) - {"VitexportError", "ParityError", "BackendUnavailable", "__version__"}  # from .api

if TYPE_CHECKING:
    from .api import (BenchResult, BenchRow, ExportResult, OpenVinoResult, Parity, Prediction, QuantizeResult,
                      TritonResult, TrtResult, bench, export, openvino, predict, quantize, triton, trt)


def __getattr__(name: str) -> Any:
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'vitexport' has no attribute {name!r}")
