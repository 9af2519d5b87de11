"""The bench report's files: JSON, Markdown and CSV (rendered by `report.py`), the page (`html.py`) and the PNG plot
(`plot.py`, matplotlib imported only for a plot), each written atomically; the page and the plot are rendered from
the dict the JSON holds."""

from __future__ import annotations

import json
from pathlib import Path

from ..paths import write_text_atomic
from .report import to_csv, to_json, to_markdown
from .run import BenchReport


def write_outputs(report: BenchReport, json_path=None, markdown_path=None, csv_path=None, plot_path=None,
                  html_path=None) -> list[Path]:
    """Each report file asked for (None: not written); the paths written, in that order."""
    written = []
    for path, render in ((json_path, to_json), (markdown_path, to_markdown), (csv_path, to_csv)):
        if path:
            write_text_atomic(Path(path), render(report))
            written.append(Path(path))
    d = json.loads(to_json(report)) if plot_path or html_path else {}  # what the JSON holds, NaN as null
    if plot_path:
        from .plot import plot  # matplotlib, only for a plot

        plot(d, Path(plot_path))
        written.append(Path(plot_path))
    if html_path:
        from .html import render as page

        write_text_atomic(Path(html_path), page(d))
        written.append(Path(html_path))
    return written
