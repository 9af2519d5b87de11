"""Multi-head self-attention: ``attn`` (one fused qkv projection, optional q/k norm and a norm before the output
projection) and ``diff`` (differential attention: two softmax maps subtracted, scaled by a learned lambda).

`fused_attn` picks PyTorch's fused kernel (eager) or the explicit MatMul -> Softmax -> MatMul form, which is what
the export writes (`VisionTransformer.set_fused_attn(False)`): the form every runtime and quantizer understands.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import VitexportError
from .norm import RmsNorm

NormFactory = Callable[[int], nn.Module]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, fused: bool) -> torch.Tensor:
    """softmax(q k^T * scale) v over (B, H, Nq, hd) x (B, H, Nk, hd) -> (B, H, Nq, hd)."""
    if fused:
        return F.scaled_dot_product_attention(q, k, v)
    attn = (q * scale) @ k.transpose(-2, -1)  # (B, H, Nq, Nk)
    return attn.softmax(dim=-1) @ v


class Attention(nn.Module):
    """qkv -> per-head attention -> (norm) -> proj."""

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, qk_norm: bool = False,
                 scale_norm: bool = False, proj_bias: bool = True, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 norm_layer: NormFactory | None = None, depth: int = 0):
        super().__init__()
        if dim % num_heads != 0:
            raise VitexportError(f"Embedding width {dim} is not divisible by {num_heads} heads.")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = norm_layer(self.head_dim) if qk_norm and norm_layer else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm and norm_layer else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm_layer(dim) if scale_norm and norm_layer else nn.Identity()
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)
        self.fused_attn = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (3, B, H, N, hd)
        q, k, v = qkv.unbind(0)  # each (B, H, N, hd)
        q, k = self.q_norm(q), self.k_norm(k)
        x = attend(q, k, v, self.scale, self.fused_attn)  # (B, H, N, hd)
        x = x.transpose(1, 2).reshape(B, N, C)  # (B, N, D)
        return self.proj_drop(self.proj(self.norm(x)))


def add_diff_lambdas(module: nn.Module, head_dim: int, depth: int) -> None:
    """Differential attention's parameters on `module` itself (timm's names: lambda_q1, lambda_k1, lambda_q2,
    lambda_k2) and lambda_init = 0.8 - 0.6 exp(-0.3 depth), depth being the block's index."""
    for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
        module.register_parameter(name, nn.Parameter(torch.zeros(head_dim)))
    module.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * depth)


def diff_lambda(module: nn.Module) -> torch.Tensor:
    """The weight of the second map: exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init."""
    lambda_1 = torch.exp(torch.sum(module.lambda_q1 * module.lambda_k1, dim=-1).float())
    lambda_2 = torch.exp(torch.sum(module.lambda_q2 * module.lambda_k2, dim=-1).float())
    return lambda_1 - lambda_2 + module.lambda_init


def diff_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lam: torch.Tensor, scale: float,
                fused: bool) -> torch.Tensor:
    """Two attention maps from 2H half-width heads, the second weighted by lam and subtracted:
    q, k (B, 2H, N, hd/2), v (B, H, N, hd) -> (B, H, N, hd)."""
    B, H2, N, hd = q.shape
    q1, q2 = q.reshape(B, H2 // 2, 2, N, hd).unbind(2)  # each (B, H, N, hd/2)
    k1, k2 = k.reshape(B, H2 // 2, 2, N, hd).unbind(2)
    return attend(q1, k1, v, scale, fused) - lam * attend(q2, k2, v, scale, fused)


class DiffAttention(nn.Module):
    """Differential attention (arXiv 2410.05258): qkv -> two maps over half-width heads -> sub-norm -> proj."""

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, qk_norm: bool = False,
                 scale_norm: bool = False, proj_bias: bool = True, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 norm_layer: NormFactory | None = None, depth: int = 0):
        super().__init__()
        if dim % (2 * num_heads) != 0:
            raise VitexportError(f"Differential attention: width {dim} is not divisible by 2 x {num_heads} heads.")
        norm_layer = norm_layer or RmsNorm
        self.num_heads = num_heads
        self.head_dim = dim // num_heads // 2
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm_layer(dim) if scale_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)
        add_diff_lambdas(self, self.head_dim, depth)
        self.sub_norm = RmsNorm(2 * self.head_dim, eps=1e-5)
        self.fused_attn = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=2)  # each (B, N, D)
        q = q.reshape(B, N, 2 * self.num_heads, self.head_dim).transpose(1, 2)  # (B, 2H, N, hd/2)
        k = k.reshape(B, N, 2 * self.num_heads, self.head_dim).transpose(1, 2)
        v = v.reshape(B, N, self.num_heads, 2 * self.head_dim).transpose(1, 2)  # (B, H, N, hd)
        q, k = self.q_norm(q), self.k_norm(k)
        x = diff_attend(q, k, v, diff_lambda(self).type_as(q), self.scale, self.fused_attn)  # (B, H, N, hd)
        x = self.sub_norm(x) * (1 - self.lambda_init)
        x = x.transpose(1, 2).reshape(B, N, C)  # (B, N, D)
        return self.proj_drop(self.proj(self.norm(x)))


ATTN_LAYERS: dict[str, type[nn.Module]] = {"attn": Attention, "diff": DiffAttention}
