"""vitexport: Vision Transformers from checkpoint to ONNX, FP16/INT8 and TensorRT, with proof of parity."""

__version__ = "0.1.0"
