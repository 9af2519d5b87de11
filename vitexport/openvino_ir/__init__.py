"""OpenVINO IR made from the folder's ONNX: conversion, its check against FP32 and its record (`convert`); the
`ensure.MAKERS` step of the `openvino-*` kinds, and `vitexport openvino`'s check of an IR a user names.

Imports precision (for the INT8 source and its result type), backends, artifacts and below.
"""
