"""Label files for a flat folder of images, in the forms data sets come with.

- CSV, TSV or whitespace-separated lines of `file,label` (whitespace: the label is the last word): the file name with or without its extension (or a path
  relative to the data folder), the label a class index, a WordNet synset or a class name; a header line is
  recognised and skipped.
- ImageNet's `LOC_val_solution.csv` (`ImageId,PredictionString`): the label is the first word of the prediction
  string, a synset (the boxes after it are ignored).
- ImageNet-ReaL's `real.json`: a list, the n-th entry the ReaL classes of `ILSVRC2012_val_<n:08d>` (an empty list:
  no ReaL label), as timm's `RealLabelsImagenet` reads it.

Nothing here knows the model: labels stay strings until validate.labels maps them onto the head's classes.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import VitexportError

HEADER_KEYS = {"file", "filename", "file_name", "image", "image_id", "imageid", "img", "name", "path", "id"}
LABEL_KEYS = {"label", "labels", "class", "class_id", "classid", "target", "synset", "predictionstring", "category"}
MAX_BYTES = 256 << 20  # a label file is text: 50,000 ImageNet rows are 10 MB


@dataclass
class LabelFile:
    """One label file: `labels` maps a key (file name without extension, or relative path without it) to a label
    string; `real` maps a key to ReaL's class indices."""

    path: Path
    labels: dict[str, str] | None = None
    real: dict[str, list[int]] | None = None

    @property
    def keys(self) -> dict:
        return self.labels if self.labels is not None else self.real or {}


def file_key(name: str) -> str:
    """A label file's name for an image: without its image extension, '/'-separated."""
    from .images import IMAGE_SUFFIXES

    name = name.strip().replace("\\", "/")
    name = name[2:] if name.startswith("./") else name
    p = Path(name)
    return str(p.with_suffix("")) if p.suffix.lower() in IMAGE_SUFFIXES else name


def read_label_file(path: Path | str) -> LabelFile:
    """A label file (see the module docstring); one sentence when it is not one."""
    path = Path(path)
    try:
        if not path.is_file():
            raise VitexportError(f"Label file {path} does not exist." if not path.exists()
                                 else f"Label file {path} is not a file.")
        if path.stat().st_size > MAX_BYTES:
            raise VitexportError(f"Label file {path} is larger than {MAX_BYTES >> 20} MB; is it a label file?")
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise VitexportError(f"Label file {path} is not UTF-8 text.") from None
    except OSError as e:
        raise VitexportError(f"Cannot read label file {path}: {e.strerror or e}.") from None
    if path.suffix.lower() == ".json":
        return LabelFile(path, real=_real(path, text))
    return LabelFile(path, labels=_rows(path, text))


def _real(path: Path, text: str) -> dict[str, list[int]]:
    try:
        data = json.loads(text)
    except ValueError as e:
        raise VitexportError(f"Label file {path} is not valid JSON ({e}).") from None
    if not isinstance(data, list) or not all(isinstance(r, list) and all(isinstance(c, int) and not isinstance(c, bool)
                                                                          and c >= 0 for c in r) for r in data):
        raise VitexportError(f"Label file {path} is not ImageNet-ReaL's real.json: a list with, per validation image, "
                             "a list of class indices.")
    if not data:
        raise VitexportError(f"Label file {path} is an empty list: it labels no image.")
    return {f"ILSVRC2012_val_{i + 1:08d}": list(r) for i, r in enumerate(data)}


def _split(line: str) -> list[str]:
    if "\t" in line:
        return next(csv.reader([line], delimiter="\t"))
    if "," in line:
        return next(csv.reader([line]))
    return line.rsplit(None, 1)  # the label last: a file name may hold spaces


def _rows(path: Path, text: str) -> dict[str, str]:
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise VitexportError(f"Label file {path} is empty.")
    out: dict[str, str] = {}
    for n, line in enumerate(lines, 1):
        row = [c.strip() for c in _split(line)]
        if n == 1 and len(row) >= 2 and (row[0].lower() in HEADER_KEYS or row[1].lower() in LABEL_KEYS):
            continue  # a header
        if len(row) < 2 or not row[0] or not row[1].split():
            raise VitexportError(f"Line {n} of label file {path} is not 'file,label': {line.strip()[:80]!r}.")
        key, label = file_key(row[0]), row[1].split()[0]  # LOC_val_solution: the synset before the boxes
        if out.get(key, label) != label:
            raise VitexportError(f"Label file {path} gives {row[0]} two labels ({out[key]} and {label}).")
        out[key] = label
    if not out:
        raise VitexportError(f"Label file {path} has a header and no labels.")
    return out


def match(files: list[Path], root: Path, table: dict) -> list:
    """Each file's entry in `table` (None where it has none): by its path relative to `root` without the
    extension when the table's keys hold folders, else by its name without the extension."""
    by_path = any("/" in k for k in table)
    out = []
    for f in files:
        rel = f.relative_to(root) if f.is_relative_to(root) else Path(f.name)
        key = str(rel.with_suffix("")) if by_path else f.stem
        out.append(table.get(key))
    return out
