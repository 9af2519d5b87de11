"""`vitexport predict` for Segment Anything: the image encoder on the chosen backend, then the decoder graph
(`decoder.onnx`, FP32, ONNX Runtime) with the user's prompts, post-processed as SAM's processor does
(`post_process_masks`: the low-resolution logits resized bilinearly to the input frame, the padding cut off, resized
to the image's own size, above 0).

Prompts are in the original image's pixels: `--point X,Y[,LABEL]` (1 foreground, the default; 0 background),
repeated, and `--box X0,Y0,X1,Y1`. They are scaled into the encoder's input frame as the processor scales them
(`heads.sam_decoder.prompts_to_inputs`). The graph returns four masks (the single-mask output and three
alternatives); the one SAM's own script would pick (`select_mask`) is drawn on the image. Per image:
`<stem>.mask.png` (the chosen mask, 0/255), `<stem>.mask.K.png` (every mask K = 0..3), `<stem>.mask.overlay.png`
(the chosen mask over the image, the prompts marked), and one JSON line with the files, every mask's predicted IoU,
the chosen index and its share of the image.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ..artifacts.folder import ModelFolder
from ..artifacts.verify import require
from ..errors import VitexportError
from ..paths import display_path
from ..progress import QUIET, Log
from ..parity.masks import postprocess_masks
from ..validate.sam_masks import decode
from .dense import _save_png, _stems, refuse_existing


@dataclass
class MaskResult:
    image: str
    files: dict[str, str] = field(default_factory=dict)
    figures: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"image": self.image, "files": self.files, **self.figures}


def parse_point(text: str) -> tuple[float, float, int]:
    """'X,Y' or 'X,Y,LABEL' (LABEL 1 foreground, 0 background) -> (x, y, label)."""
    parts = [p.strip() for p in text.split(",")]
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        x, y = float(parts[0]), float(parts[1])
        label = int(parts[2]) if len(parts) == 3 else 1
    except ValueError:
        raise VitexportError(f"--point {text!r} is not X,Y or X,Y,LABEL (pixels of the image; LABEL 1 foreground, "
                             f"0 background).") from None
    if label not in (0, 1) or not (np.isfinite(x) and np.isfinite(y)):
        raise VitexportError(f"--point {text!r}: the label is 1 (foreground) or 0 (background), the coordinates "
                             f"finite pixels.")
    return x, y, label


def parse_box(text: str) -> tuple[float, float, float, float]:
    """'X0,Y0,X1,Y1' -> the box, its corners ordered."""
    try:
        v = [float(p) for p in text.split(",")]
        if len(v) != 4 or not all(np.isfinite(v)):
            raise ValueError
    except ValueError:
        raise VitexportError(f"--box {text!r} is not X0,Y0,X1,Y1 (pixels of the image).") from None
    return min(v[0], v[2]), min(v[1], v[3]), max(v[0], v[2]), max(v[1], v[3])


def _overlay(img, mask: np.ndarray, points, box, path: Path) -> None:
    """The mask tinted over the image, foreground points green, background red, the box yellow."""
    from PIL import Image, ImageDraw

    rgb = np.asarray(img.convert("RGB"), np.float32)
    rgb[mask] = 0.45 * rgb[mask] + 0.55 * np.array([30, 144, 255], np.float32)
    out = Image.fromarray(rgb.round().astype(np.uint8))
    draw = ImageDraw.Draw(out)
    r = max(3, round(min(out.size) / 100))
    for x, y, label in points:
        draw.ellipse((x - r, y - r, x + r, y + r), fill=(0, 200, 0) if label else (220, 0, 0), outline=(255, 255, 255))
    if box is not None:
        draw.rectangle(box, outline=(255, 215, 0), width=max(2, r // 2))
    _save_png(out, path)


def iter_masks(folder: ModelFolder, images: Sequence[Path | str], out: Path,
               points: Sequence[tuple[float, float, int]] = (), box: tuple[float, float, float, float] | None = None,
               *, backend: str = "onnxruntime", precision: str = "fp32", batch: int = 4,
               workers: int | None = None, log: Log = QUIET) -> Iterator[MaskResult]:
    """Every image's masks for the prompts, written to `out`; one MaskResult per image, in order. A file of the
    same name already in `out` is refused before any work."""
    from PIL import Image, ImageOps

    from ..backends.ort_session import create_session
    from ..model.heads.sam_decoder import prompts_to_inputs, select_mask
    from .predict import _outputs, collect_images

    manifest = folder.read_manifest()
    if manifest.dense_task != "masks":
        raise VitexportError(f"{folder.path} holds no Segment Anything model with its decoder graph: prompts are "
                             f"for SAM.")
    if not points and box is None:
        raise VitexportError("Give SAM a prompt: --point X,Y[,LABEL] (repeatable) and/or --box X0,Y0,X1,Y1.")
    dense = manifest.dense or {}
    decoder_path = require(folder, "decoder", manifest)
    files = collect_images(images)
    stems = _stems(files)
    refuse_existing(out, stems, ["mask.png", "mask.overlay.png"] + [f"mask.{k}.png" for k in range(4)])
    out.mkdir(parents=True, exist_ok=True)
    session = create_session(decoder_path)
    pp, side, s = manifest.preprocess, int(dense["image_size"]), 4 * int(dense["embedding_size"])
    i = 0
    for chunk, emb in _outputs(folder, manifest, files, backend, precision, batch, workers, log, "image_embeddings",
                               dense_shape=True):
        for f, e in zip(chunk, emb):
            with Image.open(f) as img:
                img = ImageOps.exif_transpose(img) or img  # prompts are in the upright image's pixels
                w, h = img.size
                nw, nh = pp.resized_size(w, h)
                coords, labels = prompts_to_inputs(points, box, (nw / w, nh / h))
                masks, iou = decode(session, e[None], coords[None], labels[None], s)
                full = postprocess_masks(masks[0], side, (min(nh, side), min(nw, side)), (h, w))
                k = select_mask(iou[0], len(labels))
                written = {}
                for j, m in enumerate(full):
                    path = out / f"{stems[i]}.mask.{j}.png"
                    _save_png(Image.fromarray((m * 255).astype(np.uint8)), path)
                    written[f"mask{j}"] = display_path(path)
                chosen = out / f"{stems[i]}.mask.png"
                _save_png(Image.fromarray((full[k] * 255).astype(np.uint8)), chosen)
                overlay = out / f"{stems[i]}.mask.overlay.png"
                _overlay(img, full[k], points, box, overlay)
                written = {"mask": display_path(chosen), "overlay": display_path(overlay), **written}
                figures = {"scores": [float(v) for v in iou[0]], "chosen": k, "area": float(full[k].mean())}
            yield MaskResult(display_path(f), written, figures)
            i += 1
