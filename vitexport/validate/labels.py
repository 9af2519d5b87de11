"""A validation set's labels as the model's class indices.

A set names its classes by class folder or by label file; each name is read, in this order, as a class index
(`3`), a WordNet synset of ImageNet-1k for a 1000-class head (`n01440764`, head order from the shipped table), or
a class name (the checkpoint's `id2label` / timm's label names, any of the comma-separated names of an ImageNet
class, case and `_` ignored; a name two classes share is no name). The first reading that maps every class wins;
when none does, the one that maps the most, and the images of the classes left are skipped and named. A set may
cover any subset of the head's classes: its accuracy is then also given with the logits restricted to the classes
present (as timm does for ImageNet-A and -R).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..model.labels import imagenet_synsets

@dataclass
class ClassMap:
    index: np.ndarray  # per set class: the model's class index, -1 for none
    how: str  # 'class index' | 'WordNet synset' | 'class name' | 'folder order'

    @property
    def unmapped(self) -> list[int]:
        return [i for i, v in enumerate(self.index.tolist()) if v < 0]


def _norm(name: str) -> str:
    return " ".join(name.replace("_", " ").lower().split())


def name_table(names: list[str]) -> dict[str, int]:
    """Normalised class name -> class index: each whole name, and each of its comma-separated names; a name two
    classes share maps to neither."""
    table: dict[str, int] = {}
    shared: set[str] = set()
    for i, full in enumerate(names):
        for n in {_norm(full), *(_norm(p) for p in full.split(",") if p.strip())}:
            if n in table and table[n] != i:
                shared.add(n)
            table.setdefault(n, i)
    return {k: v for k, v in table.items() if k not in shared}


def readers(num_classes: int, names: list[str]) -> list[tuple[str, Callable[[str], int]]]:
    """How a class name can be read, in order: (what, name -> class index or -1)."""
    synsets = {s: i for i, s in enumerate(imagenet_synsets())} if num_classes == 1000 else {}
    by_name = name_table(names)
    return [("class index", lambda c: int(c) if c.isdigit() and int(c) < num_classes else -1),
            ("WordNet synset", lambda c: synsets.get(c, -1)),
            ("class name", lambda c: by_name.get(_norm(c), -1))]


def map_classes(classes: list[str], num_classes: int, names: list[str]) -> ClassMap | None:
    """The model's class of each of a set's classes (see the module docstring); None when no class maps and the set
    does not have exactly one class per output either."""
    best: ClassMap | None = None
    for how, read in readers(num_classes, names):
        m = ClassMap(np.array([read(c) for c in classes], np.int64), how)
        if not m.unmapped:
            return m
        if best is None or len(m.unmapped) < len(best.unmapped):
            best = m
    if best is not None and len(best.unmapped) < len(classes):
        return best
    if len(classes) == num_classes:  # as before names were read: the sorted classes are the head's, in order
        return ClassMap(np.arange(num_classes), "folder order")
    return None


def model_labels(data, num_classes: int, names: list[str] | None = None) -> tuple[np.ndarray | None, str | None]:
    """The labels of a set (a data.images.Dataset or data.stream.ImageSet: `labels` indexing `classes`) as the
    model's class indices, -1 for an image whose class maps to none; or (None, why not)."""
    if data.labels is None or data.classes is None:
        return None, None
    if num_classes <= 0:
        return None, "the model has no classification head"
    m = map_classes(list(data.classes), num_classes, list(names or []))
    if m is None:
        return None, (f"none of its {len(data.classes)} classes is one of the model's {num_classes} by index, "
                      "WordNet synset or class name")
    return m.index[data.labels], None

