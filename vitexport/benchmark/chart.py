"""The report's charts, from the report's dict (the JSON's data): the accuracy/throughput points with their Pareto
front, and each timed row's latency distribution. One style for the PNG (`plot.py`) and the page (`html.py`): a
colour per precision, a marker per backend, so no two rows look alike and each reads at a glance. Drawn here as
SVG: a page needs no plotting library and no network."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

# a colour per precision (Okabe-Ito: distinct for colour-blind readers too), a marker per backend
PRECISION_COLOURS = {"fp32": "#0072B2", "bf16": "#009E73", "fp16": "#E69F00", "int8": "#D55E00", "fp8": "#CC79A7"}
OTHER_COLOUR = "#555555"
MARKERS = {"pytorch": "o", "aoti": "P", "onnxruntime": "s", "openvino": "D", "tensorrt": "^", "served": "v"}
MARKER_NAMES = {"o": "PyTorch", "P": "PyTorch compiled (AOTInductor)", "s": "ONNX Runtime", "D": "OpenVINO",
                "^": "TensorRT", "v": "served endpoint"}


@dataclass
class Point:
    label: str  # 'onnxruntime cpu int8 b8'
    precision: str
    marker: str
    x: float  # images / s
    y: float  # percent
    lo: float | None
    hi: float | None


def marker(result: dict) -> str:
    if result.get("provider") == "aoti":
        return "P"
    if result["backend"] not in ("pytorch", "onnxruntime", "openvino", "tensorrt"):
        return "v"
    return MARKERS[result["backend"]]


def colour(precision: str) -> str:
    return PRECISION_COLOURS.get(precision, OTHER_COLOUR)


def y_figure(d: dict) -> tuple[str, str]:
    """(the parity field the chart's y axis shows, its axis title) for this report: accuracy on labelled data, a
    dense model's task figure against the reference, an embedding's k-NN or neighbour agreement, else top-1
    agreement with the reference."""
    data, dense = d["data"], next((r["parity"].get("dense") for r in d["results"] if r.get("parity")), None)
    if dense:
        return {"depth": ("delta1", "delta1 against the reference, %"),
                "segmentation": ("pixel_agree", "pixel agreement with the reference, %"),
                "masks": ("mask_iou", "mask IoU against the reference's masks, %"),
                "detection": ("map", "mAP against the reference's detections, %")}[dense]
    if data.get("embeddings"):
        return ("knn_acc", "k-NN top-1, %") if data["embeddings"].get("labelled") else \
            ("neighbour_agree", "nearest neighbour the reference's, %")
    return ("acc", "top-1 accuracy, %") if data.get("labelled") else ("top1_agree", "top-1 agreement with the "
                                                                                    "reference, %")


def points(d: dict) -> list[Point]:
    """One point per available row and batch (and concurrency) that was timed and has the figure."""
    field_name, _ = y_figure(d)
    out = []
    for r in d["results"]:
        par = r.get("parity") or {}
        y = par.get(field_name)
        if not r.get("available") or y is None or (isinstance(y, float) and math.isnan(y)):
            continue
        ci = par.get(f"{field_name}_ci") or [None, None]
        for lat in r.get("latency") or []:
            if lat.get("throughput"):
                conc = f" x{lat['concurrency']}" if lat.get("concurrency") else ""
                out.append(Point(f"{r['name']} b{lat['batch']}{conc}", r["precision"], marker(r), lat["throughput"],
                                 y * 100, None if ci[0] is None else ci[0] * 100,
                                 None if ci[1] is None else ci[1] * 100))
    return out


def pareto(pts: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (throughput, accuracy) points no other point beats on both, by throughput."""
    front, best = [], -math.inf
    for x, y in sorted(pts, key=lambda p: (-p[0], -p[1])):
        if y > best:
            front.append((x, y))
            best = y
    return sorted(front)


# -- SVG ---------------------------------------------------------------------------------------------------------

def _shape(m: str, x: float, y: float, fill: str, r: float = 5.5) -> str:
    if m == "o":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{fill}" stroke="#000" stroke-width="0.6"/>'
    pts = {"s": [(-1, -1), (1, -1), (1, 1), (-1, 1)], "D": [(0, -1.3), (1.3, 0), (0, 1.3), (-1.3, 0)],
           "^": [(0, -1.3), (1.2, 1), (-1.2, 1)], "v": [(0, 1.3), (1.2, -1), (-1.2, -1)],
           "P": [(-.4, -1.2), (.4, -1.2), (.4, -.4), (1.2, -.4), (1.2, .4), (.4, .4), (.4, 1.2), (-.4, 1.2),
                 (-.4, .4), (-1.2, .4), (-1.2, -.4), (-.4, -.4)]}[m]
    s = r * 0.85
    poly = " ".join(f"{x + a * s:.1f},{y + b * s:.1f}" for a, b in pts)
    return f'<polygon points="{poly}" fill="{fill}" stroke="#000" stroke-width="0.6"/>'


def _log_ticks(lo: float, hi: float) -> list[float]:
    ticks = []
    for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        ticks += [m * 10 ** e for m in (1, 2, 5) if lo <= m * 10 ** e <= hi]
    return ticks or [lo, hi]


def _nice(v: float) -> str:
    return f"{v:,.0f}" if v >= 10 else f"{v:g}"


def pareto_svg(d: dict, width: int = 880, height: int = 440) -> str:
    """Accuracy (or agreement) against throughput, log x; a point per row and batch with its 95 % interval, the
    Pareto front dashed and its points named; legends of colours (precision) and markers (backend) beside it."""
    pts = points(d)
    _, title = y_figure(d)
    if not pts:
        return '<p class="none">No row was both timed and judged by this figure: nothing to chart.</p>'
    left, right, top, bottom = 60, 250, 16, 46
    pw, ph = width - left - right, height - top - bottom
    xs = [p.x for p in pts]
    x0, x1 = min(xs) / 1.25, max(xs) * 1.25
    ys = [v for p in pts for v in (p.y, p.lo, p.hi) if v is not None]
    y0, y1 = min(ys), max(ys)
    pad = max((y1 - y0) * 0.12, 0.05)
    y0, y1 = y0 - pad, min(y1 + pad, 100.0 + pad / 2)

    def sx(v):
        return left + (math.log10(v) - math.log10(x0)) / (math.log10(x1) - math.log10(x0)) * pw

    def sy(v):
        return top + (y1 - v) / (y1 - y0) * ph

    out = [f'<svg class="chart" id="pareto" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)} against images per second">',
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fff" stroke="#999"/>']
    for t in _log_ticks(x0, x1):
        out.append(f'<line x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{top}" y2="{top + ph}" stroke="#eee"/>'
                   f'<text x="{sx(t):.1f}" y="{top + ph + 16}" text-anchor="middle">{_nice(t)}</text>')
    for i in range(6):
        v = y0 + (y1 - y0) * i / 5
        if v > 100 + 1e-9:  # the axis's headroom above 100 %: no tick there
            continue
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{sy(v):.1f}" y2="{sy(v):.1f}" stroke="#eee"/>'
                   f'<text x="{left - 6}" y="{sy(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 8}" text-anchor="middle">images / s (log scale)</text>'
               f'<text transform="translate(14,{top + ph / 2}) rotate(-90)" text-anchor="middle">'
               f'{escape(title)}</text>')
    front = pareto([(p.x, p.y) for p in pts])
    if len(front) > 1:
        out.append('<polyline class="front" fill="none" stroke="#000" stroke-dasharray="5,4" points="'
                   + " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in front) + '"/>')
    on_front = set(front)
    labelled = 0
    for p in pts:
        c = colour(p.precision)
        if p.lo is not None and p.hi is not None:
            out.append(f'<line x1="{sx(p.x):.1f}" x2="{sx(p.x):.1f}" y1="{sy(p.lo):.1f}" y2="{sy(p.hi):.1f}" '
                       f'stroke="{c}" stroke-width="1.2"/>')
        out.append(f'<g class="point"><title>{escape(p.label)}: {p.x:,.1f} img/s, {p.y:.2f} %</title>'
                   f'{_shape(p.marker, sx(p.x), sy(p.y), c)}</g>')
        if (p.x, p.y) in on_front:  # named, toward the chart's inside, labels of near points stepped apart
            end, dy = sx(p.x) > left + pw * 0.6, 12 + 15 * (labelled % 3)
            labelled += 1
            tx, ty = sx(p.x) + (-10 if end else 10), max(sy(p.y) - dy, top + 10)
            out.append(f'<line x1="{sx(p.x):.1f}" y1="{sy(p.y):.1f}" x2="{tx:.1f}" y2="{ty + 3:.1f}" stroke="#888" '
                       f'stroke-width="0.6"/><text class="front-label" x="{tx:.1f}" y="{ty:.1f}" '
                       f'text-anchor="{"end" if end else "start"}">{escape(p.label)}</text>')
    out.append(_legends({p.precision for p in pts}, {p.marker for p in pts}, left + pw + 16, top + 4))
    out.append("</svg>")
    return "".join(out)


def _legends(precisions: set[str], markers: set[str], x: float, y: float) -> str:
    rows = ['<g class="legend">', f'<text x="{x}" y="{y + 8}" font-weight="bold">precision (colour)</text>']
    y += 24
    for p in sorted(precisions, key=lambda q: list(PRECISION_COLOURS).index(q) if q in PRECISION_COLOURS else 99):
        rows.append(f'<rect x="{x}" y="{y - 9}" width="12" height="12" fill="{colour(p)}"/>'
                    f'<text x="{x + 18}" y="{y + 1}">{escape(p)}</text>')
        y += 18
    y += 10
    rows.append(f'<text x="{x}" y="{y}" font-weight="bold">backend (marker)</text>')
    y += 18
    for m in sorted(markers, key=list(MARKER_NAMES).index):
        rows.append(_shape(m, x + 6, y - 4, "#bbb") + f'<text x="{x + 20}" y="{y + 1}">{MARKER_NAMES[m]}</text>')
        y += 18
    rows.append(f'<line x1="{x}" x2="{x + 14}" y1="{y}" y2="{y}" stroke="#000" stroke-dasharray="5,4"/>'
                f'<text x="{x + 18}" y="{y + 4}">Pareto front (named)</text></g>')
    return "".join(rows)


def latency_svg(d: dict, width: int = 880) -> str:
    """A line per timed row and batch (not a served load): every kept run as a tick on a log ms axis, p50, p90 and
    p99 marked."""
    lines = [(f"{r['name']} b{lat['batch']}", r["precision"], lat) for r in d["results"] if r.get("available")
             for lat in r.get("latency") or [] if lat.get("samples_ms") and lat.get("concurrency") is None]
    if not lines:
        return '<p class="none">No row kept its runs (a report made before they were kept).</p>'
    left, right, top, row_h = 290, 20, 10, 22
    height = top + row_h * len(lines) + 40
    values = [v for _, _, lat in lines for v in lat["samples_ms"] if v > 0]
    if not values:
        return '<p class="none">No run took a measurable time.</p>'
    x0, x1 = min(values) / 1.2, max(values) * 1.2
    pw = width - left - right

    def sx(v):
        return left + (math.log10(max(v, x0)) - math.log10(x0)) / (math.log10(x1) - math.log10(x0)) * pw

    out = [f'<svg class="chart" id="latency" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="latency per run, ms">']
    for t in _log_ticks(x0, x1):
        out.append(f'<line x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{top}" y2="{height - 34}" stroke="#eee"/>'
                   f'<text x="{sx(t):.1f}" y="{height - 20}" text-anchor="middle">{_nice(t)}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 4}" text-anchor="middle">ms per run (log scale); '
               'ticks: runs; marks: p50 (black), p90, p99</text>')
    for i, (name, precision, lat) in enumerate(lines):
        y = top + row_h * i + row_h / 2
        c = colour(precision)
        out.append(f'<g class="dist"><title>{escape(name)}: p50 {lat["p50_ms"]:.2f} ms, p90 {lat["p90_ms"]:.2f}, '
                   f'p99 {lat["p99_ms"]:.2f} ({lat["iterations"]} runs)</title>'
                   f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">{escape(name)}</text>')
        ticks = sorted({round(sx(v), 1) for v in lat["samples_ms"]})  # one tick per pixel column is enough
        out.append(f'<path d="{"".join(f"M{x:.1f} {y - 6:.1f}v12" for x in ticks)}" stroke="{c}" '
                   'stroke-opacity="0.5"/>')
        for key, col, h in (("p99_ms", "#999", 8), ("p90_ms", "#666", 8), ("p50_ms", "#000", 10)):
            out.append(f'<line x1="{sx(lat[key]):.1f}" x2="{sx(lat[key]):.1f}" y1="{y - h:.1f}" y2="{y + h:.1f}" '
                       f'stroke="{col}" stroke-width="2.5"/>')
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


def served_svg(result: dict, width: int = 560, height: int = 300) -> str:
    """A served row: client p50 and p95 against requests in flight, and the server's queue and compute time per
    request (dashed), ms."""
    lats = sorted((lat for lat in result.get("latency") or [] if lat.get("concurrency")),
                  key=lambda lat: lat["concurrency"])
    series = [("client p50", "p50_ms", "#0072B2", ""), ("client p95", "p95_ms", "#D55E00", ""),
              ("server queue", "server_queue_ms", "#009E73", "4,3"),
              ("server compute", "server_compute_ms", "#CC79A7", "4,3")]
    vals = [lat.get(k) for lat in lats for _, k, _, _ in series if lat.get(k) is not None]
    if not lats or not vals:
        return ""
    left, right, top, bottom = 56, 140, 12, 40
    pw, ph = width - left - right, height - top - bottom
    concs = [lat["concurrency"] for lat in lats]
    c0, c1, y1 = min(concs), max(concs), max(vals) * 1.1 or 1.0

    def sx(c):
        return left + (0.5 if c1 == c0 else (c - c0) / (c1 - c0)) * pw

    def sy(v):
        return top + (1 - v / y1) * ph

    out = [f'<svg class="chart served" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="latency against concurrency">',
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fff" stroke="#999"/>']
    for c in concs:
        out.append(f'<text x="{sx(c):.1f}" y="{top + ph + 16}" text-anchor="middle">{c}</text>')
    for i in range(5):
        v = y1 * i / 4
        out.append(f'<text x="{left - 6}" y="{sy(v) + 4:.1f}" text-anchor="end">{v:.1f}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle">requests in flight</text>'
               f'<text transform="translate(14,{top + ph / 2}) rotate(-90)" text-anchor="middle">ms</text>')
    for k, (name, key, col, dash) in enumerate(series):
        xy = [(sx(lat["concurrency"]), sy(lat[key])) for lat in lats if lat.get(key) is not None]
        if not xy:
            continue
        out.append(f'<polyline fill="none" stroke="{col}" stroke-width="2" stroke-dasharray="{dash}" points="'
                   + " ".join(f"{x:.1f},{y:.1f}" for x, y in xy) + '"/>'
                   + "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{col}"/>' for x, y in xy)
                   + f'<line x1="{left + pw + 12}" x2="{left + pw + 30}" y1="{top + 12 + 18 * k}" '
                   f'y2="{top + 12 + 18 * k}" stroke="{col}" stroke-width="2" stroke-dasharray="{dash}"/>'
                   f'<text x="{left + pw + 36}" y="{top + 16 + 18 * k}">{name}</text>')
    out.append("</svg>")
    return "".join(out)
