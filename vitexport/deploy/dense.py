"""`vitexport predict` for a dense model: each image's map at the image's own size, as the library's processor
post-processes it, and the files people look at and programs read, written as the batches come (memory holds a
few batches whatever the number of images):

- depth (`predicted_depth`): resized to the image's size bicubically (align_corners False, no clamp: the
  processor's post_process_depth_estimation); `<stem>.depth.npy` (float32, the model's own units),
  `<stem>.depth.png` (16-bit: value = depth x scale, the scale in the JSON line, 0 = no depth) and
  `<stem>.depth.color.png` (the map normalised per image, colour-mapped: near is bright for a relative model's
  disparity, far is bright for metric depth);
- segmentation (`logits`, EoMT's `semantic_probs`): resized bilinearly (align_corners False) to the image's size,
  argmax (post_process_semantic_segmentation), the padding of an EoMT input cut off first (transformers'
  post-processing stretches the padded map over the image instead); `<stem>.seg.png` (a palette PNG of class indices), `<stem>.overlay.png`
  (the classes' colours over the image) and the share of pixels of each class in the JSON line.

One JSON object per image gives its files and figures (`predict --jsonl` prints them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ..artifacts.folder import ModelFolder
from ..errors import VitexportError
from ..parity.dense import resize_maps
from ..paths import atomic_path, display_path
from ..progress import QUIET, Log

DEPTH_PNG_MAX = 65535


@dataclass
class DenseResult:
    image: str  # as the user named it
    files: dict[str, str] = field(default_factory=dict)  # kind -> path written
    figures: dict = field(default_factory=dict)  # depth: min/max/mean and the PNG's scale; segmentation: shares

    def to_dict(self) -> dict:
        return {"image": self.image, "files": self.files, **self.figures}


def colormap(v: np.ndarray) -> np.ndarray:
    """(H, W) values in [0, 1] -> (H, W, 3) uint8 with the Turbo colour map (Google's polynomial fit of it)."""
    x = np.clip(v, 0.0, 1.0)[..., None] ** np.arange(6)  # (H, W, 6): 1, x, ..., x^5
    coeffs = np.array([[0.13572138, 4.61539260, -42.66032258, 132.13108234, -152.94239396, 59.28637943],
                       [0.09140261, 2.19418839, 4.84296658, -14.18503333, 4.27729857, 2.82956604],
                       [0.10667330, 12.64194608, -60.58204836, 110.36276771, -89.90310912, 27.34824973]])
    return (np.clip(x @ coeffs.T, 0.0, 1.0) * 255).round().astype(np.uint8)


def palette(classes: int) -> np.ndarray:
    """A distinct colour per class (PASCAL VOC's bit-interleaved palette), (classes, 3) uint8."""
    out = np.zeros((classes, 3), np.uint8)
    for c in range(classes):
        v, r, g, b = c, 0, 0, 0
        for bit in range(8):
            r |= ((v >> 0) & 1) << (7 - bit)
            g |= ((v >> 1) & 1) << (7 - bit)
            b |= ((v >> 2) & 1) << (7 - bit)
            v >>= 3
        out[c] = (r, g, b)
    return out


def _save_png(img, path: Path) -> None:
    with atomic_path(path, suffix=".png") as tmp:
        img.save(tmp, format="PNG")


def depth_files(depth: np.ndarray, out: Path, stem: str, metric: bool, max_depth: float) -> tuple[dict, dict]:
    """Write one image's depth (H, W): the .npy, the 16-bit PNG and the colour map; (files, figures)."""
    from PIL import Image

    files = {"npy": out / f"{stem}.depth.npy", "png16": out / f"{stem}.depth.png",
             "color": out / f"{stem}.depth.color.png"}
    with atomic_path(files["npy"], suffix=".npy") as tmp, open(tmp, "wb") as f:
        np.save(f, depth.astype(np.float32))
    top = float(depth.max()) if depth.size else 0.0
    # metric depth: one scale for every image (the model's range fills the PNG); relative: the image's maximum
    scale = DEPTH_PNG_MAX / max_depth if metric else (DEPTH_PNG_MAX / top if top > 0 else 1.0)
    _save_png(Image.fromarray(np.clip(depth * scale, 0, DEPTH_PNG_MAX).round().astype(np.uint16)), files["png16"])
    lo, hi = float(depth.min()), top
    norm = (depth - lo) / (hi - lo) if hi > lo else np.zeros_like(depth)
    _save_png(Image.fromarray(colormap(norm)), files["color"])
    figures = {"depth": {"min": lo, "max": hi, "mean": float(depth.mean()), "png16_scale": scale,
                         "kind": "metric" if metric else "relative"}}
    return {k: display_path(v) for k, v in files.items()}, figures


def segmentation_files(classes_map: np.ndarray, image, out: Path, stem: str, classes: int) -> tuple[dict, dict]:
    """Write one image's class map (H, W): the palette PNG and the overlay; (files, figures)."""
    from PIL import Image

    files = {"classes": out / f"{stem}.seg.png", "overlay": out / f"{stem}.overlay.png"}
    pal = palette(max(classes, 1))
    seg = Image.fromarray(classes_map.astype(np.uint8), mode="P")
    seg.putpalette(pal.flatten().tolist())
    _save_png(seg, files["classes"])
    rgb = np.asarray(image.convert("RGB"), np.float32)
    _save_png(Image.fromarray((0.5 * rgb + 0.5 * pal[classes_map]).round().astype(np.uint8)), files["overlay"])
    counts = np.bincount(classes_map.ravel(), minlength=classes)
    shares = {str(c): float(n) / classes_map.size for c, n in enumerate(counts) if n}
    return {k: display_path(v) for k, v in files.items()}, {"class_shares": shares}


def iter_dense(folder: ModelFolder, images: Sequence[Path | str], out: Path, *, backend: str = "onnxruntime",
               precision: str = "fp32", batch: int = 4, workers: int | None = None,
               log: Log = QUIET) -> Iterator[DenseResult]:
    """Every image's map through one backend, post-processed to the image's size and written to `out`; one
    DenseResult per image, in order. A file of the same name already in `out` is refused before any work."""
    from PIL import Image

    from .predict import _outputs, collect_images

    manifest = folder.read_manifest()
    task = manifest.dense_task
    if task is None:
        raise VitexportError(f"{folder.path} holds no dense model: predict gives its classes or embeddings.")
    files = collect_images(images)
    stems = _stems(files)
    kinds = ("depth.npy", "depth.png", "depth.color.png") if task == "depth" else ("seg.png", "overlay.png")
    refuse_existing(out, stems, kinds)
    dense = manifest.dense
    metric = dense.get("depth_type") == "metric"
    per_image = manifest.img_size_range is not None and manifest.preprocess.multiple_of > 0
    outputs = _own_sizes(folder, manifest, files, backend, precision, log) if per_image else \
        _outputs(folder, manifest, files, backend, precision, batch, workers, log, dense_shape=True)
    i = 0
    for chunk, maps in outputs:
        for f, m in zip(chunk, maps):
            with Image.open(f) as img:
                size = (img.height, img.width)
                if task == "depth":
                    depth = resize_maps(m[None], size, "bicubic")[0]
                    written, figures = depth_files(depth, out, stems[i], metric, float(dense.get("max_depth", 1)))
                else:
                    # the map over the image alone (EoMT's input is padded below and right of it)
                    classes = resize_maps(manifest.preprocess.image_part(m, size), size, "bilinear").argmax(0)
                    written, figures = segmentation_files(classes, img, out, stems[i], m.shape[0])
            yield DenseResult(display_path(f), written, figures)
            i += 1


def _own_sizes(folder: ModelFolder, manifest, files: list[Path], backend: str, precision: str,
               log: Log) -> Iterator[tuple[list[Path], list[np.ndarray]]]:
    """Each image at its own size, as DPT's processor with keep_aspect_ratio sizes it (Preprocess.aspect_size),
    through a dynamic-size graph one at a time; one sentence for an image whose size is outside the export's
    range."""
    from dataclasses import replace

    from PIL import Image

    from ..artifacts.workspace import reading
    from ..data.images import ImageError, normalise, resize_and_crop
    from ..ensure import ensure_artifact
    from .predict import open_runner

    pp = manifest.preprocess
    (h0, w0), (h1, w1) = manifest.img_size_range
    if backend in ("onnxruntime", "openvino"):
        ensure_artifact(folder, precision, log=log)
    with reading(folder, log):
        runner = open_runner(folder, backend, precision, log)
    try:
        with log.bar("predicting", len(files)) as advance:
            for f in files:
                try:
                    with Image.open(f) as img:
                        w, h = pp.aspect_size(*img.size)
                        if not (h0 <= h <= h1 and w0 <= w <= w1):
                            raise VitexportError(f"{display_path(f)} is resized to {h}x{w} as the model's processor "
                                                 f"does, outside this export's {h0}x{w0} to {h1}x{w1}; export it "
                                                 f"with a wider --img-size-range.")
                        crop = resize_and_crop(img, replace(pp, input_size=(h, w), crop_mode="squash", crop_pct=1.0))
                except OSError as e:
                    raise ImageError(f, "unreadable", str(e), "check the file") from None
                x = normalise(np.asarray(crop, np.uint8)[None], pp)
                yield [f], list(np.asarray(runner.infer_all(x, chunk=1), np.float32))
                advance(1)
    finally:
        runner.close()


def refuse_existing(out: Path, stems: Sequence[str], kinds: Sequence[str]) -> None:
    """One sentence, before any work, when a file `out/<stem>.<kind>` of these images already exists: nothing is
    overwritten."""
    clash = [out / f"{s}.{k}" for s in stems for k in kinds if (out / f"{s}.{k}").exists()]
    if clash:
        raise VitexportError(f"{display_path(clash[0])} already exists ({len(clash)} file(s) of these images in "
                             f"{display_path(out)}); give another --out-dir or remove them.")


def _stems(files: list[Path]) -> list[str]:
    """A file name stem per image, made unique by its position when two images share one."""
    stems = [f.stem for f in files]
    seen: dict[str, int] = {}
    out = []
    for s in stems:
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.append(s if stems.count(s) == 1 else f"{s}-{n + 1}")
    return out
