"""BEiT's relative position bias: a learned bias per head for each relative offset between two patches of the grid,
added to the attention logits, with three extra entries for the class token (class -> patch, patch -> class,
class -> class).

For a window (h, w) the table has (2h-1)(2w-1) + 3 rows, one per offset (dy, dx) in [-(h-1), h-1] x [-(w-1), w-1]
and the three class entries, and `num_heads` columns. `relative_position_index` says which row each (query, key)
pair of the N + 1 tokens reads; `relative_bias` gathers the (1, heads, N+1, N+1) bias from a table.

A table trained at one window is used at another by resampling it (`resize_table`), as timm does when a BEiT
checkpoint is loaded at another image size (`resize_rel_pos_bias_table`): the offsets of the trained window are
spread over the new one along a geometric progression (BEiT's own fine-tuning code) and the table is
interpolated linearly between them. Built from integer arithmetic and concatenation only (no in-place writes):
exported, it is constants or Range/Gather arithmetic, never a ScatterND.
"""

from __future__ import annotations

import torch
from torch import nn

EXTRA_TOKENS = 3  # class -> patch, patch -> class, class -> class


def table_size(window: tuple[int, int]) -> int:
    return (2 * window[0] - 1) * (2 * window[1] - 1) + EXTRA_TOKENS


def relative_position_index(window: tuple) -> torch.Tensor:
    """(N+1, N+1) int64: the table row of each (query, key) pair; the class token first. `window` may be symbolic."""
    h, w = window
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    coords = torch.stack([ys.reshape(-1), xs.reshape(-1)])  # (2, N)
    rel = coords[:, :, None] - coords[:, None, :]  # (2, N, N): query minus key
    index = (rel[0] + (h - 1)) * (2 * w - 1) + (rel[1] + (w - 1))  # (N, N)
    n = index.shape[0]
    offsets = (2 * h - 1) * (2 * w - 1)
    to_patches = torch.full((1, n), 1, dtype=index.dtype) * offsets  # class -> patch
    top = torch.cat([torch.full((1, 1), 1, dtype=index.dtype) * (offsets + 2), to_patches], dim=1)  # class -> class
    left = torch.full((n, 1), 1, dtype=index.dtype) * (offsets + 1)  # patch -> class
    return torch.cat([top, torch.cat([left, index], dim=1)], dim=0)


def relative_bias(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """A table (rows, heads) read at an index (N+1, N+1) -> the logits' bias (1, heads, N+1, N+1)."""
    n = index.shape[0]
    bias = table[index.reshape(-1)].reshape(n, n, -1)  # (N+1, N+1, heads)
    return bias.permute(2, 0, 1).unsqueeze(0)


class RelPosGrid:
    """The relative positions of one patch grid: what an attention's bias table is read at. With `axes` (a dynamic
    size: the resampling weights of each axis, `TableResampler.axes`), a table trained at another window is first
    resampled to the grid's."""

    def __init__(self, index: torch.Tensor, axes: tuple[torch.Tensor, torch.Tensor] | None = None):
        self.index = index  # (N+1, N+1)
        self.axes = axes  # (2h-1, 2h0-1), (2w-1, 2w0-1)

    def bias(self, table: torch.Tensor) -> torch.Tensor:
        if self.axes is not None:
            wy, wx = self.axes
            heads = table.shape[1]
            grid = table[:-EXTRA_TOKENS].T.reshape(heads, wy.shape[1], wx.shape[1])  # (heads, 2h0-1, 2w0-1)
            resized = (wy @ grid @ wx.T).reshape(heads, -1).T  # ((2h-1)(2w-1), heads)
            table = torch.cat([resized, table[-EXTRA_TOKENS:]], dim=0)
        return relative_bias(table, self.index)


class RelativePositionBias(nn.Module):
    """One table shared by every block (timm's `rel_pos_bias`, BEiT's use_shared_rel_pos_bias)."""

    def __init__(self, window: tuple[int, int], num_heads: int):
        super().__init__()
        self.relative_position_bias_table = nn.Parameter(torch.zeros(table_size(window), num_heads))

    def forward(self, rel_pos: RelPosGrid) -> torch.Tensor:
        return rel_pos.bias(self.relative_position_bias_table)


# -- a table trained at one window, used at another ---------------------------------------------------------------

def _spread(src: int, dst: int) -> list[float]:
    """Where the src offsets of the trained window lie on the new window's axis: a geometric progression whose
    sum reaches half the new side (BEiT's `geometric_progression` search, as timm runs it)."""
    def progression(r: float, n: int) -> float:
        return (1.0 - r**n) / (1.0 - r)

    left, right = 1.01, 1.5
    while right - left > 1e-6:
        q = (left + right) / 2.0
        if progression(q, src // 2) > dst // 2:
            right = q
        else:
            left = q
    dis, cur = [], 1.0
    for i in range(src // 2):
        dis.append(cur)
        cur += q ** (i + 1)
    return [-d for d in reversed(dis)] + [0.0] + dis


def _linear_weights(points: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(len(targets), len(points)) weights of linear interpolation between sorted `points`, constant beyond the
    ends (timm's RegularGridInterpolator in its linear mode, one axis)."""
    n = points.shape[0]
    right = torch.bucketize(targets, points).clamp(max=n - 1)
    left = (right - 1).clamp(0, n - 1)
    d_left = (targets - points[left]).clamp(min=0)
    d_right = (points[right] - targets).clamp(min=0)
    both_zero = (d_left == 0) & (d_right == 0)
    d_left = torch.where(both_zero, torch.ones_like(d_left), d_left)
    d_right = torch.where(both_zero, torch.ones_like(d_right), d_right)
    total = d_left + d_right
    weights = torch.zeros(targets.shape[0], n, dtype=points.dtype)
    rows = torch.arange(targets.shape[0])
    weights[rows, left] += d_right / total
    weights[rows, right] += d_left / total
    return weights


def _axis_weights(src: int, dst: int) -> torch.Tensor:
    """(dst, src) weights resampling one axis of a table (src, dst: 2 x the window side - 1)."""
    targets = torch.arange(-(dst // 2), dst // 2 + 0.1, 1.0)
    return _linear_weights(torch.tensor(_spread(src, dst)), targets)


class TableResampler(nn.Module):
    """A dynamic-size BEiT's tables, trained at `window`, resampled in the graph to any grid of up to `max_grid`
    patches a side, as timm resamples them for a model set to that size (`set_input_size`).

    timm finds each axis's geometric progression with a bisection per size, and resamples both axes as soon as one
    differs from the trained window (an axis of the same size is then stretched too); at the trained size the table
    is used as it is. So the weights of every side are computed here once, with timm's arithmetic, and looked up
    by the input's side: (max_grid, 2 max_grid - 1, 2 w0 - 1) constants per axis, read with Gather and Slice, and
    blended with the identity where both sides are the trained ones (a product with 0 or 1: no If)."""

    def __init__(self, window: tuple[int, int], max_grid: tuple[int, int]):
        super().__init__()
        self.window, self.max_grid = tuple(window), tuple(max_grid)
        for axis in (0, 1):
            src, sides = 2 * window[axis] - 1, max_grid[axis]
            lut = torch.zeros(sides, 2 * sides - 1, src)
            for g in range(1, sides + 1):
                lut[g - 1, :2 * g - 1] = _axis_weights(src, 2 * g - 1)
            same = torch.zeros(sides)
            if window[axis] <= sides:
                same[window[axis] - 1] = 1.0
            self.register_buffer(f"lut{axis}", lut, persistent=False)
            self.register_buffer(f"same{axis}", same, persistent=False)
            self.register_buffer(f"eye{axis}", torch.eye(2 * sides - 1, src), persistent=False)

    def axes(self, grid: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """The weights of each axis for a grid (h, w) (symbolic in an export): (2h-1, 2h0-1), (2w-1, 2w0-1)."""
        luts, sames, eyes = (self.lut0, self.lut1), (self.same0, self.same1), (self.eye0, self.eye1)
        trained = sames[0][grid[0] - 1] * sames[1][grid[1] - 1]  # 1 at the trained size, else 0
        out = []
        for axis in (0, 1):
            rows = 2 * grid[axis] - 1
            geometric = luts[axis][grid[axis] - 1][:rows]
            out.append(trained * eyes[axis][:rows] + (1 - trained) * geometric)
        return out[0], out[1]


def resize_table(table: torch.Tensor, old_window: tuple[int, int], new_window: tuple[int, int]) -> torch.Tensor:
    """A (rows, heads) table trained at `old_window` -> the table of `new_window` (the class entries kept)."""
    if tuple(old_window) == tuple(new_window):
        return table
    src = (2 * old_window[0] - 1, 2 * old_window[1] - 1)
    dst = (2 * new_window[0] - 1, 2 * new_window[1] - 1)
    grid, extra = table[:-EXTRA_TOKENS].float(), table[-EXTRA_TOKENS:]
    heads = table.shape[1]
    wy, wx = _axis_weights(src[0], dst[0]), _axis_weights(src[1], dst[1])
    planes = grid.T.reshape(heads, src[0], src[1])  # (heads, src_h, src_w)
    resized = wy @ planes @ wx.T  # (heads, dst_h, dst_w)
    return torch.cat([resized.reshape(heads, -1).T.to(table.dtype), extra], dim=0)


def resize_table_bilinear(table: torch.Tensor, old_window: tuple[int, int],
                          new_window: tuple[int, int]) -> torch.Tensor:
    """transformers' BEiT and data2vec-vision at another window (`BeitRelativePositionBias.forward`): the offsets'
    table resampled bilinearly (align_corners False) to the new window's, as transformers does in every forward
    pass; its rows are laid out (width, height) before resampling, as it lays them out."""
    if tuple(old_window) == tuple(new_window):
        return table
    src = (2 * old_window[0] - 1, 2 * old_window[1] - 1)
    dst = (2 * new_window[0] - 1, 2 * new_window[1] - 1)
    grid, extra = table[:-EXTRA_TOKENS].float(), table[-EXTRA_TOKENS:]
    planes = grid.reshape(1, src[1], src[0], -1).permute(0, 3, 1, 2)
    resized = torch.nn.functional.interpolate(planes, size=dst, mode="bilinear")
    return torch.cat([resized.permute(0, 2, 3, 1).reshape(dst[0] * dst[1], -1).to(table.dtype), extra], dim=0)
