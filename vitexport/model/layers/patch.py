"""Image to tokens: (B, C, H, W) -> (B, N, D), one token per non-overlapping P x P patch."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..config import to_2tuple


class PatchEmbed(nn.Module):
    """A convolution with kernel = stride = patch size (a linear map applied to each patch), then an optional norm
    (timm's embed_norm_layer). The grid is floor(side / patch): the remainder of a side is not seen."""

    def __init__(self, img_size: int | tuple[int, int] = 224, patch_size: int | tuple[int, int] = 16,
                 in_chans: int = 3, embed_dim: int = 768, bias: bool = True,
                 norm_layer: Callable[[int], nn.Module] | None = None):
        super().__init__()
        self.img_size = to_2tuple(img_size)
        self.patch_size = to_2tuple(patch_size)
        # a side that is not a multiple of the patch loses its last pixels, as in timm (SigLIP so400m/14 at 384)
        self.grid_size = (self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1])
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size, bias=bias)
        self.norm = norm_layer(embed_dim) if norm_layer is not None else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)  # (B, D, H/P, W/P)
        x = x.flatten(2).transpose(1, 2)  # (B, N, D)
        return self.norm(x)
