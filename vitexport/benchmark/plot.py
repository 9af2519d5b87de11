"""The bench's PNG plot: accuracy (or top-1 agreement, or a dense model's task figure) against throughput, one point
per row and batch, its Pareto front named; the page's chart (chart.py) in matplotlib, with the same colours (one per
precision) and markers (one per backend)."""

from __future__ import annotations

from pathlib import Path

from ..paths import pyplot, save_png
from .chart import MARKER_NAMES, PRECISION_COLOURS, colour, pareto, points, y_figure


def plot(d: dict, path: Path) -> None:
    """`d`: the report's dict (BenchReport.to_dict(), what the JSON holds)."""
    plt = pyplot()
    from matplotlib.lines import Line2D

    pts = points(d)
    _, title = y_figure(d)
    fig, ax = plt.subplots(figsize=(10, 5.5))
    for p in pts:
        err = None if p.lo is None or p.hi is None else [[p.y - p.lo], [p.hi - p.y]]
        ax.errorbar([p.x], [p.y], yerr=err, marker=p.marker, markersize=8, color=colour(p.precision),
                    markeredgecolor="black", markeredgewidth=0.6, capsize=3, linestyle="none")
    front = pareto([(p.x, p.y) for p in pts])
    if len(front) > 1:
        ax.plot([x for x, _ in front], [y for _, y in front], "k--", linewidth=1)
    on_front = set(front)
    for p in pts:
        if (p.x, p.y) in on_front:
            ax.annotate(p.label, (p.x, p.y), textcoords="offset points", xytext=(6, 6), fontsize=7)
    ax.set_xlabel("images / s (log scale)")
    ax.set_ylabel(title)
    ax.set_xscale("log")
    m = d["model"]
    ax.set_title(f"{m['variant']} {m['img_size'][0]}x{m['img_size'][1]} on {d['data']['n_parity']:,} images "
                 "(95% intervals)")
    ax.grid(True, alpha=0.3)
    used_p = [q for q in PRECISION_COLOURS if any(p.precision == q for p in pts)] + \
        sorted({p.precision for p in pts} - set(PRECISION_COLOURS))
    handles = [Line2D([], [], marker="s", linestyle="none", markersize=9, color=colour(q), label=q) for q in used_p]
    handles += [Line2D([], [], marker=m, linestyle="none", markersize=8, color="#bbbbbb", markeredgecolor="black",
                       label=name) for m, name in MARKER_NAMES.items() if any(p.marker == m for p in pts)]
    handles.append(Line2D([], [], color="black", linestyle="--", label="Pareto front (named)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False,
              title="colour: precision; marker: backend", title_fontsize=8)
    fig.tight_layout()
    save_png(fig, path)
