"""FP16 and INT8 prepared in the ONNX graph (TensorRT 11 takes precision from the graph's types and Q/DQ nodes).

- FP16: mixed precision with FP32 inputs/outputs; LayerNormalization and Softmax kept FP32 by default.
- INT8: explicit, symmetric Q/DQ (every zero point 0), per-channel weights, calibrated on real images,
  with a content-addressed calibration cache.

After each conversion the new model is run against the FP32 ONNX on held-out images (never the calibration
images) and judged with the per-precision thresholds of vitexport.parity.compare.

Modules: `settings` (what is asked: plain data), `convert` (the graph conversions), `prepare` (the step:
convert, check, record in the manifest). `vitexport.ensure.ensure_artifact` is the entry that runs the step
when a file is missing or stale.

Imports preflight, backends (ONNX Runtime's session), model, artifacts, data, parity and the base modules; never
another step.
"""

from .settings import CalibOptions, Int8Settings

__all__ = ["CalibOptions", "Int8Settings"]
