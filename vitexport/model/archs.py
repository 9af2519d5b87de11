"""timm's vision transformers by name: the architecture table (`resources/timm_archs.json`, generated from timm's
registry by `scripts/gen_timm_archs.py`: every architecture of vision_transformer.py, deit.py, eva.py, beit.py and
naflexvit.py) turned into ViTConfig fields and preprocessing.

An architecture is timm's model name (`vit_small_patch14_reg4_dinov2`); a tag names pretrained weights of it
(`lvd142m`), written `ARCH.TAG` as timm does, with its own input size, preprocessing and class count. No torch
and no timm here: the CLI resolves names before anything heavy is imported.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from ..data.preprocess import INCEPTION_MEAN, INCEPTION_STD, Preprocess
from ..errors import VitexportError
from .config import to_2tuple
from .readers.timm_args import MODULES

if TYPE_CHECKING:
    from .config import ViTConfig

TABLE_FILE = "timm_archs.json"
# timm's arguments that are not the model's shape: how it is run (vitexport chooses per export)
_RUNTIME_ARGS = ("dynamic_img_size",)


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    """The committed table: {'timm_version', 'architectures': {name: {'module', 'args', 'tags'}}}."""
    return json.loads(resources.files("vitexport.resources").joinpath(TABLE_FILE).read_text())


def arch_names() -> list[str]:
    return list(table()["architectures"])


@dataclass(frozen=True)
class Tag:
    """One pretrained configuration of an architecture (timm's pretrained_cfg, resolved)."""

    name: str
    input_size: tuple[int, int]
    num_classes: int
    mean: tuple[float, float, float] = INCEPTION_MEAN
    std: tuple[float, float, float] = INCEPTION_STD
    crop_pct: float = 0.9
    crop_mode: str = "center"
    interpolation: str = "bicubic"
    params: int | None = None  # timm's parameter count for the model this tag builds
    args: dict[str, Any] = field(default_factory=dict)  # constructor arguments that differ from the arch's

    def preprocess(self, img_size: tuple[int, int] | None = None) -> Preprocess:
        return Preprocess(input_size=tuple(img_size or self.input_size),  # type: ignore[arg-type]
                          mean=self.mean, std=self.std, crop_pct=self.crop_pct, interpolation=self.interpolation,
                          crop_mode=self.crop_mode)


@dataclass(frozen=True)
class Architecture:
    """A registered timm ViT architecture: its constructor arguments and its pretrained tags."""

    name: str
    module: str  # timm's module: 'vision_transformer' | 'deit' | 'eva' | 'beit' | 'naflexvit' (timm_args.MODULES)
    args: dict[str, Any]  # timm's constructor arguments, in ViTConfig's vocabulary
    tags: dict[str, Tag]

    @property
    def default_tag(self) -> Tag | None:
        """timm's default pretrained config: the first tag."""
        return next(iter(self.tags.values()), None)

    @property
    def img_size(self) -> tuple[int, int]:
        return to_2tuple(self.args.get("img_size", 224))

    @property
    def patch(self) -> int:
        return to_2tuple(self.args.get("patch_size", 16))[0]

    @property
    def num_classes(self) -> int:
        return int(self.args.get("num_classes", 1000))

    def unsupported(self) -> dict[str, Any]:
        return dict(self.args.get("unsupported") or {})

    def config_fields(self, tag: Tag | None = None) -> dict[str, Any]:
        """ViTConfig fields for this architecture (and tag); refuses what vitexport cannot build, by name."""
        if bad := self.unsupported():
            opts = ", ".join(f"{k}={v}" for k, v in bad.items())
            raise VitexportError(f"{self.name} needs {opts}, which vitexport's ViT does not build.")
        args = {**self.args, **(tag.args if tag else {})}
        return {k: (tuple(v) if isinstance(v, list) else v) for k, v in args.items() if k not in _RUNTIME_ARGS}

    def config(self, tag: Tag | None = None, img_size: tuple[int, int] | None = None,
               num_classes: int | None = None, **overrides: Any) -> "ViTConfig":
        from .config import ViTConfig

        fields_ = self.config_fields(tag)
        fields_.update(overrides)
        if img_size is not None:
            fields_["img_size"] = img_size
        if num_classes is not None:
            fields_["num_classes"] = num_classes
        return ViTConfig(**fields_)

    def preprocess(self, img_size: tuple[int, int] | None = None, tag: Tag | None = None) -> Preprocess:
        """The tag's preprocessing (the default tag's without one) at `img_size`; ImageNet-Inception defaults for an
        architecture without pretrained weights, as timm's _cfg."""
        tag = tag or self.default_tag
        if tag is None:
            return Preprocess(input_size=img_size or self.img_size)
        return tag.preprocess(img_size)

    def describe(self) -> dict[str, Any]:
        """Width, depth, heads, patch, input size: what `vitexport models` lists."""
        return {"embed_dim": self.args.get("embed_dim", 768), "depth": self.args.get("depth", 12),
                "num_heads": self.args.get("num_heads", 12), "mlp_ratio": float(self.args.get("mlp_ratio", 4.0)),
                "patch": self.patch, "img_size": self.img_size}


def _tag(name: str, d: dict[str, Any]) -> Tag:
    return Tag(name=name, input_size=(int(d["input_size"][0]), int(d["input_size"][1])),
               num_classes=int(d.get("num_classes", 1000)),
               mean=tuple(d["mean"]), std=tuple(d["std"]),  # type: ignore[arg-type]
               crop_pct=float(d["crop_pct"]), crop_mode=str(d.get("crop_mode", "center")),
               interpolation=str(d["interpolation"]), params=d.get("params"), args=dict(d.get("args") or {}))


@lru_cache(maxsize=None)
def get_arch(name: str) -> Architecture:
    """An architecture by timm's name; one sentence with the closest names when there is none."""
    entry = table()["architectures"].get(name)
    if entry is None:
        raise VitexportError(unknown_name(name))
    return Architecture(name, entry["module"], dict(entry["args"]),
                        {t: _tag(t, d) for t, d in entry["tags"].items()})


def unknown_name(name: str) -> str:
    from ..paths import DIGITS_VARIANT

    close = difflib.get_close_matches(name, arch_names() + known_tags() + [DIGITS_VARIANT], n=3, cutoff=0.6)
    hint = f"; closest: {', '.join(close)}" if close else ""
    return (f"Unknown model {name!r}: it is not one of the {len(arch_names())} architectures of timm's vision "
            f"transformer modules ({', '.join(MODULES)}) nor {DIGITS_VARIANT} (`vitexport models` lists them){hint}.")


def known_tags() -> list[str]:
    return [f"{a}.{t}" for a, e in table()["architectures"].items() for t in e["tags"]]


def split_name(name: str) -> tuple[str, str | None]:
    """'ARCH.TAG' -> (ARCH, TAG); 'ARCH' -> (ARCH, None)."""
    arch, dot, tag = name.partition(".")
    return arch, (tag if dot else None)


def resolve(name: str) -> tuple[Architecture, Tag | None]:
    """'ARCH' or 'ARCH.TAG' -> the architecture and the tag (None for a bare architecture). A tag the table does
    not know is still accepted (timm may have published it since): its preprocessing comes from the hub config."""
    arch_name, tag_name = split_name(name)
    arch = get_arch(arch_name)
    return arch, (arch.tags.get(tag_name) if tag_name else None)

