"""FP16 that cannot overflow: measured ranges decide which nodes of an FP16 graph stay in FP32.

Large ViTs carry "massive activations": a few residual channels reach hundreds to tens of thousands, and the
residual sum can leave FP16's range (65,504) even when every weight fits. FP32 has no such limit, so a graph that is
fine in FP32 gives Inf in FP16. The rule, per node of the FP32 graph:

- measure every float tensor's largest |x| on the calibration images (`tensor_maxima`: each tensor reduced to one
  number inside the graph, Abs then ReduceMax, so one pass at about inference speed returns scalars, whatever the
  model's size);
- a node stays in FP32 when one of its float inputs or outputs reaches FP16_MAX / MARGIN (or a weight it reads is
  beyond FP16_MAX): its output cannot be FP16, or it reads a tensor that cannot. In a ViT these are the residual
  Adds, the LayerNorms that read the stream, the bias Adds (or GEMMs) that produce the outliers, and the final norm;
  the GEMMs and the attention that read normalised tensors stay FP16, so TensorRT still fuses them in FP16. The
  converter puts Casts at each boundary.

MARGIN is 16 (a limit of 4,094): calibration images are a sample, and a tensor within a factor of 16 of the limit
on them may reach it on another image; FP16's relative precision is the same at every magnitude, so a large value
costs nothing else. NVIDIA ModelOpt's AutoCast keeps nodes whose outputs exceed 512 (`data_max`), a margin of 128,
and initializers over 65,504 (`init_max`), which keeps far more nodes in FP32 in large ViTs (docs/PARITY.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from ..errors import VitexportError

FP16_MAX = 65504.0
MARGIN = 16.0
SAFE_MAX = FP16_MAX / MARGIN  # a tensor reaching this on the calibration images is kept out of FP16
_REDUCED = ("__vx_max", "__vx_min")  # suffixes of the two scalar outputs added per observed tensor
RANGES_FORMAT = "vitexport-ranges/1"  # the calibration cache's file of tensor maxima


def reduced_model(model, elem_types: tuple[int, ...] | None = None) -> tuple[bytes, dict, list[str]]:
    """A copy of `model` with two scalar outputs per float tensor (its largest and smallest value), serialized
    without its inline weights; those weights ({name: array}, for create_session's `weights`); and the tensors'
    names. The graph's own outputs stay first; weights in external data stay there (the session reads them from the
    model's folder). `model` is not changed. elem_types: the tensor types observed (default FP32; an FP16 graph's:
    FP16 and FP32)."""
    import onnx
    from onnx import helper

    from ..backends.ort_session import lifted
    from .convert import with_inferred_types

    model, weights = lifted(model)
    model = with_inferred_types(model)
    graph = model.graph
    wanted = elem_types or (onnx.TensorProto.FLOAT,)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in (*graph.value_info, *graph.input, *graph.output)}
    produced = [i.name for i in graph.input] + [o for n in graph.node for o in n.output if o]
    names = list(dict.fromkeys(t for t in produced if types.get(t) in wanted))
    wanted_names = set(names)
    reductions: dict[str, list] = {}
    for k, t in enumerate(names):
        # the largest and the smallest value (their magnitudes give the largest |x|): no tensor-sized temporary
        reductions[t] = [helper.make_node(op, [t], [f"{t}{sfx}"], name=f"vx_{op}_{k}", keepdims=0)
                         for op, sfx in zip(("ReduceMax", "ReduceMin"), _REDUCED)]
        graph.output.extend(helper.make_tensor_value_info(f"{t}{sfx}", types[t], []) for sfx in _REDUCED)
    # each reduction right after the node that makes its tensor: a session made with graph_order=True runs nodes in
    # this order, so a tensor is freed as soon as its readers and its reduction have run (appended at the end, or
    # run in ONNX Runtime's default order, every activation of the whole forward pass would be alive at once)
    ordered = [r for i in graph.input if i.name in wanted_names for r in reductions[i.name]]
    for node in graph.node:
        ordered.append(node)
        ordered += [r for o in node.output if o in wanted_names for r in reductions.pop(o, [])]
    del graph.node[:]
    graph.node.extend(ordered)
    return model.SerializeToString(), weights, names


def _reduced_session(model_path: Path, elem_types: tuple[int, ...] | None = None, threads: int | None = None,
                     optimize: str = "all"):
    """(a session on reduced_model of the graph at model_path, the tensors it reduces): the graph read once
    (graphs.read_graph: the run's shared parse, inside sharing()), its weights handed over as arrays."""
    from ..backends.ort_session import create_session
    from .graphs import read_graph

    data, weights, names = reduced_model(read_graph(Path(model_path)), elem_types)
    sess = create_session(data, threads=threads, external_folder=Path(model_path).parent, optimize=optimize,
                          weights=weights, graph_order=True)  # each reduction as soon as its tensor is made
    return sess, names


def tensor_maxima(model_path: Path, batches: Iterable[np.ndarray], input_name: str, threads: int | None = None,
                  tick: Callable[[int], None] | None = None) -> tuple[dict[str, float], int]:
    """({float tensor: largest |x| over the batches}, inputs seen), one ONNX Runtime pass; memory: one batch."""
    sess, names = _reduced_session(Path(model_path), threads=threads)
    top = np.zeros(len(names), np.float64)
    n = 0
    for x in batches:
        top = np.maximum(top, _abs_max(sess, names, input_name, x))
        n += len(x)
        if tick is not None:
            tick(len(x))
    if n == 0:
        raise VitexportError("No calibration inputs were given to measure the tensors' ranges.")
    return dict(zip(names, map(float, top))), n


def _abs_max(sess, names: list[str], input_name: str, x: np.ndarray) -> np.ndarray:
    """Each tensor's largest |x| over the images of `x` (inf where it is NaN or Inf), run one image at a time: a
    session that returns every tensor's reductions keeps more of them alive than a plain forward pass, so one
    image's activations is the memory it needs."""
    outputs = [f"{t}{sfx}" for t in names for sfx in _REDUCED]
    top = np.zeros(len(names), np.float64)
    for i in range(len(x)):
        got = np.asarray(sess.run(outputs, {input_name: np.ascontiguousarray(x[i:i + 1], dtype=np.float32)}),
                         dtype=np.float64).reshape(len(names), 2)
        mag = np.abs(got).max(axis=1)
        top = np.maximum(top, np.where(np.isfinite(got).all(axis=1), mag, np.inf))
    return top


@dataclass(frozen=True)
class Kept:
    """A node kept in FP32, and why: the tensor that reaches the limit, and how far it goes."""

    node: str
    op: str
    tensor: str
    max: float

    def to_dict(self) -> dict:
        return {"node": self.node, "op": self.op, "tensor": self.tensor, "max": self.max}


def weight_maxima(model_path: Path, model) -> dict[str, float]:
    """The largest |w| of each float initializer of `model`, the graph at model_path as read (weights in external
    data read one at a time from beside it)."""
    import onnx
    from onnx import numpy_helper

    base = str(Path(model_path).parent)
    return {t.name: float(np.abs(numpy_helper.to_array(t, base_dir=base)).max(initial=0.0))
            for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT}


def fp32_nodes(graph, maxima: dict[str, float], weights: dict[str, float] | None = None,
               limit: float | None = None) -> list[Kept]:
    """The nodes of `graph` (FP32) that stay in FP32: a float input or output reaches `limit` (SAFE_MAX), or a
    weight it reads is beyond FP16's range. In graph order."""
    weights, limit = weights or {}, SAFE_MAX if limit is None else limit
    kept = []
    for node in graph.node:
        worst = max(((maxima[t], t) for t in (*node.input, *node.output) if t in maxima), default=(0.0, ""))
        wmax = max(((weights[t], t) for t in node.input if t in weights), default=(0.0, ""))
        if worst[0] >= limit:
            kept.append(Kept(node.name, node.op_type, worst[1], worst[0]))
        elif wmax[0] > FP16_MAX:
            kept.append(Kept(node.name, node.op_type, wmax[1], wmax[0]))
    return kept


def summary(kept: list[Kept], compute_nodes: int) -> str:
    """One line: '12 of 310 nodes kept in FP32 (blocks 2-11, final norm): their tensors reach 2.4e5 on the
    calibration images, FP16's limit with a 16x margin is 4.1e3'."""
    if not kept:
        return f"No node kept in FP32: every tensor stays under {SAFE_MAX:.3g} on the calibration images."
    numbers = [block_of(k.node) for k in kept]
    blocks = sorted({b for b in numbers if b is not None})
    where = []
    if blocks:
        where.append(f"block{'s' if len(blocks) > 1 else ''} {_spans(blocks)}")
    if None in numbers:
        where.append("outside the blocks")
    top = max(k.max for k in kept)
    reach = "Inf" if not np.isfinite(top) else f"{top:.2g}"
    return (f"{len(kept)} of {compute_nodes} nodes kept in FP32 ({', '.join(where)}): their tensors reach {reach} on "
            f"the calibration images; FP16 holds {FP16_MAX:.0f}, kept under {SAFE_MAX:.0f} ({MARGIN:.0f}x margin).")


def block_of(node_name: str) -> int | None:
    """The transformer block a node of the exported graph belongs to (groups.group_of), None outside them."""
    from .groups import group_of, module_of

    return group_of(module_of(node_name))[0]


def _spans(ids: list[int]) -> str:
    """[2, 3, 4, 7] -> '2-4, 7'."""
    out, start = [], ids[0]
    for a, b in zip(ids, ids[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out)


def first_non_finite(model_path: Path, batches: Iterable[np.ndarray], input_name: str
                     ) -> tuple[str, str, str] | None:
    """(tensor, node, op) where NaN or Inf first appears in graph order in the first batch that has any, run
    through the graph at model_path (an FP16 or mixed graph); None when every tensor stays finite."""
    import onnx

    from .graphs import read_graph

    # every tensor is a graph output, so it is stored in its declared type (ONNX Runtime's CPU provider would
    # otherwise compute a chain of FP16 ops in FP32 and never overflow where TensorRT does); basic optimizations
    # run an FP8 graph as it is written (optimization_for)
    sess, names = _reduced_session(Path(model_path), (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16),
                                   optimize="basic")
    for x in batches:
        bad = {t for t, v in zip(names, _abs_max(sess, names, input_name, x)) if not np.isfinite(v)}
        if bad:
            break
    else:
        return None
    graph = read_graph(Path(model_path)).graph
    producer = {o: n for n in graph.node for o in n.output}
    for node in graph.node:
        for o in node.output:
            if o in bad:
                while node.op_type == "Cast" and node.input[0] in producer:  # the converter's: name the node it casts
                    node = producer[node.input[0]]
                return o, node.name, node.op_type
    return next(iter(bad)), "", ""


def measured_keep(fp32: Path, fp32_sha: str, manifest, opts, cache_for: Callable[[str], Path], log,
                  extra: tuple[str, ...] = ()) -> list[Kept]:
    """The nodes an FP16 graph of model.onnx keeps in FP32 (fp32_nodes), from the tensors' ranges on the calibration
    images (measured once, then read from the calibration cache), plus the nodes the user names (`extra`); the
    summary line is printed when any is kept."""
    from ..paths import default_calib_dir
    from .graphs import read_graph
    from .int8 import CALIB_BATCH, calibration_key, calibration_set

    root = Path(opts.data) if opts.data else default_calib_dir(manifest.variant)
    data = calibration_set(root, manifest.preprocess, opts.samples)
    cache = cache_for(calibration_key(fp32_sha, data, manifest.preprocess.to_dict(), {"ranges": RANGES_FORMAT}))
    maxima = _cached_maxima(cache)
    if maxima is None:
        with log.step(f"Measuring every tensor's range on {data.count} calibration inputs ({root})"):
            with log.bar("ranges", data.count) as tick:
                maxima, n = tensor_maxima(fp32, data.batches(manifest.preprocess, CALIB_BATCH), manifest.input_name,
                                          tick=tick)
        _write_maxima(cache, maxima, n)
    model = read_graph(fp32)
    graph = model.graph
    kept = fp32_nodes(graph, maxima, weight_maxima(fp32, model))
    names = {k.node for k in kept}
    ops = {n.name: n.op_type for n in graph.node}
    unknown = [e for e in extra if e not in ops]
    if unknown:
        raise VitexportError(f"--exclude-node: the graph has no node {unknown[0]!r}.")
    kept += [Kept(e, ops[e], "", 0.0) for e in extra if e not in names]  # the user's: no range behind them
    if kept:
        log.warn(summary(kept, sum(1 for n in graph.node if n.op_type not in NOT_COMPUTE)))
    tables = [k for k in position_table_nodes(graph) if k.node not in names]
    if tables:
        log.info(f"The RoPE table's {len(tables)} nodes stay in FP32: its angles grow with the grid, and FP16 "
                 f"resolves an angle of 64 only to 1/32.")
    return kept + tables


ROPE_MODULE = "rope"  # model.eva.Eva's RoPE layer: at a dynamic size its table is computed in the graph


def position_table_nodes(graph) -> list[Kept]:
    """The nodes of a dynamic-size graph's RoPE table (the `rope` module's, its casts and reshapes too, so the
    converter leaves the whole computation as it is): in FP32 in every FP16 graph, as timm computes it, whatever the
    range rule says (the table is small; its angles need the precision)."""
    from .groups import module_of

    return [Kept(n.name, n.op_type, "rope table", 0.0) for n in graph.node
            if module_of(n.name).split(".")[0] == ROPE_MODULE]


NOT_COMPUTE = frozenset({"Constant", "Shape", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Gather", "Slice",
                         "Concat", "Cast", "Identity", "Expand", "Flatten", "Split"})  # moves or casts, no arithmetic


def _cached_maxima(cache: Path) -> dict[str, float] | None:
    import json

    try:
        body = json.loads(cache.read_text()) if cache.is_file() else None
    except (OSError, ValueError):
        return None
    if not isinstance(body, dict) or body.get("format") != RANGES_FORMAT or not isinstance(body.get("max"), dict):
        return None
    got = body["max"]
    if not all(v is None or (isinstance(v, (int, float)) and v >= 0) for v in got.values()):
        return None
    return {t: float("inf") if v is None else float(v) for t, v in got.items()}


def _write_maxima(cache: Path, maxima: dict[str, float], samples: int) -> None:
    import json

    from ..paths import write_text_atomic

    body = {"format": RANGES_FORMAT, "samples": samples,
            "max": {t: (v if np.isfinite(v) else None) for t, v in maxima.items()}}  # JSON has no Infinity: null
    write_text_atomic(cache, json.dumps(body, sort_keys=True) + "\n")


def stores_fp16(graph_path: Path) -> bool:
    """Whether a graph holds FP16 weights or casts to FP16, any Q/DQ included."""
    import onnx

    from .convert import computes_fp16

    return computes_fp16(onnx.load(str(graph_path), load_external_data=False))


def overflow_hint(graph_path: Path, held, input_name: str) -> str:
    """For a failed check whose output has NaN/Inf: where it first appears (on the held-out inputs) and what
    helps; '' when it cannot be found."""
    try:
        hit = first_non_finite(graph_path, (x for _, x in held.inputs.batches(8)), input_name)
    except Exception:  # noqa: BLE001 -- a diagnosis must not hide the failure it explains
        return ""
    if hit is None:
        return ""
    tensor, node, op = hit
    at = f"{tensor} (output of {op} node {node})" if node else tensor
    return (f" NaN/Inf first appears at {at}. Its range on these inputs leaves FP16's: keep it in FP32 with "
            f"--exclude-node {node or tensor}, or calibrate on images like these (--calib-data) so that the "
            f"measured ranges keep it in FP32.")
