"""A labelled ImageFolder of any size from the shipped held-out digits, for validating the digits model at scale.

Each image is one of the 360 held-out digits (calibration/digits/heldout/, never a training image), taken in turn,
moved by up to one pixel, rescaled by 0.9-1.1 and given mild Gaussian noise, all from one seeded generator: the
same arguments write the same files, byte for byte. Labels stay meaningful: the trained digits model gets about
88 % of them right (98.89 % of the originals), on images it finds harder than the originals.

`vitexport bench -m vit_digits_patch4_32` without --data validates on `cached_set()`: DEFAULT_COUNT such images,
made once into the user's cache. 360 images cannot decide the default accuracy bounds (a row with no flipped image
has a paired interval of +-1.21 points, the FP16 bound is 0.5); 2,000 decide them for every row.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

DEFAULT_COUNT = 2000
GENERATOR = 1  # bump when the images change: a cached set of another version is made again


def sources(root: Path) -> list[tuple[np.ndarray, str]]:
    """(8x8 uint8 image, class folder) of every held-out digit, in a fixed order."""
    from PIL import Image

    out = []
    for cls in sorted(d.name for d in root.iterdir() if d.is_dir()):
        for f in sorted((root / cls).glob("*.png")):
            with Image.open(f) as img:
                out.append((np.asarray(img.convert("L"), dtype=np.uint8), cls))
    return out


def variant(img8: np.ndarray, rng: np.random.Generator, size: int):
    """One deterministic variation of an 8x8 digit, as a size x size RGB PIL image."""
    from PIL import Image

    dy, dx = rng.integers(-1, 2, size=2)
    shifted = np.roll(np.roll(np.pad(img8, 1), dy, axis=0), dx, axis=1)[1:-1, 1:-1]  # ink never wraps round
    scale = rng.uniform(0.9, 1.1)
    inner = max(4, int(round(size * scale)))
    big = Image.fromarray(shifted).resize((inner, inner), Image.BILINEAR)
    canvas = Image.new("L", (max(size, inner), max(size, inner)), 0)
    off = (canvas.size[0] - inner) // 2
    canvas.paste(big, (off, off))
    left = (canvas.size[0] - size) // 2
    a = np.asarray(canvas.crop((left, left, left + size, left + size)), dtype=np.float64)
    a = np.clip(a + rng.normal(0.0, 8.0, a.shape), 0, 255).round().astype(np.uint8)
    return Image.fromarray(a).convert("RGB")


def write_set(heldout: Path, out: Path, count: int, size: int = 32, fmt: str = "png", seed: int = 0) -> Path:
    """OUT/<class>/<number>.<fmt>: `count` variations of the digits under `heldout`, written to a staging folder
    beside `out` and renamed into place (a reader never sees half a set). `out` must not exist."""
    src = sources(heldout)
    if not src:
        raise ValueError(f"no digits under {heldout}")
    rng = np.random.default_rng(seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        for cls in sorted({c for _, c in src}):
            (staging / cls).mkdir()
        kw = {"quality": 90} if fmt == "jpg" else {}
        for i in range(count):
            img8, cls = src[i % len(src)]
            variant(img8, rng, size).save(staging / cls / f"{i:06d}.{fmt}", **kw)
        os.chmod(staging, 0o755)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def cache_dir() -> Path:
    """Where generated data sets are kept: $VITEXPORT_CACHE, else $XDG_CACHE_HOME/vitexport, else ~/.cache/vitexport."""
    if os.environ.get("VITEXPORT_CACHE"):
        return Path(os.environ["VITEXPORT_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vitexport"


def cached_set(heldout: Path, count: int = DEFAULT_COUNT) -> Path:
    """The default validation set of the digits model: made once (about a second) into cache_dir(), then reused.
    Another process making it at the same time is harmless: the first rename wins, the other's copy is dropped."""
    out = cache_dir() / f"digits-heldout-{count}-v{GENERATOR}"
    if out.is_dir():
        return out
    try:
        return write_set(heldout, out, count)
    except OSError:
        if out.is_dir():  # made by another process meanwhile
            return out
        raise
