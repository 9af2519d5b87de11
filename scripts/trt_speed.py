"""TensorRT plans of one model timed side by side at their profile's opt batch, with the bench's accuracy beside.

    python scripts/trt_speed.py MODEL_DIR [--bench BENCH_JSON] [--gate 1.1] [--rounds 9] [--iters 20] [--json OUT]
    python scripts/trt_speed.py --table OUT.json [OUT.json ...]     # one table of several models' results

Every plan in the folder (FP16, INT8, FP8) is loaded at once and timed in interleaved rounds: each round runs every
plan `--iters` times, in an order that rotates from round to round, and keeps each plan's median. A plan's speed
against FP16 is the median over rounds of (FP16's round median / its round median), so a clock that drifts during
the run moves both sides of each ratio alike. The plans are built from graphs that differ only in the GEMMs'
precision (artifacts.folder.PLAN_SOURCE), so the ratio is the GEMMs' own.

--gate X exits 1 when a plan other than FP16 is below X times FP16, and needs an opt batch of at least 32 (the
batch the published ratios are for). Exit 2: what the comparison needs is missing (no FP16 plan, plans tuned for
different batches, an engine that does not load). Used by scripts/gpu_smoke.sh.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from vitexport.artifacts.folder import PLAN_PRECISIONS, ModelFolder
from vitexport.artifacts.sidecar import read_sidecar
from vitexport.errors import VitexportError

ORDER = ("fp16", "int8", "fp8")  # the plans timed, FP16 (the reference) first
GATE_MIN_BATCH = 32


@dataclass
class SpeedRow:
    model: str
    precision: str
    source_onnx: str  # the graph the plan was built from (its sidecar)
    batch: int
    ms_median: float  # median over rounds of the per-round median
    throughput: float  # images/s at that median
    vs_fp16: float | None  # median over rounds of FP16 ms / this ms (None for FP16 itself)
    vs_fp16_range: tuple[float, float] | None  # lowest and highest round ratio
    top1_agree: float | None = None  # from the bench report: against PyTorch FP32, on the bench's images
    acc: float | None = None  # top-1 against the labels, when the data had them
    cos_min: float | None = None
    engine_problems: tuple[str, ...] = ()  # runner.info["engine_problems"]: a fallback or an unfused attention
    placement: str = ""  # INT8: the Q/DQ placement of its graph (manifest), 'vitexport' or 'modelopt'


def plans_of(folder: ModelFolder) -> dict[str, dict[str, Any]]:
    """precision -> sidecar of every plan present, FP16 first; one sentence when FP16 is missing or the plans were
    tuned for different batches."""
    sidecars = {p: read_sidecar(folder.sidecar(p)) for p in ORDER if p in PLAN_PRECISIONS and folder.plan(p).is_file()}
    if "fp16" not in sidecars:
        raise VitexportError(f"{folder.plan('fp16')} does not exist: the other plans are timed against it.")
    opts = {p: int(s["profile"]["opt"][0]) for p, s in sidecars.items()}
    if len(set(opts.values())) != 1:
        raise VitexportError(f"The plans were tuned for different batches ({opts}); rebuild them with the same "
                             f"--opt-batch.")
    return sidecars


def rotation(names: Sequence[str], round_index: int) -> list[str]:
    """The order of one round: the list rotated by the round's index, so no plan always runs first or last."""
    k = round_index % len(names) if names else 0
    return list(names[k:]) + list(names[:k])


def interleave(timers: dict[str, Callable[[], float]], rounds: int, iters: int) -> dict[str, list[float]]:
    """name -> its median milliseconds in each round, the rounds interleaving every timer."""
    per_round: dict[str, list[float]] = {n: [] for n in timers}
    for r in range(rounds):
        for name in rotation(list(timers), r):
            per_round[name].append(statistics.median(timers[name]() for _ in range(iters)))
    return per_round


def summarize(model: str, per_round: dict[str, list[float]], batch: int, sources: dict[str, str]) -> list[SpeedRow]:
    """Rows from the rounds' medians: each plan's median and its round-by-round ratio to FP16."""
    ref = per_round["fp16"]
    rows = []
    for p, ms in per_round.items():
        med = statistics.median(ms)
        ratios = None if p == "fp16" else [f / m for f, m in zip(ref, ms)]
        rows.append(SpeedRow(model, p, sources.get(p, "?"), batch, med, batch * 1000.0 / med,
                             None if ratios is None else statistics.median(ratios),
                             None if ratios is None else (min(ratios), max(ratios))))
    return rows


def add_accuracy(rows: list[SpeedRow], report: dict[str, Any]) -> None:
    """The bench report's parity figures of the TensorRT rows, beside their speed."""
    for row in rows:
        match = [r for r in report.get("results", []) if r.get("backend") == "tensorrt"
                 and r.get("precision") == row.precision and r.get("available")]
        parity = (match[0].get("parity") or {}) if match else {}
        row.top1_agree, row.acc, row.cos_min = parity.get("top1_agree"), parity.get("acc"), parity.get("cos_min")


def gate_failures(rows: Sequence[SpeedRow], gate: float) -> list[str]:
    """One sentence per plan slower than `gate` x FP16, or one saying the batch is too small to judge."""
    batch = rows[0].batch if rows else 0
    if batch < GATE_MIN_BATCH:
        return [f"the speed gate needs an opt batch of at least {GATE_MIN_BATCH}; these plans were tuned for "
                f"{batch} (rebuild with --opt-batch {GATE_MIN_BATCH})"]
    return [f"{r.model}: TensorRT {r.precision.upper()} is {r.vs_fp16:.2f}x FP16 at batch {r.batch} (rounds "
            f"{r.vs_fp16_range[0]:.2f}-{r.vs_fp16_range[1]:.2f}x), below the {gate:.2f}x gate"
            for r in rows if r.vs_fp16 is not None and r.vs_fp16_range is not None and r.vs_fp16 < gate]


def table(rows: Sequence[SpeedRow]) -> str:
    """A text table: model, precision, graph, INT8 placement, batch, img/s, x FP16 (with its rounds' range),
    accuracy, engine check."""
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.2f}%"

    head = ("model", "precision", "graph", "placement", "batch", "img/s", "x FP16 (rounds)", "top-1 agree", "top-1 acc",
            "cos min", "engine")
    lines = [head]
    for r in rows:
        vs = "1.00" if r.vs_fp16 is None else f"{r.vs_fp16:.2f} ({r.vs_fp16_range[0]:.2f}-{r.vs_fp16_range[1]:.2f})" \
            if r.vs_fp16_range else f"{r.vs_fp16:.2f}"
        lines.append((r.model, r.precision.upper(), r.source_onnx, r.placement or "-", str(r.batch),
                      f"{r.throughput:,.0f}", vs,
                      pct(r.top1_agree), pct(r.acc), "-" if r.cos_min is None else f"{r.cos_min:.5f}",
                      "ok" if not r.engine_problems else f"{len(r.engine_problems)} problem(s)"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def measure(model_dir: Path, rounds: int, iters: int, warmup: int = 10) -> list[SpeedRow]:
    """Load every plan of the folder, time them interleaved at the opt batch, return one row each (needs a GPU)."""
    import numpy as np

    from vitexport.backends.tensorrt import TensorRTRunner

    folder = ModelFolder(model_dir)
    sidecars = plans_of(folder)
    opt = [int(d) for d in next(iter(sidecars.values()))["profile"]["opt"]]
    x = np.random.default_rng(0).standard_normal(opt).astype(np.float32)
    runners = {p: TensorRTRunner(folder.plan(p)) for p in sidecars}
    try:
        for runner in runners.values():
            runner.load()
        staged = {p: r.stage(x) for p, r in runners.items()}
        for p, r in runners.items():
            for _ in range(warmup):
                r.timed_run(staged[p])
        per_round = interleave({p: (lambda r=r, s=staged[p]: r.timed_run(s)) for p, r in runners.items()},
                               rounds, iters)
        problems = {p: tuple(r.info.get("engine_problems", ())) for p, r in runners.items()}
    finally:
        for runner in runners.values():
            runner.close()
    model = folder.read_manifest().variant if folder.has_manifest() else folder.path.name
    rows = summarize(model, per_round, opt[0], {p: str(s.get("source_onnx", "?")) for p, s in sidecars.items()})
    records = folder.read_manifest().precisions if folder.has_manifest() else {}
    for row in rows:
        row.engine_problems = problems[row.precision]
        if row.precision == "int8" and "int8-trt" in records:
            row.placement = str((records["int8-trt"].qdq or {}).get("placement", "vitexport"))
    return rows


def _rows_from(path: Path) -> list[SpeedRow]:
    rows = []
    for d in json.loads(Path(path).read_text())["rows"]:
        d["vs_fp16_range"] = tuple(d["vs_fp16_range"]) if d.get("vs_fp16_range") else None
        d["engine_problems"] = tuple(d.get("engine_problems") or ())
        rows.append(SpeedRow(**d))
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", nargs="?", type=Path)
    ap.add_argument("--bench", type=Path, help="a `vitexport bench --json` report of the folder: accuracy columns")
    ap.add_argument("--gate", type=float, help="exit 1 when a plan is below this many times FP16")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--table", nargs="+", type=Path, metavar="JSON", help="print one table of these results")
    args = ap.parse_args(argv)
    try:
        if args.table:
            print(table([r for p in args.table for r in _rows_from(p)]))
            return 0
        if args.model_dir is None or args.rounds < 1 or args.iters < 1:
            ap.error("give MODEL_DIR (and --rounds/--iters of at least 1), or --table")
        rows = measure(args.model_dir, args.rounds, args.iters)
        if args.bench:
            add_accuracy(rows, json.loads(args.bench.read_text()))
    except (VitexportError, OSError, ValueError, KeyError) as e:
        print(f"trt_speed: {e}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps({"rows": [asdict(r) for r in rows]}, indent=1) + "\n")
    print(table(rows))
    failures = gate_failures(rows, args.gate) if args.gate else []
    for line in failures:
        print(f"trt_speed: {line}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
