"""Multi-head self-attention: ``attn`` (one fused qkv projection, optional q/k norm and a norm before the output
projection) and ``diff`` (differential attention: two softmax maps subtracted, scaled by a learned lambda).

`Attention` also takes what the RoPE and relative-position ViTs (EVA, DINOv3, BEiT, ...; `model/eva.py`,
`model/beit.py`) add, each as timm names its tensors: separate q/k/v projections (`qkv_fused=False`); biases on the
query and the value only (`k_bias=False`: EVA and BEiT learn no key bias, timm's `q_bias`/`v_bias`); fewer key/value
heads than query heads (grouped-query attention, `num_kv_heads`); a RoPE table of the whole sequence rotating q and
k (`forward(x, rope=...)`; `rotate_half` gives the layout, its prefix rows leave the class and register tokens as
they are); and an additive bias on the attention logits (BEiT's relative position bias, its
own table `relative_position_bias_table` per block, or a shared one passed in as `attn_bias`); and Segment Anything's
decomposed relative position (`rel_pos_size`: one table per axis, `rel_pos_h` and `rel_pos_w`, read with each query;
`layers/decomposed.py`), over the h x w grid of tokens it is given (`forward(x, grid=...)`: a window or the image).

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
from .decomposed import decomposed_bias, rel_pos_rows
from .norm import RmsNorm
from .relpos import RelPosGrid, table_size
from .rope import apply_rope, halves_order

NormFactory = Callable[[int], nn.Module]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, fused: bool,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T * scale + bias) v over (B, H, Nq, hd) x (B, H, Nk, hd) -> (B, H, Nq, hd)."""
    if fused:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
    attn = (q if scale == 1.0 else q * scale) @ k.transpose(-2, -1)  # (B, H, Nq, Nk); 1.0: folded into q
    if bias is not None:
        attn = attn + bias
    return attn.softmax(dim=-1) @ v


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, Hkv, N, hd) -> (B, Hkv * groups, N, hd): query head h reads key/value head h // groups."""
    if groups == 1:
        return x
    B, H, N, hd = x.shape
    return x[:, :, None].expand(B, H, groups, N, hd).reshape(B, H * groups, N, hd)


class Attention(nn.Module):
    """qkv (one GEMM or three) -> per-head q/k norm -> RoPE -> attention (+ bias) -> (norm) -> proj."""

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, qk_norm: bool = False,
                 scale_norm: bool = False, proj_bias: bool = True, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 norm_layer: NormFactory | None = None, depth: int = 0, qkv_fused: bool = True, k_bias: bool = True,
                 num_kv_heads: int | None = None, rotate_half: bool | None = None,
                 rel_pos_window: tuple[int, int] | None = None, rel_pos_size: tuple[int, int] | None = None):
        super().__init__()
        if dim % num_heads != 0:
            raise VitexportError(f"Embedding width {dim} is not divisible by {num_heads} heads.")
        kv_heads = num_kv_heads or num_heads
        if num_heads % kv_heads != 0:
            raise VitexportError(f"{num_heads} attention heads do not split into groups of {kv_heads} key/value heads.")
        self.num_heads, self.num_kv_heads = num_heads, kv_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.rotate_half = rotate_half  # a RoPE ViT's rotation layout: halves (True) or interleaved pairs (False)
        kv_dim = self.head_dim * kv_heads
        self.qkv = self.q_proj = self.k_proj = self.v_proj = None
        self.q_bias = self.v_bias = None
        if qkv_fused:
            if kv_heads != num_heads:
                raise VitexportError("Grouped-query attention (num_kv_heads) needs separate q/k/v projections.")
            self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias and k_bias)
            if qkv_bias and not k_bias:  # EVA's and BEiT's: learned q and v biases, a key bias of zeros
                self.q_bias = nn.Parameter(torch.zeros(dim))
                self.register_buffer("k_bias", torch.zeros(dim), persistent=False)
                self.v_bias = nn.Parameter(torch.zeros(dim))
        else:
            self.q_proj = nn.Linear(dim, dim, bias=qkv_bias)
            self.k_proj = nn.Linear(dim, kv_dim, bias=qkv_bias and k_bias)
            self.v_proj = nn.Linear(dim, kv_dim, bias=qkv_bias)
        self.q_norm = norm_layer(self.head_dim) if qk_norm and norm_layer else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm and norm_layer else nn.Identity()
        self.rel_pos_window = rel_pos_window
        if rel_pos_window is not None:  # BEiT: a learned bias per relative offset and head, at the trained window
            self.relative_position_bias_table = nn.Parameter(torch.zeros(table_size(rel_pos_window), num_heads))
        self.rel_pos_h = self.rel_pos_w = None
        if rel_pos_size is not None:  # SAM: a table per axis of the grid this attention runs over, (2 side - 1, hd)
            self.rel_pos_h = nn.Parameter(torch.zeros(2 * rel_pos_size[0] - 1, self.head_dim))
            self.rel_pos_w = nn.Parameter(torch.zeros(2 * rel_pos_size[1] - 1, self.head_dim))
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm_layer(dim) if scale_norm and norm_layer else nn.Identity()
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)
        self.fused_attn = True

    @torch.no_grad()
    def rope_as_halves(self) -> None:
        """Interleaved RoPE pairs regrouped as halves, for an export: every query and key head's channels take the
        same new order (`halves_order`) in the projection's rows, biases and q/k norms. q . k is a sum over a head's
        channels, so the logits are unchanged, and the rotation becomes two slices and a concatenation, which
        OpenVINO fuses into one kernel (interleaved strided slices run as reference kernels)."""
        if self.rotate_half is not False:
            return
        hd, order = self.head_dim, halves_order(self.head_dim)

        def rows(heads: int, start: int = 0) -> torch.Tensor:
            return start + (torch.arange(heads)[:, None] * hd + order).flatten()

        def reorder(t: torch.Tensor | None, idx: torch.Tensor) -> None:
            if t is not None:
                t.copy_(t[idx])

        D = self.num_heads * hd
        if self.qkv is not None:
            idx = torch.cat([rows(self.num_heads), rows(self.num_heads, D), torch.arange(2 * D, 3 * D)])
            reorder(self.qkv.weight, idx)
            reorder(self.qkv.bias, idx)
            reorder(self.q_bias, rows(self.num_heads))
        else:
            for proj, heads in ((self.q_proj, self.num_heads), (self.k_proj, self.num_kv_heads)):
                reorder(proj.weight, rows(heads))
                reorder(proj.bias, rows(heads))
        for norm in (self.q_norm, self.k_norm):
            reorder(getattr(norm, "weight", None), order)
            reorder(getattr(norm, "bias", None), order)
        self.rotate_half = True

    @torch.no_grad()
    def unfuse_qkv(self) -> None:
        """One qkv projection as three (q_proj, k_proj, v_proj; EVA's q and v biases theirs, its key bias of zeros
        none), for a RoPE'd export: the same function, and each head's (B, N, H, hd) -> (B, H, N, hd) transpose is
        then taken by the kernel that reads it (OpenVINO's RoPE for q and k, its attention for v) instead of one
        copy of the whole (B, N, 3, H, hd) tensor before the rotation."""
        if self.qkv is None:
            return
        D, w = self.num_heads * self.head_dim, self.qkv.weight
        bias = self.qkv.bias if self.qkv.bias is not None else \
            None if self.q_bias is None else torch.cat((self.q_bias, self.k_bias, self.v_bias))
        for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
            b = None if bias is None or (name == "k_proj" and self.q_bias is not None) else bias[i * D:(i + 1) * D]
            proj = nn.Linear(w.shape[1], D, bias=b is not None, device=w.device, dtype=w.dtype)
            proj.weight.copy_(w[i * D:(i + 1) * D])
            if b is not None:
                proj.bias.copy_(b)
            setattr(self, name, proj)
        self.qkv = self.q_bias = self.v_bias = None

    @torch.no_grad()
    def fold_scale(self) -> None:
        """The logits' scale 1/sqrt(hd) moved into the queries' last affine step (q_norm's weight and bias, or
        q_proj's), for a RoPE'd export: the rotation is linear, so the function is the same, and the scaling Mul
        between the rotation and Q.K^T, which no runtime fuses there, is gone."""
        if self.qkv is not None or self.scale == 1.0:
            return
        last = self.q_norm if not isinstance(self.q_norm, nn.Identity) else self.q_proj
        if getattr(last, "weight", None) is None:
            return  # a norm without an affine weight: the scale stays in the graph
        for t in (last.weight, getattr(last, "bias", None)):
            if t is not None:
                t.mul_(self.scale)
        self.scale = 1.0

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, N, D) -> q (B, H, N, hd), k and v (B, Hkv, N, hd)."""
        B, N, _ = x.shape
        if self.qkv is not None:
            qkv = self.qkv(x)  # (B, N, 3D): through the module, so its GEMM is named blocks.N.attn.qkv
            if self.q_bias is not None:
                qkv = qkv + torch.cat((self.q_bias, self.k_bias, self.v_bias))
            q, k, v = qkv.reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
            return q, k, v
        q = self.q_proj(x).reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).reshape(B, N, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).reshape(B, N, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return q, k, v

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None = None, attn_bias: torch.Tensor | None = None,
                rel_pos: RelPosGrid | None = None, grid: tuple[int, int] | None = None) -> torch.Tensor:
        """x (B, N, D); rope: the RoPE table of the patch grid; attn_bias: added to the logits (B or 1, H, N, N);
        rel_pos: the patch grid's relative positions, which this attention's own bias table is read at; grid: the
        (h, w) layout of the N tokens, which the decomposed tables are read at."""
        B, N, C = x.shape
        q, k, v = self.project(x)  # (B, H, N, hd), (B, Hkv, N, hd) x 2
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:  # queries and keys rotated by their positions (the prefix rows of the table: by none)
            table = rope.reshape((1,) * (4 - rope.ndim) + tuple(rope.shape))  # (1, 1 or H, N, 2*hd), as q and k
            q, k = apply_rope(q, table, self.rotate_half), apply_rope(k, table, self.rotate_half)
        groups = self.num_heads // self.num_kv_heads
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)
        if self.rel_pos_window is not None:
            if rel_pos is None:
                raise ValueError("an attention with a relative position bias table needs the grid's rel_pos")
            own = rel_pos.bias(self.relative_position_bias_table)  # (1, H, N, N)
            attn_bias = own if attn_bias is None else own + attn_bias
        if self.rel_pos_h is not None:
            if grid is None:
                raise ValueError("an attention with decomposed relative positions needs its tokens' grid")
            rows_h = rel_pos_rows(grid[0], grid[0], self.rel_pos_h)  # (h, h, hd)
            rows_w = rel_pos_rows(grid[1], grid[1], self.rel_pos_w)  # (w, w, hd)
            own = decomposed_bias(q, rows_h, rows_w, grid)  # (B, H, N, N), from the unscaled queries
            attn_bias = own if attn_bias is None else own + attn_bias
        x = attend(q, k, v, self.scale, self.fused_attn, attn_bias)  # (B, H, N, hd)
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
