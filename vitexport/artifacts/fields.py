"""Typed reading of the manifest's JSON: each field checked, a missing or wrong one named in one sentence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import VitexportError

# the model.ViTConfig fields that decide the model's shapes: without one, a rebuilt model would silently take a
# default (another width, depth, ...)
CONFIG_SHAPE_FIELDS = ("img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads",
                       "mlp_ratio")


class Fields:
    """Reads typed fields out of one JSON object, naming the file and the field when one is missing or wrong."""

    def __init__(self, data: Any, where: str, path: Path) -> None:
        if not isinstance(data, dict):
            raise VitexportError(f"{path} holds a JSON {type(data).__name__} where {where or 'a manifest'} "
                                 f"should be an object; re-export the model.")
        self.data, self.where, self.path = data, where, path

    def _name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def req(self, key: str, kind: type | tuple[type, ...] = object) -> Any:
        if key not in self.data:
            raise VitexportError(f"{self.path} lacks the field {self._name(key)!r}; re-export the model.")
        return self.check(key, self.data[key], kind)

    def opt(self, key: str, kind: type | tuple[type, ...] = object, default: Any = None) -> Any:
        value = self.data.get(key, default)
        return default if value is None else self.check(key, value, kind)

    def check(self, key: str, value: Any, kind: type | tuple[type, ...]) -> Any:
        if not isinstance(value, kind):
            raise VitexportError(f"{self.path} has a {type(value).__name__} in the field {self._name(key)!r}, "
                                 f"which is not what vitexport writes there; re-export the model.")
        return value

    def sub(self, key: str) -> "Fields | None":
        value = self.data.get(key)
        return None if value is None else Fields(value, self._name(key), self.path)

    def rest(self, known: set[str]) -> dict[str, Any]:
        """Fields this version does not know: kept as they are, so a rewrite does not lose them."""
        return {k: v for k, v in self.data.items() if k not in known}


def config_field(f: Fields) -> dict[str, Any]:
    config = f.req("config", dict)
    missing = [k for k in CONFIG_SHAPE_FIELDS if k not in config]
    if missing:
        raise VitexportError(f"{f.path} lacks the field 'config.{missing[0]}'; re-export the model.")
    return config


def size_range_field(f: Fields) -> tuple[tuple[int, int], tuple[int, int]] | None:
    value = f.opt("img_size_range", list)
    if value is None:
        return None
    if len(value) != 2 or not all(isinstance(s, list) and len(s) == 2 and all(isinstance(v, int) and v > 0 for v in s)
                                  for s in value):
        raise VitexportError(f"{f.path} has {value!r} in the field 'img_size_range', not two sizes [H, W]; "
                             f"re-export the model.")
    return (value[0][0], value[0][1]), (value[1][0], value[1][1])


def pair_field(f: Fields, key: str) -> tuple[int, int]:
    value = f.req(key, list)
    if len(value) != 2 or not all(isinstance(v, int) for v in value):
        raise VitexportError(f"{f.path} has {value!r} in the field {key!r}, not two sizes; re-export the model.")
    return (value[0], value[1])


def outputs_field(f: Fields) -> dict[str, list[Any]] | None:
    """The 'outputs' field: {name: shape}; one sentence when it is not."""
    raw = f.opt("outputs", dict)
    if raw is None:
        return None
    if not raw or not all(isinstance(k, str) and isinstance(v, list) for k, v in raw.items()):
        raise VitexportError(f"{f.path} has an unreadable 'outputs' field (expected output name -> shape); re-export "
                             f"the model.")
    return {k: list(v) for k, v in raw.items()}
