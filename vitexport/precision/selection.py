"""Which GEMMs of an FP32 graph a Q/DQ graph quantizes (`select_gemms`, `selection_from`), and the products it
never does: matrix-vector ones where asked (the head) and those by a signed permutation (RoPE's rotation)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..tensorrt_engine.fusion import LINEAR_OPS, constant_names


@dataclass
class GemmSelection:
    """Which nodes of the FP32 graph are quantized, and the tensors whose ranges calibration must measure."""

    nodes: list[str]  # node names, in graph order
    activations: list[str]  # activation inputs of those nodes (Q/DQ before the GEMM): what calibration measures
    inputs: dict[str, tuple[int, ...]] = field(default_factory=dict)  # node -> the inputs quantized (default 0, 1)

    def picked(self, node) -> range | tuple[int, ...]:
        """The input indices of `node` (a selected node) that get a Q/DQ pair."""
        return self.inputs.get(node.name, range(min(2, len(node.input))))


def selection_from(graph, picks: dict[str, tuple[int, ...]]) -> GemmSelection:
    """The selection of the nodes in `picks` (node -> the input indices to quantize), in graph order, with the
    activations among those inputs (what calibration measures)."""
    consts = constant_names(graph)
    nodes = [n for n in graph.node if n.name in picks]
    acts = [n.input[k] for n in nodes for k in picks[n.name] if k < len(n.input) and n.input[k] not in consts]
    inputs = {n.name: picks[n.name] for n in nodes if tuple(picks[n.name]) != tuple(range(min(2, len(n.input))))}
    return GemmSelection([n.name for n in nodes], list(dict.fromkeys(acts)), inputs)


def _rank(graph, name: str) -> int | None:
    for vi in list(graph.value_info) + list(graph.input) + list(graph.output):
        if vi.name == name and vi.type.tensor_type.HasField("shape"):
            return len(vi.type.tensor_type.shape.dim)
    return None


def is_matrix_vector(graph, node) -> bool:
    """A GEMM whose activation is (batch, K): one row per image, a matrix-vector product per image (the head).

    TensorRT gains nothing from INT8 there, and ModelOpt leaves such products in float.
    """
    return node.op_type == "Gemm" or (node.op_type == "MatMul" and _rank(graph, node.input[0]) == 2)


PERMUTATION_MAX = 1024  # the largest side of a constant checked for being a signed permutation (RoPE's: the head size)


def signed_permutations(graph) -> set[str]:
    """The square constants of a graph (inline, at most PERMUTATION_MAX a side) that are signed permutations, one
    +-1 in each row and column and zeros elsewhere: the RoPE rotation (x @ R) of graphs exported before it took the
    slice form, data movement, not a GEMM to quantize (exact in any float type; INT8 would only round its input)."""
    from onnx import numpy_helper

    found = set()
    for t in graph.initializer:
        if len(t.dims) != 2 or t.dims[0] != t.dims[1] or not 1 < t.dims[0] <= PERMUTATION_MAX or t.external_data:
            continue
        w = numpy_helper.to_array(t)
        nonzero = w != 0
        if np.all(np.abs(w[nonzero]) == 1) and np.all(nonzero.sum(0) == 1) and np.all(nonzero.sum(1) == 1):
            found.add(t.name)
    return found


def batched_constants(graph) -> set[str]:
    """Constants of rank 3 or more: read by a MatMul, not a layer's weight but a table of a batched product (SAM's
    decomposed relative position rows, (side, head_dim, side)), left in float like the rest of the attention's bias
    (a convolution's 4-D weight is a weight)."""
    found = {t.name for t in graph.initializer if len(t.dims) > 2}
    for node in graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value" and len(a.t.dims) > 2:
                    found.add(node.output[0])
    return found


def select_gemms(graph, excluded: set[str], quantize_attention: bool = False,
                 skip_matrix_vector: bool = False) -> GemmSelection:
    """The GEMMs to quantize: MatMul/Gemm/Conv with a constant weight, minus `excluded`, the products by a signed
    permutation (RoPE's rotation) and those by a batched table (`batched_constants`).

    quantize_attention adds the MatMuls of two activations (Q.K^T, A.V); skip_matrix_vector leaves (batch, K)
    products (the head) in float.
    """
    consts = constant_names(graph)
    rotations, tables = signed_permutations(graph), batched_constants(graph)
    nodes, acts = [], []
    for node in graph.node:
        if node.op_type not in LINEAR_OPS or node.name in excluded:
            continue
        weight_const = len(node.input) > 1 and node.input[1] in consts
        if weight_const and (node.input[1] in rotations or (node.op_type == "MatMul" and node.input[1] in tables)):
            continue
        if not weight_const and not (quantize_attention and node.op_type == "MatMul"):
            continue
        if weight_const and skip_matrix_vector and is_matrix_vector(graph, node):
            continue
        nodes.append(node.name)
        acts += [i for i in node.input[:2] if i and i not in consts]
    return GemmSelection(nodes, list(dict.fromkeys(acts)))
