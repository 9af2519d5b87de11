"""Checkpoints a user actually has -> our (timm-named) state dict.

The format is chosen from what the file contains, never from its name:

- timm state dicts (``.pth``/``.pt``/``.bin`` via ``torch.load(weights_only=True)``, or ``.safetensors``),
  possibly wrapped under ``model``/``state_dict``/``model_ema`` or prefixed with ``module.``;
- Hugging Face ``ViTForImageClassification`` / ``ViTModel`` (a weights file, or the directory with ``config.json``);
- the original JAX ``.npz`` files of google-research/vision_transformer.

Each converter is a pure function ``raw tensors -> state dict``.
"""

from __future__ import annotations

import json
import pickle
import re
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..artifacts.manifest import CheckpointRecord
from ..errors import VitexportError
from ..paths import sha256_file
from .hub import origin
from .labels import checkpoint_labels
from .posembed import resample_pos_embed
from .vit import VisionTransformer

StateDict = dict[str, torch.Tensor]


@dataclass
class Checkpoint:
    state_dict: StateDict  # timm parameter names
    format: str  # 'timm' | 'huggingface' | 'jax'
    path: Path  # the weights file that was read
    sha256: str
    hints: dict = field(default_factory=dict)  # config facts the file carries (norm_eps, grid, ...)

    @property
    def num_classes(self) -> int:
        head = self.state_dict.get("head.weight")
        return int(head.shape[0]) if head is not None else 0

    def record(self) -> CheckpointRecord:
        """What the manifest keeps: the file, its bytes, and the hub repository and commit it came from."""
        hub = origin(self.path)
        if hub is None:
            return CheckpointRecord(str(self.path.resolve()), self.sha256, self.format)
        # inside the Hugging Face cache: the snapshot path (its config.json beside it), not the blob it links to
        return CheckpointRecord(str(self.path.absolute()), self.sha256, self.format, repo=hub[0], revision=hub[1])


# -- reading raw tensors -------------------------------------------------------------------------------------

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


def _read_raw(path: Path) -> dict[str, torch.Tensor | np.ndarray]:
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


# -- converters: one per format -----------------------------------------------------------------------------

def convert_timm(raw: dict) -> StateDict:
    sd = {k: torch.as_tensor(v) for k, v in raw.items()}
    # drop what the reference ViT has no place for (pre-logits representation layer of old checkpoints)
    return {k: v for k, v in sd.items() if not k.startswith("pre_logits.")}


_HF_BLOCK = {
    "layernorm_before": "norm1",
    "attention.output.dense": "attn.proj",
    "layernorm_after": "norm2",
    "intermediate.dense": "mlp.fc1",
    "output.dense": "mlp.fc2",
}


def convert_huggingface(raw: dict) -> StateDict:
    """transformers' ViTModel / ViTForImageClassification names -> timm names (q, k, v fused into qkv)."""
    sd = {re.sub(r"^vit\.", "", k): torch.as_tensor(v) for k, v in raw.items()}
    out: StateDict = {}
    qkv: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for k, v in sd.items():
        if k.startswith(("pooler.", "embeddings.mask_token")):
            continue  # ViTModel's pooler and the masked-image-modelling token are not part of the classifier
        if k == "embeddings.cls_token":
            out["cls_token"] = v
        elif k == "embeddings.position_embeddings":
            out["pos_embed"] = v
        elif k.startswith("embeddings.patch_embeddings.projection."):
            out["patch_embed.proj." + k.rsplit(".", 1)[1]] = v
        elif k.startswith("layernorm."):
            out["norm." + k.rsplit(".", 1)[1]] = v
        elif k.startswith("classifier."):
            out["head." + k.rsplit(".", 1)[1]] = v
        elif m := re.match(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$", k):
            i, name, kind = int(m.group(1)), m.group(2), m.group(3)
            if qm := re.match(r"attention\.attention\.(query|key|value)$", name):
                qkv.setdefault((i, kind), {})[qm.group(1)] = v
            elif name in _HF_BLOCK:
                out[f"blocks.{i}.{_HF_BLOCK[name]}.{kind}"] = v
            else:
                out[k] = v  # unknown: reported as unexpected later
        else:
            out[k] = v
    for (i, kind), parts in qkv.items():
        if set(parts) != {"query", "key", "value"}:
            raise VitexportError(f"Hugging Face checkpoint: block {i} lacks some of query/key/value {kind}.")
        out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat([parts["query"], parts["key"], parts["value"]], dim=0)
    return out


def _n2p(w: np.ndarray, t: bool = True) -> torch.Tensor:
    """A JAX kernel -> PyTorch layout (HWIO -> OIHW, (in, out) -> (out, in), (D, H, hd) -> (hd..)); as timm."""
    if w.ndim == 4 and w.shape[0] == w.shape[1] == w.shape[2] == 1:
        w = w.flatten()
    if t:
        if w.ndim == 4:
            w = w.transpose([3, 2, 0, 1])
        elif w.ndim == 3:
            w = w.transpose([2, 0, 1])
        elif w.ndim == 2:
            w = w.transpose([1, 0])
    return torch.from_numpy(np.ascontiguousarray(w)).float()


def convert_jax(raw: dict) -> StateDict:
    """google-research/vision_transformer .npz (Flax names) -> timm names."""
    prefix = next((p for p in ("", "opt/target/", "params/") if f"{p}embedding/kernel" in raw), None)
    if prefix is None:
        raise VitexportError("The .npz file has no 'embedding/kernel': not a vision_transformer checkpoint.")
    w = {k[len(prefix):]: v for k, v in raw.items() if k.startswith(prefix)}
    if "pos_embedding" in w or "Transformer/encoderblock/LayerNorm_0/scale" in w:
        raise VitexportError("big_vision .npz checkpoints (scanned blocks) are not supported; use the timm conversion.")
    out: StateDict = {
        "patch_embed.proj.weight": _n2p(w["embedding/kernel"]),
        "patch_embed.proj.bias": _n2p(w["embedding/bias"]),
        "pos_embed": _n2p(w["Transformer/posembed_input/pos_embedding"], t=False),
        "norm.weight": _n2p(w["Transformer/encoder_norm/scale"]),
        "norm.bias": _n2p(w["Transformer/encoder_norm/bias"]),
    }
    if "cls" in w:
        out["cls_token"] = _n2p(w["cls"], t=False)
    if "head/kernel" in w and np.asarray(w["head/kernel"]).size:
        out["head.weight"] = _n2p(w["head/kernel"])
        out["head.bias"] = _n2p(w["head/bias"])
    depth = len({m.group(1) for k in w if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))})
    for i in range(depth):
        b, mha = f"Transformer/encoderblock_{i}/", f"Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1/"
        out[f"blocks.{i}.norm1.weight"] = _n2p(w[b + "LayerNorm_0/scale"])
        out[f"blocks.{i}.norm1.bias"] = _n2p(w[b + "LayerNorm_0/bias"])
        out[f"blocks.{i}.attn.qkv.weight"] = torch.cat(
            [_n2p(w[f"{mha}{n}/kernel"], t=False).flatten(1).T for n in ("query", "key", "value")])  # (3D, D)
        out[f"blocks.{i}.attn.qkv.bias"] = torch.cat(
            [_n2p(w[f"{mha}{n}/bias"], t=False).reshape(-1) for n in ("query", "key", "value")])  # (3D,)
        out[f"blocks.{i}.attn.proj.weight"] = _n2p(w[mha + "out/kernel"]).flatten(1)  # (D, H*hd)
        out[f"blocks.{i}.attn.proj.bias"] = _n2p(w[mha + "out/bias"])
        out[f"blocks.{i}.norm2.weight"] = _n2p(w[b + "LayerNorm_2/scale"])
        out[f"blocks.{i}.norm2.bias"] = _n2p(w[b + "LayerNorm_2/bias"])
        for r in range(2):
            out[f"blocks.{i}.mlp.fc{r + 1}.weight"] = _n2p(w[f"{b}MlpBlock_3/Dense_{r}/kernel"])
            out[f"blocks.{i}.mlp.fc{r + 1}.bias"] = _n2p(w[f"{b}MlpBlock_3/Dense_{r}/bias"])
    return out


def detect_format(raw: dict) -> str:
    keys = list(raw)
    if any(k.endswith("embedding/kernel") for k in keys):
        return "jax"
    if any(k.endswith("embeddings.patch_embeddings.projection.weight") for k in keys):
        return "huggingface"
    if any(k.endswith("patch_embed.proj.weight") for k in keys):
        return "timm"
    raise VitexportError("The checkpoint's tensor names match no known ViT format (timm, Hugging Face or JAX .npz).")


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint file or directory into timm names, with the config facts it carries."""
    weights, config = resolve_weights(Path(path))
    raw = _read_raw(weights)
    fmt = detect_format(raw)
    hints: dict = {}
    try:
        if fmt == "jax":
            sd = convert_jax(raw)
        elif fmt == "huggingface":
            sd = convert_huggingface(raw)
            hints["norm_eps"] = float(config.get("layer_norm_eps", 1e-12))
            if "image_size" in config and "patch_size" in config:
                img = config["image_size"]
                img = (img, img) if isinstance(img, int) else tuple(img)
                hints["grid"] = (img[0] // config["patch_size"], img[1] // config["patch_size"])
            if "qkv_bias" in config:
                hints["qkv_bias"] = bool(config["qkv_bias"])
        else:
            sd = convert_timm(raw)
    except KeyError as e:
        raise VitexportError(f"Checkpoint {weights} ({fmt} format) lacks tensor {e.args[0]!r}.") from None
    if names := checkpoint_labels(config):
        hints["labels"] = names  # class names, in head order
    return Checkpoint(sd, fmt, weights, sha256_file(weights), hints)


# -- putting a checkpoint into a model ----------------------------------------------------------------------

def describe_checkpoint(sd: StateDict) -> str:
    """A short description of the architecture a state dict holds, for error messages."""
    w = sd.get("patch_embed.proj.weight")
    depth = len({m.group(1) for k in sd if (m := re.match(r"blocks\.(\d+)\.", k))})
    if w is None:
        return f"depth {depth}"
    return f"width {w.shape[0]}, depth {depth}, patch {w.shape[-1]}"


def adapt_state_dict(
    sd: StateDict,
    model: VisionTransformer,
    pos_embed_interp: str,
    old_grid: tuple[int, int] | None = None,
) -> tuple[StateDict, list[str]]:
    """Fit a checkpoint to the model: resize the position embedding, drop a head of another class count.

    Returns the adapted state dict and warnings. Raises one readable error listing every missing,
    unexpected or mis-shaped tensor by name.
    """
    notes: list[str] = []
    sd = dict(sd)
    target = model.state_dict()
    grid = model.pos_grid  # the model's own grid, or a dynamic-size model's stored one
    if "pos_embed" in sd and sd["pos_embed"].shape != target["pos_embed"].shape or (
            old_grid and tuple(old_grid) != grid and "pos_embed" in sd):
        prefix = 0 if model.no_embed_class else model.num_prefix_tokens
        pe = sd["pos_embed"]
        if pe.ndim == 2:
            pe = pe.unsqueeze(0)
        if pe.shape[-1] == target["pos_embed"].shape[-1]:
            sd["pos_embed"] = resample_pos_embed(pe, grid, prefix, old_grid, pos_embed_interp)
            notes.append(f"Resized the position embedding to a {grid[0]}x{grid[1]} grid ({pos_embed_interp}).")
    head_w = sd.get("head.weight")
    if head_w is not None and "head.weight" not in target:
        notes.append("num_classes is 0: dropped the checkpoint's head; the model outputs features.")
        _drop_heads(sd)
    elif head_w is not None and head_w.shape != target["head.weight"].shape \
            and head_w.shape[1:] == target["head.weight"].shape[1:]:
        notes.append(f"The checkpoint's head has {head_w.shape[0]} classes, the model {target['head.weight'].shape[0]}:"
                     " dropped the checkpoint's head; the new head is untrained.")
        _drop_heads(sd)
    elif head_w is None and "head.weight" in target:
        notes.append("The checkpoint has no classification head: the head is untrained.")

    missing = [k for k in target if k not in sd and not k.startswith(("head.", "head_dist."))]
    unexpected = [k for k in sd if k not in target]
    mis_shaped = [f"{k} {tuple(sd[k].shape)} vs model {tuple(target[k].shape)}"
                  for k in sd if k in target and sd[k].shape != target[k].shape]
    if missing or unexpected or mis_shaped:
        parts = []
        for label, names in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", mis_shaped)):
            if names:
                shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
                parts.append(f"{len(names)} {label} ({shown})")
        raise VitexportError(
            f"The checkpoint ({describe_checkpoint(sd)}) does not fit the model "
            f"({describe_checkpoint(target)}): " + "; ".join(parts) + ".")
    return sd, notes


def _drop_heads(sd: StateDict) -> None:
    """The classifier and, for a distilled DeiT, the distillation head."""
    for k in ("head.weight", "head.bias", "head_dist.weight", "head_dist.bias"):
        sd.pop(k, None)


def load_into(model: VisionTransformer, ckpt: Checkpoint, pos_embed_interp: str) -> list[str]:
    """Load a checkpoint into a model in place; returns warnings for the user."""
    sd, notes = adapt_state_dict(ckpt.state_dict, model, pos_embed_interp, ckpt.hints.get("grid"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.load_state_dict(sd, strict=False)
    return notes
