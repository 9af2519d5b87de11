"""Windowed attention's layout (ViTDet, Segment Anything): a (B, H, W, D) token grid padded on the bottom and right
to a multiple of the window, cut into windows of window x window tokens that attend among themselves, and put back.

The padding is zeros added after the block's first norm (the padded tokens take part in their window's attention as
zero vectors, as both timm and transformers run it) and is cropped after. The pad sizes are Python integers of a
fixed grid, so an export holds a constant Pad, Reshapes and Transposes, never a data-dependent shape.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def window_partition(x: torch.Tensor, window: int) -> tuple[torch.Tensor, tuple[int, int]]:
    """(B, H, W, D) -> windows (B * nH * nW, window, window, D) and the padded grid (Hp, Wp)."""
    B, H, W, D = x.shape
    pad_h, pad_w = (window - H % window) % window, (window - W % window) % window
    if pad_h or pad_w:
        x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))  # (B, Hp, Wp, D): zero tokens on the bottom and right
    Hp, Wp = H + pad_h, W + pad_w
    x = x.reshape(B, Hp // window, window, Wp // window, window, D)  # (B, nH, window, nW, window, D)
    windows = x.permute(0, 1, 3, 2, 4, 5).reshape(-1, window, window, D)  # (B * nH * nW, window, window, D)
    return windows, (Hp, Wp)


def window_unpartition(windows: torch.Tensor, window: int, padded: tuple[int, int],
                       grid: tuple[int, int]) -> torch.Tensor:
    """windows (B * nH * nW, window, window, D) -> (B, H, W, D), the padding cropped."""
    Hp, Wp = padded
    H, W = grid
    D = windows.shape[-1]
    x = windows.reshape(-1, Hp // window, Wp // window, window, window, D)  # (B, nH, nW, window, window, D)
    x = x.permute(0, 1, 3, 2, 4, 5).reshape(-1, Hp, Wp, D)  # (B, Hp, Wp, D)
    return x[:, :H, :W] if (Hp, Wp) != (H, W) else x  # (B, H, W, D)


# -- RF-DETR's windows of tokens: the class token copied into each ------------------------------------------------
def token_windows(x: torch.Tensor, grid: tuple[int, int], windows: int) -> torch.Tensor:
    """(B, 1 + H W, D): a class token and a square H x W grid of patch tokens -> (B * n^2, 1 + H W / n^2, D): n x n
    windows (row-major), each its own copy of the class token before its tokens (transformers' RfDetrDinov2
    window_partition)."""
    D = x.shape[-1]
    h, w = grid[0] // windows, grid[1] // windows
    patches = x[:, 1:].reshape(-1, windows, h, windows, w, D)  # (B, n, h, n, w, D)
    patches = patches.transpose(2, 3).reshape(-1, h * w, D)  # (B * n^2, h w, D)
    cls = x[:, :1].repeat_interleave(windows * windows, dim=0)  # (B * n^2, 1, D): window b n^2 + i is image b's
    return torch.cat([cls, patches], dim=1)


def join_windows(x: torch.Tensor, windows: int) -> torch.Tensor:
    """(B * n^2, T, D) -> (B, n^2 T, D): every window's tokens one sequence (a global block attends over it)."""
    return x.reshape(-1, windows * windows * x.shape[1], x.shape[2])


def split_windows(x: torch.Tensor, windows: int) -> torch.Tensor:
    """join_windows' inverse: (B, n^2 T, D) -> (B * n^2, T, D)."""
    return x.reshape(-1, x.shape[1] // (windows * windows), x.shape[2])


def token_map(x: torch.Tensor, grid: tuple[int, int], windows: int) -> torch.Tensor:
    """token_windows' windows (B * n^2, 1 + h w, D) -> the patch tokens as a map (B, D, H, W), the class copies
    dropped."""
    D = x.shape[-1]
    h, w = grid[0] // windows, grid[1] // windows
    patches = x[:, 1:].reshape(-1, windows, windows, h, w, D).transpose(2, 3)  # (B, n, h, n, w, D)
    return patches.reshape(-1, grid[0], grid[1], D).permute(0, 3, 1, 2)  # (B, D, H, W)
