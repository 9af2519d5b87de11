"""The bench's plot: accuracy (or top-1 agreement) against throughput, one point per backend, its Pareto front."""

from __future__ import annotations

import math
from pathlib import Path

from ..paths import pyplot, save_png
from .report import accuracy_columns, rows
from .run import BenchReport


def pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (throughput, accuracy) points no other point beats on both, by throughput."""
    front, best = [], -math.inf
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if y > best:
            front.append((x, y))
            best = y
    return sorted(front)


def plot(report: BenchReport, path: Path) -> None:
    """Accuracy (labelled data) or top-1 agreement with the reference against throughput: one point per backend
    and batch, its 95 % interval as an error bar, and the Pareto front a user chooses from."""
    plt = pyplot()
    labelled, acc_name = accuracy_columns(report.data)
    fig, ax = plt.subplots(figsize=(8, 5))
    points = []
    for row in rows(report):
        if row.throughput is None:
            continue
        y, lo, hi = (row.acc, row.acc_low, row.acc_high) if labelled else \
            (row.top1_agree, row.top1_agree_low, row.top1_agree_high)
        if y is None:
            continue
        err = None if lo is None else [[(y - lo) * 100], [(hi - y) * 100]]
        ax.errorbar([row.throughput], [y * 100], yerr=err, marker="o", capsize=3, linestyle="none",
                    label=f"{row.backend} b{row.batch}" + (f" c{row.concurrency}" if row.concurrency else ""))
        points.append((row.throughput, y * 100))
    front = pareto(points)
    if front:
        ax.plot([p[0] for p in front], [p[1] for p in front], "k--", linewidth=1, label="Pareto front")
    ax.set_xlabel("images / s")
    ax.set_ylabel(f"{acc_name.replace('acc', 'accuracy')}, %" if labelled else "top-1 agreement with the reference, %")
    ax.set_xscale("log")
    m = report.model
    ax.set_title(f"{m['variant']} {m['img_size'][0]}x{m['img_size'][1]} on {report.data['n_parity']:,} images "
                 "(95% intervals)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    save_png(fig, path)
