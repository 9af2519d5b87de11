"""One runner per runtime behind `base.Runner` (load/close, inference in chunks an engine accepts, what the bench
times): PyTorch, ONNX Runtime (CPU/CUDA/TensorRT providers), OpenVINO, TensorRT plans.

Runners never import each other; a runtime is imported only by its runner. Imports tensorrt_engine (the plan's
options and inspector), artifacts and the base modules.
"""
