"""FP8 (E4M3) for TensorRT on Hopper and Ada, placed as NVIDIA ModelOpt's ONNX PTQ places it.

What ModelOpt 0.47 writes for a ViT in its fp8 mode (`modelopt.onnx.quantization.quantize(..., quantize_mode="fp8")`,
read from its output on the digits model: scripts/modelopt_placement.py), and what this graph keeps of it:

- FP8 Q/DQ (zero points FLOAT8E4M3FN, FP16 scales) on the inputs of the weight MatMuls: activations per tensor
  (amax / 448), weights per output channel (amax / 448 each); the patch embedding's Conv and the matrix-vector
  head stay FP16, as ModelOpt leaves them;
- both attention products quantized, the Softmax output included, where the Q.K^T -> Softmax -> .V pattern
  matches with 8 < head size <= 256 (ModelOpt's rule), so TensorRT can pick its FP8 fused attention;
- GEMM outputs and the logits unquantized; every other op in FP16 (the graph model.fp16.trt.onnx holds);
- the Q/DQ pair right before the consumer, so no FP8 tensor flows through a Reshape or Squeeze: valid at opset 19
  (ModelOpt moves the key's Q above its Squeeze, which needs opset 21 and which ONNX Runtime rejects at 19).

Left out, with the reason in docs/TENSORRT.md: ModelOpt also quantizes the LayerNorm inputs and one input of the
residual Adds.

The FP8 ranges come from the same calibration collectors as INT8 (amax, percentile or entropy on |x|).
"""

from __future__ import annotations

from pathlib import Path

from ..tensorrt_engine.fusion import attention_sites
from .qdq import FP8, FP8_MAX, write_qdq
from .selection import GemmSelection, select_gemms, selection_from

FP8_HEAD_SIZES = (9, 256)  # ModelOpt quantizes the attention products when 8 < head size <= 256


def fp8_selection(model, excluded: set[str]) -> GemmSelection:
    """The FP8 nodes of an FP32 ModelProto (weights need not be loaded): the weight MatMuls but the head, and the
    attention products of the sites ModelOpt quantizes."""
    weights = select_gemms(model.graph, excluded, skip_matrix_vector=True)
    ops = {n.name: n for n in model.graph.node}
    nodes = [n for n in weights.nodes if ops[n].op_type == "MatMul"]
    lo, hi = FP8_HEAD_SIZES
    for site in attention_sites(model):
        if site.head_size is not None and lo <= site.head_size <= hi and not {site.bmm1, site.bmm2} & excluded:
            nodes += [site.bmm1, site.bmm2]
    return selection_from(model.graph, {n: (0, 1) for n in nodes})


def write_fp8(fp32_path: Path, dst: Path, selection: GemmSelection, amax: dict[str, float]):
    """model.onnx + calibrated ranges -> the FP8 ONNX at `dst` (checked by onnx.checker); returns the graph written.
    The weights are quantized first and the FP32 model let go before the FP16 copy is made."""
    return write_qdq(fp32_path, dst, selection, amax, "FP8", weight_max=FP8_MAX, fmt=FP8)
