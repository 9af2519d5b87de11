"""The original JAX .npz files of google-research/vision_transformer (Flax names) -> timm names, as timm's
`_load_weights` reads them."""

from __future__ import annotations

import re

import numpy as np
import torch

from ....errors import VitexportError
from .common import StateDict

NAME = "jax"


def matches(keys: set[str]) -> bool:
    return any(k.endswith("embedding/kernel") for k in keys)


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


def convert(raw: dict) -> StateDict:
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
