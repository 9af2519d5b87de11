"""Rotary position embedding (RoPE) for a 2-D grid of patches, in timm's three flavours, and its application to the
queries and keys of attention.

A RoPE layer turns a patch grid (H, W) into a table: for each of the N = H*W patch tokens, the sine and the cosine
of one angle per pair of channels, concatenated, (N, 2*hd) (hd = head size). Blocks take the table as an argument
and rotate each head's q and k with it (`apply_rope`); the prefix tokens (class, registers) are not rotated.

- ``cat`` (EVA02, the sbb RoPE ViTs, Perception Encoder, naver's RoPE ViTs; timm's `RotaryEmbeddingCat`): integer
  grid positions (+ `grid_offset`), optionally rescaled to a reference grid (`ref_grid`, EVA's fine-tuning at
  another size), times hd/4 inverse frequencies 1 / temperature^(i / (hd/4)), for each axis;
- ``dinov3`` (DINOv3, Sapiens2, LingBot; `RotaryEmbeddingDinoV3`): positions at patch centres normalised to
  [-1, 1] on each axis, angles 2 pi x / period with periods temperature^(2i / (hd/2));
- ``mixed`` (naver's RoPE-Mixed; `RotaryEmbeddingMixed`): learned frequencies per block and head mixing both axes,
  (2, depth, heads, hd/2): a table per block, (depth, heads, N, 2*hd).

Angles are laid out interleaved ([a0, a0, a1, a1, ...], rotation pairs neighbours) or in halves ([a0, a1, ..., a0,
a1, ...], `rotate_half`, rotation pairs channel i with i + hd/2), as the checkpoint was trained. An export always
rotates halves (two slices and a concatenation, which OpenVINO fuses into one RoPE kernel): an interleaved model's
query and key channels are first reordered in its weights so that each pair becomes a pair of halves
(`Attention.rope_as_halves`), which leaves q . k, and so the model's function, as it was.

At a fixed image size the grid is Python integers, so the exported table is a constant of the graph. At a dynamic
size the grid is the input's symbolic patch grid and the table is computed in the graph with Range, Mul, Sin and
Cos only: nothing TensorRT's parser refuses for shape computation (no If, Loop, ScatterND or NonZero).
DINOv3's and Sapiens2's coordinate shift, jitter and rescale are training augmentations: inference has none.
"""

from __future__ import annotations

import math

import torch
from torch import nn

ROPE_KINDS = ("cat", "dinov3", "mixed")


def _axis(n, dtype=torch.float32) -> torch.Tensor:
    """0, 1, ..., n-1 as floats; `n` may be a symbolic size (an ONNX Range)."""
    return torch.arange(n, dtype=torch.int64).to(dtype)


def _grid(feat: tuple, indexing: str) -> tuple[tuple, int]:
    """The grid in the order its coordinate channels come: (H, W) for 'ij', (W, H) for 'xy' (x first)."""
    return (feat if indexing == "ij" else (feat[1], feat[0])), (0 if indexing == "ij" else 1)


def _mesh(coords: list[torch.Tensor], indexing: str) -> torch.Tensor:
    """Per-axis coordinates -> (N, 2) in row-major (h, w) token order, channels in `indexing` order."""
    grid = torch.stack(torch.meshgrid(*coords, indexing=indexing), dim=-1)  # (H, W, 2)
    return grid.reshape(-1, 2)


def layout(angles_fn: torch.Tensor, rotate_half: bool) -> torch.Tensor:
    """Per-pair values (..., hd/2) -> (..., hd): halves [f0, f1, .., f0, f1, ..] or interleaved [f0, f0, f1, f1, ..]."""
    if rotate_half:
        return torch.cat([angles_fn, angles_fn], dim=-1)
    return torch.stack([angles_fn, angles_fn], dim=-1).flatten(-2)


def sincos(angles: torch.Tensor, rotate_half: bool) -> torch.Tensor:
    """Angles (..., hd/2) -> the table (..., 2*hd): [sin | cos], each in the rotation's layout."""
    return torch.cat([layout(angles.sin(), rotate_half), layout(angles.cos(), rotate_half)], dim=-1)


class AxialRope(nn.Module):
    """``cat``: integer positions (+ offset, rescaled to `ref_grid`) times inverse frequencies, per axis."""

    def __init__(self, head_dim: int, temperature: float = 10000.0, ref_grid: tuple[int, int] | None = None,
                 grid_offset: float = 0.0, indexing: str = "ij", rotate_half: bool = False):
        super().__init__()
        self.head_dim, self.rotate_half = head_dim, rotate_half
        self.ref_grid, self.grid_offset, self.indexing = ref_grid, grid_offset, indexing
        n = head_dim // 4
        exponents = torch.arange(0, n, dtype=torch.int64).to(torch.float32) / n
        self.register_buffer("bands", 1.0 / (temperature ** exponents), persistent=False)  # (hd/4,)

    def forward(self, feat: tuple) -> torch.Tensor:
        """(H, W) -> (N, 2*hd)."""
        shape, _ = _grid(feat, self.indexing)
        ref = None if self.ref_grid is None else _grid(self.ref_grid, self.indexing)[0]
        coords = []
        for i, s in enumerate(shape):
            t = _axis(s) + self.grid_offset
            if ref is not None:  # EVA's rescale of positions to the grid it was trained at
                t = t / s * ref[i]
            coords.append(t)
        pos = _mesh(coords, self.indexing)  # (N, 2)
        angles = (pos.unsqueeze(-1) * self.bands).flatten(1)  # (N, 2 * hd/4)
        return sincos(angles, self.rotate_half)


class DinoV3Rope(nn.Module):
    """``dinov3``: patch centres normalised to [-1, 1] on each axis, angles 2 pi x / period."""

    def __init__(self, head_dim: int, temperature: float = 100.0, grid_offset: float = 0.0, indexing: str = "ij",
                 rotate_half: bool = True):
        super().__init__()
        self.head_dim, self.rotate_half = head_dim, rotate_half
        self.grid_offset, self.indexing = grid_offset, indexing
        n = head_dim // 4
        exponents = 2.0 * torch.arange(n, dtype=torch.float32) / (head_dim // 2)
        self.register_buffer("periods", temperature ** exponents, persistent=False)  # (hd/4,)

    def forward(self, feat: tuple) -> torch.Tensor:
        """(H, W) -> (N, 2*hd)."""
        shape, _ = _grid(feat, self.indexing)
        coords = [(_axis(s) + 0.5 + self.grid_offset) / s for s in shape]  # centres in [0, 1]
        pos = 2.0 * _mesh(coords, self.indexing) - 1.0  # (N, 2) in [-1, 1]
        angles = (2 * math.pi * pos.unsqueeze(-1) / self.periods).flatten(1)  # (N, 2 * hd/4)
        return sincos(angles, self.rotate_half)


class MixedRope(nn.Module):
    """``mixed``: learned frequencies per block and head, each a mix of both axes: a table per block."""

    def __init__(self, head_dim: int, depth: int, num_heads: int, indexing: str = "xy"):
        super().__init__()
        self.head_dim, self.indexing, self.rotate_half = head_dim, indexing, False  # halves after as_halves
        self.freqs = nn.Parameter(torch.zeros(2, depth, num_heads, head_dim // 2))  # timm's `rope.freqs`

    def forward(self, feat: tuple) -> torch.Tensor:
        """(H, W) -> (depth, heads, N, 2*hd)."""
        shape, _ = _grid(feat, self.indexing)
        pos = _mesh([_axis(s) for s in shape], self.indexing)  # (N, 2): (x, y) for 'xy'
        freqs = self.freqs.float()
        angles = pos[:, 0, None] * freqs[0].unsqueeze(-2) + pos[:, 1, None] * freqs[1].unsqueeze(-2)
        return sincos(angles, self.rotate_half)  # (depth, heads, N, 2*hd)


def make_rope(kind: str, head_dim: int, depth: int, num_heads: int, temperature: float,
              ref_grid: tuple[int, int] | None, grid_offset: float, indexing: str, rotate_half: bool) -> nn.Module:
    """The RoPE layer a config names (`ViTConfig.rope`)."""
    if kind == "cat":
        return AxialRope(head_dim, temperature, ref_grid, grid_offset, indexing, rotate_half)
    if kind == "dinov3":
        return DinoV3Rope(head_dim, temperature, grid_offset, indexing, rotate_half)
    if kind == "mixed":
        return MixedRope(head_dim, depth, num_heads, indexing)
    raise ValueError(f"unknown RoPE kind {kind!r}")


def halves_order(head_dim: int) -> torch.Tensor:
    """The channel order that turns interleaved pairs into halves: slot i takes channel 2i and slot i + hd/2 channel
    2i + 1, so the interleaved rotation of pair i is the halves rotation of slots i and i + hd/2 (same angle)."""
    return torch.arange(head_dim).reshape(head_dim // 2, 2).t().flatten()


def with_prefix(table: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """A table (..., N, 2*hd) with rows for the prefix tokens before the patches' (sin 0, cos 1: not rotated), so one
    rotation covers the whole sequence."""
    if not num_prefix_tokens:
        return table
    hd = table.shape[-1] // 2
    lead = table.shape[:-2]
    rows = torch.cat([torch.zeros(*lead, num_prefix_tokens, hd, dtype=table.dtype),
                      torch.ones(*lead, num_prefix_tokens, hd, dtype=table.dtype)], dim=-1)
    return torch.cat([rows, table], dim=-2)


def rotate(x: torch.Tensor, rotate_half: bool) -> torch.Tensor:
    """Each channel's partner in its rotation, negated where the rotation needs it: halves [x0..x5] -> [-x3, -x4, -x5,
    x0, x1, x2] (two slices and a concatenation: the form OpenVINO fuses into one RoPE kernel); interleaved [x0..x5]
    -> [-x1, x0, -x3, x2, -x5, x4] (timm's `rot`; exports regroup it as halves, `Attention.rope_as_halves`)."""
    if rotate_half:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def apply_rope(x: torch.Tensor, table: torch.Tensor, rotate_half: bool) -> torch.Tensor:
    """Rotate q or k (B, H, N, hd) by a table of the whole sequence (..., N, 2*hd; with_prefix): x * cos + rotate(x) *
    sin, in the table's precision, cast back to x's type."""
    sin, cos = table.chunk(2, dim=-1)
    return (x * cos + rotate(x, rotate_half) * sin).to(x.dtype)
