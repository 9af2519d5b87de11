"""What each GEMM group costs in accuracy when quantized, and the fewest groups to return to float for a target.

One graph measures every group: the Q/DQ graph of the kind (its weights' range and element type, its FP16 or FP32
remainder) in which every quantized input of a group passes through `Where(flags[g], DQ(Q(x)), x)`, the flags a
graph input. One ONNX Runtime session then runs any subset of the groups quantized, the others in float, with no
graph written per group. The FP32 model runs first over the held-out set, its outputs kept on disk, as the
reference of every pass (and of the checks of what the fallback writes).

Each group's cost is measured with it alone quantized, every other group in float: the figure is that group's own
error, not mixed with the others', comparable across groups, and (for small errors) the costs of several groups
roughly add, which is what the fallback's ordering assumes. Quantizing everything but one group instead would give
each group's share of an error dominated by the others, within the noise of the held-out set for all but the worst.
The cost is 1 - mean cosine to FP32 (the mean: a property of the set, where the minimum is of one image); top-1
agreement and accuracy (when labelled) are measured with it.

The fallback then returns the most costly groups to float, fewest first, until the target holds on the held-out
set with the same switched graph, and the kind's real graph is written and checked (precision/prepare.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from ..backends.base import infer_in_chunks
from ..backends.ort_session import create_session
from ..data.stream import OutputStore
from ..errors import VitexportError
from ..parity.compare import ParityStats, Thresholds
from ..progress import QUIET, Log
from ..validate.evaluate import ValidationSet, evaluate
from .groups import Group, gemm_groups
from .int8 import kind_format
from .qdq import QDQWriter, insert_qdq_from, qdq_sources
from .selection import GemmSelection

FLAGS = "vitexport_quantized_groups"  # the switched graph's second input: bool[groups], True = quantized
SERIALIZED_MAX = 1_800_000_000  # a switched graph over this many bytes is saved with external data, not in memory


class SwitchedWriter(QDQWriter):
    """A QDQWriter whose every quantized input is switched by its group's flag."""

    def __init__(self, *args, group_index: dict[str, int]) -> None:
        super().__init__(*args)
        self.group_index = group_index
        self.conds: dict[int, str] = {}

    def quantize_input(self, node, k: int, t32: str) -> None:
        from onnx import helper, numpy_helper

        before = node.input[k]
        super().quantize_input(node, k, t32)
        if node.input[k] == before:
            return
        g = self.group_index[node.name]
        if g not in self.conds:
            self.inits.append(numpy_helper.from_array(np.asarray(g, dtype=np.int64), f"{FLAGS}_{g}_index"))
            self.nodes.append(helper.make_node("Gather", [FLAGS, f"{FLAGS}_{g}_index"], [f"{FLAGS}_{g}"],
                                               name=f"{FLAGS}/Gather_{g}", axis=0))
            self.conds[g] = f"{FLAGS}_{g}"
        out = f"{node.name}/input{k}_switched"
        self.nodes.append(helper.make_node("Where", [self.conds[g], node.input[k], before], [out],
                                           name=f"{node.name}/Switch_{k}"))
        node.input[k] = out


def switched_graph(source: Path, selection: GemmSelection, amax: dict[str, float], kind: str, groups: list[Group],
                   weight_bits: int | None = None):
    """The kind's Q/DQ graph of `source` (an FP32 ONNX) with each group switched by FLAGS (module docstring); the
    CPU graph's weights of `weight_bits` (int8.cpu_weight_max)."""
    import onnx

    f = kind_format(kind, weight_bits)
    scale_dtype = np.float16 if f.fp16 else np.float32
    # the float weights too: a group in float reads them
    gemms, model = qdq_sources(source, selection, f.fp16, scale_dtype, f.weight_max, f.fmt, keep_float=True)
    model.graph.input.append(onnx.helper.make_tensor_value_info(FLAGS, onnx.TensorProto.BOOL, [len(groups)]))
    index = {n: i for i, g in enumerate(groups) for n in g.nodes}
    return insert_qdq_from(gemms, model, selection, amax, scale_dtype,
                           writer=partial(SwitchedWriter, group_index=index))


@dataclass
class Pass:
    """One run over the held-out set with some groups quantized."""

    quantized: str  # what was quantized, in words
    stats: ParityStats

    @property
    def cost(self) -> float:
        """1 - mean cosine to FP32; a dense output's by its task: a depth's AbsRel, 1 - a segmentation's pixel
        agreement."""
        s = self.stats
        if s.dense == "depth" and s.absrel is not None:
            return s.absrel
        if s.dense == "segmentation" and s.pixel_agree is not None:
            return 1.0 - s.pixel_agree
        return 1.0 - s.cos_mean


class Simulator:
    """The switched graph in one session, judged against the FP32 reference's outputs on the held-out set (`store`:
    the caller's, who removes it)."""

    def __init__(self, store: OutputStore, source: Path, selection: GemmSelection, amax: dict[str, float], kind: str,
                 held: ValidationSet, io: tuple[str, str], scratch: Path, log: Log = QUIET,
                 weight_bits: int | None = None) -> None:
        self.groups = gemm_groups(selection)
        if not self.groups:
            raise VitexportError("No GEMM is quantized: there is nothing to measure or return to float.")
        self.held, self.io, self.store = held, io, store
        with log.step(f"Building the switched {kind} graph ({len(self.groups)} groups)"):
            model = switched_graph(source, selection, amax, kind, self.groups, weight_bits)
            if model.ByteSize() <= SERIALIZED_MAX:
                graph: bytes | Path = model.SerializeToString()
            else:  # over protobuf's cap: saved beside its own external data in the scratch folder
                import onnx

                graph = Path(scratch) / "switched.onnx"
                onnx.save_model(model, str(graph), save_as_external_data=True, location="switched.onnx.data")
            del model  # the session's copy is the only one kept
            self.sess = create_session(graph, optimize="basic")
            del graph

    def run(self, quantized: set[int], what: str) -> Pass:
        """The held-out set with the groups of these indices quantized, the others in float."""
        flags = np.zeros(len(self.groups), dtype=bool)
        flags[list(quantized)] = True
        inp, out = self.io

        def infer(x: np.ndarray) -> np.ndarray:
            return infer_in_chunks(lambda b: self.sess.run([out], {inp: b, FLAGS: flags})[0], x)

        ev = evaluate(infer, self.held.inputs, self.held.truth, reference=self.store, label=what)
        return Pass(what, ev.stats)

    def close(self) -> None:
        self.sess = None


@dataclass
class Sensitivity:
    """Every group's pass, with the passes of all groups quantized and of none (the kind's float remainder)."""

    kind: str
    groups: list[Group]
    passes: list[Pass]  # one per group, in the order of `groups`
    all_quantized: Pass
    none_quantized: Pass  # FP32 for the CPU graph; FP16 for the kinds shaped for TensorRT
    images: int
    labelled: bool
    data: str

    def ranked(self) -> list[int]:
        """Group indices, most costly first (ties: lower top-1 agreement first, then graph order)."""
        return sorted(range(len(self.groups)),
                      key=lambda i: (-self.passes[i].cost, self.passes[i].stats.top1_agree, i))


def measure(sim: Simulator, kind: str, log: Log = QUIET, baseline: tuple[Pass, Pass] | None = None) -> Sensitivity:
    """One pass with everything quantized, one with nothing (or those two as given), then one per group alone."""
    n = len(sim.groups)
    with log.step(f"Measuring {n} groups, one at a time, on {len(sim.held):,} held-out inputs"):
        with log.bar("groups", n + (0 if baseline else 2), unit="passes") as tick:
            if baseline is None:
                everything = sim.run(set(range(n)), "all groups")
                tick(1)
                nothing = sim.run(set(), "no group")
                tick(1)
            else:
                everything, nothing = baseline
            passes = []
            for i, g in enumerate(sim.groups):
                passes.append(sim.run({i}, g.name))
                tick(1)
    return Sensitivity(kind, sim.groups, passes, everything, nothing, len(sim.held), sim.held.labels is not None,
                       sim.held.source)


@dataclass
class Target:
    """What the fallback must reach on the held-out set: a minimum cosine, or a most accuracy drop (points), with
    the kind's other bounds (`base`: the file written is checked against them too, so the search keeps to them)."""

    min_cos: float | None = None
    max_drop: float | None = None
    base: Thresholds = field(default_factory=Thresholds)
    dense: float | None = None  # a dense model's task figure: a depth's most AbsRel, a segmentation's least pixel agreement

    def __bool__(self) -> bool:
        return self.min_cos is not None or self.max_drop is not None or self.dense is not None

    def to_dict(self) -> dict:
        return {k: v for k, v in (("min_cos", self.min_cos), ("max_drop", self.max_drop),
                                  ("dense_target", self.dense)) if v is not None}

    def describe(self) -> str:
        return " and ".join(([f"min cosine >= {self.min_cos:g}"] if self.min_cos is not None else [])
                            + ([f"top-1 drop <= {self.max_drop:g} points"] if self.max_drop is not None else [])
                            + ([f"the dense target {self.dense:g}"] if self.dense is not None else []))

    def met(self, s: ParityStats) -> bool:
        """Whether a pass reaches the target and fails none of the kind's bounds. The drop is judged by its estimate
        on these images; whether its 95 % interval is within the bound as well is `decided`."""
        if self.thresholds().assess(s)[0]:
            return False
        if self.min_cos is not None and not s.cos_min >= self.min_cos:
            return False
        if self.max_drop is not None:
            if s.acc is None or s.acc_ref is None:
                raise VitexportError("--max-drop needs labelled held-out data (class folders named as the model's "
                                     "classes); pass it with --check-data, or use --min-cos.")
            drop = s.acc_drop if s.acc_drop is not None else (s.acc_ref - s.acc) * 100
            if drop > self.max_drop:
                return False
        if self.dense is not None:
            if s.dense is None:
                raise VitexportError("--dense-target is for a depth or segmentation model; use --min-cos.")
            if (s.absrel > self.dense) if s.dense == "depth" else (s.pixel_agree < self.dense):  # type: ignore
                return False
        return True

    def decided(self, s: ParityStats) -> bool:
        return self.max_drop is None or not Thresholds(acc_drop=self.max_drop).assess(s)[1]

    def decidable(self, floor: ParityStats) -> bool:
        """Whether the held-out set can decide the target at all: a drop bound's interval is within it with every
        group in float (`floor`: the fewest flips there are). If not, the drop's estimate decides, and the result
        says it is inconclusive."""
        return self.decided(floor)

    def holds(self, s: ParityStats, strict: bool) -> bool:
        """met, and decided too when `strict` (the set is decidable)."""
        return self.met(s) and (not strict or self.decided(s))

    def thresholds(self) -> Thresholds:
        """The kind's bounds with the target's in place of theirs (a user's --max-drop 3 is 3, not the kind's 1.5):
        the check of the file written."""
        from dataclasses import replace

        t = self.base
        if self.min_cos is not None:
            t = replace(t, cos_min=self.min_cos)
        if self.max_drop is not None:
            t = replace(t, acc_drop=self.max_drop)
        if self.dense is not None:  # each kind reads its own figure's bound
            t = replace(t, absrel=self.dense, pixel_agree=self.dense)
        return t


@dataclass
class Fallback:
    """The groups returned to float for a target, and the pass that showed it met."""

    target: Target
    floated: list[Group]
    result: Pass


def search(sim: Simulator, sens: Sensitivity, target: Target, log: Log = QUIET) -> Fallback:
    """The fewest of the most costly groups (sens.ranked) whose return to float meets the target on the held-out
    set, its drop's interval within the bound too where the set can decide it (Target.decidable); one sentence when
    no number of them does."""
    order = sens.ranked()
    strict = target.decidable(sens.none_quantized.stats)
    first: tuple[int, Pass] | None = None  # the fewest meeting the estimate, when none is decided
    with log.bar("fallback", len(order) + 1, unit="passes") as tick:
        for k in range(len(order) + 1):
            p = sens.all_quantized if k == 0 else sim.run(set(order[k:]), f"{k} groups in float")
            tick(1)
            if target.holds(p.stats, strict):
                return Fallback(target, [sens.groups[i] for i in order[:k]], p)
            if target.met(p.stats):
                first = first or (k, p)
    if first is not None:
        return Fallback(target, [sens.groups[i] for i in order[:first[0]]], first[1])
    floor = sens.none_quantized.stats
    raise VitexportError(f"No number of groups in float meets {target.describe()} (with the kind's other bounds): "
                         f"with every group in float the "
                         f"{sens.kind} graph gives min cosine {floor.cos_min:.5f}"
                         + (f", top-1 drop {floor.acc_drop:.2f} points" if floor.acc_drop is not None else "")
                         + " on the held-out set.")
