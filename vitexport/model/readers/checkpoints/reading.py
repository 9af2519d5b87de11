"""Reading a checkpoint's raw tensors: the weights file of a folder, its config.json, and the file's own format
(safetensors, a torch zip or pickle read with weights_only, a JAX .npz), sniffed from its bytes, never its name.
Training checkpoints are unwrapped (model_ema / model / state_dict, DataParallel's 'module.').

Large models are saved in shards (`save_pretrained` and the hub write `model.safetensors.index.json` or
`pytorch_model.bin.index.json`: `weight_map`, tensor -> shard file). An index is read shard by shard, each shard's
tensors kept as they come, so the peak is the weights themselves, as with one file. An index is input: a shard it
names must be a plain file name beside it (never a path out of the folder), present, and hold the tensors the
index puts there; a tensor named twice is one sentence.
"""

from __future__ import annotations

import json
import pickle
import re
import zipfile
from pathlib import Path

import numpy as np
import torch

from ....errors import VitexportError

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.pth", "model.pt", "model.npz")
SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")  # tried after WEIGHT_FILES


def resolve_weights(path: Path) -> tuple[Path, dict]:
    """A file or a directory -> (weights file, config.json contents or {})."""
    if not path.exists():
        raise VitexportError(f"Checkpoint {path} does not exist.")
    config: dict = {}
    if path.is_dir():
        candidates = [path / n for n in (*WEIGHT_FILES, *SHARD_INDEXES) if (path / n).is_file()]
        if not candidates:
            candidates = sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin", ".pth", ".pt", ".npz"))
        if not candidates:
            raise VitexportError(f"Checkpoint directory {path} holds no weights file (looked for "
                                 f"{', '.join(WEIGHT_FILES + SHARD_INDEXES)}).")
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


def is_index(path: Path) -> bool:
    return Path(path).name.endswith(".index.json")


def shard_map(index: Path) -> dict[str, list[str]]:
    """An index's shards -> the tensors each holds, in the index's order; one sentence for an index that is not
    one, names a file that is not a plain name beside it, names a missing shard, or names a tensor twice."""
    shards = shard_names(index)
    for shard in shards:
        if not (Path(index).parent / shard).is_file():
            raise VitexportError(f"Checkpoint index {index} names shard {shard}, which is not in "
                                 f"{Path(index).parent}; download or copy it too.")
    return shards


def shard_names(index: Path) -> dict[str, list[str]]:
    """shard_map without looking for the shards (a hub repository's are fetched from what it says)."""
    from ....paths import plain_name

    def pairs(items: list) -> dict:
        keys = [k for k, _ in items]
        if len(set(keys)) != len(keys):
            twice = next(k for k in keys if keys.count(k) > 1)
            raise VitexportError(f"Checkpoint index {index} names tensor {twice!r} twice.")
        return dict(items)

    try:
        data = json.loads(Path(index).read_text(), object_pairs_hook=pairs)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VitexportError(f"Checkpoint index {index} is not readable JSON ({type(e).__name__}).") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise VitexportError(f"Checkpoint index {index} has no weight_map of tensor names to shard files.")
    shards: dict[str, list[str]] = {}
    for tensor, shard in weight_map.items():
        try:
            plain_name(shard, f"a shard of {index}")
        except VitexportError:
            raise VitexportError(f"Checkpoint index {index} names shard {shard!r} for {tensor!r}, which is not a "
                                 f"file beside it; vitexport reads only the folder it is given.") from None
        shards.setdefault(shard, []).append(tensor)
    return shards


def _read_sharded(index: Path) -> dict[str, torch.Tensor | np.ndarray]:
    """Every tensor of a sharded checkpoint, shard by shard."""
    out: dict[str, torch.Tensor | np.ndarray] = {}
    for shard, names in shard_map(index).items():
        raw = read_raw(Path(index).parent / shard)
        missing = [n for n in names if n not in raw]
        if missing:
            raise VitexportError(f"Shard {shard} of {index} lacks tensor {missing[0]!r}, which the index puts there"
                                 f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}.")
        for n in names:
            if n in out:
                raise VitexportError(f"Checkpoint index {index} puts tensor {n!r} in two shards.")
            out[n] = raw.pop(n)
        del raw
    return out


def weights_digest(path: Path) -> str:
    """The sha256 that names a checkpoint's weights: the file's; for an index, of the index and every shard's."""
    import hashlib

    from ....paths import sha256_file

    if not is_index(path):
        return sha256_file(path)
    h = hashlib.sha256(Path(path).read_bytes())
    for shard in sorted(shard_map(path)):
        h.update(bytes.fromhex(sha256_file(Path(path).parent / shard)))
    return h.hexdigest()


def read_raw(path: Path) -> dict[str, torch.Tensor | np.ndarray]:
    if is_index(path):
        return _read_sharded(path)
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
