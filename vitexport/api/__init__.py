"""vitexport from Python: the steps the CLI runs, as functions returning results instead of printing them.

    import vitexport

    exported = vitexport.export("vit_base_patch16_224", img_size=384)
    int8 = vitexport.quantize(exported.folder, "int8")

Each function decides what the matching command decides, through the same code (`ensure.ensure_artifact`, the
spec and calibration options built by `model.spec.spec_for` and `precision.settings.calib_options`, which the CLI's
option groups call too). Bad input, a parity miss and a missing runtime raise `VitexportError` and its subclasses
(`ParityError`, `BackendUnavailable`), each carrying the one sentence the CLI prints; nothing here exits the
process. Progress is silent unless `progress` is given: it is called with each line the CLI would print on stderr
(warnings start with "warning: "). Nothing heavy (torch, onnxruntime) is imported until a function runs.
"""

from .build import export, quantize
from .results import (BenchResult, BenchRow, ExportResult, OpenVinoResult, Parity, Prediction, Progress,
                      QuantizeResult, TritonResult, TrtResult)
from .run import bench, openvino, predict, triton, trt

__all__ = ["export", "quantize", "bench", "openvino", "trt", "triton", "predict", "ExportResult", "QuantizeResult",
           "BenchResult", "BenchRow", "OpenVinoResult", "TrtResult", "TritonResult", "Prediction", "Parity",
           "Progress"]
