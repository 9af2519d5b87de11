"""Transformer blocks, each composed of the parts it is given by name (`BlockArgs`):

- ``block``: pre-norm, x + attn(norm1(x)), then x + mlp(norm2(x)) (each branch with optional LayerScale);
- ``res_post``: post-norm on the branch, x + norm1(attn(x)), then x + norm2(mlp(x)) (SwinV2-style residual);
- ``parallel_scaling``: one norm and one input projection for the MLP's fc1 and qkv together, attention and MLP
  side by side, their projections summed (ViT-22B);
- ``diff_parallel_scaling``: the same with differential attention and one fused output projection;
- ``parallel_things``: two attention branches summed, then two MLP branches summed ("Three things everyone should
  know about ViTs").

The RoPE and relative-position ViTs (`model/eva.py`, `model/beit.py`) use two more, with timm's EVA names (the
LayerScale as the block's own `gamma_1`/`gamma_2`), both passing the grid's RoPE table, a shared attention bias and
the relative positions on to their attention:

- ``EvaBlock``: pre-norm as ``block`` (LayerScale on the attention branch only with `attn_only_layer_scale`:
  Sapiens2);
- ``EvaPostNormBlock``: post-norm on the branch, as ``res_post`` (EVA02-enormous).

Segment Anything's ViT (`model/sam.py`) runs ``block``'s parts over a (B, H, W, D) grid: ``WindowBlock``, whose
attention sees the tokens of one window at a time (`layers/window.py`) or, in its global blocks, the whole grid, each
with its decomposed relative position tables at that size.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .attention import ATTN_LAYERS, add_diff_lambdas, attend, diff_attend, diff_lambda
from .mlp import MLP_LAYERS
from .norm import RmsNorm
from .window import window_partition, window_unpartition


class LayerScale(nn.Module):
    """Per-channel learnable scaling of a residual branch (CaiT); gamma starts at init_values."""

    def __init__(self, dim: int, init_values: float = 1e-5):
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class DropPath(nn.Module):
    """Stochastic depth: drop a whole residual branch per sample while training."""

    def __init__(self, drop_prob: float = 0.0):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1.0 - self.drop_prob
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)  # (B, 1, 1)
        return x * mask / keep


@dataclass(frozen=True)
class BlockArgs:
    """What every block of one model shares (the config's per-block options, parts already resolved)."""

    dim: int
    num_heads: int
    mlp_ratio: float
    qkv_bias: bool
    qk_norm: bool
    scale_attn_norm: bool
    scale_mlp_norm: bool
    proj_bias: bool
    init_values: float | None
    norm_layer: Callable[[int], nn.Module]
    act_layer: type[nn.Module]
    mlp_layer: str
    attn_layer: str
    proj_drop: float = 0.0
    attn_drop: float = 0.0
    # what the RoPE and relative-position ViTs add (the defaults are the classic ViT's)
    hidden_features: int | None = None  # the MLP's hidden width; None: int(dim * mlp_ratio)
    qkv_fused: bool = True  # one qkv GEMM, or q/k/v projections of their own
    k_bias: bool = True  # False: q and v biases only (EVA, BEiT)
    num_kv_heads: tuple[int | None, ...] | None = None  # per block: key/value heads (grouped-query attention)
    rotate_half: bool | None = None  # the RoPE layout (halves or interleaved); None: no RoPE
    rel_pos_window: tuple[int, int] | None = None  # each block's own relative position bias table, at this window
    attn_only_layer_scale: bool = False
    # SAM: attention inside windows of this many tokens a side (0: none) except in the global blocks, each attention
    # with decomposed relative position tables at the grid it runs over (its window, or the image's `grid`)
    window_size: int = 0
    global_blocks: tuple[int, ...] = ()
    decomposed_grid: tuple[int, int] | None = None

    def window(self, depth: int) -> int:
        """Block `depth`'s window side (0: it attends over the whole grid)."""
        return 0 if depth in self.global_blocks else self.window_size

    @property
    def hidden(self) -> int:
        return self.hidden_features if self.hidden_features is not None else int(self.dim * self.mlp_ratio)

    def attention(self, depth: int) -> nn.Module:
        extra = {} if self.attn_layer != "attn" else dict(
            qkv_fused=self.qkv_fused, k_bias=self.k_bias, rotate_half=self.rotate_half,
            num_kv_heads=self.num_kv_heads[depth] if self.num_kv_heads else None,
            rel_pos_window=self.rel_pos_window,
            rel_pos_size=None if self.decomposed_grid is None else
            (self.window(depth),) * 2 if self.window(depth) else self.decomposed_grid)
        return ATTN_LAYERS[self.attn_layer](
            self.dim, num_heads=self.num_heads, qkv_bias=self.qkv_bias, qk_norm=self.qk_norm,
            scale_norm=self.scale_attn_norm, proj_bias=self.proj_bias, attn_drop=self.attn_drop,
            proj_drop=self.proj_drop, norm_layer=self.norm_layer, depth=depth, **extra)

    def mlp(self) -> nn.Module:
        return MLP_LAYERS[self.mlp_layer](
            self.dim, self.hidden, act_layer=self.act_layer,
            norm_layer=self.norm_layer if self.scale_mlp_norm else None, bias=self.proj_bias, drop=self.proj_drop)

    def layer_scale(self) -> nn.Module:
        return LayerScale(self.dim, self.init_values) if self.init_values else nn.Identity()


def _drop_path(p: float) -> nn.Module:
    return DropPath(p) if p > 0.0 else nn.Identity()


class Block(nn.Module):
    """Pre-norm: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(self, a: BlockArgs, depth: int = 0, drop_path: float = 0.0):
        super().__init__()
        self.norm1 = a.norm_layer(a.dim)
        self.attn = a.attention(depth)
        self.ls1 = a.layer_scale()
        self.drop_path1 = _drop_path(drop_path)
        self.norm2 = a.norm_layer(a.dim)
        self.mlp = a.mlp()
        self.ls2 = a.layer_scale()
        self.drop_path2 = _drop_path(drop_path)

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor | None = None) -> torch.Tensor:
        """attn_bias: added to the attention logits (B or 1, 1 or H, N, N): EoMT's masked attention."""
        h = self.norm1(x)
        h = self.attn(h) if attn_bias is None else self.attn(h, attn_bias=attn_bias)
        x = x + self.drop_path1(self.ls1(h))  # (B, N, D)
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))  # (B, N, D)


class WindowBlock(Block):
    """``block`` over a (B, H, W, D) grid (timm's and transformers' SAM block): the attention inside each window of
    `BlockArgs.window(depth)` tokens a side (the grid padded to a multiple, the padding cropped after), or over the
    whole grid when that is 0; the MLP over every token."""

    def __init__(self, a: BlockArgs, depth: int = 0, drop_path: float = 0.0):
        super().__init__(a, depth, drop_path)
        self.window_size = a.window(depth)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        B, H, W, D = x.shape
        h = self.norm1(x)
        padded = (H, W)
        if self.window_size:
            h, padded = window_partition(h, self.window_size)  # (B * windows, ws, ws, D)
        grid = (h.shape[1], h.shape[2])
        h = self.attn(h.reshape(-1, grid[0] * grid[1], D), grid=grid).reshape(-1, grid[0], grid[1], D)
        if self.window_size:
            h = window_unpartition(h, self.window_size, padded, (H, W))  # (B, H, W, D)
        x = x + self.drop_path1(self.ls1(h))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))  # (B, H, W, D)


class ResPostBlock(nn.Module):
    """Post-norm on the branch: x + norm1(attn(x)), then x + norm2(mlp(x)); init_values sets the norms' weights."""

    def __init__(self, a: BlockArgs, depth: int = 0, drop_path: float = 0.0):
        super().__init__()
        self.init_values = a.init_values
        self.attn = a.attention(depth)
        self.norm1 = a.norm_layer(a.dim)
        self.drop_path1 = _drop_path(drop_path)
        self.mlp = a.mlp()
        self.norm2 = a.norm_layer(a.dim)
        self.drop_path2 = _drop_path(drop_path)
        if a.init_values is not None:
            nn.init.constant_(self.norm1.weight, a.init_values)
            nn.init.constant_(self.norm2.weight, a.init_values)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.norm1(self.attn(x)))  # (B, N, D)
        return x + self.drop_path2(self.norm2(self.mlp(x)))  # (B, N, D)


class ParallelScalingBlock(nn.Module):
    """in_norm -> in_proj = [fc1 | q | k | v] in one GEMM; attention and act(fc1) in parallel; their output
    projections summed into the residual. Without qkv bias, the MLP keeps a bias of its own (mlp_bias)."""

    diff = False  # DiffParallelScalingBlock: differential attention, one fused output projection

    def __init__(self, a: BlockArgs, depth: int = 0, drop_path: float = 0.0):
        super().__init__()
        dim, hidden = a.dim, a.hidden
        self.num_heads = a.num_heads
        self.head_dim = dim // a.num_heads // (2 if self.diff else 1)
        self.scale = self.head_dim**-0.5
        self.in_norm = a.norm_layer(dim)
        self.in_proj = nn.Linear(dim, hidden + 3 * dim, bias=a.qkv_bias)
        self.in_split = [hidden] + [dim] * 3
        self.mlp_bias = None if a.qkv_bias else nn.Parameter(torch.zeros(hidden))  # in in_proj's bias otherwise
        self.q_norm = a.norm_layer(self.head_dim) if a.qk_norm else nn.Identity()
        self.k_norm = a.norm_layer(self.head_dim) if a.qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(a.attn_drop)
        if self.diff:
            self.sub_norm = RmsNorm(2 * self.head_dim, eps=1e-5)
            add_diff_lambdas(self, self.head_dim, depth)
        self.mlp_drop = nn.Dropout(a.proj_drop)
        self.mlp_act = a.act_layer()
        if self.diff:
            self.out_proj = nn.Linear(dim + hidden, dim, bias=a.proj_bias)
        else:
            self.attn_out_proj = nn.Linear(dim, dim, bias=a.proj_bias)
            self.mlp_out_proj = nn.Linear(hidden, dim, bias=a.proj_bias)
        self.ls = LayerScale(dim, a.init_values) if a.init_values is not None else nn.Identity()
        self.drop_path = _drop_path(drop_path)
        self.fused_attn = True

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v (B, N, D) -> (B, N, D)."""
        B, N, C = q.shape
        H, hd = self.num_heads, self.head_dim
        if not self.diff:
            q = self.q_norm(q.view(B, N, H, hd)).transpose(1, 2)  # (B, H, N, hd)
            k = self.k_norm(k.view(B, N, H, hd)).transpose(1, 2)
            v = v.view(B, N, H, hd).transpose(1, 2)
            x = attend(q, k, v, self.scale, self.fused_attn)  # (B, H, N, hd)
        else:
            q = self.q_norm(q.reshape(B, N, 2 * H, hd).transpose(1, 2))  # (B, 2H, N, hd/2)
            k = self.k_norm(k.reshape(B, N, 2 * H, hd).transpose(1, 2))
            v = v.reshape(B, N, H, 2 * hd).transpose(1, 2)  # (B, H, N, hd)
            x = diff_attend(q, k, v, diff_lambda(self).type_as(q), self.scale, self.fused_attn)
            x = self.sub_norm(x) * (1 - self.lambda_init)
        return x.transpose(1, 2).reshape(B, N, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.in_proj(self.in_norm(x))  # (B, N, hidden + 3D)
        x_mlp, q, k, v = torch.split(y, self.in_split, dim=-1)
        if self.mlp_bias is not None:
            x_mlp = x_mlp + self.mlp_bias
        x_attn = self._attention(q, k, v)  # (B, N, D)
        x_mlp = self.mlp_drop(self.mlp_act(x_mlp))  # (B, N, hidden)
        if self.diff:
            y = self.out_proj(torch.cat((x_attn, x_mlp), dim=-1))
        else:
            y = self.attn_out_proj(x_attn) + self.mlp_out_proj(x_mlp)
        return x + self.drop_path(self.ls(y))  # (B, N, D)


class DiffParallelScalingBlock(ParallelScalingBlock):
    diff = True


class ParallelThingsBlock(nn.Module):
    """x + sum of two attention branches, then x + sum of two MLP branches (each branch norm -> part -> ls)."""

    def __init__(self, a: BlockArgs, depth: int = 0, drop_path: float = 0.0, num_parallel: int = 2):
        super().__init__()
        self.num_parallel = num_parallel
        self.attns = nn.ModuleList([self._branch(a, "attn", a.attention(depth), drop_path)
                                    for _ in range(num_parallel)])
        self.ffns = nn.ModuleList([self._branch(a, "mlp", a.mlp(), drop_path) for _ in range(num_parallel)])

    @staticmethod
    def _branch(a: BlockArgs, name: str, part: nn.Module, drop_path: float) -> nn.Sequential:
        return nn.Sequential(OrderedDict([("norm", a.norm_layer(a.dim)), (name, part), ("ls", a.layer_scale()),
                                          ("drop_path", _drop_path(drop_path))]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + torch.stack([attn(x) for attn in self.attns]).sum(dim=0)  # (B, N, D)
        return x + torch.stack([ffn(x) for ffn in self.ffns]).sum(dim=0)


class EvaBlock(nn.Module):
    """Pre-norm, x + gamma_1 * attn(norm1(x), rope), then x + gamma_2 * mlp(norm2(x)) (timm's EvaBlock and BEiT's
    Block); without init_values there is no LayerScale, with attn_only_layer_scale only gamma_1."""

    def __init__(self, a: BlockArgs, depth: int = 0, drop_path: float = 0.0):
        super().__init__()
        self.norm1 = a.norm_layer(a.dim)
        self.attn = a.attention(depth)
        has_ls = a.init_values is not None
        self.gamma_1 = nn.Parameter(a.init_values * torch.ones(a.dim)) if has_ls else None
        self.drop_path1 = _drop_path(drop_path)
        self.norm2 = a.norm_layer(a.dim)
        self.mlp = a.mlp()
        self.gamma_2 = nn.Parameter(a.init_values * torch.ones(a.dim)) if has_ls and not a.attn_only_layer_scale \
            else None
        self.drop_path2 = _drop_path(drop_path)

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None = None, attn_bias: torch.Tensor | None = None,
                rel_pos=None) -> torch.Tensor:
        y = self.attn(self.norm1(x), rope=rope, attn_bias=attn_bias, rel_pos=rel_pos)  # (B, N, D)
        x = x + self.drop_path1(y if self.gamma_1 is None else self.gamma_1 * y)
        y = self.mlp(self.norm2(x))
        return x + self.drop_path2(y if self.gamma_2 is None else self.gamma_2 * y)  # (B, N, D)


class EvaPostNormBlock(nn.Module):
    """Post-norm on the branch: x + norm1(attn(x, rope)), then x + norm2(mlp(x)) (timm's EvaBlockPostNorm)."""

    def __init__(self, a: BlockArgs, depth: int = 0, drop_path: float = 0.0):
        super().__init__()
        self.attn = a.attention(depth)
        self.norm1 = a.norm_layer(a.dim)
        self.drop_path1 = _drop_path(drop_path)
        self.mlp = a.mlp()
        self.norm2 = a.norm_layer(a.dim)
        self.drop_path2 = _drop_path(drop_path)

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None = None, attn_bias: torch.Tensor | None = None,
                rel_pos=None) -> torch.Tensor:
        x = x + self.drop_path1(self.norm1(self.attn(x, rope=rope, attn_bias=attn_bias, rel_pos=rel_pos)))
        return x + self.drop_path2(self.norm2(self.mlp(x)))  # (B, N, D)


# the blocks of the RoPE / relative-position families, by the same block_fn names
EVA_BLOCK_LAYERS: dict[str, type[nn.Module]] = {"block": EvaBlock, "res_post": EvaPostNormBlock}

BLOCK_LAYERS: dict[str, type[nn.Module]] = {
    "block": Block, "res_post": ResPostBlock, "parallel_scaling": ParallelScalingBlock,
    "diff_parallel_scaling": DiffParallelScalingBlock, "parallel_things": ParallelThingsBlock,
}
