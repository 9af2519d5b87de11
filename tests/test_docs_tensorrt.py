"""docs/TENSORRT.md states the parity bounds the code applies: its threshold table equals compare.DEFAULT_THRESHOLDS,
and no other sentence there states a cosine bound of its own."""

from __future__ import annotations

import re

from conftest import ROOT

from vitexport.parity.compare import DEFAULT_THRESHOLDS

DOC = ROOT / "docs" / "TENSORRT.md"
COLUMNS = {"max abs": "max_abs", "min cosine": "cos_min", "mean cosine": "cos_mean",
           "top-1 agreement": "top1_agree", "top-1 accuracy drop (labelled data)": "acc_drop"}


def _table(text: str) -> tuple[list[str], list[list[str]], str]:
    start = text.index("<!-- thresholds:")
    end = text.index("<!-- end thresholds -->")
    block = text[start:end]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in block.splitlines()[1:]
            if line.startswith("|")]
    return rows[0], [r for r in rows[2:]], text[:start] + text[end:]


def _value(cell: str) -> float | None:
    if cell in ("–", "-", ""):
        return None
    m = re.fullmatch(r"(?:≤|≥|<=|>=)\s*([0-9.eE+-]+)", cell)
    assert m, f"unreadable cell {cell!r}"
    return float(m.group(1))


def test_the_threshold_table_is_the_code():
    header, rows, _ = _table(DOC.read_text())
    assert header[0] == "precision" and set(header[1:]) == set(COLUMNS), header
    documented = {row[0]: {COLUMNS[h]: _value(c) for h, c in zip(header[1:], row[1:])} for row in rows}
    assert set(documented) == {"fp32", "fp16", "int8", "fp8"}
    for precision, bounds in documented.items():
        code = DEFAULT_THRESHOLDS[precision]
        assert bounds == {f: getattr(code, f) for f in COLUMNS.values()}, (precision, bounds, code)


def test_no_other_cosine_bound_is_stated():
    _, _, rest = _table(DOC.read_text())
    stray = re.findall(r"cosine\s*(?:>=|≥|>)\s*[0-9.]+", rest)
    assert not stray, stray
