"""A validation set streamed in bounded memory: list the images (labels from class folders), take an even subset
when asked, decode each image once per run with a pool of worker threads into an on-disk cache, then read it
back batch by batch for every backend.

Why a cache of 8-bit crops on disk: every backend must see the same inputs, and decoding a JPEG costs more than
a small model's inference, so decoding once per run and reading back is cheaper than decoding per backend; a
resized, center-cropped 8-bit image is exactly what the float input is made from (scale and normalise are applied
per batch), a quarter of its float32 size (150 KB at 224 x 224). It is read with plain reads into one reusable
buffer, not a memory map: a mapped file's pages count in the process's resident memory, a read's page cache does
not. Threads, not processes: Pillow releases the GIL while it decodes and resizes.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..environment import usable_cores
from ..errors import VitexportError
from .images import (ImageError, Skipped, class_folders, class_order, decode_crop, find_inputs, is_labelled, normalise,
                     select)
from .labelfile import LabelFile, match
from .preprocess import Preprocess

Progress = Callable[[int], None]  # called with the number of images just done


@dataclass
class ImageSet:
    """The images of a run, in order, with their class's index into `classes` when a class folder or a label file
    names it."""

    source: str
    files: list[Path]
    labels: np.ndarray | None  # (N,) index into `classes`
    classes: list[str] | None  # class folder names, or the labels of a label file
    total: int  # images in the folder before --max-images
    npy: list[Path] = field(default_factory=list)  # .npy batches of preprocessed inputs instead of images
    skipped: Skipped = field(default_factory=Skipped)  # files left out (listing, then decoding), and why
    label_source: str = ""  # 'class folders' or 'labels.csv': where `labels` came from
    real: np.ndarray | None = None  # (N, K) ImageNet-ReaL class indices per image, -1 padded (a row of -1: none)

    def __len__(self) -> int:
        return len(self.files) if not self.npy else self.total

    def keep(self, mask: np.ndarray) -> None:
        """Only the images where `mask` holds (before decoding)."""
        self.files = [f for f, k in zip(self.files, mask) if k]
        self.labels = None if self.labels is None else self.labels[mask]
        self.real = None if self.real is None else self.real[mask]


def open_images(root: Path | str, max_images: int | None = None, label_files: tuple[LabelFile, ...] = ()) -> ImageSet:
    """The images below `root` (an ImageFolder, or a label file, gives labels), or `max_images` of them spread
    evenly over it. With a label file, the images it does not name are left out (noted in `skipped`)."""
    root, skipped = Path(root), Skipped()
    files, npys = find_inputs(root, skipped)
    if npys:
        if label_files:
            raise VitexportError(f"A label file names image files; {root} holds .npy inputs.")
        return _npy_set(npys, str(root), max_images)
    found = {lf.path: match(files, root, lf.keys) for lf in label_files}
    for lf in label_files:
        if not any(v is not None for v in found[lf.path]):
            raise VitexportError(f"Label file {lf.path} names none of the {len(files):,} images of {root} (its first "
                                 f"entry is {next(iter(lf.keys), '')!r}, the first image {files[0].name}).")
    single = [lf for lf in label_files if lf.labels is not None]
    if len(single) > 1:
        raise VitexportError("Give one label file of names and labels (and at most one real.json).")
    names, source = None, ""
    if single:
        names, source = found[single[0].path], single[0].path.name
        for f, v in zip(files, names):
            if v is None:
                skipped.add(f, "not in the label file", f"{f.stem} is not in {source}")
    elif is_labelled(root, files):
        names, source = [f.parent.name for f in files], "class folders"
    keep = [i for i in range(len(files)) if names is None or names[i] is not None]
    total = len(keep)
    chosen = select(keep, max_images)
    files = [files[i] for i in chosen]
    classes = labels = None
    if names is not None:
        classes = class_folders(root) if source == "class folders" else sorted({names[i] for i in keep}, key=class_order)
        index = {c: i for i, c in enumerate(classes)}
        labels = np.array([index[names[i]] for i in chosen], np.int64)
    real = [lf for lf in label_files if lf.real is not None]
    return ImageSet(str(root), files, labels, classes, total, skipped=skipped, label_source=source,
                    real=_real_rows(match(files, root, real[0].real)) if real else None)


def _real_rows(rows: list) -> np.ndarray:
    width = max((len(r) for r in rows if r), default=1)
    out = np.full((len(rows), width), -1, np.int64)
    for i, r in enumerate(rows):
        if r:
            out[i, :len(r)] = r
    return out


def _npy_set(paths: list[Path], source: str, max_images: int | None) -> ImageSet:
    from .images import _load_npy_header

    total = sum(_load_npy_header(p)[0] for p in paths)
    if max_images is not None and max_images < total:
        raise VitexportError("--max-images takes images, not .npy batches; cut the arrays instead.")
    return ImageSet(source, [], None, None, total, npy=list(paths))


# -- decoding, once --------------------------------------------------------------------------------------------

def default_workers() -> int:
    """One decoding thread per core and one more, at most 8: the extra one decodes while another holds the GIL
    (file opening, mode conversion); on 2 cores 3 threads decoded 256 px JPEGs 1.83x faster than one, 2 threads
    1.59x (scripts/bench_decode.py)."""
    return max(1, min(8, usable_cores() + 1))


Decoded = tuple[np.ndarray, list[int], list[ImageError]]  # (B, H, W, 3) crops, their indices, the files left out


def decoded_crops(files: list[Path], pp: Preprocess, workers: int, chunk: int = 32,
                  prefetch: int = 4) -> Iterator[Decoded]:
    """The uint8 crops of `files` in order, chunk by chunk, decoded by `workers` threads at most `prefetch` chunks
    ahead; with each chunk, the indices (into `files`) of its crops and the errors of the files that could not be
    decoded (left out, for the caller to report)."""
    h, w = pp.input_size

    def one_chunk(start: int) -> Decoded:
        crops, kept, errors = [], [], []
        for i, f in enumerate(files[start:start + chunk], start):
            try:
                crops.append(decode_crop(f, pp))
                kept.append(i)
            except ImageError as e:
                errors.append(e)
        return (np.stack(crops) if crops else np.empty((0, h, w, 3), np.uint8)), kept, errors

    starts = list(range(0, len(files), chunk))
    if workers <= 1:
        yield from (one_chunk(s) for s in starts)
        return
    pool = ThreadPoolExecutor(workers, thread_name_prefix="decode")
    try:
        pending = [pool.submit(one_chunk, s) for s in starts[:prefetch * workers]]
        nxt = len(pending)
        while pending:
            done = pending.pop(0).result()
            if nxt < len(starts):
                pending.append(pool.submit(one_chunk, starts[nxt]))
                nxt += 1
            yield done
    finally:  # a failure, Ctrl-C or a consumer that stops early: the chunks not started yet are dropped
        pool.shutdown(wait=True, cancel_futures=True)


@dataclass
class DecodeStats:
    images: int
    seconds: float
    workers: int

    def to_dict(self) -> dict:
        return {"images": self.images, "seconds": round(self.seconds, 3), "workers": self.workers,
                "images_per_s": round(self.images / self.seconds, 1) if self.seconds > 0 else None}


class InputCache:
    """The preprocessed inputs of one run in a temporary folder: uint8 crops, or float32 arrays from .npy files.
    `batches(b)` yields (start, (B, 3, H, W) float32) in order; close() (or `with`) removes the folder.

    An image that cannot be decoded is left out and noted in `images.skipped`; `kept` holds the indices (into
    `images.files`) of the inputs the cache holds, in order. None decodable: one sentence.
    """

    def __init__(self, images: ImageSet, pp: Preprocess, workers: int | None = None, where: Path | None = None,
                 progress: Progress | None = None) -> None:
        self.pp, self.n = pp, len(images)
        self.batch: int | None = None  # images a call when the set is evaluated (validate.evaluate.eval_batch)
        h, w = pp.input_size
        self.item_shape, self.dtype = ((h, w, 3), np.uint8) if not images.npy else ((3, h, w), np.float32)
        self.item_bytes = int(np.prod(self.item_shape)) * np.dtype(self.dtype).itemsize
        where = Path(where or tempfile.gettempdir())
        _check_room(where, self.n * self.item_bytes)
        self.dir = Path(tempfile.mkdtemp(prefix=".vitexport-inputs-", dir=where))
        self.path = self.dir / "inputs.bin"
        self.kept = np.arange(self.n)
        try:
            self.decode = self._fill(images, workers or default_workers(), progress)
        except BaseException:
            self.close()
            raise
        if self.n == 0 and len(images):
            self.close()
            raise images.skipped.nothing_usable(len(images), images.source)

    def _fill(self, images: ImageSet, workers: int, progress: Progress | None) -> DecodeStats:
        t0 = time.perf_counter()
        with open(self.path, "wb") as f:
            if images.npy:
                for a in _npy_arrays(images.npy, self.item_shape):
                    f.write(np.ascontiguousarray(a, np.float32).tobytes())
                    if progress:
                        progress(len(a))
                return DecodeStats(self.n, time.perf_counter() - t0, 0)
            kept: list[int] = []
            for crops, indices, errors in decoded_crops(images.files, self.pp, workers):
                f.write(crops.tobytes())
                kept += indices
                for e in errors:
                    images.skipped.add_error(e)
                if progress:
                    progress(len(indices) + len(errors))
        self.kept, self.n = np.asarray(kept, np.int64), len(kept)
        return DecodeStats(self.n, time.perf_counter() - t0, workers)

    def _normalise(self, raw: np.ndarray) -> np.ndarray:
        return raw.copy() if self.dtype == np.float32 else normalise(raw, self.pp)

    def batches(self, batch: int, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        stop = self.n if stop is None else min(stop, self.n)
        buf = np.empty((batch, *self.item_shape), self.dtype)
        with open(self.path, "rb", buffering=0) as f:
            f.seek(start * self.item_bytes)
            for i in range(start, stop, batch):
                b = min(batch, stop - i)
                view = buf[:b]
                f.readinto(memoryview(view.reshape(-1).view(np.uint8)))
                yield i, self._normalise(view)

    def item(self, i: int) -> np.ndarray:
        """Input i as stored: its (H, W, 3) uint8 crop, or a .npy set's (3, H, W) float32 array."""
        out = np.empty(self.item_shape, self.dtype)
        with open(self.path, "rb", buffering=0) as f:
            f.seek(i * self.item_bytes)
            f.readinto(memoryview(out.reshape(-1).view(np.uint8)))
        return out

    def sample(self, batch: int) -> np.ndarray:
        """A (batch, 3, H, W) input of real images for timing: the first ones, repeated when there are fewer."""
        first = next(self.batches(min(batch, self.n)))[1]
        reps = -(-batch // len(first))
        return np.ascontiguousarray(np.concatenate([first] * reps)[:batch])

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "InputCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_room(where: Path, need: int) -> None:
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return
    if need > free - (256 << 20):
        raise VitexportError(f"The decoded inputs need {need / 1e9:.1f} GB in {where}, which has {free / 1e9:.1f} GB "
                             f"free; use --max-images, or point TMPDIR at a larger disk.")


def _npy_arrays(paths: list[Path], item_shape: tuple[int, ...]) -> Iterator[np.ndarray]:
    from .images import check_npy

    for p in paths:
        a = check_npy(p, item_shape)
        for i in range(0, len(a), 256):
            part = np.asarray(a[i:i + 256], np.float32)
            if not np.isfinite(part).all():
                raise VitexportError(f"{p} holds NaN or infinite values; give finite, preprocessed inputs.")
            yield part
        del a  # the map goes, and with it the pages it held


class OutputStore:
    """One backend's (N, C) float32 outputs on disk, written in order and read back batch by batch (the reference
    of a bench: every later backend is compared with it without holding it in memory)."""

    def __init__(self, where: Path) -> None:
        self.path = Path(tempfile.mkstemp(prefix="outputs-", suffix=".bin", dir=where)[1])
        self.width: int | None = None
        self.rows = 0
        self._f = open(self.path, "wb")

    def append(self, out: np.ndarray) -> None:
        out = np.ascontiguousarray(out, np.float32).reshape(len(out), -1)
        if self.width is None:
            self.width = out.shape[1]
        self._f.write(out.tobytes())
        self.rows += len(out)

    def finish(self) -> None:
        self._f.close()

    def read(self, start: int, count: int) -> np.ndarray:
        assert self.width is not None
        out = np.empty((count, self.width), np.float32)
        with open(self.path, "rb", buffering=0) as f:
            f.seek(start * self.width * 4)
            f.readinto(memoryview(out.reshape(-1).view(np.uint8)))
        return out
