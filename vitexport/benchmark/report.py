"""Bench reports: a terminal table, and the JSON / Markdown / CSV texts of the files (`outputs.py` writes them)."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass

from .figures import fastest_line, figure_lines, labels_line, source_line, unsettled_line
from .run import BackendResult, BenchReport


def fmt(v, spec: str, none: str = "-") -> str:
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
    parity: str  # 'pass' | 'FAIL' | 'inconclusive'
    top1_agree_low: float | None = None  # 95 % interval of top1_agree
    top1_agree_high: float | None = None
    acc_low: float | None = None  # 95 % interval of acc
    acc_high: float | None = None
    top5_acc: float | None = None
    acc_drop: float | None = None  # points, paired against the reference on the same images
    acc_drop_low: float | None = None
    acc_drop_high: float | None = None
    flips_down: int | None = None
    flips_up: int | None = None
    # a dense output's task figures against the reference (parity.dense), with their 95 % intervals
    absrel: float | None = None
    absrel_low: float | None = None
    absrel_high: float | None = None
    delta1: float | None = None
    delta1_low: float | None = None
    delta1_high: float | None = None
    pixel_agree: float | None = None
    pixel_agree_low: float | None = None
    pixel_agree_high: float | None = None
    miou: float | None = None
    miou_low: float | None = None
    miou_high: float | None = None
    mask_iou: float | None = None  # SAM: its masks against the reference's (parity.masks)
    mask_iou_low: float | None = None
    mask_iou_high: float | None = None
    mask_iou_min: float | None = None
    map: float | None = None  # a detector: COCO mAP@[.5:.95] against the reference's detections (parity.detections)
    map_low: float | None = None
    map_high: float | None = None
    map_50: float | None = None
    map_50_low: float | None = None
    map_50_high: float | None = None
    box_iou: float | None = None
    box_iou_low: float | None = None
    box_iou_high: float | None = None
    concurrency: int | None = None  # a served model: requests in flight while timed
    stable: bool | None = None  # its measurement windows agreed within 10 %
    server_queue_ms: float | None = None  # per request, from the server's statistics
    server_compute_ms: float | None = None


def rows(report: BenchReport) -> list[BenchRow]:
    """One row per available backend x batch size (a backend that timed nothing: one row without latency)."""
    out = []
    for r in report.results:
        if not r.available:
            continue
        st = r.parity.stats if r.parity else None
        status = {"pass": "pass", "fail": "FAIL", "inconclusive": "inconclusive"}[r.parity.status] if r.parity \
            else "FAIL"
        ci = _intervals(st)
        for lat in r.latency or [None]:
            out.append(BenchRow(
                backend=r.name, precision=r.precision, device=r.device, batch=lat.batch if lat else None,
                mean_ms=lat.mean_ms if lat else None, p50_ms=lat.p50_ms if lat else None,
                p90_ms=lat.p90_ms if lat else None, p99_ms=lat.p99_ms if lat else None,
                throughput=lat.throughput if lat else None, vs_reference=lat.relative_to_reference if lat else None,
                h2d_ms=lat.h2d_ms if lat else None,
                max_abs=st.max_abs if st else None, mean_abs=st.mean_abs if st else None,
                cos_min=st.cos_min if st else None, cos_mean=st.cos_mean if st else None,
                top1_agree=st.top1_agree if st and not st.argmax_meaningless else None,
                top5_agree=st.top5_agree if st and not st.embedding else None,
                acc=(st.knn_acc if st.embedding else st.acc) if st else None, parity=status, **ci,
                **({} if lat is None or lat.concurrency is None else dict(
                    concurrency=lat.concurrency, stable=lat.stable, server_queue_ms=lat.server_queue_ms,
                    server_compute_ms=lat.server_compute_ms)),
            ))
    return out


def unavailable_lines(d: dict) -> list[str]:
    """The backends that could not run, rows that share a cause said once: 'N rows unavailable: cause (names)'; from
    the report's dict (BenchReport.to_dict()), so the table and the page say the same.

    The cause is the reason up to its consequence (', so ...'): on a machine without a GPU every CUDA and TensorRT
    row has one, and a table that ends in nine copies of it hides the line that matters.
    """
    groups: dict[str, list[dict]] = {}
    for r in d["results"]:
        if not r["available"] and not r.get("error"):  # a served row that failed is said as a failure
            groups.setdefault(r["reason"].split(", so ")[0], []).append(r)
    out = []
    for cause, members in groups.items():
        reasons = {r["reason"] for r in members}
        said = reasons.pop() if len(reasons) == 1 else cause
        what = "" if said.startswith("not run:") else "unavailable: "  # not run: its file failed (said apart)
        if len(members) == 1:
            out.append(f"{members[0]['name']}: {what}{said}")
        else:
            out.append(f"{len(members)} rows {what}{said} ({', '.join(r['name'] for r in members)})")
    return out


def accuracy_columns(data: dict) -> tuple[bool, str]:
    """(whether the table has accuracy columns, what they hold): top-1 accuracy, or an embedding model's k-NN."""
    knn = data.get("embeddings")
    if knn:
        return bool(knn.get("labelled")), f"k-NN top-1 (k={knn['k']})"
    return bool(data["labelled"]), "top-1 acc"


def _intervals(st) -> dict:
    """The BenchRow fields that carry the figures' uncertainty."""
    if st is None:
        return {}

    def pair(v):
        return (v[0], v[1]) if v else (None, None)

    if st.dense is not None:  # a dense map: its task figures against the reference
        return {**{k: v for name in ("absrel", "delta1", "pixel_agree", "miou", "mask_iou", "map", "map_50", "box_iou")
                   if getattr(st, name) is not None
                   for k, v in ((name, getattr(st, name)), (f"{name}_low", pair(getattr(st, f"{name}_ci"))[0]),
                                (f"{name}_high", pair(getattr(st, f"{name}_ci"))[1]))},
                **({} if st.mask_iou_min is None else {"mask_iou_min": st.mask_iou_min})}
    if st.embedding:  # an embedding model: its k-NN figures stand in the accuracy columns
        (al, ah), (dl, dh) = pair(st.knn_acc_ci), pair(st.knn_drop_ci)
        return dict(acc_low=al, acc_high=ah, acc_drop=st.knn_drop, acc_drop_low=dl, acc_drop_high=dh,
                    flips_down=st.knn_flips_down, flips_up=st.knn_flips_up)
    (al, ah), (dl, dh), (tl, th) = pair(st.acc_ci), pair(st.acc_drop_ci), pair(st.top1_agree_ci)
    return dict(top1_agree_low=tl, top1_agree_high=th, acc_low=al, acc_high=ah, top5_acc=st.top5_acc,
                acc_drop=st.acc_drop, acc_drop_low=dl, acc_drop_high=dh, flips_down=st.flips_down,
                flips_up=st.flips_up)


def with_interval(v, lo, hi, digits: int = 2) -> str:
    """'98.89 (97.2-99.7)': a rate in percent and its 95 % interval."""
    if v is None:
        return "-"
    return f"{v * 100:.{digits}f}" + ("" if lo is None else f" ({lo * 100:.1f}-{hi * 100:.1f})")


def _drop(r: BenchRow) -> str:
    """'+0.28 [-0.9,+1.2] 3/1': the paired top-1 drop in points, its interval and the flips down/up."""
    if r.acc_drop is None:
        return "-"
    return f"{r.acc_drop:+.2f} [{r.acc_drop_low:+.1f},{r.acc_drop_high:+.1f}] {r.flips_down}/{r.flips_up}"


_PARITY_STYLE = {"pass": "[green]pass[/green]", "FAIL": "[red]FAIL[/red]",
                 "inconclusive": "[yellow]inconclusive[/yellow]"}


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
    labelled, acc_name = accuracy_columns(report.data)
    table = rows(report)
    loaded = any(row.concurrency is not None for row in table)  # a served model: the concurrency of each timing
    for col, kw in [("backend", {}), ("batch", {"justify": "right"})] + ([("conc", {"justify": "right"})] if loaded
                                                                         else []) + [("mean ms", {"justify": "right"}),
                    ("p50", {"justify": "right"}), ("p99", {"justify": "right"}), ("img/s", {"justify": "right"}),
                    ("vs ref", {"justify": "right"}), ("max abs", {"justify": "right"}),
                    ("cos min", {"justify": "right"}), ("top-1 agree %", {"justify": "right"})] + (
            [(f"{acc_name} % (95% CI)", {"justify": "right"}), ("drop pts [95% CI] down/up", {"justify": "right"})]
            if labelled else []) + [("parity", {})]:
        t.add_column(col, **kw)
    for row in table:
        cells = [row.backend, fmt(row.batch, "d")] + ([_conc(row)] if loaded else []) + [
                 fmt(row.mean_ms, ".2f"), fmt(row.p50_ms, ".2f"),
                 fmt(row.p99_ms, ".2f"), fmt(row.throughput, ".1f"), _ratio(row.vs_reference),
                 fmt(row.max_abs, ".2e"), fmt(row.cos_min, ".5f"),
                 with_interval(row.top1_agree, row.top1_agree_low, row.top1_agree_high, 1)]
        if labelled:
            cells += [with_interval(row.acc, row.acc_low, row.acc_high), _drop(row)]
        cells.append(_PARITY_STYLE[row.parity])
        t.add_row(*cells)
    console.print(t)
    rd = report.to_dict()
    for line in unavailable_lines(rd):
        console.print(f"  [dim]{escape(line)}[/dim]")
    for r in report.results:
        if r.available and r.missed_parity and r.parity is not None:
            style = "red" if r.parity.failed else "yellow"
            what = "parity miss" if r.parity.failed else "parity"
            console.print(f"  [{style}]{r.name}: {what}: {escape('; '.join(r.parity.problems()))}[/{style}]")
        if r.available and "not_timed" in r.info:
            console.print(f"  [dim]{r.name}: parity only: {escape(r.info['not_timed'])}[/dim]")
    for r in report.results:
        if r.error:
            console.print(f"  [red]FAIL {escape(r.name)}: {escape(r.error)}[/red]")
    _print_served(report, console)
    for a in _wrong_artifacts(report):  # present but not the file its record describes: a failure, not 'unavailable'
        console.print(f"  [red]FAIL {escape(a['file'])} ({a['status']}): {escape(a['reason'])}; "
                      f"{escape(a['remedy'])}[/red]")
    d = report.data
    if d.get("decode"):
        dec = d["decode"]
        console.print(f"  Inputs: {d['n_parity']:,} images{' (a subset, spread evenly)' if d.get('subset') else ''}, "
                      f"decoded once in {dec['seconds']:.1f}s ({dec['images_per_s'] or 0:,.0f}/s, {dec['workers']} "
                      f"workers); inference per backend: "
                      + ", ".join(f"{r.name} {r.timing['inference_s']:.1f}s" for r in report.results if r.timing))
    for line in [fastest_line(rd), source_line(d), labels_line(d)] + figure_lines(report) + [unsettled_line(report)]:
        if line:
            console.print(f"  {escape(line)}")
    if skipped_count(d):
        console.print(f"  [yellow]{escape(skipped_line(d))}[/yellow]")
    if report.model["random_weights"]:
        console.print("  [yellow]Random weights (no checkpoint): latency is real, accuracy is meaningless.[/yellow]")
    env = report.environment
    console.print(f"  CPU: {escape(env['cpu'])} ({env['threads']} threads); GPU: "
                  f"{env['gpu']['name'] if env['gpu'] else 'none'}; wall time {report.wall_s:.0f}s")


def _conc(row: BenchRow) -> str:
    """'8', or '8*' for a measurement whose windows never agreed within 10 %."""
    return "-" if row.concurrency is None else f"{row.concurrency}{'' if row.stable else '*'}"


def served_lines(report: BenchReport) -> list[str]:
    """Per served row and load: the server's own time per request and its count against the client's."""
    out = []
    for r in report.results:
        for lat in r.latency if r.available else ():
            if lat.concurrency is None:
                continue
            server = "no statistics from the server" if lat.server_requests is None else (
                f"server: {lat.server_requests:,} requests, {lat.server_inferences:,} images; per request "
                f"{lat.server_queue_ms or 0:.2f} ms queued, {lat.server_compute_ms or 0:.2f} ms computing")
            out.append(f"{r.name} batch {lat.batch} x {lat.concurrency} in flight: {lat.requests:,} requests sent, "
                       f"{lat.windows} windows{'' if lat.stable else ' (unstable: *)'}, p95 {lat.p95_ms:.2f} ms; "
                       f"{server}")
    return out


def _print_served(report: BenchReport, console) -> None:
    from rich.markup import escape

    for line in served_lines(report):
        console.print(f"  [dim]{escape(line)}[/dim]")


def skipped_count(data: dict) -> int:
    """Files of the data folder the bench left out (0 in reports made before it counted them)."""
    return int((data.get("skipped") or {}).get("count", 0))


def skipped_line(data: dict) -> str:
    """'Skipped 3 files of the data folder (2 damaged, 1 link out of the folder); all are listed in the JSON.'"""
    sk = data["skipped"]
    kinds = ", ".join(f"{n:,} {k}" for k, n in sk["kinds"].items())
    return (f"Skipped {sk['count']:,} file(s) of {data['source']} that cannot be used ({kinds}); every backend was "
            f"judged on the other {data['n_parity']:,}; the files and why are listed under data.skipped in the JSON.")


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
        *([f"- {skipped_line(report.data)}"] if skipped_count(report.data) else []),
        f"- reference: {report.reference}",
        f"- CPU: {env['cpu']}, {env['cores']} cores, {env['threads']} threads; GPU: "
        f"{env['gpu']['name'] if env['gpu'] else 'none'}",
        f"- CPU features: {', '.join(env.get('cpu_flags') or []) or 'not read'}"
        + (f"; OpenVINO's CPU plugin reports {', '.join(env['openvino_cpu_capabilities'])}"
           if env.get("openvino_cpu_capabilities") else ""),
        *(["- inference precision asked of OpenVINO: " + ", ".join(hints)] if hints else []),
        "- versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v), "",
        "| backend | batch | mean ms | p50 ms | p90 ms | p99 ms | img/s | vs reference | max abs | cos min | "
        f"top-1 agree % (95% CI) | {accuracy_columns(report.data)[1]} % (95% CI) | drop pts [95% CI] down/up | parity |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows(report):
        lines.append(
            f"| {r.backend} | {fmt(r.batch, 'd')}{'' if r.concurrency is None else f' x{_conc(r)}'} | {fmt(r.mean_ms, '.2f')} | {fmt(r.p50_ms, '.2f')} | "
            f"{fmt(r.p90_ms, '.2f')} | {fmt(r.p99_ms, '.2f')} | {fmt(r.throughput, '.1f')} | "
            f"{_ratio(r.vs_reference, '')} | {fmt(r.max_abs, '.2e')} | {fmt(r.cos_min, '.5f')} | "
            f"{with_interval(r.top1_agree, r.top1_agree_low, r.top1_agree_high, 1)} | "
            f"{with_interval(r.acc, r.acc_low, r.acc_high)} | {_drop(r)} | {r.parity} |")
    rd = report.to_dict()
    unavailable = unavailable_lines(rd)
    if unavailable:
        lines += ["", "Unavailable:", ""] + [f"- {line}" for line in unavailable]
    if more := [x for x in [fastest_line(rd), source_line(report.data), labels_line(report.data)]
                + figure_lines(report)
                + [unsettled_line(report)] if x]:
        lines += ["", "Labels and further figures:", ""] + [f"- {x}" for x in more]
    if served := served_lines(report):
        lines += ["", "Served models under load (concurrency: requests in flight):", ""] + [f"- {x}" for x in served]
    if errors := [r for r in report.results if r.error]:
        lines += ["", "Served models that failed:", ""] + [f"- {r.name}: {r.error}" for r in errors]
    failed = [r for r in report.results if r.missed_parity and r.parity is not None]
    if failed:
        lines += ["", "Parity misses and undecided bounds:", ""] + [
            f"- {r.name}: {'; '.join(r.parity.problems())}" for r in failed]
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


__all__ = ["BackendResult", "BenchRow", "print_table", "rows", "to_csv", "to_json", "to_markdown"]
