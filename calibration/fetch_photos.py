#!/usr/bin/env python3
"""Regenerate vitexport's default calibration and held-out photos.

Every photo comes from a file that a PyPI package ships *inside its wheel*
(nothing is downloaded at run time).  See ``SOURCES.md`` next to this script
for what each photo shows, who made it and under which licence it is
redistributed.

What the script does, for each entry of ``PHOTOS``:

1. locates the installed package without importing it
   (``importlib.util.find_spec``) and reads the shipped file;
2. checks the file's SHA-256 against the value recorded below, so the
   provenance is verifiable (a different package version that changed the
   file is reported instead of silently producing different photos);
3. converts it to 8-bit RGB, downscales it with Lanczos so that the shorter
   side is at most ``MAX_SHORT_SIDE`` pixels (aspect ratio kept, never
   upscaled) and writes a baseline JPEG, quality 90, 4:2:0, no metadata.

The output is deterministic for a given Pillow build.

Usage::

    python calibration/fetch_photos.py            # (re)write calibration/photos/
    python calibration/fetch_photos.py --check    # compare with the files on disk
    python calibration/fetch_photos.py --out DIR  # write somewhere else

Requirements (see SOURCES.md): numpy, Pillow, and the source packages
scikit-image==0.26.0, scikit-learn, matplotlib, PyWavelets==1.9.0 and
sporco==0.2.2.post1 (``pip install --no-deps sporco`` is enough: only its
data files are read).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import io
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image

MAX_SHORT_SIDE = 512
JPEG_QUALITY = 90
SPLITS = ("calib", "holdout")
HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "photos"


class Photo(NamedTuple):
    name: str  # output file name (without .jpg)
    split: str  # "calib" or "holdout"
    dist: str  # PyPI distribution name (for the version)
    package: str  # import package that holds the file
    relpath: str  # path of the file inside the package
    sha256: str  # SHA-256 of the shipped file
    reader: str = "image"  # "image" (Pillow) or "npz" (array under key "data")


# fmt: off
PHOTOS: tuple[Photo, ...] = (
    # ---- calibration set (INT8 calibration only) ----------------------------
    Photo("astronaut", "calib", "scikit-image", "skimage", "data/astronaut.png",
          "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5"),
    Photo("chelsea", "calib", "scikit-image", "skimage", "data/chelsea.png",
          "596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb"),
    Photo("coffee", "calib", "scikit-image", "skimage", "data/coffee.png",
          "cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7"),
    Photo("rocket", "calib", "scikit-image", "skimage", "data/rocket.jpg",
          "c2dd0de7c538df8d111e479619b129464d0269d0ae5fd18ca91d33a7fdfea95c"),
    Photo("hubble_deep_field", "calib", "scikit-image", "skimage",
          "data/hubble_deep_field.jpg",
          "3a19c5dd8a927a9334bb1229a6d63711b1c0c767fb27e2286e7c84a3e2c2f5f4"),
    Photo("retina", "calib", "scikit-image", "skimage", "data/retina.jpg",
          "38a07f36f27f095e818aea7b96d34202c05176d30253c66733f2e00379e9e0e6"),
    Photo("camera", "calib", "scikit-image", "skimage", "data/camera.png",
          "b0793d2adda0fa6ae899c03989482bff9a42d3d5690fc7e3648f2795d730c23a"),
    Photo("coins", "calib", "scikit-image", "skimage", "data/coins.png",
          "f8d773fc9cfa6f4d8e5942dc34d0a0788fcaed2a4fefbbed0aef5398d7ef4cba"),
    Photo("gravel", "calib", "scikit-image", "skimage", "data/gravel.png",
          "c48615b451bf1e606fbd72c0aa9f8cc0f068ab7111ef7d93bb9b0f2586440c12"),
    Photo("china", "calib", "scikit-learn", "sklearn", "datasets/images/china.jpg",
          "8378025ad2519d649d02e32bd98990db4ab572357d9f09841c2fbfbb4fefad29"),
    Photo("kodim23", "calib", "sporco", "sporco", "data/kodim23.png",
          "34d8f029d2eae3ed37b65e2f94fd2c319923ebfae0fa8bff5f001e2565b7d80f"),
    Photo("tulips", "calib", "sporco", "sporco", "data/tulips.png",
          "6f7fa671ce446f85c47fcda0ba9658f22b9824baf3c1abfae7051448665c37d1"),
    Photo("ascent", "calib", "PyWavelets", "pywt", "data/ascent.npz",
          "a6d56bc8e96571d6124f34cedeba49f1d3599507f6c890ad9ba538544454e8f7",
          reader="npz"),
    # ---- held-out set (evaluation only, never used for calibration) ---------
    Photo("grace_hopper", "holdout", "matplotlib", "matplotlib",
          "mpl-data/sample_data/grace_hopper.jpg",
          "a8ca6d734765703b09728ab47fe59f473d93ae3967fc24c7c0288c3c7adb7130"),
    Photo("flower", "holdout", "scikit-learn", "sklearn", "datasets/images/flower.jpg",
          "a77f6ec41e353afdf8bdff2ea981b2955535d8d83294f8cfa49cf4e423dd5638"),
    Photo("monarch", "holdout", "sporco", "sporco", "data/monarch.png",
          "c2435a5e37c04658824d26124ab27c3943e7b95b0eeeb27effa6439f81ff5ca9"),
    Photo("sail", "holdout", "sporco", "sporco", "data/sail.png",
          "7b8a3b23c79bf83b233915e2199c190589c40980d54d20eb3bf446a33c6e0461"),
    Photo("clock_motion", "holdout", "scikit-image", "skimage", "data/clock_motion.png",
          "f029226b28b642e80113d86622e9b215ee067a0966feaf5e60604a1e05733955"),
    Photo("grass", "holdout", "scikit-image", "skimage", "data/grass.png",
          "b6b6022426b38936c43a4ac09635cd78af074e90f42ffa8227ac8b7452d39f89"),
    Photo("brick", "holdout", "scikit-image", "skimage", "data/brick.png",
          "7966caf324f6ba843118d98f7a07746d22f6a343430add0233eca5f6eaaa8fcf"),
)
# fmt: on


class SourceError(RuntimeError):
    pass


def package_dir(package: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SourceError(f"package {package!r} is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def read_source(photo: Photo) -> tuple[bytes, Path]:
    path = package_dir(photo.package) / photo.relpath
    if not path.is_file():
        raise SourceError(
            f"{photo.name}: {path} is missing (is {photo.dist} "
            f"{dist_version(photo.dist)} the expected version?)"
        )
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != photo.sha256:
        raise SourceError(
            f"{photo.name}: {path} has sha256 {digest}, expected {photo.sha256} "
            f"({photo.dist} {dist_version(photo.dist)} ships a different file)"
        )
    return data, path


def to_rgb_image(photo: Photo, data: bytes) -> Image.Image:
    if photo.reader == "npz":
        with np.load(io.BytesIO(data)) as npz:
            arr = np.asarray(npz["data"])
        if arr.dtype != np.uint8:
            arr = np.clip(arr, 0, 255).astype(np.uint8)
        im = Image.fromarray(arr)
    else:
        im = Image.open(io.BytesIO(data))
        im.load()
    if im.mode in ("RGBA", "LA") or (im.mode == "P" and "transparency" in im.info):
        rgba = im.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        im = Image.alpha_composite(bg, rgba)
    return im.convert("RGB")


def downscale(im: Image.Image) -> Image.Image:
    w, h = im.size
    short = min(w, h)
    if short <= MAX_SHORT_SIDE:
        return im
    scale = MAX_SHORT_SIDE / short
    size = (
        MAX_SHORT_SIDE if w == short else round(w * scale),
        MAX_SHORT_SIDE if h == short else round(h * scale),
    )
    return im.resize(size, Image.Resampling.LANCZOS, reducing_gap=None)


def encode_jpeg(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(
        buf,
        format="JPEG",
        quality=JPEG_QUALITY,
        subsampling=2,  # 4:2:0, like most photos
        optimize=False,
        progressive=False,
    )
    return buf.getvalue()


def build(photo: Photo) -> tuple[bytes, tuple[int, int], Path]:
    data, src = read_source(photo)
    im = downscale(to_rgb_image(photo, data))
    return encode_jpeg(im), im.size, src


def check_table() -> None:
    names = [p.name for p in PHOTOS]
    assert len(set(names)) == len(names), "duplicate output names"
    for p in PHOTOS:
        assert p.split in SPLITS, p
        assert p.name.replace("_", "").isalnum() and p.name == p.name.lower(), p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT,
                    help=f"output folder (default: {DEFAULT_OUT})")
    ap.add_argument("--check", action="store_true",
                    help="do not write; compare the generated bytes with the files in --out")
    args = ap.parse_args(argv)
    check_table()

    built: dict[Path, bytes] = {}
    failures: list[str] = []
    for photo in PHOTOS:
        rel = Path(photo.split) / f"{photo.name}.jpg"
        try:
            jpeg, size, src = build(photo)
        except SourceError as exc:
            failures.append(str(exc))
            continue
        built[rel] = jpeg
        print(f"{str(rel):32s} {size[0]:4d}x{size[1]:<4d} {len(jpeg):7d} B  "
              f"<- {photo.dist} {dist_version(photo.dist)}: {photo.package}/{photo.relpath}")
    if failures:
        for msg in failures:
            print(f"error: {msg}", file=sys.stderr)
        return 2

    if args.check:
        bad = []
        for rel, jpeg in built.items():
            path = args.out / rel
            if not path.is_file() or path.read_bytes() != jpeg:
                bad.append(str(rel))
        for split in SPLITS:
            for path in sorted((args.out / split).glob("*")):
                if path.relative_to(args.out) not in built:
                    bad.append(f"{path.relative_to(args.out)} (not produced by this script)")
        if bad:
            print("differs from the generated output: " + ", ".join(bad), file=sys.stderr)
            return 1
        print(f"OK: {len(built)} files in {args.out} match")
        return 0

    for split in SPLITS:
        folder = args.out / split
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*"):
            if old.is_file() and old.suffix.lower() in (".jpg", ".jpeg", ".png"):
                old.unlink()
    for rel, jpeg in built.items():
        (args.out / rel).write_bytes(jpeg)
    total = sum(len(b) for b in built.values())
    counts = {s: sum(1 for r in built if r.parts[0] == s) for s in SPLITS}
    print(f"wrote {len(built)} photos ({counts['calib']} calib, {counts['holdout']} holdout), "
          f"{total} bytes, to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
