"""Where the TensorRT-shaped INT8 graph puts its Q/DQ: vitexport's placement (the default) or ModelOpt's.

- ``vitexport``: the inputs of the weight GEMMs (patch embedding included, the matrix-vector head not); the
  attention products stay FP16, fused by TensorRT as FP16 attention.
- ``modelopt``: what NVIDIA ModelOpt 0.47's INT8 ONNX PTQ writes for a ViT, read from its output on the digits model
  (scripts/modelopt_placement.py compares the two node by node): the same weight GEMMs, plus
    - both inputs of both attention products (Q and K^T, the Softmax output and V) at the sites TensorRT's INT8
      fused attention takes (tensorrt_engine/fusion.py: head size 16/32/64, at most 512 tokens),
    - the input of each LayerNormalization that reads a residual Add and feeds a quantized GEMM (the residual
      stream where it enters a block's norm; not the first block's norm1, which reads the position-embedding Add,
      nor the final norm, which feeds the float head),
    - the GEMM branch of each residual Add whose other input is itself a residual Add (not the first block's first
      residual Add).
  A residual Add here is an Add of two activations, one of them a weight GEMM's output or its bias Add's.

Which is faster on TensorRT is for the first GPU measurement to decide (docs/TENSORRT.md); the default stays
vitexport's, whose attention the CPU checks show unchanged.
"""

from __future__ import annotations

from dataclasses import replace

from ..tensorrt_engine.fusion import attention_sites, constant_names, why_not_fused
from .selection import GemmSelection, select_gemms, selection_from


def modelopt_selection(model, excluded: set[str]) -> GemmSelection:
    """ModelOpt's INT8 placement for an FP32 ModelProto (weights need not be loaded), with the input indices of the
    nodes that are not GEMMs (LayerNorm: its input; a residual Add: its GEMM branch)."""
    graph = model.graph
    base = select_gemms(graph, excluded, skip_matrix_vector=True)
    consts = constant_names(graph)
    producer = {o: n for n in graph.node for o in n.output}
    gemm_outputs = {n.output[0] for n in graph.node if n.name in base.nodes}

    def from_gemm(tensor: str) -> bool:
        """A weight GEMM's output, or the output of the Add that adds its bias."""
        p = producer.get(tensor)
        return tensor in gemm_outputs or (p is not None and p.op_type == "Add" and any(
            i in gemm_outputs for i in p.input) and any(i in consts for i in p.input))

    residual = {}  # residual Add -> (skip input index, branch input index)
    for n in graph.node:
        if n.op_type == "Add" and len(n.input) == 2 and not any(i in consts for i in n.input):
            branch = [k for k in (0, 1) if from_gemm(n.input[k])]
            if len(branch) == 1:
                residual[n.name] = (1 - branch[0], branch[0])
    residual_outputs = {o for n in graph.node if n.name in residual for o in n.output}

    readers: dict[str, list[str]] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n.name)

    def readers_quantized(tensor: str) -> bool:  # the final norm feeds the (float) head: ModelOpt leaves it
        return any(r in base.nodes for r in readers.get(tensor, []))

    picks: dict[str, tuple[int, ...]] = {name: (0, 1) for name in base.nodes}
    for site in attention_sites(model):
        if site.bmm1 not in excluded and site.bmm2 not in excluded and \
                why_not_fused(replace(site, dtype="int8")) is None:
            picks[site.bmm1] = picks[site.bmm2] = (0, 1)
    for n in graph.node:
        if n.name in excluded:
            continue
        if n.op_type == "LayerNormalization" and n.input[0] in residual_outputs and readers_quantized(n.output[0]):
            picks[n.name] = (0,)
        elif n.name in residual and n.input[residual[n.name][0]] in residual_outputs:
            picks[n.name] = (residual[n.name][1],)
    return selection_from(graph, picks)
