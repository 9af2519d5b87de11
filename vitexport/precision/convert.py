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
    """'fp8' or 'int8' if the graph has Q/DQ nodes (by their zero points' type), 'fp16' if it computes in float16,
    else 'fp32'."""
    from .graphs import read_graph

    try:
        model = read_graph(path)
    except Exception:  # protobuf's DecodeError, onnx's parse errors, OSError
        raise VitexportError(f"{path} is not a readable ONNX model.") from None
    ops = {n.op_type for n in model.graph.node}
    if ops & set(QDQ_OPS):
        from ..tensorrt_engine.fusion import FP8_TYPES

        return "fp8" if any(i.data_type in FP8_TYPES for i in model.graph.initializer) else "int8"
    return "fp16" if computes_fp16(model) else "fp32"


def computes_fp16(model) -> bool:
    """Whether a graph holds FP16 weights or casts to FP16."""
    import onnx

    return any(init.data_type == onnx.TensorProto.FLOAT16 for init in model.graph.initializer) or \
        any(n.op_type == "Cast" and any(a.name == "to" and a.i == onnx.TensorProto.FLOAT16 for a in n.attribute)
            for n in model.graph.node)


def to_fp16(fp32_model, keep_fp32: tuple[str, ...] = DEFAULT_KEEP_FP32, types: list | None = None,
            keep_nodes: tuple[str, ...] = ()):
    """A ModelProto in mixed FP16 (converted in place and returned): FP32 inputs/outputs, `keep_fp32` op types and
    the nodes named in `keep_nodes` (ranges.fp32_nodes) computed in FP32 with Casts at their boundaries, the rest in
    FP16; sorted, deduplicated and re-inferred so onnx.checker accepts it.

    The converter needs every tensor's type. It infers them on the whole model, which protobuf cannot serialize past
    2 GB (and serializes 346 MB twice for a ViT-B/16); given the FP32 graph's types (`types`: `inferred_types` of
    the graph the model was read from, its weights left out), the converter is told not to infer again."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    if types is not None:
        del fp32_model.graph.value_info[:]
        fp32_model.graph.value_info.extend(types)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("onnxruntime.transformers.float16").setLevel(logging.ERROR)
        model = convert_float_to_float16(fp32_model, keep_io_types=True, op_block_list=list(keep_fp32),
                                         node_block_list=list(keep_nodes), disable_shape_infer=types is not None)
    dedupe_casts(model.graph)
    drop_round_trips(model.graph)
    topological_sort(model.graph)
    return with_inferred_types(model)  # types of converted tensors are stale; inferred again from the graph


LIGHT_BYTES = 4096  # tensors larger than this are left out of the copy shape inference reads (their dims kept)


def load_weights(path: Path, skip: frozenset[str] = frozenset(), fp16: bool = False,
                 float32: frozenset[str] = frozenset(), model=None):
    """The model at `path` read one weight at a time, from the file or its external data, into a model that holds
    them inline; with fp16, every float weight over LIGHT_BYTES already in FP16 with the converter's own rounding
    (`convert_np_to_float16`), so the FP32 weights are never all in memory. `skip`: weights about to be replaced
    (by their quantized form) and never read: they stay as FP16 (fp16) or FP32 tensors with dims and no data.
    `float32`: weights read as they are (FP32) even with fp16: those of nodes kept in FP32. `model`: the graph at
    `path` already read (without its external data), which is changed in place.

    Peak memory is the model written plus one weight, where onnx.load followed by a conversion holds the FP32
    weights, then their FP16 copies besides (a protobuf message keeps a replaced field's bytes until it is freed).
    """
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import uses_external_data
    from onnxruntime.transformers.float16 import convert_np_to_float16

    model = model if model is not None else onnx.load(str(path), load_external_data=False)
    base = str(Path(path).parent)
    for t in model.graph.initializer:
        external, is_float = uses_external_data(t), t.data_type == onnx.TensorProto.FLOAT
        to_fp16 = fp16 and is_float and t.name not in float32 and (external or len(t.raw_data) > LIGHT_BYTES)
        if not (external or to_fp16 or (is_float and t.name in skip)):
            continue  # inline already, and kept as it is
        array = None if t.name in skip else numpy_helper.to_array(t, base_dir=base)  # a copy: t keeps no bytes
        t.ClearField("raw_data")
        t.ClearField("external_data")
        t.data_location = onnx.TensorProto.DEFAULT
        if to_fp16 or (fp16 and is_float and t.name in skip):
            t.data_type = onnx.TensorProto.FLOAT16
        if array is not None:
            t.raw_data = (convert_np_to_float16(array) if to_fp16 else array).tobytes()
    return model


def inferred_types(model) -> list:
    """The value_info of `model` inferred afresh from a copy of its graph whose large tensors carry their dims but
    not their data: the same types and shapes, without protobuf serializing the weights for the inference (a copy
    each way, 1.5 s for a ViT-B/16, and a 2 GB cap). Small tensors (shapes, axes) keep their data, which shape
    inference reads. `model` is not changed."""
    import onnx

    def light(t):
        if len(t.raw_data) <= LIGHT_BYTES and not t.external_data:
            return t
        stub = onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims)
        stub.data_location = onnx.TensorProto.EXTERNAL  # no data: the checker in inference must not ask for it
        stub.external_data.add(key="location", value="unused")
        return stub

    graph = model.graph
    copy = onnx.helper.make_graph(graph.node, graph.name, graph.input, graph.output,
                                  [light(t) for t in graph.initializer])
    skeleton = onnx.helper.make_model(copy, opset_imports=model.opset_import, ir_version=model.ir_version)
    return list(onnx.shape_inference.infer_shapes(skeleton).graph.value_info)


def with_inferred_types(model):
    """The model with its value_info inferred afresh (in place, and returned): inferred_types."""
    typed = inferred_types(model)
    del model.graph.value_info[:]
    model.graph.value_info.extend(typed)
    return model


def convert_fp16(src: Path, dst: Path, keep_fp32: tuple[str, ...] = DEFAULT_KEEP_FP32,
                 keep_nodes: tuple[str, ...] = ()) -> None:
    """Mixed FP16 with FP32 inputs/outputs; ops in keep_fp32 and the nodes in keep_nodes stay FP32. The graph at src
    is read once (graphs.take_graph: the shared parse, inside sharing()) and converted in place."""
    from .graphs import read_graph, take_graph

    src = Path(src)
    graph = read_graph(src)
    types = inferred_types(graph)  # from the FP32 graph, before it is taken and converted
    # no op type kept in FP32 (the TensorRT-shaped graph): the weights become FP16 as they are read, but those of
    # the nodes kept in FP32
    float32 = fp32_weights(src, keep_nodes, graph.graph) if not keep_fp32 else frozenset()
    del graph
    model = load_weights(src, fp16=not keep_fp32, float32=float32, model=take_graph(src))
    save_checked(to_fp16(model, tuple(keep_fp32), types, tuple(keep_nodes)), dst, "FP16")


def fp32_weights(src: Path, keep_nodes: tuple[str, ...], graph=None) -> frozenset[str]:
    """The initializers the nodes `keep_nodes` read (of `graph` when given, the graph at src already read)."""
    if not keep_nodes:
        return frozenset()
    from .graphs import read_graph

    graph = graph if graph is not None else read_graph(src).graph
    inits, kept = {i.name for i in graph.initializer}, set(keep_nodes)
    return frozenset(t for n in graph.node if n.name in kept for t in n.input if t in inits)


def save_checked(model, dst: Path, what: str) -> None:
    """Save to dst (a temporary file: callers rename it into place), then onnx.checker's full check of that file; a
    graph the checker rejects is removed again, so it never takes the place of a good one. Checked by path, the
    checker reads the file once, where an in-memory check serializes the whole model twice more."""
    import onnx

    onnx.save_model(model, str(dst))
    try:
        onnx.checker.check_model(str(dst), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        Path(dst).unlink(missing_ok=True)
        raise VitexportError(f"The {what} graph failed onnx.checker: {str(e).strip().splitlines()[0]}") from None


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


def drop_round_trips(graph) -> None:
    """The converter casts every kept node's output to FP16 and back to FP32 for the next kept node: between two
    FP32 nodes the value would pass through FP16 (and overflow, the very thing they are kept for). Such a
    Cast(FP16) -> Cast(FP32) pair is removed and the FP32 readers read the FP32 tensor itself."""
    import onnx

    def to(node) -> int:
        return next((a.i for a in node.attribute if a.name == "to"), -1)

    producer = {o: n for n in graph.node for o in n.output}
    up = {n.output[0]: n.input[0] for n in graph.node
          if n.op_type == "Cast" and to(n) == onnx.TensorProto.FLOAT
          and (src := producer.get(n.input[0])) is not None and src.op_type == "Cast"
          and to(src) == onnx.TensorProto.FLOAT16 and src.input[0] in producer}  # FP32 tensor after the trip -> its
    # FP16 copy's own FP32 source
    if not up:
        return
    back = {c: producer[h].input[0] for c, h in up.items()}
    outputs = {o.name for o in graph.output}
    for node in graph.node:
        for k, t in enumerate(node.input):
            if t in back:
                node.input[k] = back[t]
    dead = {id(producer[c]) for c in back if c not in outputs}
    keep = [n for n in graph.node if id(n) not in dead]
    read = {t for n in keep for t in n.input} | outputs
    keep = [n for n in keep if not (n.op_type == "Cast" and to(n) == onnx.TensorProto.FLOAT16
                                    and n.output[0] not in read)]
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
