"""Models by name: timm's VisionTransformer architectures (`archs`, from the generated table) and the shipped digits
model, vitexport's own."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

from ..data.preprocess import INCEPTION_MEAN, INCEPTION_STD, Preprocess
from ..errors import VitexportError
from ..paths import DIGITS_VARIANT
from .archs import Architecture, Tag, get_arch

# the small model trained on scikit-learn's digits (scripts/train_digits.py): vitexport's own, not timm's
DIGITS = Architecture(
    DIGITS_VARIANT, "vitexport",
    args={"img_size": [32, 32], "patch_size": 4, "embed_dim": 64, "depth": 4, "num_heads": 4, "mlp_ratio": 2.0,
          "num_classes": 10},
    tags={"digits": Tag("digits", (32, 32), 10, INCEPTION_MEAN, INCEPTION_STD, crop_pct=1.0,
                        interpolation="bilinear")})
# the variants vitexport knew by name before it read timm's table: its examples, docs and defaults use them
CLASSIC = ("vit_tiny_patch16_224", "vit_tiny_patch16_384", "vit_small_patch16_224", "vit_small_patch16_384",
           "vit_small_patch32_224", "vit_base_patch16_224", "vit_base_patch16_384", "vit_base_patch32_224",
           "vit_base_patch32_384", "vit_large_patch16_224", "vit_large_patch16_384", "vit_huge_patch14_224",
           DIGITS_VARIANT)
DEFAULT_VARIANT = "vit_base_patch16_224"


def get_variant(name: str) -> Architecture:
    """A model by name: any architecture of timm's VisionTransformer family (resources/timm_archs.json), or the
    shipped digits model. Unknown names: one sentence with the closest names."""
    return DIGITS if name == DIGITS_VARIANT else get_arch(name)


def names_a_model(text: str) -> bool:
    """`text` is a model name (an architecture, or ARCH.TAG), as a user may type one where a folder belongs."""
    try:
        return "/" not in text and bool(get_variant(text.partition(".")[0]))
    except VitexportError:
        return False


def missing_path_sentence(path: Path | str, takes_name: bool = True) -> str:
    """The sentence for a path that does not exist where a model folder belongs: a model name typed there (an
    architecture or ARCH.TAG) is told to go to -m (takes_name False: a command without -m, told to export it)."""
    text = str(path)
    if not names_a_model(text):
        return f"{text} does not exist."
    how = f"give it as -m {text}" if takes_name else f"export it with `vitexport onnx -m {text}` and give that folder"
    return f"{text} does not exist; {text} is a model name: {how}."


class _Classic(Mapping[str, Architecture]):
    """The classic names -> their architectures (`VARIANTS[name].preprocess()`), read from the table when asked."""

    def __getitem__(self, name: str) -> Architecture:
        if name not in CLASSIC:
            raise KeyError(name)
        return get_variant(name)

    def __iter__(self) -> Iterator[str]:
        return iter(CLASSIC)

    def __len__(self) -> int:
        return len(CLASSIC)


VARIANTS: Mapping[str, Architecture] = _Classic()


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


__all__ = ["CLASSIC", "DEFAULT_VARIANT", "DIGITS", "DIGITS_VARIANT", "Preprocess", "VARIANTS", "get_variant",
           "parse_img_size"]
