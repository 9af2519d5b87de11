"""Images -> model inputs. One implementation, shared by calibration, parity checks and bench, so they never disagree.

Preprocessing follows timm's eval transform: resize keeping the aspect ratio (shorter side to size / crop_pct)
with the manifest's interpolation, center crop to the input size, scale to [0, 1],
normalise with mean/std. Grayscale, palette and RGBA images are converted to RGB.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import VitexportError
from .preprocess import Preprocess

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
_FILTERS = {"bicubic": 3, "bilinear": 2, "nearest": 0, "lanczos": 1}  # PIL.Image.Resampling values


def to_8bit(img):
    """16-bit and 32-bit integer or float images -> 8-bit 'L', scaled from their real range (Pillow's own
    conversion clips them to 255, so a 16-bit photo would come out nearly white)."""
    from PIL import Image

    if img.mode.startswith("I;16") or img.mode in ("I", "F"):
        a = np.asarray(img, dtype=np.float64)
        if img.mode == "F":
            top = 1.0 if a.size and float(np.nanmax(a)) <= 1.0 else 255.0  # [0, 1] floats, else 8-bit values
        else:
            top = 65535.0 if img.mode.startswith("I;16") or (a.size and a.max() > 255) else 255.0
        a = np.clip(np.nan_to_num(a) / top * 255.0, 0, 255).round().astype(np.uint8)
        return Image.fromarray(a, mode="L")
    return img


def preprocess_image(img, pp: Preprocess) -> np.ndarray:
    """A PIL image -> (3, H, W) float32, normalised."""
    return normalise(np.asarray(resize_and_crop(img, pp), dtype=np.uint8)[None], pp)[0]


def resize_and_crop(img, pp: Preprocess):
    """A PIL image -> the RGB image of pp.input_size the model sees, before scaling and normalisation: upright,
    8-bit, resized and center-cropped (what a client sends to a graph that normalises its uint8 input itself)."""
    from PIL import Image, ImageOps

    img = ImageOps.exif_transpose(img) or img  # a photo taken upright is fed upright, as torchvision users expect
    img = to_8bit(img)
    if img.mode != "RGB":
        if img.mode in ("RGBA", "LA") or (img.mode == "P" and "transparency" in img.info):
            img = img.convert("RGBA")
            background = Image.new("RGBA", img.size, (255, 255, 255, 255))
            img = Image.alpha_composite(background, img)
        img = img.convert("RGB")
    resample = _FILTERS.get(pp.interpolation)
    if resample is None:
        raise VitexportError(f"Unknown interpolation {pp.interpolation!r} in the preprocessing config.")
    th, tw = pp.input_size
    w, h = img.size
    nw, nh = pp.resized_size(w, h)
    if (nw, nh) != (w, h):
        img = img.resize((nw, nh), resample=resample)
    if pp.crop_mode in ("pad", "longest"):  # top left; below and right black (EoMT's processor pads raw pixels
        # with 0) or the mean colour (SAM's pads with 0 after normalising)
        fill = (0, 0, 0) if pp.crop_mode == "pad" else tuple(round(255 * v) for v in pp.mean)
        canvas = Image.new("RGB", (tw, th), fill)
        canvas.paste(img, (0, 0))
        return canvas
    if pp.crop_mode == "border" and (nw < tw or nh < th):  # pad with the mean colour, centred (CenterCropOrPad)
        fill = tuple(round(255 * v) for v in pp.mean)
        canvas = Image.new("RGB", (max(nw, tw), max(nh, th)), fill)
        canvas.paste(img, ((tw - nw) // 2 if tw > nw else 0, (th - nh) // 2 if th > nh else 0))
        img, (nw, nh) = canvas, canvas.size
    top, left = int(round((nh - th) / 2.0)), int(round((nw - tw) / 2.0))
    return img.crop((left, top, left + tw, top + th))


class ImageError(VitexportError):
    """An image file that cannot be used: one sentence naming it, with `kind` (a short class of reason, how skips
    are counted) and `why` (the detail)."""

    def __init__(self, path: Path, kind: str, why: str, advice: str) -> None:
        super().__init__(f"Cannot read image {path}: {why}; {advice}.")
        self.path, self.kind, self.why = path, kind, why


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.errno and e.strerror:  # 'permission denied', not "[Errno 13] ...: '<path>'"
        return e.strerror.lower()
    return (str(e).strip().splitlines() or [""])[0].rstrip(".") or "the file is damaged"


def _is_empty(path: Path) -> bool:
    try:
        return os.stat(path).st_size == 0
    except OSError:
        return False


def decode_crop(path: Path, pp: Preprocess) -> np.ndarray:
    """One image file -> its (H, W, 3) uint8 crop (resize_and_crop); an ImageError naming the file when it cannot
    be used. Animated GIF/WebP give their first frame; CMYK, palette, 1-bit, LA and 16-bit images are converted."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            img.load()
            return np.asarray(resize_and_crop(img, pp), dtype=np.uint8)
    except Image.DecompressionBombError as e:
        raise ImageError(path, "too large", f"it is too large to decode safely ({_reason(e)})",
                         "downscale it first") from None
    except UnidentifiedImageError:
        if _is_empty(path):
            raise ImageError(path, "damaged", "the file is empty", "remove it from the folder or save it again") from None
        raise ImageError(path, "not an image", "it is not an image Pillow recognises",
                         "remove it from the folder or convert it to PNG or JPEG") from None
    except MemoryError:
        raise ImageError(path, "too large", "decoding it ran out of memory", "downscale it first") from None
    except (OSError, ValueError, SyntaxError, EOFError) as e:  # truncated, corrupt or unreadable files
        unreadable = isinstance(e, OSError) and e.errno is not None
        raise ImageError(path, "unreadable" if unreadable else "damaged", _reason(e),
                         "check its permissions" if unreadable else "remove it from the folder or save it "
                         "again") from None


def normalise(crops: np.ndarray, pp: Preprocess) -> np.ndarray:
    """(B, H, W, 3) uint8 crops -> (B, 3, H, W) float32 inputs: scaled to [0, 1], then mean/std."""
    x = crops.astype(np.float32) / 255.0
    x = (x - np.asarray(pp.mean, dtype=np.float32)) / np.asarray(pp.std, dtype=np.float32)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def load_image(path: Path, pp: Preprocess) -> np.ndarray:
    """One image file -> its (3, H, W) float32 input."""
    return normalise(decode_crop(path, pp)[None], pp)[0]


def class_folders(root: Path) -> list[str]:
    """The class subfolders of an ImageFolder, in class order: '2' before '10', names after numbers (links to
    folders are not classes: list_images does not follow them)."""
    return sorted((d.name for d in root.iterdir() if d.is_dir() and not d.is_symlink() and not d.name.startswith(".")),
                  key=class_order)


def class_order(name: str) -> tuple:
    """The sort key of class names: '2' before '10', names after numbers."""
    return (0, int(name), name) if name.isdigit() else (1, 0, name)


@dataclass
class Dataset:
    """Preprocessed inputs, with labels when the folder has one subfolder per class."""

    x: np.ndarray  # (N, 3, H, W) float32
    labels: np.ndarray | None  # (N,) int64
    files: list[Path]
    classes: list[str] | None
    source: str

    def __len__(self) -> int:
        return len(self.x)


@dataclass
class Skipped:
    """The files of a data folder a run leaves out, each with why: counted and reported, never silent."""

    entries: list[tuple[str, str, str]] = field(default_factory=list)  # (path, kind, detail), in the order found
    first_error: ImageError | None = None  # the first image that could not be decoded

    def add(self, path: Path | str, kind: str, why: str = "") -> None:
        self.entries.append((str(path), kind, why))

    def add_error(self, e: ImageError) -> None:
        """An image that could not be decoded."""
        self.add(e.path, e.kind, e.why)
        self.first_error = self.first_error or e

    def __len__(self) -> int:
        return len(self.entries)

    def kinds(self) -> dict[str, int]:
        return dict(Counter(kind for _, kind, _ in self.entries).most_common())

    def summary(self, source: str) -> str:
        """'Skipped 3 files of DIR: 2 damaged (a.jpg: image file is truncated, ...); 1 link out of the folder (b.jpg).'"""
        noun = "file" if len(self) == 1 else "files"
        return f"Skipped {len(self):,} {noun} of {source}: {self.details()}."

    def details(self) -> str:
        """'2 damaged (a.jpg: image file is truncated, ...); 1 link out of the folder (b.jpg: it leads to /x)'"""
        parts = []
        for kind, count in self.kinds().items():
            first = [(p, w) for p, k, w in self.entries if k == kind][:2]
            shown = ", ".join(f"{Path(p).name}: {w}" if w else Path(p).name for p, w in first)
            more = ", ..." if count > len(first) else ""
            parts.append(f"{count:,} {kind} ({shown}{more})")
        return "; ".join(parts)

    def nothing_usable(self, count: int, source: str) -> VitexportError:
        """The one sentence for a run none of whose `count` inputs could be used: the file's own when it is one."""
        if count == 1 and self.first_error is not None:
            return self.first_error
        return VitexportError(f"None of the {count:,} images of {source} can be read: {self.details()}; remove or "
                              f"fix them.")

    def to_dict(self, limit: int = 1000) -> dict:
        return {"count": len(self), "kinds": self.kinds(),
                "files": [{"file": p, "kind": k, "why": w} for p, k, w in self.entries[:limit]]}


LINK_OUT = "link out of the folder"  # a data folder is input: nothing in it makes vitexport read outside it


def list_images(root: Path, skipped: Skipped | None = None) -> list[Path]:
    """Every image below `root` (see list_files), a dense data set's ground-truth maps aside (dense_truth)."""
    from .dense_truth import is_truth

    return [p for p in list_files(root, IMAGE_SUFFIXES, skipped) if not is_truth(p)]


def list_files(root: Path, suffixes: tuple[str, ...], skipped: Skipped | None = None) -> list[Path]:
    """Every file below `root` with one of `suffixes`, recursively (hidden names aside), sorted; what cannot be listed or read safely is
    noted in `skipped` (when given): folders that cannot be listed, links that lead out of `root` or to a folder
    (never followed: no loops, no image counted twice), image names that are not regular files (a FIFO would
    block a reader forever).

    A link to a file inside `root` is read. Works with a plain stack, not recursion: any depth.
    """
    root = Path(root)
    inside = root.resolve()
    note = skipped.add if skipped is not None else (lambda *a: None)
    found: list[Path] = []
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                entries = list(it)
        except OSError as e:
            note(d, "unreadable folder", _reason(e))
            continue
        for e in entries:
            if e.name.startswith("."):
                continue
            p = d / e.name
            wanted = p.suffix.lower() in suffixes
            try:
                if e.is_symlink():
                    target = Path(os.path.realpath(p))
                    if not target.is_relative_to(inside):
                        if wanted or target.is_dir():
                            note(p, LINK_OUT, f"it leads to {target}")
                    elif target.is_dir():
                        note(p, "link to a folder", "not followed")
                    elif wanted and target.is_file():
                        found.append(p)
                    elif wanted:
                        note(p, "not a regular file", "a broken link" if not target.exists() else "")
                elif e.is_dir(follow_symlinks=False):
                    stack.append(p)
                elif wanted:
                    if e.is_file(follow_symlinks=False):
                        found.append(p)
                    else:
                        note(p, "not a regular file")
            except OSError as err:
                note(p, "unreadable", _reason(err))
    return sorted(found)


def select(files: list, n: int | None) -> list:
    """Choose n items deterministically, spread evenly over the sorted list (not just the first n)."""
    if n is None or n >= len(files):
        return list(files)
    idx = np.linspace(0, len(files) - 1, n).round().astype(int)
    return [files[i] for i in sorted(set(idx.tolist()))]


def find_inputs(root: Path, skipped: Skipped | None = None) -> tuple[list[Path], list[Path]]:
    """(images, .npy files) of a data folder (or one .npy file): its images when it has any, else its .npy
    batches; one sentence when it has neither."""
    root = Path(root)
    if not root.exists():
        raise VitexportError(f"Data folder {root} does not exist.")
    if root.is_file() and root.suffix == ".npy":
        return [], [root]
    if not root.is_dir():
        raise VitexportError(f"{root} is neither a folder of images nor a .npy file.")
    files = list_images(root, skipped)
    if files:
        return files, []
    npys = list_files(root, (".npy",), skipped)
    if npys:
        return [], npys
    raise VitexportError(f"Data folder {root} holds no images ({', '.join(IMAGE_SUFFIXES)}) or .npy batches.")


def is_labelled(root: Path, files: list[Path]) -> bool:
    """An ImageFolder: every image sits in a class subfolder of `root`."""
    return bool(class_folders(root)) and all(f.parent.parent == root for f in files)


def load_folder(root: Path, pp: Preprocess, limit: int | None = None, progress=None) -> Dataset:
    """Images (recursively) or .npy batches from a folder, all in memory (small sets: tests, scripts; the
    commands stream through data.stream); labels from class subfolders (ImageFolder layout)."""
    root = Path(root)
    files, npys = find_inputs(root)
    if npys:
        return _load_npy(npys, pp, limit)
    subdirs = class_folders(root)
    labelled = is_labelled(root, files)
    files = select(files, limit)
    xs = []
    for f in files:
        xs.append(load_image(f, pp))
        if progress is not None:
            progress()
    x = np.stack(xs)
    if labelled:
        classes = subdirs
        labels = np.array([classes.index(f.parent.name) for f in files], dtype=np.int64)
        return Dataset(x, labels, files, classes, str(root))
    return Dataset(x, None, files, None, str(root))


def _load_npy(paths: list[Path], pp: Preprocess, limit: int | None) -> Dataset:
    arrays = []
    for p in paths:
        try:
            a = np.load(p, allow_pickle=False)
        except (OSError, ValueError) as e:
            why = (str(e).strip().splitlines() or [""])[0].rstrip(".") or "not a NumPy .npy file"
            raise VitexportError(f"Cannot read {p}: {why}; give arrays saved with numpy.save.") from None
        if a.dtype.kind not in "fiu":
            raise VitexportError(f"{p} holds {a.dtype} values; give float32 preprocessed inputs.")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            bad = int(a.size - np.isfinite(a).sum())
            raise VitexportError(f"{p} holds {bad:,} NaN or infinite values (of {a.size:,}); give finite, "
                                 f"preprocessed inputs.")
        if a.ndim == 3:
            a = a[None]
        want = (3, *pp.input_size)
        if a.ndim != 4 or tuple(a.shape[1:]) != want:
            raise VitexportError(f"{p} has shape {a.shape}; expected (N, {want[0]}, {want[1]}, {want[2]}) "
                                 "preprocessed inputs.")
        arrays.append(a.astype(np.float32))
    x = np.concatenate(arrays)
    if limit is not None and limit < len(x):
        x = x[select(list(range(len(x))), limit)]
    return Dataset(x, None, list(paths), None, ",".join(map(str, paths)))


def _load_npy_header(p: Path) -> tuple[int, tuple[int, ...]]:
    """(images, shape) of a .npy file of preprocessed inputs, read from its header alone."""
    try:
        shape = np.load(p, mmap_mode="r", allow_pickle=False).shape  # the header only: nothing is read
    except (OSError, ValueError) as e:
        why = (str(e).strip().splitlines() or [""])[0].rstrip(".") or "not a NumPy .npy file"
        raise VitexportError(f"Cannot read {p}: {why}; give arrays saved with numpy.save.") from None
    return (1 if len(shape) == 3 else int(shape[0]) if shape else 0), tuple(shape)


def check_npy(p: Path, item_shape: tuple[int, ...]) -> np.ndarray:
    """A .npy file of (N, 3, H, W) (or one (3, H, W)) preprocessed inputs, opened as a read-only map."""
    try:
        a = np.load(p, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        why = (str(e).strip().splitlines() or [""])[0].rstrip(".") or "not a NumPy .npy file"
        raise VitexportError(f"Cannot read {p}: {why}; give arrays saved with numpy.save.") from None
    if a.dtype.kind not in "fiu":
        raise VitexportError(f"{p} holds {a.dtype} values; give float32 preprocessed inputs.")
    if a.ndim == 3:
        a = a[None]
    if a.ndim != 4 or tuple(a.shape[1:]) != tuple(item_shape):
        raise VitexportError(f"{p} has shape {a.shape}; expected (N, {item_shape[0]}, {item_shape[1]}, "
                             f"{item_shape[2]}) preprocessed inputs.")
    return a
