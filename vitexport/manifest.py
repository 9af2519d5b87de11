"""The manifest: a JSON file beside every exported model saying exactly what it is and how it was made."""

from __future__ import annotations

import json
from pathlib import Path

from .errors import VitexportError
from .paths import write_text_atomic
from .variants import Preprocess

MANIFEST_NAME = "manifest.json"


def manifest_path_for(model_path: Path) -> Path:
    """The manifest of a model folder, or of the folder an ONNX file lies in."""
    model_path = Path(model_path)
    return (model_path if model_path.is_dir() else model_path.parent) / MANIFEST_NAME


def read_manifest(path: Path) -> dict:
    mpath = manifest_path_for(path)
    if not mpath.is_file():
        raise VitexportError(f"{path} has no {MANIFEST_NAME} beside it; export it with 'vitexport onnx' first.")
    try:
        data = json.loads(mpath.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise VitexportError(f"{mpath} is not valid JSON ({e.__class__.__name__}).") from None
    for key in ("variant", "config", "preprocess", "onnx"):
        if key not in data:
            raise VitexportError(f"{mpath} lacks the field {key!r}; re-export the model.")
    return data


def write_manifest(folder: Path, data: dict) -> Path:
    path = Path(folder) / MANIFEST_NAME
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")
    return path


def update_manifest(folder: Path, **fields) -> dict:
    data = read_manifest(folder)
    for k, v in fields.items():
        if isinstance(v, dict) and isinstance(data.get(k), dict):
            data[k].update(v)
        else:
            data[k] = v
    write_manifest(folder, data)
    return data


def preprocess_of(manifest: dict) -> Preprocess:
    return Preprocess.from_dict(manifest["preprocess"])
