"""From tokens to one vector per image: `global_pool` 'token' (the class token), 'avg', 'max', 'avgmax' (the
mean of both) over the patch tokens (prefix tokens too with pool_include_prefix), 'token_avg' (the class token and
the patch tokens' mean, concatenated), '' (no pooling), and 'map'
(multi-head attention pooling: a learned latent query attends to the tokens, then proj and a residual MLP; SigLIP's
head, timm's AttentionPoolLatent)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .attention import attend
from .mlp import Mlp

def global_pool_nlc(x: torch.Tensor, pool_type: str, num_prefix_tokens: int, include_prefix: bool) -> torch.Tensor:
    """(B, N, D) -> (B, D) ((B, 2D) for 'token_avg', (B, N, D) for '')."""
    if not pool_type:
        return x
    if pool_type == "token":
        return x[:, 0]  # the class token
    if pool_type == "token_avg":  # the class token beside the mean of the patch tokens: (B, 2D)
        return torch.cat([x[:, 0], x[:, num_prefix_tokens:].mean(dim=1)], dim=-1)
    x = x if include_prefix else x[:, num_prefix_tokens:]
    if pool_type == "avg":
        return x.mean(dim=1)
    if pool_type == "max":
        return x.amax(dim=1)
    return 0.5 * (x.amax(dim=1) + x.mean(dim=1))  # avgmax


class AttentionPoolLatent(nn.Module):
    """A learned latent query attends to the tokens (q from the latent, k and v from the tokens), then proj and
    x + mlp(norm(x)) (none with mlp_ratio 0); the latent's output is the pooled vector."""

    def __init__(self, dim: int, num_heads: int = 8, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 norm_layer: Callable[[int], nn.Module] | None = None, act_layer: type[nn.Module] = nn.GELU):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))  # (1, latent_len=1, D)
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.q_norm = nn.Identity()
        self.k_norm = nn.Identity()
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)
        # mlp_ratio 0: no MLP and no norm after the attention (AIMv2's head)
        self.norm = norm_layer(dim) if norm_layer is not None and mlp_ratio else nn.Identity()
        self.mlp = Mlp(dim, int(dim * mlp_ratio), out_features=dim, act_layer=act_layer) if mlp_ratio else None
        self.fused_attn = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        q = self.q(self.latent.expand(B, -1, -1))  # (B, 1, D)
        q = q.reshape(B, 1, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, 1, hd)
        kv = self.kv(x).reshape(B, N, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (2, B, H, N, hd)
        k, v = kv.unbind(0)
        x = attend(self.q_norm(q), self.k_norm(k), v, self.scale, self.fused_attn)  # (B, H, 1, hd)
        x = x.transpose(1, 2).reshape(B, 1, C)  # (B, 1, D)
        x = self.proj_drop(self.proj(x))
        if self.mlp is not None:
            x = x + self.mlp(self.norm(x))
        return x[:, 0]  # (B, D)
