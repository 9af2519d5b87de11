"""INT8 against FP16 TensorRT throughput at the engines' opt batch, read from a `vitexport bench --json` report.

    python scripts/int8_vs_fp16.py --opt-batch MODEL_DIR           # prints the profile's opt batch
    python scripts/int8_vs_fp16.py BENCH_JSON MODEL_DIR [--gate]   # prints both throughputs on one line

With --gate it exits 1 when INT8 is slower than FP16; without, it only reports. Exit 2: the report or the plans'
sidecars lack what the comparison needs (an engine that did not run, a batch that was not timed). Used by
scripts/gpu_smoke.sh.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from vitexport.artifacts.folder import ModelFolder
from vitexport.artifacts.sidecar import read_sidecar
from vitexport.errors import VitexportError


def opt_batch(model_dir: Path) -> int:
    """The batch both plans were tuned for (their sidecars' profile.opt); one sentence when they disagree."""
    folder = ModelFolder(model_dir)
    opts = {p: int(read_sidecar(folder.sidecar(p))["profile"]["opt"][0]) for p in ("int8", "fp16")}
    if opts["int8"] != opts["fp16"]:
        raise VitexportError(f"The INT8 and FP16 plans were tuned for different batches ({opts['int8']} and "
                             f"{opts['fp16']}); rebuild them with the same --opt-batch.")
    return opts["int8"]


def throughput(report: dict[str, Any], precision: str, batch: int) -> float:
    rows = [r for r in report.get("results", []) if r.get("backend") == "tensorrt" and r.get("precision") == precision]
    if not rows or not rows[0].get("available"):
        why = rows[0].get("reason") if rows else "no row in the report"
        raise VitexportError(f"TensorRT {precision.upper()} did not run ({why}).")
    for lat in rows[0].get("latency", []):
        if lat.get("batch") == batch:
            return float(lat["throughput"])
    raise VitexportError(f"TensorRT {precision.upper()} was not timed at batch {batch} (the plans' opt batch); "
                         f"run the bench with --batch {batch}.")


def compare(report: dict[str, Any], batch: int) -> tuple[bool, str]:
    """(INT8 at least as fast as FP16, the line that says so with both numbers)."""
    int8, fp16 = throughput(report, "int8", batch), throughput(report, "fp16", batch)
    verdict = "faster than" if int8 > fp16 else "as fast as" if int8 == fp16 else "SLOWER than"
    return int8 >= fp16, (f"TensorRT at batch {batch} (the profile's opt batch): INT8 {int8:.1f} img/s is {verdict} "
                          f"FP16 {fp16:.1f} img/s (INT8/FP16 = {int8 / fp16:.2f}x)")


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["--opt-batch"] and len(argv) == 2:
            print(opt_batch(Path(argv[1])))
            return 0
        if len(argv) not in (2, 3) or (len(argv) == 3 and argv[2] != "--gate"):
            print(__doc__, file=sys.stderr)
            return 2
        report = json.loads(Path(argv[0]).read_text())
        ok, line = compare(report, opt_batch(Path(argv[1])))
    except (VitexportError, OSError, ValueError) as e:
        print(f"int8_vs_fp16: {e}", file=sys.stderr)
        return 2
    print(line)
    return 0 if ok or len(argv) == 2 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
