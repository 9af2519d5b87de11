"""TensorRT engines: build a plan from a precision-prepared ONNX, describe it in a sidecar, check it before use.

Only `trt_build` imports tensorrt, and only when a build is asked for; everything that decides (options,
profile shapes, file names, sidecar contents, compatibility verdicts) lives in `options` as plain functions.
"""
