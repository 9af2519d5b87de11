"""The FP16 graphs (`write_fp16`): model.onnx in FP16 but the nodes its measured ranges keep in FP32
(ranges.measured_keep), the op types --keep-fp32 names (the CPU graph) and, with `--min-cos C` or `--max-drop
POINTS`, the FP16 regions that cost the most, returned to FP32 until the target holds, with the machinery INT8 uses
for its GEMM groups (sensitivity.measure, sensitivity.search).

A region is one transformer block's nodes, or the nodes before the blocks (the stem) or after them (the head). The
emulation graph is the FP32 model in which every float output of a region's nodes passes through
`Where(flags[g], Cast(Cast(x, FP16), FP32), x)`: with its flag on, the region's tensors are stored as FP16 (rounded,
and Inf where they leave FP16's range) as TensorRT stores them; one session then runs any subset of the regions in
FP16. Each region's cost is 1 - mean cosine to FP32 with it alone in FP16; the search returns the costliest to FP32,
fewest first, until the target holds. The FP16 graph is then written with those regions' nodes kept in FP32 and
checked as any FP16 graph is.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import VitexportError
from ..progress import QUIET, Log
from .groups import Group
from .ranges import NOT_COMPUTE, block_of
from .sensitivity import FLAGS, Simulator, Target, measure, search



def regions(graph) -> list[Group]:
    """The FP16 regions of a graph, in graph order: 'stem', one per block ('blocks.N'), 'head'."""
    members: dict[str, list[str]] = {}
    seen_block = False
    for node in graph.node:
        if node.op_type in NOT_COMPUTE:
            continue
        block = block_of(node.name)
        if block is not None:
            seen_block = True
            name = f"blocks.{block}"
        else:
            name = "head" if seen_block else "stem"
        members.setdefault(name, []).append(node.name)
    return [Group(name, int(name.split(".")[1]) if name.startswith("blocks.") else None,
                  "block" if name.startswith("blocks.") else name, tuple(nodes)) for name, nodes in members.items()]


def emulation_graph(fp32: Path, groups: list[Group]):
    """The FP32 model with each region's float outputs switched to their FP16-stored value by FLAGS."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from .convert import topological_sort, with_inferred_types

    model = with_inferred_types(onnx.load(str(fp32)))
    graph = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.output)}
    index = {n: i for i, g in enumerate(groups) for n in g.nodes}
    graph.input.append(helper.make_tensor_value_info(FLAGS, TensorProto.BOOL, [len(groups)]))
    added, inits, renamed = [], [], {}
    for g in sorted(set(index.values())):
        inits.append(numpy_helper.from_array(np.asarray(g, dtype=np.int64), f"{FLAGS}_{g}_index"))
        added.append(helper.make_node("Gather", [FLAGS, f"{FLAGS}_{g}_index"], [f"{FLAGS}_{g}"],
                                      name=f"{FLAGS}/gather_{g}", axis=0))
    weights = {i.name for i in graph.initializer if i.data_type == TensorProto.FLOAT}

    def switch(t: str, g: int, out: str) -> list:
        return [helper.make_node("Cast", [t], [f"{out}/h"], name=f"{out}/to16", to=TensorProto.FLOAT16),
                helper.make_node("Cast", [f"{out}/h"], [f"{out}/r"], name=f"{out}/to32", to=TensorProto.FLOAT),
                helper.make_node("Where", [f"{FLAGS}_{g}", f"{out}/r", t], [out], name=f"{out}/switch")]

    switched_weights: dict[tuple[str, int], str] = {}
    for node in list(graph.node):
        if node.name not in index:
            continue
        g = index[node.name]
        for k, t in enumerate(node.input):  # its weights, stored in FP16 when the region is
            if t in weights:
                if (t, g) not in switched_weights:
                    switched_weights[(t, g)] = f"{t}/sw{g}"
                    added += switch(t, g, f"{t}/sw{g}")
                node.input[k] = switched_weights[(t, g)]
        for t in node.output:
            if types.get(t) == TensorProto.FLOAT:
                added += switch(t, g, f"{t}/sw")
                renamed[t] = f"{t}/sw"
    for node in graph.node:  # the readers read the switched value (the graph's own outputs stay as they are)
        if node.name.endswith("/switch") or node.name.endswith("/to16"):
            continue
        for k, t in enumerate(node.input):
            if t in renamed:
                node.input[k] = renamed[t]
    graph.node.extend(added)
    graph.initializer.extend(inits)
    topological_sort(graph)
    return model


class FP16Simulator(Simulator):
    """Simulator's passes (run, close) over the FP16 emulation graph of the regions."""

    def __init__(self, store, fp32: Path, held, io: tuple[str, str], log: Log = QUIET) -> None:
        import onnx

        from ..backends.ort_session import create_session

        self.groups = regions(onnx.load(str(fp32), load_external_data=False).graph)
        if not self.groups:
            raise VitexportError("The graph has no compute node to keep in FP32.")
        self.held, self.io, self.store = held, io, store
        with log.step(f"Building the FP16 emulation graph ({len(self.groups)} regions)"):
            self.sess = create_session(emulation_graph(fp32, self.groups).SerializeToString(), optimize="basic",
                                       external_folder=Path(fp32).parent)


def fp16_fallback(fp32: Path, store, held, io: tuple[str, str], target: Target, log: Log = QUIET
                  ) -> tuple[list[Group], int, bool]:
    """(the regions, costliest first; how many of them the emulation keeps in FP32 for `target`; whether the
    held-out set decides the target's drop bound: Target.decidable)."""
    sim = FP16Simulator(store, fp32, held, io, log)
    try:
        n = len(sim.groups)
        everything, nothing = sim.run(set(range(n)), "all regions in FP16"), sim.run(set(), "no region in FP16")
        strict = target.decidable(nothing.stats)
        if target.holds(everything.stats, strict):
            log.info(f"Every region in FP16 meets {target.describe()} on the held-out set (emulated).")
            return list(sim.groups), 0, strict
        sens = measure(sim, "fp16", log, (everything, nothing))
        with log.step(f"Returning FP16 regions to FP32 until {target.describe()}"):
            k = len(search(sim, sens, target, log=log).floated)
        return [sim.groups[i] for i in sens.ranked()], k, strict
    finally:
        sim.close()


def write_fp16(kind: str, fp32: Path, fp32_sha: str, dst: Path, manifest, opts, held, cache_for, record,
               log: Log = QUIET):
    """model.onnx -> the FP16 graph of `kind` ('fp16': --keep-fp32's op types in FP32 too; 'fp16-trt': none) at
    dst, its record's keep_fp32 and fp32_nodes filled; returns the bounds its check uses (a target's, else None).
    With a target, the graph written is checked against it, and one more region goes to FP32 while it misses (the
    emulation stores tensors as FP16; the real kernels round their arithmetic too)."""
    import tempfile

    from .convert import convert_fp16
    from .ranges import measured_keep

    keep = tuple(opts.keep_fp32) if kind == "fp16" else ()  # the TensorRT graph keeps no op type
    kept = measured_keep(fp32, fp32_sha, manifest, opts, cache_for, log, tuple(opts.int8.exclude_nodes))
    what = "mixed FP16" if kind == "fp16" else "FP16 for TensorRT"
    if not opts.int8.target():
        with log.step(f"Converting to {what} (kept in FP32: {', '.join(keep) or 'no op type'}, {len(kept)} nodes)"):
            convert_fp16(fp32, dst, keep, tuple(k.node for k in kept))
        record.keep_fp32, record.fp32_nodes = list(keep), [k.to_dict() for k in kept]
        return None
    target = _target(opts, held)
    with tempfile.TemporaryDirectory(prefix="vitexport-fp16-") as scratch:
        from .check import check_against_fp32, fp32_reference

        with log.step(f"FP32 reference on {len(held):,} held-out inputs"):
            store = fp32_reference(fp32, held, manifest, Path(scratch), log)
        ordered, k, strict = fp16_fallback(fp32, store, held, (manifest.input_name, manifest.output_name), target,
                                           log)
        while True:
            extra = _region_nodes(fp32, ordered[:k], kept)
            with log.step(f"Converting to {what} ({len(kept) + len(extra)} nodes kept in FP32, {k} regions)"):
                convert_fp16(fp32, dst, keep, tuple(n.node for n in kept + extra))
            verdict = check_against_fp32(fp32, dst, held, "fp16", manifest, target.thresholds(), log, reference=store)
            if target.holds(verdict.stats, strict) or k == len(ordered):
                break
            log.warn(f"The written graph misses {target.describe()} where the emulation met it: one more region in "
                     f"FP32.")
            k += 1
    log.info(f"Kept in FP32 for {target.describe()} ({k} of {len(ordered)} regions): "
             f"{', '.join(g.name for g in ordered[:k]) or 'none'}")
    record.keep_fp32, record.fp32_nodes = list(keep), [n.to_dict() for n in kept + extra]
    return target.thresholds()


def _target(opts, held) -> Target:
    """The target of --min-cos / --max-drop; one sentence when the held-out data cannot judge it."""
    from ..parity.compare import DEFAULT_THRESHOLDS

    settings = opts.int8
    if held is None:
        raise VitexportError("--min-cos and --max-drop choose what stays in FP32 on held-out data: drop --no-check.")
    if settings.max_drop is not None and held.labels is None:
        raise VitexportError(f"--max-drop needs labelled held-out data; {held.source} has none: pass such a folder "
                             f"with --check-data, or use --min-cos.")
    return Target(settings.min_cos, settings.max_drop, opts.thresholds or DEFAULT_THRESHOLDS["fp16"],
                  settings.dense_target)


def _region_nodes(fp32: Path, regions_: list[Group], already: list) -> list:
    """The nodes of these regions not kept already, as ranges.Kept (no range behind them)."""
    import onnx

    from .ranges import Kept

    ops = {n.name: n.op_type for n in onnx.load(str(fp32), load_external_data=False).graph.node}
    have = {k.node for k in already}
    return [Kept(n, ops[n], "", 0.0) for g in regions_ for n in g.nodes if n not in have]
