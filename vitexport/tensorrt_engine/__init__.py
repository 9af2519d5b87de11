"""TensorRT engines: build a plan from a precision-prepared ONNX, describe it in a sidecar, check it before use.

Only `trt_build` imports tensorrt, and only when a build is asked for. What can be decided without TensorRT is
plain functions: `options` (build options, profile shapes, version floor), `probe` (is TensorRT usable here),
`events` (the log, progress, Ctrl-C), `engine_info` (the inspector's JSON); `compiler.run_trt` ties them together
and writes the sidecar (read back by `artifacts.sidecar`). Which ONNX feeds which plan is
vitexport.artifacts.folder.PLAN_SOURCE.

Imports artifacts and the base modules; `backends.tensorrt` runs the plans it builds.
"""
