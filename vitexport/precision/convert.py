"""FP32 -> mixed FP16 in the ONNX graph, and the graph hygiene every written graph gets (valid for onnx.checker).

ONNX Runtime's converter leaves three things onnx.checker rejects or that break other consumers: the input Casts
appended at the end of the node list (not topologically sorted), one duplicate Cast per consumer of a shared
initializer, and value_info entries still typed FP32 for tensors that became FP16. All three are repaired here.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

from ..errors import VitexportError
from .settings import DEFAULT_KEEP_FP32

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def graph_precision(path: Path) -> str:
    """'int8' if the graph has Q/DQ nodes, 'fp16' if it computes in float16, else 'fp32'."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # protobuf's DecodeError, onnx's parse errors, OSError
        raise VitexportError(f"{path} is not a readable ONNX model.") from None
    ops = {n.op_type for n in model.graph.node}
    if ops & set(QDQ_OPS):
        return "int8"
    if any(init.data_type == onnx.TensorProto.FLOAT16 for init in model.graph.initializer) or \
            any(n.op_type == "Cast" and any(a.name == "to" and a.i == onnx.TensorProto.FLOAT16 for a in n.attribute)
                for n in model.graph.node):
        return "fp16"
    return "fp32"


def to_fp16(fp32_model, keep_fp32: tuple[str, ...] = DEFAULT_KEEP_FP32):
    """A ModelProto in mixed FP16 (converted in place and returned): FP32 inputs/outputs, `keep_fp32` op types
    computed in FP32, the rest in FP16; sorted, deduplicated and re-inferred so onnx.checker accepts it."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("onnxruntime.transformers.float16").setLevel(logging.ERROR)
        model = convert_float_to_float16(fp32_model, keep_io_types=True, op_block_list=list(keep_fp32),
                                         disable_shape_infer=False)
    dedupe_casts(model.graph)
    topological_sort(model.graph)
    del model.graph.value_info[:]  # types of converted tensors are stale; inferred again from the graph
    return onnx.shape_inference.infer_shapes(model)


def convert_fp16(src: Path, dst: Path, keep_fp32: tuple[str, ...] = DEFAULT_KEEP_FP32) -> None:
    """Mixed FP16 with FP32 inputs/outputs; ops in keep_fp32 stay FP32 (LayerNorm overflows in FP16)."""
    import onnx

    save_checked(to_fp16(onnx.load(str(src)), tuple(keep_fp32)), dst, "FP16")


def save_checked(model, dst: Path, what: str) -> None:
    """onnx.checker (full check) first, then save: a graph the checker rejects is never written."""
    import onnx

    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise VitexportError(f"The {what} graph failed onnx.checker: {str(e).strip().splitlines()[0]}") from None
    onnx.save_model(model, str(dst))


def dedupe_casts(graph) -> None:
    """The converter inserts one Cast per consumer of a shared initializer, all with the same name and output
    (the exporter shares identical initializers, e.g. LayerNorm weights before training). Keep the first."""
    seen: set[tuple] = set()
    keep = []
    for node in graph.node:
        key = (node.name, node.op_type, tuple(node.input), tuple(node.output))
        if node.op_type == "Cast" and key in seen:
            continue
        seen.add(key)
        keep.append(node)
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)


def topological_sort(graph) -> None:
    """Order nodes so each comes after the producers of its inputs (onnx.checker requires it)."""
    available = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        rest = []
        for node in pending:
            if all(i in available for i in node.input):
                ordered.append(node)
                available.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):
            missing = sorted({i for n in rest for i in n.input if i not in available})[:3]
            raise VitexportError(f"The graph has a cycle or inputs no node makes ({', '.join(missing)}).")
        pending = rest
    if [id(n) for n in ordered] != [id(n) for n in graph.node]:
        copies = [type(n)() for n in ordered]
        for c, n in zip(copies, ordered):
            c.CopyFrom(n)
        del graph.node[:]
        graph.node.extend(copies)
