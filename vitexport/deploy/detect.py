"""`vitexport predict` for a detector: each image's detections at the image's own size, as the library's processor
post-processes them (parity.detections.postprocess: sigmoid, the best top_k over queries x classes, boxes to x0, y0,
x1, y1 in the image's pixels, the scores above --threshold), and the files people look at and programs read,
written as the batches come (memory holds a few batches whatever the number of images):

- `<stem>.boxes.png`: the image with each box, its class name and score drawn on it;
- `detections.json` in --out-dir: COCO's results format, one record per detection (`image_id` the image's position
  from 1, `category_id` the model's label index, `bbox` x, y, w, h in pixels, `score`), beside `images.json`
  naming each image_id's file; written to a temporary and renamed when the last image is done.

One JSON object per image gives its detections and files (`predict --jsonl` prints them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from ..artifacts.folder import ModelFolder
from ..errors import VitexportError
from ..model.labels import class_names
from ..parity.boxes import xyxy_to_xywh
from ..parity.detections import Detections, postprocess, split
from ..paths import atomic_path, display_path
from ..progress import QUIET, Log
from .dense import _save_png, _stems, palette, refuse_existing

RESULTS_FILE, IMAGES_FILE = "detections.json", "images.json"


@dataclass
class DetectionResult:
    image: str  # as the user named it
    image_id: int  # its id in detections.json
    size: tuple[int, int]  # (height, width)
    detections: list[dict] = field(default_factory=list)  # {"label", "name", "score", "box": [x0, y0, x1, y1]}
    files: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"image": self.image, "image_id": self.image_id, "height": self.size[0], "width": self.size[1],
                "detections": self.detections, "files": self.files}


def draw(image, det: Detections, names: list[str], path: Path) -> None:
    """The image with each box outlined in its class's colour, its name and score above it."""
    from PIL import ImageDraw

    img = image.convert("RGB")
    pen = ImageDraw.Draw(img)
    colours = palette(max(len(names), 1) + 1)[1:]  # index 0 of the palette is black
    width = max(2, round(max(img.size) / 300))
    for (x0, y0, x1, y1), label, score in zip(det.boxes.tolist(), det.labels.tolist(), det.scores.tolist()):
        colour = tuple(int(c) for c in colours[label % len(colours)])
        pen.rectangle([x0, y0, x1, y1], outline=colour, width=width)
        text = f"{names[label] if label < len(names) else label} {score:.2f}"
        left, top, right, bottom = pen.textbbox((x0, y0), text)
        y = max(0.0, y0 - (bottom - top) - 2)
        pen.rectangle([x0, y, x0 + (right - left) + 4, y + (bottom - top) + 2], fill=colour)
        pen.text((x0 + 2, y), text, fill=(0, 0, 0) if sum(colour) > 380 else (255, 255, 255))
    _save_png(img, path)


def iter_detections(folder: ModelFolder, images: Sequence[Path | str], out: Path, *, threshold: float | None = None,
                    backend: str = "onnxruntime", precision: str = "fp32", batch: int = 4,
                    workers: int | None = None, log: Log = QUIET) -> Iterator[DetectionResult]:
    """Every image's detections through one backend, at the image's own size, drawn into `out`; the COCO results
    file written when the last is done. Files of the same names already in `out` are refused before any work."""
    from PIL import Image

    from .predict import _outputs, collect_images

    manifest = folder.read_manifest()
    if manifest.dense_task != "detection":
        raise VitexportError(f"{folder.path} holds no detector.")
    d = manifest.dense
    assert d is not None
    threshold = d["threshold"] if threshold is None else threshold
    if not 0 <= threshold <= 1:
        raise VitexportError(f"--threshold {threshold:g} is not a score from 0 to 1.")
    files = collect_images(images)
    stems = _stems(files)
    refuse_existing(out, stems, ("boxes.png",))
    for name in (RESULTS_FILE, IMAGES_FILE):
        if (out / name).exists():
            raise VitexportError(f"{display_path(out / name)} already exists; give another --out-dir or remove it.")
    names = class_names(manifest)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / RESULTS_FILE, suffix=".json") as tmp, open(tmp, "w") as results:
        results.write("[")
        first, listing = True, []
        i = 0
        for chunk, outs in _outputs(folder, manifest, files, backend, precision, batch, workers, log,
                                    dense_shape=True):
            for f, q in zip(chunk, outs):
                with Image.open(f) as img:
                    size = (img.height, img.width)
                    det = postprocess(*split(q[None], d["num_labels"]), [size], d["top_k"], threshold)[0]
                    path = out / f"{stems[i]}.boxes.png"
                    draw(img, det, names, path)
                records = [{"image_id": i + 1, "category_id": int(c), "bbox": [round(float(v), 3) for v in b],
                            "score": round(float(s), 6)}
                           for b, c, s in zip(xyxy_to_xywh(det.boxes), det.labels, det.scores)]
                for r in records:
                    results.write(("" if first else ",") + "\n" + json.dumps(r))
                    first = False
                listing.append({"id": i + 1, "file_name": display_path(f), "height": size[0], "width": size[1]})
                yield DetectionResult(display_path(f), i + 1, size, [
                    {"label": int(c), "name": names[c] if c < len(names) else str(c), "score": float(s),
                     "box": [float(v) for v in b]} for b, c, s in zip(det.boxes, det.labels, det.scores)],
                    {"boxes": display_path(path)})
                i += 1
        results.write("\n]\n")
    with atomic_path(out / IMAGES_FILE, suffix=".json") as tmp:
        Path(tmp).write_text(json.dumps(listing, indent=1))
    log.info(f"wrote {display_path(out / RESULTS_FILE)} (COCO results: category_id is the model's label index) and "
             f"{display_path(out / IMAGES_FILE)} (each image_id's file)")


__all__ = ["DetectionResult", "IMAGES_FILE", "RESULTS_FILE", "draw", "iter_detections"]
