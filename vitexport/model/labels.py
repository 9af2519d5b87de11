"""Class names of a model's head, and where they came from.

In order of preference: the names the checkpoint carries (transformers' `id2label`, timm's `label_names` /
`label_descriptions`), ImageNet-1k's names for a 1000-class head (shipped in `resources/`, see its SOURCES.md),
`0`-`9` for the digits model, otherwise the class indices. The export records the choice in the manifest
(`Manifest.labels`), so `predict` and `triton` name classes the same way.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..artifacts.manifest import LabelsRecord, Manifest
from .variants import DIGITS_VARIANT

IMAGENET_LABELS = Path(__file__).resolve().parents[1] / "resources" / "imagenet1k_labels.tsv"
SOURCES = ("checkpoint", "imagenet-1k", "digits", "indices")
_PLACEHOLDER = re.compile(r"LABEL_\d+")  # transformers' id2label when a model was saved without names


@lru_cache(maxsize=1)
def _imagenet() -> tuple[tuple[str, str], ...]:
    """(synset, lemmas) of ImageNet-1k's classes, in head order."""
    rows = [line.split("\t", 1) for line in IMAGENET_LABELS.read_text().splitlines() if line]
    return tuple((r[0], r[1]) for r in rows)


def imagenet_synsets() -> list[str]:
    """ImageNet-1k's WordNet synsets (`n01440764`), in head order."""
    return [synset for synset, _ in _imagenet()]


def imagenet_names() -> list[str]:
    return [lemmas for _, lemmas in _imagenet()]


def checkpoint_labels(config: dict[str, Any]) -> list[str] | None:
    """Class names a checkpoint's config.json carries, in head order; None when it names none."""
    id2label = config.get("id2label")
    if isinstance(id2label, dict) and id2label:
        try:
            names = [str(id2label[k]) for k in sorted(id2label, key=int)]
        except (TypeError, ValueError):
            return None
        return None if all(_PLACEHOLDER.fullmatch(n) for n in names) else names
    pcfg = config.get("pretrained_cfg") if isinstance(config.get("pretrained_cfg"), dict) else {}
    names = config.get("label_names") or pcfg.get("label_names")
    descriptions = config.get("label_descriptions") or pcfg.get("label_descriptions") or {}
    if isinstance(names, dict):  # timm allows {index: name} when indices have gaps
        try:
            names = [names[k] for k in sorted(names, key=int)]
        except (TypeError, ValueError):
            return None
    if not isinstance(names, list) or not names:
        return None
    if not descriptions and len(names) == 1000 and names == [s for s, _ in _imagenet()]:
        return imagenet_names()  # ImageNet synsets without descriptions: their lemmas
    return [str(descriptions.get(n, n)) if isinstance(descriptions, dict) else str(n) for n in names]


def head_classes(num_classes: int, dense: Any) -> int:
    """The classes a model names: its classifier's, or a detector's labels (its head's config, or its dict)."""
    if num_classes > 0 or dense is None:
        return num_classes
    get = dense.get if isinstance(dense, dict) else (lambda k, d=None: getattr(dense, k, d))
    return int(get("num_labels", 0) or 0) if get("task") == "detection" else 0


def labels_record(num_classes: int, variant: str, names: list[str] | None = None) -> LabelsRecord | None:
    """Where this head's class names come from; None for a model that outputs features."""
    if num_classes <= 0:
        return None
    if names is not None and len(names) == num_classes:
        return LabelsRecord("checkpoint", list(names))
    if num_classes == 1000:
        return LabelsRecord("imagenet-1k")
    if variant == DIGITS_VARIANT and num_classes == 10:
        return LabelsRecord("digits")
    return LabelsRecord("indices")


def class_names(manifest: Manifest) -> list[str]:
    """One name per class of the model's head ([] for features); exports older than the labels field get the
    names an export would record now."""
    n = head_classes(manifest.num_classes, manifest.dense)
    record = manifest.labels or labels_record(n, manifest.variant)
    if record is None or n <= 0:
        return []
    if record.source == "checkpoint" and record.names and len(record.names) == n:
        return list(record.names)
    if record.source == "imagenet-1k" and n == 1000:
        return imagenet_names()
    return [str(i) for i in range(n)]  # digits: the class index is the digit
