"""TensorRT engines: build a plan from a precision-prepared ONNX, describe it in a sidecar, check it before use.

Only `trt_build` imports tensorrt, and only when a build is asked for. What can be decided without TensorRT is
plain functions: `options` (build options, profile shapes, version floor), `sidecar` (the plan's JSON and whether
it can run here), `probe` (is TensorRT usable here); `compiler.run_trt` ties them together. Which ONNX feeds which
plan is vitexport.folder.PLAN_SOURCE.
"""
