"""Position-embedding resampling to a new patch grid.

Three conventions exist and they give different numbers, so the method is always named and recorded:

- ``bicubic-antialias`` (default): current timm (``resample_abs_pos_embed``), bicubic with antialias=True.
  PyTorch's antialiased bicubic uses another cubic kernel, so it differs from plain bicubic even when upsampling.
- ``bicubic``: the original ``resize_pos_embed`` walk-through, bicubic without antialias.
- ``bilinear``: timm's loader for the original JAX ``.npz`` checkpoints, bilinear without antialias.

NaFlexViT resamples its stored grid (16 x 16 for SigLIP2, 128 x 128 for C-RADIO) with two more: ``bilinear-antialias``
(SigLIP2) and ``bilinear-corners`` (bilinear with align_corners, C-RADIO v3 base and huge). C-RADIO keeps the aspect
ratio (`square`): it resamples to a square of the grid's longer side and keeps its top-left corner.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..errors import VitexportError

if TYPE_CHECKING:
    import torch

# name -> (torch interpolation mode, antialias, align_corners)
INTERPOLATIONS = {
    "bicubic-antialias": ("bicubic", True, False),
    "bicubic": ("bicubic", False, False),
    "bilinear": ("bilinear", False, False),
    "bilinear-antialias": ("bilinear", True, False),
    "bilinear-corners": ("bilinear", False, True),
}
DEFAULT_INTERPOLATION = "bicubic-antialias"


def infer_grid(num_grid_tokens: int) -> tuple[int, int]:
    side = int(math.isqrt(num_grid_tokens))
    if side * side != num_grid_tokens:
        raise VitexportError(
            f"The checkpoint's position embedding has {num_grid_tokens} grid tokens, which is not a square grid.")
    return (side, side)


def resample_pos_embed(
    pos_embed: "torch.Tensor",
    new_grid: tuple[int, int],
    num_prefix_tokens: int = 1,
    old_grid: tuple[int, int] | None = None,
    method: str = DEFAULT_INTERPOLATION,
    square: bool = False,
) -> "torch.Tensor":
    """(1, prefix + Ho*Wo, D) -> (1, prefix + Hn*Wn, D); the prefix (class) tokens are kept as they are."""
    if method not in INTERPOLATIONS:
        raise VitexportError(f"Unknown position-embedding interpolation {method!r}; choose one of: "
                             f"{', '.join(INTERPOLATIONS)}.")
    old_grid = old_grid or infer_grid(pos_embed.shape[1] - num_prefix_tokens)
    if tuple(old_grid) == tuple(new_grid):
        return pos_embed
    return interpolate_pos_embed(pos_embed, new_grid, num_prefix_tokens, old_grid, method, square)


def interpolate_pos_embed(pos_embed: "torch.Tensor", new_grid: tuple, num_prefix_tokens: int,
                          old_grid: tuple[int, int], method: str, square: bool = False) -> "torch.Tensor":
    """resample_pos_embed without its same-size shortcut, so that `new_grid` may be symbolic (a dynamic-size
    export: the Resize runs in the graph, identity at the stored grid, as timm's dynamic_img_size does).
    square: resample to (L, L), L the longer side of `new_grid`, and keep the top-left new_grid (NaFlexViT's
    aspect-ratio preserving resampling)."""
    import torch
    import torch.nn.functional as F

    mode, antialias, corners = INTERPOLATIONS[method]
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]  # (1, p, D), (1, Ho*Wo, D)
    D = grid.shape[-1]
    dtype = grid.dtype
    grid = grid.float().reshape(1, old_grid[0], old_grid[1], D).permute(0, 3, 1, 2)  # (1, D, Ho, Wo)
    size = (max(new_grid), max(new_grid)) if square else tuple(new_grid)
    grid = F.interpolate(grid, size=size, mode=mode, align_corners=corners, antialias=antialias)
    if square:
        grid = grid[:, :, :new_grid[0], :new_grid[1]]  # (1, D, Hn, Wn)
    grid = grid.permute(0, 2, 3, 1).reshape(1, -1, D).to(dtype)  # (1, Hn*Wn, D)
    return torch.cat([prefix, grid], dim=1)


def antialiased_resizes(onnx_path) -> list[str]:
    """The Resize nodes of a graph with antialias set (read without its external data); none for a file that is not
    ONNX (the parser's own error says so)."""
    import onnx

    try:
        graph = onnx.load(str(onnx_path), load_external_data=False).graph
    except Exception:  # noqa: BLE001 -- protobuf's DecodeError, OSError: TensorRT's parser names what is wrong
        return []
    return [n.name or n.output[0] for n in graph.node
            if n.op_type == "Resize" and any(a.name == "antialias" and a.i for a in n.attribute)]
