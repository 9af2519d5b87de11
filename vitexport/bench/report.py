"""Bench reports: a terminal table, and JSON / Markdown / CSV / PNG files."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import VitexportError
from ..paths import atomic_path, write_text_atomic
from .run import BackendResult, BenchReport


def _fmt(v, spec: str, none: str = "-") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return none
    return format(v, spec)


def _ratio(v, none: str = "") -> str:
    """'3.45x', or nothing for a row that was not timed (a parity-only row has no speed to compare)."""
    return none if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}x"


@dataclass
class BenchRow:
    """One available backend at one batch size: the body of the table, the Markdown and the CSV."""

    backend: str
    precision: str
    device: str
    batch: int | None
    mean_ms: float | None
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    throughput: float | None
    vs_reference: float | None
    h2d_ms: float | None
    max_abs: float | None
    mean_abs: float | None
    cos_min: float | None
    cos_mean: float | None
    top1_agree: float | None
    top5_agree: float | None
    acc: float | None
    parity: str  # 'pass' | 'FAIL'


def rows(report: BenchReport) -> list[BenchRow]:
    """One row per available backend x batch size (a backend that timed nothing: one row without latency)."""
    out = []
    for r in report.results:
        if not r.available:
            continue
        st = r.parity.stats if r.parity else None
        for lat in r.latency or [None]:
            out.append(BenchRow(
                backend=r.name, precision=r.precision, device=r.device, batch=lat.batch if lat else None,
                mean_ms=lat.mean_ms if lat else None, p50_ms=lat.p50_ms if lat else None,
                p90_ms=lat.p90_ms if lat else None, p99_ms=lat.p99_ms if lat else None,
                throughput=lat.throughput if lat else None, vs_reference=lat.relative_to_reference if lat else None,
                h2d_ms=lat.h2d_ms if lat else None,
                max_abs=st.max_abs if st else None, mean_abs=st.mean_abs if st else None,
                cos_min=st.cos_min if st else None, cos_mean=st.cos_mean if st else None,
                top1_agree=st.top1_agree if st else None, top5_agree=st.top5_agree if st else None,
                acc=st.acc if st else None, parity="pass" if r.parity and r.parity.passed else "FAIL",
            ))
    return out


def unavailable_lines(report: BenchReport) -> list[str]:
    """The backends that could not run, rows that share a cause said once: 'N rows unavailable: cause (names)'.

    The cause is the reason up to its consequence (', so ...'): on a machine without a GPU every CUDA and TensorRT
    row has one, and a table that ends in nine copies of it hides the line that matters.
    """
    groups: dict[str, list[BackendResult]] = {}
    for r in report.results:
        if not r.available:
            groups.setdefault(r.reason.split(", so ")[0], []).append(r)
    out = []
    for cause, members in groups.items():
        reasons = {r.reason for r in members}
        said = reasons.pop() if len(reasons) == 1 else cause
        if len(members) == 1:
            what = "" if said.startswith("not run:") else "unavailable: "  # not run: its file failed (said apart)
            out.append(f"{members[0].name}: {what}{said}")
        else:
            out.append(f"{len(members)} rows unavailable: {said} ({', '.join(r.name for r in members)})")
    return out


def _wrong_artifacts(report: BenchReport) -> list[dict]:
    return [a for a in report.artifacts if a.get("status", "ok") != "ok"]


def print_table(report: BenchReport, console=None) -> None:
    import sys

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # a pipe or a file gets the whole table, not one squeezed to 80 columns
    console = console or Console(width=None if sys.stdout.isatty() else 170)
    m = report.model
    title = (f"{m['variant']} {m['img_size'][0]}x{m['img_size'][1]} - {report.data['n_parity']} inputs from "
             f"{report.data['source']} - reference: {report.reference}")
    t = Table(title=title, title_justify="left")
    labelled = report.data["labelled"]
    for col, kw in [("backend", {}), ("batch", {"justify": "right"}), ("mean ms", {"justify": "right"}),
                    ("p50", {"justify": "right"}), ("p99", {"justify": "right"}), ("img/s", {"justify": "right"}),
                    ("vs ref", {"justify": "right"}), ("max abs", {"justify": "right"}),
                    ("cos min", {"justify": "right"}), ("top-1 agree", {"justify": "right"})] + (
            [("top-1 acc", {"justify": "right"})] if labelled else []) + [("parity", {})]:
        t.add_column(col, **kw)
    for row in rows(report):
        cells = [row.backend, _fmt(row.batch, "d"), _fmt(row.mean_ms, ".2f"), _fmt(row.p50_ms, ".2f"),
                 _fmt(row.p99_ms, ".2f"), _fmt(row.throughput, ".1f"), _ratio(row.vs_reference),
                 _fmt(row.max_abs, ".2e"), _fmt(row.cos_min, ".5f"), _fmt(row.top1_agree, ".1%")]
        if labelled:
            cells.append(_fmt(row.acc, ".2%"))
        cells.append("[green]pass[/green]" if row.parity == "pass" else "[red]FAIL[/red]")
        t.add_row(*cells)
    console.print(t)
    for line in unavailable_lines(report):
        console.print(f"  [dim]{escape(line)}[/dim]")
    for r in report.results:
        if r.available and r.missed_parity and r.parity is not None:
            console.print(f"  [red]{r.name}: parity miss: {escape('; '.join(r.parity.failures))}[/red]")
        if r.available and "not_timed" in r.info:
            console.print(f"  [dim]{r.name}: parity only: {escape(r.info['not_timed'])}[/dim]")
    for a in _wrong_artifacts(report):  # present but not the file its record describes: a failure, not 'unavailable'
        console.print(f"  [red]FAIL {escape(a['file'])} ({a['status']}): {escape(a['reason'])}; "
                      f"{escape(a['remedy'])}[/red]")
    if report.model["random_weights"]:
        console.print("  [yellow]Random weights (no checkpoint): latency is real, accuracy is meaningless.[/yellow]")
    env = report.environment
    console.print(f"  CPU: {escape(env['cpu'])} ({env['threads']} threads); GPU: "
                  f"{env['gpu']['name'] if env['gpu'] else 'none'}; wall time {report.wall_s:.0f}s")


def to_json(report: BenchReport) -> str:
    def clean(o):
        if isinstance(o, float) and not math.isfinite(o):
            return None  # JSON has no NaN: a missing figure is null
        if isinstance(o, dict):
            return {k: clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        return o

    return json.dumps(clean(report.to_dict()), indent=2, allow_nan=False) + "\n"


def to_markdown(report: BenchReport) -> str:
    m, env = report.model, report.environment
    hints = [f"{r.name}: {r.info['inference_precision']}" for r in report.results
             if r.available and "inference_precision" in r.info]
    lines = [
        f"# vitexport bench: {m['variant']} at {m['img_size'][0]}x{m['img_size'][1]}", "",
        f"- created: {report.created} (vitexport {report.vitexport_version}), wall time {report.wall_s:.0f} s",
        f"- weights: {'random (latency is real, accuracy meaningless)' if m['random_weights'] else m['checkpoint']['path']}",
        f"- inputs: {report.data['n_parity']} from `{report.data['source']}`"
        + (" (labelled)" if report.data["labelled"] else ""),
        f"- reference: {report.reference}",
        f"- CPU: {env['cpu']}, {env['cores']} cores, {env['threads']} threads; GPU: "
        f"{env['gpu']['name'] if env['gpu'] else 'none'}",
        f"- CPU features: {', '.join(env.get('cpu_flags') or []) or 'not read'}"
        + (f"; OpenVINO's CPU plugin reports {', '.join(env['openvino_cpu_capabilities'])}"
           if env.get("openvino_cpu_capabilities") else ""),
        *(["- inference precision asked of OpenVINO: " + ", ".join(hints)] if hints else []),
        "- versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v), "",
        "| backend | batch | mean ms | p50 ms | p90 ms | p99 ms | img/s | vs reference | max abs | cos min | "
        "top-1 agree | top-1 acc | parity |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows(report):
        lines.append(
            f"| {r.backend} | {_fmt(r.batch, 'd')} | {_fmt(r.mean_ms, '.2f')} | {_fmt(r.p50_ms, '.2f')} | "
            f"{_fmt(r.p90_ms, '.2f')} | {_fmt(r.p99_ms, '.2f')} | {_fmt(r.throughput, '.1f')} | "
            f"{_ratio(r.vs_reference, '')} | {_fmt(r.max_abs, '.2e')} | {_fmt(r.cos_min, '.5f')} | "
            f"{_fmt(r.top1_agree, '.1%')} | {_fmt(r.acc, '.2%')} | {r.parity} |")
    unavailable = unavailable_lines(report)
    if unavailable:
        lines += ["", "Unavailable:", ""] + [f"- {line}" for line in unavailable]
    failed = [r for r in report.results if r.missed_parity and r.parity is not None]
    if failed:
        lines += ["", "Parity misses:", ""] + [f"- {r.name}: {'; '.join(r.parity.failures)}" for r in failed]
    wrong = _wrong_artifacts(report)
    if wrong:
        lines += ["", "Artifacts that failed verification:", ""] + [
            f"- `{a['file']}` ({a['status']}): {a['reason']}; {a['remedy']}" for a in wrong]
    return "\n".join(lines) + "\n"


def to_csv(report: BenchReport) -> str:
    buf = io.StringIO()
    data = [asdict(r) for r in rows(report)]
    if data:
        w = csv.DictWriter(buf, fieldnames=list(data[0]))
        w.writeheader()
        w.writerows(data)
    return buf.getvalue()


def plot(report: BenchReport, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise VitexportError("--plot needs matplotlib: pip install 'vitexport[plot]'.") from None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in report.results:
        if r.available and r.latency:
            ax.plot([lt.batch for lt in r.latency], [lt.throughput for lt in r.latency], marker="o", label=r.name)
    ax.set_xlabel("batch size")
    ax.set_ylabel("images / s")
    ax.set_xscale("log", base=2)
    m = report.model
    ax.set_title(f"{m['variant']} {m['img_size'][0]}x{m['img_size'][1]} throughput")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(Path(path), suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def write_outputs(report: BenchReport, json_path=None, markdown_path=None, csv_path=None, plot_path=None) -> list[Path]:
    written = []
    for path, render in ((json_path, to_json), (markdown_path, to_markdown), (csv_path, to_csv)):
        if path:
            write_text_atomic(Path(path), render(report))
            written.append(Path(path))
    if plot_path:
        plot(report, Path(plot_path))
        written.append(Path(plot_path))
    return written


__all__ = ["BackendResult", "BenchRow", "plot", "print_table", "rows", "to_csv", "to_json", "to_markdown",
           "write_outputs"]
