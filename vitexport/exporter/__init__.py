"""The export step: PyTorch model from a spec or a manifest (`torch_model`), PyTorch -> ONNX with a symbolic batch
(`to_onnx`), ONNX Runtime against PyTorch (`check`), and the step that ties them to the manifest (`run`).

Imports preflight, backends (ONNX Runtime's session), model, artifacts and below; never another step.
"""
