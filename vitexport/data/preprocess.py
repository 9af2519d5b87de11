"""What preprocessing is, as data: the fields of timm's eval transform that turn an image into the model's input.
The transform itself is `data.images`; each variant's defaults are `model.variants`; the manifest records one."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..errors import VitexportError

INCEPTION_MEAN = (0.5, 0.5, 0.5)
INCEPTION_STD = (0.5, 0.5, 0.5)
# timm's eval crop modes (data/transforms_factory.py): 'center' keeps the aspect ratio and crops, 'squash' resizes each
# side to size / crop_pct (aspect ratio lost, nothing cut at crop_pct 1), 'border' fits the longest side and pads;
# and 'pad': the longest side fitted as transformers' get_size_with_aspect_ratio does (EoMT's processor), the image
# at the top left and black pixels below and right of it (normalised to -mean / std); 'longest': SAM's processor,
# the longer side to the input size (int(side * size / longer + 0.5)), the image at the top left and the mean colour
# below and right of it (SAM pads with 0 after normalising: the mean colour rounded to 8 bits is within 0.006 of it)
CROP_MODES = ("center", "squash", "border", "pad", "longest")
PADDED = ("pad", "longest")  # the image at the top left of the input, padding below and right


@dataclass(frozen=True)
class Preprocess:
    """How an image becomes the model's input tensor (timm's data config)."""

    input_size: tuple[int, int]  # (H, W) fed to the model
    mean: tuple[float, float, float] = INCEPTION_MEAN
    std: tuple[float, float, float] = INCEPTION_STD
    crop_pct: float = 0.9  # resize the shorter side to size / crop_pct, then center-crop to size
    interpolation: str = "bicubic"  # resize filter: bicubic | bilinear | nearest
    crop_mode: str = "center"  # CROP_MODES
    # DPT's processor with keep_aspect_ratio (Depth Anything): each image resized, keeping its aspect ratio, to
    # multiples of this (the side whose scale is closer to 1 sets the scale; 0: off). A fixed-size graph takes
    # input_size alone; a dynamic-size one takes each image at its own size (`aspect_size`)
    multiple_of: int = 0

    def resized_size(self, w: int, h: int) -> tuple[int, int]:
        """(width, height) an image of w x h is resized to before the crop, as timm's eval transform resizes it:
        the target scaled by 1 / crop_pct, then 'center' covers it keeping the aspect ratio (shorter side),
        'squash' takes it exactly, 'border' fits inside it keeping the aspect ratio (longer side)."""
        th, tw = self.input_size
        sh, sw = math.floor(th / self.crop_pct), math.floor(tw / self.crop_pct)
        if self.crop_mode == "squash":
            return sw, sh
        if self.crop_mode == "pad":
            return fit_longest(w, h, min(th, tw))
        if self.crop_mode == "longest":  # SamImageProcessor's _get_preprocess_shape
            scale = max(th, tw) / max(h, w)
            return int(w * scale + 0.5), int(h * scale + 0.5)
        if self.crop_mode == "border":  # timm's ResizeKeepRatio(longest=1)
            ratio = max(h / sh, w / sw)
            return round(w / ratio), round(h / ratio)
        if self.crop_mode != "center":
            raise VitexportError(f"Unknown crop_mode {self.crop_mode!r} in the preprocessing config; timm's are "
                                 f"{', '.join(CROP_MODES)}.")
        if th == tw:  # torchvision's Resize(int): the shorter side to the scale, the other in proportion
            return (sw, int(sw * h / w)) if w <= h else (int(sw * w / h), sw)
        # non-square target: keep the aspect ratio, scale so both sides cover size / crop_pct (timm's
        # ResizeKeepRatio with longest=0)
        ratio = min(h / sh, w / sw)
        return round(w / ratio), round(h / ratio)

    def image_part(self, maps, size: tuple[int, int]):
        """(..., h, w) maps over the model's input -> the part over the image of `size` (H, W): all of it, except
        for 'pad' and 'longest', where the image fills the top left and the rest is padding."""
        if self.crop_mode not in PADDED:
            return maps
        th, tw = self.input_size
        nw, nh = self.resized_size(size[1], size[0])
        h, w = maps.shape[-2:]
        return maps[..., :max(1, round(h * min(nh, th) / th)), :max(1, round(w * min(nw, tw) / tw))]

    def aspect_size(self, w: int, h: int) -> tuple[int, int]:
        """(width, height) DPT's processor gives an image of w x h with keep_aspect_ratio and ensure_multiple_of
        (transformers' get_resize_output_image_size): the per-axis scale closer to 1 for both axes, each side
        rounded to a multiple (Python's round: halves to even)."""
        m = self.multiple_of or 1
        th, tw = self.input_size
        sh, sw = th / h, tw / w
        if abs(1 - sw) < abs(1 - sh):
            sh = sw
        else:
            sw = sh

        def multiple(v: float) -> int:
            x = round(v / m) * m
            return math.ceil(v / m) * m if x < 0 else x

        return multiple(sw * w), multiple(sh * h)

    def to_dict(self) -> dict:
        d = asdict(self)
        if not self.multiple_of:  # manifests without it read the same
            del d["multiple_of"]
        d["input_size"] = list(self.input_size)
        d["mean"], d["std"] = list(self.mean), list(self.std)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Preprocess":
        return cls(
            input_size=tuple(d["input_size"]),  # type: ignore[arg-type]
            mean=tuple(d["mean"]),  # type: ignore[arg-type]
            std=tuple(d["std"]),  # type: ignore[arg-type]
            crop_pct=float(d["crop_pct"]),
            interpolation=str(d["interpolation"]),
            crop_mode=str(d.get("crop_mode", "center")),  # manifests before crop modes: timm's default
            multiple_of=int(d.get("multiple_of", 0)),
        )


def fit_longest(w: int, h: int, size: int) -> tuple[int, int]:
    """(width, height) of an image of w x h whose shorter side is brought to `size` without its longer side passing
    `size`, as transformers' get_size_with_aspect_ratio(..., size, max_size=size) computes it (its int() can give
    size - 1 for the longer side)."""
    short, long = float(min(h, w)), float(max(h, w))
    raw = None
    if long / short * size > size:
        raw = size * short / long
        size = int(round(raw))
    if (h <= w and h == size) or (w <= h and w == size):
        return w, h
    if w < h:
        return size, int((raw if raw is not None else size) * h / w)
    return int((raw if raw is not None else size) * w / h), size
