"""Normalisation layers and activations, named as ViTConfig names them.

- ``layernorm``: LayerNorm over the last axis (timm's default eps is 1e-6; CLIP's and SigLIP's 1e-5);
- ``rmsnorm``: x / sqrt(mean(x^2) + eps) * weight, no mean subtraction and no bias (timm's RmsNorm).

`LayerNorm2d` normalises the channels of a (B, C, H, W) map (the convolutional necks and heads: SAM, EoMT).

Activations: ``gelu`` (erf), ``gelu_tanh`` (the tanh approximation, SigLIP), ``quick_gelu`` (x * sigmoid(1.702 x),
OpenAI CLIP), ``silu`` (SwiGLU MLPs).
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import VitexportError


class RmsNorm(nn.Module):
    """Root-mean-square normalisation over the last axis with a learned per-channel scale."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.normalized_shape = (dim,)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., 1)
        return x * rms * self.weight


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of a (B, C, H, W) map."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)  # (B, H, W, C)
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps).permute(0, 3, 1, 2)


NORM_LAYERS: dict[str, type[nn.Module]] = {"layernorm": nn.LayerNorm, "rmsnorm": RmsNorm}


def norm_factory(kind: str, eps: float) -> Callable[[int], nn.Module]:
    """'layernorm' | 'rmsnorm' -> a constructor taking the width."""
    if kind not in NORM_LAYERS:
        raise VitexportError(f"Unknown norm layer {kind!r}; vitexport builds {', '.join(NORM_LAYERS)}.")
    return partial(NORM_LAYERS[kind], eps=eps)


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): OpenAI CLIP's approximation of GELU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class GELUTanh(nn.Module):
    """GELU with the tanh approximation (SigLIP; timm's gelu_tanh)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh")


ACT_LAYERS: dict[str, type[nn.Module]] = {"gelu": nn.GELU, "gelu_tanh": GELUTanh, "quick_gelu": QuickGELU,
                                          "silu": nn.SiLU}


def act_factory(kind: str) -> type[nn.Module]:
    if kind not in ACT_LAYERS:
        raise VitexportError(f"Unknown activation {kind!r}; vitexport builds {', '.join(ACT_LAYERS)}.")
    return ACT_LAYERS[kind]
