"""Named ViT variants: one size table, one preprocessing config per variant (timm's names and shapes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..data.preprocess import INCEPTION_MEAN, INCEPTION_STD, Preprocess
from ..errors import VitexportError
from ..paths import DIGITS_VARIANT

if TYPE_CHECKING:
    from .vit import ViTConfig

# size name -> (embed_dim D, depth, num_heads, mlp_ratio)
SIZES: dict[str, tuple[int, int, int, float]] = {
    "digits": (64, 4, 4, 2.0),  # the small model trained on scikit-learn's digits (scripts/train_digits.py)
    "tiny": (192, 12, 3, 4.0),
    "small": (384, 12, 6, 4.0),
    "base": (768, 12, 12, 4.0),
    "large": (1024, 24, 16, 4.0),
    "huge": (1280, 32, 16, 4.0),
}

@dataclass(frozen=True)
class Variant:
    name: str
    size: str
    patch: int
    img: int
    num_classes: int = 1000
    crop_pct: float = 0.9
    interpolation: str = "bicubic"
    mean: tuple[float, float, float] = INCEPTION_MEAN
    std: tuple[float, float, float] = INCEPTION_STD
    in_chans: int = 3

    def config(self, img_size: tuple[int, int] | None = None, num_classes: int | None = None,
               **overrides) -> "ViTConfig":
        from .vit import ViTConfig  # torch: only once a model is made, so the CLI's --help stays light

        D, depth, heads, mlp_ratio = SIZES[self.size]
        return ViTConfig(
            img_size=img_size or self.img_size,
            patch_size=(self.patch, self.patch),
            in_chans=self.in_chans,
            num_classes=self.num_classes if num_classes is None else num_classes,
            embed_dim=D, depth=depth, num_heads=heads, mlp_ratio=mlp_ratio,
            **overrides,
        )

    @property
    def img_size(self) -> tuple[int, int]:
        return (self.img, self.img)

    def preprocess(self, img_size: tuple[int, int] | None = None) -> Preprocess:
        # at a size other than the variant's own, keep the crop ratio (timm does the same for its 384 models: 1.0)
        return Preprocess(input_size=img_size or self.img_size, mean=self.mean, std=self.std,
                          crop_pct=self.crop_pct, interpolation=self.interpolation)


VARIANTS: dict[str, Variant] = {v.name: v for v in [
    Variant("vit_tiny_patch16_224", "tiny", 16, 224),
    Variant("vit_tiny_patch16_384", "tiny", 16, 384, crop_pct=1.0),
    Variant("vit_small_patch16_224", "small", 16, 224),
    Variant("vit_small_patch16_384", "small", 16, 384, crop_pct=1.0),
    Variant("vit_small_patch32_224", "small", 32, 224),
    Variant("vit_base_patch16_224", "base", 16, 224),
    Variant("vit_base_patch16_384", "base", 16, 384, crop_pct=1.0),
    Variant("vit_base_patch32_224", "base", 32, 224),
    Variant("vit_base_patch32_384", "base", 32, 384, crop_pct=1.0),
    Variant("vit_large_patch16_224", "large", 16, 224),
    Variant("vit_large_patch16_384", "large", 16, 384, crop_pct=1.0),
    Variant("vit_huge_patch14_224", "huge", 14, 224, num_classes=0),  # timm's: ImageNet-21k features, no head
    Variant("vit_digits_patch4_32", "digits", 4, 32, num_classes=10, crop_pct=1.0, interpolation="bilinear"),
]}

DEFAULT_VARIANT = "vit_base_patch16_224"


def get_variant(name: str) -> Variant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise VitexportError(f"Unknown model {name!r}; choose one of: {', '.join(VARIANTS)}.") from None


def parse_img_size(text: str | int | None) -> tuple[int, int] | None:
    """'384' -> (384, 384); '384x512' -> (384, 512)."""
    if text is None:
        return None
    if isinstance(text, int):
        return (text, text)
    parts = text.lower().replace("*", "x").split("x")
    try:
        if len(parts) == 1:
            h = w = int(parts[0])
        elif len(parts) == 2:
            h, w = int(parts[0]), int(parts[1])
        else:
            raise ValueError
    except ValueError:
        raise VitexportError(f"Image size {text!r} is not N or HxW (for example 384 or 384x512).") from None
    if h <= 0 or w <= 0:
        raise VitexportError(f"Image size {text!r} must be positive.")
    return (h, w)


__all__ = ["DEFAULT_VARIANT", "DIGITS_VARIANT", "Preprocess", "SIZES", "VARIANTS", "Variant", "get_variant",
           "parse_img_size"]
