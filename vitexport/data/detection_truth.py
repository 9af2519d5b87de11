"""A detection data set's ground truth: COCO's `instances_*.json` (`bench --annotations FILE`), or YOLO's labels (a
`.txt` beside each image, or in the `labels/` folder beside an `images/` one: a line `class cx cy w h`, normalised to
the image), read into boxes x0, y0, x1, y1 in the image's pixels with the model's label indices.

The set's categories become the model's labels by name when the model's checkpoint names its classes and the set's
names are among them (COCO's ids are not RF-DETR's or DEIMv2's indices alike), else by number (a COCO category id,
a YOLO class index, taken as the model's label index), which the log says. A file that cannot be read, a box outside
its image or a category no label takes is one sentence naming the file (or is left out, named, where the set goes
on without it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import VitexportError


@dataclass
class BoxTruth:
    """One image's truth: boxes (n, 4) x0, y0, x1, y1 in pixels, the model's label of each (n,), crowd flags (n,),
    areas (n,: COCO's `area`, else w x h), and the image's (height, width)."""

    boxes: np.ndarray
    labels: np.ndarray
    crowd: np.ndarray
    area: np.ndarray
    size: tuple[int, int]


@dataclass
class DetectionTruth:
    """Per image of a set (in its order) its truth or None, how the categories were read, and the files left out."""

    items: list[BoxTruth | None]
    how: str
    skipped: list[str]

    def read(self, i: int) -> BoxTruth | None:
        return self.items[i]


def category_map(names: dict[int, str], model_names: list[str], num_labels: int, named: bool,
                 where: str) -> tuple[dict[int, int], str]:
    """The set's category id -> the model's label index, and how ('by name' | 'by number')."""
    lower = {n.lower(): i for i, n in enumerate(model_names)}
    if named and names and all(n.lower() in lower for n in names.values()):
        return {c: lower[n.lower()] for c, n in names.items()}, "by name"
    bad = [c for c in names if not 0 <= c < num_labels]
    if bad:
        raise VitexportError(f"{where}: categories {bad[:5]} are not among the model's {num_labels} labels by "
                             f"number, and their names are not the model's class names.")
    return {c: c for c in names}, "by number"


def _boxes(rows: list[list[float]], size: tuple[int, int], where: str) -> np.ndarray:
    b = np.asarray(rows, np.float64).reshape(-1, 4)
    if not np.isfinite(b).all() or (b[:, 2:] < b[:, :2]).any():
        raise VitexportError(f"{where} has a box that is not finite or has a negative size.")
    h, w = size
    tol = 1.0  # a pixel of slack: annotation tools round
    if (b[:, :2] < -tol).any() or (b[:, 2] > w + tol).any() or (b[:, 3] > h + tol).any():
        raise VitexportError(f"{where} has a box outside its {w}x{h} image.")
    return b


def read_coco(path: Path, files: list[Path], root: Path, model_names: list[str], num_labels: int,
              named: bool) -> DetectionTruth:
    """COCO's instances JSON for the images `files` of the folder `root` (matched by their path under it, else
    their file name); an image the file does not list has no truth (None)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        images = {int(im["id"]): (str(im["file_name"]), (int(im["height"]), int(im["width"])))
                  for im in data["images"]}
        cats = {int(c["id"]): str(c.get("name", c["id"])) for c in data["categories"]}
        anns = data["annotations"]
        if not isinstance(anns, list):
            raise TypeError("annotations is not a list")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VitexportError(f"{path} cannot be read as JSON ({getattr(e, 'strerror', None) or e}).") from None
    except (KeyError, TypeError, ValueError) as e:
        raise VitexportError(f"{path} is not COCO's instances format (images, categories, annotations: {e}).") \
            from None
    mapping, how = category_map(cats, model_names, num_labels, named, str(path))
    per_image: dict[int, list[dict]] = {}
    for a in anns:
        try:
            per_image.setdefault(int(a["image_id"]), []).append(a)
        except (KeyError, TypeError, ValueError):
            raise VitexportError(f"{path} has an annotation without an image_id.") from None
    by_path = {name: i for i, (name, _) in images.items()}
    by_name = {Path(name).name: i for i, (name, _) in images.items()}
    items: list[BoxTruth | None] = []
    for f in files:
        rel = f.relative_to(root).as_posix() if f.is_relative_to(root) else f.name
        image_id = by_path.get(rel, by_name.get(f.name))
        if image_id is None:
            items.append(None)
            continue
        size, rows, labels, crowd, area = images[image_id][1], [], [], [], []
        for a in per_image.get(image_id, []):
            try:
                x, y, w, h = (float(v) for v in a["bbox"])
                c = int(a["category_id"])
            except (KeyError, TypeError, ValueError):
                raise VitexportError(f"{path}: an annotation of {rel} has no bbox [x, y, w, h] or category_id.") \
                    from None
            if c not in mapping:
                raise VitexportError(f"{path}: an annotation of {rel} has the category {c}, which the file's "
                                     f"categories do not list.")
            rows.append([x, y, x + w, y + h])
            labels.append(mapping[c])
            crowd.append(bool(a.get("iscrowd", 0)))
            area.append(float(a.get("area", w * h)))
        items.append(BoxTruth(_boxes(rows, size, f"{path} ({rel})"), np.asarray(labels, np.int64),
                              np.asarray(crowd, bool), np.asarray(area, np.float64), size))
    return DetectionTruth(items, how, [])


def yolo_label_file(image: Path) -> Path | None:
    """The YOLO label file of an image: IMAGE.txt beside it, or labels/<name>.txt for an image under images/."""
    beside = image.with_suffix(".txt")
    if beside.is_file():
        return beside
    parts = list(image.parts)
    if "images" in parts:
        i = len(parts) - 1 - parts[::-1].index("images")
        other = Path(*parts[:i], "labels", *parts[i + 1:]).with_suffix(".txt")
        if other.is_file():
            return other
    return None


def _yolo_names(root: Path) -> dict[int, str] | None:
    """classes.txt (one name a line) in the set's folder, when there is one."""
    p = root / "classes.txt"
    if not p.is_file():
        return None
    try:
        lines = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise VitexportError(f"{p} cannot be read as text ({getattr(e, 'strerror', None) or e}).") from None
    return dict(enumerate(lines))


def read_yolo(files: list[Path], root: Path, model_names: list[str], num_labels: int,
              named: bool) -> DetectionTruth | None:
    """YOLO labels of the images `files`; None when no image has one. A label file that cannot be read is named and
    its image left without truth."""
    from PIL import Image

    labels = [yolo_label_file(f) for f in files]
    if not any(p is not None for p in labels):
        return None
    names = _yolo_names(root)
    skipped: list[str] = []
    rows_all: list[tuple[int, list[list[float]], list[int], tuple[int, int]]] = []
    seen: set[int] = set()
    for i, (f, p) in enumerate(zip(files, labels)):
        if p is None:
            continue
        try:
            with Image.open(f) as im:
                size = (im.height, im.width)
            lines = [ln.split() for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
            cls = [int(ln[0]) for ln in lines]
            vals = [[float(v) for v in ln[1:5]] for ln in lines]
            if any(len(ln) < 5 for ln in lines) or any(c < 0 for c in cls) or not np.isfinite(vals).all():
                raise ValueError("a line is not 'class cx cy w h'")
        except (OSError, UnicodeDecodeError, ValueError) as e:
            skipped.append(f"{p} ({getattr(e, 'strerror', None) or e})")
            continue
        h, w = size
        rows = [[(cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h]
                for cx, cy, bw, bh in vals]
        rows_all.append((i, rows, cls, size))
        seen.update(cls)
    cats = names if names is not None else {c: str(c) for c in sorted(seen)}
    missing = sorted(seen - set(cats))
    if missing:
        raise VitexportError(f"{root / 'classes.txt'} names {len(cats)} classes; the labels use class {missing[0]}.")
    mapping, how = category_map(cats, model_names, num_labels, named and names is not None, str(root))
    items: list[BoxTruth | None] = [None] * len(files)
    for i, rows, cls, size in rows_all:
        b = _boxes(rows, size, str(labels[i]))
        items[i] = BoxTruth(b, np.asarray([mapping[c] for c in cls], np.int64), np.zeros(len(b), bool),
                            (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]), size)
    return DetectionTruth(items, how, skipped)


__all__ = ["BoxTruth", "DetectionTruth", "category_map", "read_coco", "read_yolo", "yolo_label_file"]
