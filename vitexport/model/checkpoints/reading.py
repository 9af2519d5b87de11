"""Reading a checkpoint's raw tensors: the weights file of a folder, its config.json, and the file's own format
(safetensors, a torch zip or pickle read with weights_only, a JAX .npz), sniffed from its bytes, never its name.
Training checkpoints are unwrapped (model_ema / model / state_dict, DataParallel's 'module.')."""

from __future__ import annotations

import json
import pickle
import re
import zipfile
from pathlib import Path

import numpy as np
import torch

from ...errors import VitexportError

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.pth", "model.pt", "model.npz")


def resolve_weights(path: Path) -> tuple[Path, dict]:
    """A file or a directory -> (weights file, config.json contents or {})."""
    if not path.exists():
        raise VitexportError(f"Checkpoint {path} does not exist.")
    config: dict = {}
    if path.is_dir():
        candidates = [path / n for n in WEIGHT_FILES if (path / n).is_file()]
        if not candidates:
            candidates = sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin", ".pth", ".pt", ".npz"))
        if not candidates:
            raise VitexportError(f"Checkpoint directory {path} holds no weights file (looked for {', '.join(WEIGHT_FILES)}).")
        cfg_path = path / "config.json"
        weights = candidates[0]
    else:
        weights = path
        cfg_path = path.parent / "config.json"
    if cfg_path.is_file():
        try:
            config = json.loads(cfg_path.read_text())
        except (OSError, json.JSONDecodeError):
            config = {}
    return weights, config


def _sniff(path: Path) -> str:
    """'safetensors' | 'npz' | 'torch' from the file's first bytes and, for zips, its member names."""
    with open(path, "rb") as f:
        head = f.read(16)
    if len(head) < 8:
        raise VitexportError(f"Checkpoint {path} is empty or truncated.")
    if head[:2] == b"PK":
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except zipfile.BadZipFile:
            raise VitexportError(f"Checkpoint {path} is corrupt (a damaged zip archive).") from None
        if names and all(n.endswith(".npy") for n in names):
            return "npz"
        return "torch"
    header_len = int.from_bytes(head[:8], "little")
    if 0 < header_len < 100_000_000 and head[8:9] == b"{":
        return "safetensors"
    if head[:1] == b"\x80":  # a plain pickle (legacy torch.save)
        return "torch"
    raise VitexportError(f"Checkpoint {path} is not a PyTorch, safetensors or .npz file.")


def read_raw(path: Path) -> dict[str, torch.Tensor | np.ndarray]:
    kind = _sniff(path)
    try:
        if kind == "safetensors":
            return _read_safetensors(path)
        if kind == "npz":
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except VitexportError:
        raise
    except pickle.UnpicklingError as e:
        if "weights only load failed" not in str(e).lower():
            raise VitexportError(f"Checkpoint {path} could not be read ({_first_line(e)}); is it complete?") from None
        blocked = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        needs = f" ({blocked.group(1)})" if blocked else ""
        raise VitexportError(
            f"Checkpoint {path} holds Python objects besides tensors{needs}, and vitexport never unpickles those (it "
            f"could run code); if you trust its source, convert it once to safetensors (load it in your own Python, "
            f"then safetensors.torch.save_file(state_dict, 'model.safetensors')) and pass that file.") from None
    except (RuntimeError, EOFError, ValueError, OSError, zipfile.BadZipFile) as e:
        raise VitexportError(f"Checkpoint {path} could not be read ({_first_line(e)}); is it complete?") from None
    return _unwrap(obj, path)


def _first_line(e: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()  # no terminal colour codes
    return (text.splitlines()[0][:200] if text else type(e).__name__).rstrip(".")


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return _strip_module(dict(load_file(str(path))))
    except SafetensorError as e:  # a truncated download, a damaged header
        raise VitexportError(f"Checkpoint {path} is not a complete .safetensors file ({_first_line(e)}); download "
                             f"or copy it again.") from None


def _unwrap(obj: object, path: Path) -> dict[str, torch.Tensor]:
    """Training checkpoints nest the weights: take model_ema / model / state_dict, then strip 'module.'."""
    for _ in range(3):
        if isinstance(obj, dict):
            for key in ("model_ema", "state_dict_ema", "model", "state_dict", "module"):
                inner = obj.get(key)
                if isinstance(inner, dict) and any(isinstance(v, torch.Tensor) for v in inner.values()):
                    obj = inner
                    break
            else:
                break
    if not isinstance(obj, dict):
        raise VitexportError(f"Checkpoint {path} holds a {type(obj).__name__}, not a state dict.")
    sd = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not sd:
        raise VitexportError(f"Checkpoint {path} holds no tensors.")
    return _strip_module(sd)


def _strip_module(sd: dict) -> dict:
    """DataParallel / DDP checkpoints prefix every name with 'module.'."""
    if sd and all(k.startswith("module.") for k in sd):
        return {k[len("module."):]: v for k, v in sd.items()}
    return sd
