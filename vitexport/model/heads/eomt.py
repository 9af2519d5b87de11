"""EoMT's segmentation head (Your ViT is Secretly an Image Segmentation Model, https://arxiv.org/abs/2503.19108),
as transformers' EomtForUniversalSegmentation builds it: learned queries that join the tokens before the backbone's
last blocks, and from the final-norm tokens

    queries (B, Q, D) -> class_predictor -> class_queries_logits (B, Q, C + 1)
    queries -> mask_head (3 Linears) (B, Q, D)  x  patch tokens (B, D, h, w) -> upscale blocks (ConvTranspose x2,
        act, depthwise 3x3, LayerNorm2d) (B, D, 4h, 4w)  -> masks_queries_logits (B, Q, 4h, 4w)

In the blocks the queries join, a query sees the patches its current mask holds (its logits, resampled to the patch
grid, above 0) and every query, class and register token; the mask is computed anew in each block whose
`attn_mask_probs` entry is above 0 and kept from the block before otherwise (transformers' loop). The token order is
[queries, class, registers, patches]. Parameter names are transformers', under `head.`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.norm import LayerNorm2d, act_factory
from .config import DenseConfig

# what a masked-out attention logit gets: FP16's lowest value, so an FP16 graph holds it (softmax gives those
# entries 0 in FP32 as transformers' -1e9 does: exp underflows to 0 either way)
MASKED = -65504.0


class ScaleLayer(nn.Module):
    """x2 upsampling: a 2x2 transposed conv, the activation, a depthwise 3x3 conv (no bias), LayerNorm2d."""

    def __init__(self, width: int, act: type[nn.Module]):
        super().__init__()
        self.conv1 = nn.ConvTranspose2d(width, width, kernel_size=2, stride=2)
        self.activation = act()
        self.conv2 = nn.Conv2d(width, width, kernel_size=3, padding=1, groups=width, bias=False)
        self.layernorm2d = LayerNorm2d(width, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layernorm2d(self.conv2(self.activation(self.conv1(x))))


class UpscaleBlock(nn.Module):
    def __init__(self, width: int, n: int, act: type[nn.Module]):
        super().__init__()
        self.block = nn.ModuleList([ScaleLayer(width, act) for _ in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.block:
            x = layer(x)
        return x


class MaskHead(nn.Module):
    """Three Linears with the activation between them: each query's mask embedding."""

    def __init__(self, width: int, act: type[nn.Module]):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = (nn.Linear(width, width) for _ in range(3))
        self.activation = act()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.activation(self.fc2(self.activation(self.fc1(x)))))


class EomtHead(nn.Module):
    """The queries, the class and mask predictors, and the masks' attention bias."""

    def __init__(self, cfg: DenseConfig, width: int, act_layer: str, num_prefix_tokens: int):
        super().__init__()
        act = act_factory(act_layer)
        self.num_queries, self.num_prefix_tokens = cfg.num_queries, num_prefix_tokens
        self.query = nn.Embedding(cfg.num_queries, width)
        self.class_predictor = nn.Linear(width, cfg.num_labels + 1)
        self.mask_head = MaskHead(width, act)
        self.upscale_block = UpscaleBlock(width, cfg.upscale_blocks, act)
        # per block the queries see: whether it masks their attention anew (> 0; transformers' buffer, in the
        # checkpoint): read as plain floats before an export (a branch on a tensor would not trace)
        self.register_buffer("attn_mask_probs", torch.ones(cfg.query_blocks))

    def predict(self, x: torch.Tensor, grid: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """Final-norm tokens (B, Q + prefix + N, D) -> (mask logits (B, Q, 4h, 4w), class logits (B, Q, C + 1))."""
        Q = self.num_queries
        queries = x[:, :Q]  # (B, Q, D)
        classes = self.class_predictor(queries)
        patches = x[:, Q + self.num_prefix_tokens:].transpose(1, 2)  # (B, D, N)
        patches = self.upscale_block(patches.reshape(patches.shape[0], -1, grid[0], grid[1]))  # (B, D, 4h, 4w)
        B, D, H, W = patches.shape
        masks = self.mask_head(queries) @ patches.reshape(B, D, H * W)  # (B, Q, 4h*4w): the einsum as a MatMul
        return masks.reshape(B, Q, H, W), classes

    def attention_bias(self, masks: torch.Tensor, grid: tuple) -> torch.Tensor:
        """Mask logits (B, Q, 4h, 4w) -> the bias on every block's attention logits (B, 1, T, T), T = Q + prefix
        + N: MASKED where a query's mask resampled to the patch grid is not above 0, else 0. Built by
        concatenation (no scatter): queries' rows [all of Q + prefix | their masks], the other rows all 0."""
        B, Q = masks.shape[:2]
        at_grid = F.interpolate(masks, size=tuple(grid), mode="bilinear", align_corners=False)  # (B, Q, h, w)
        seen = at_grid.flatten(2) > 0  # (B, Q, N)
        N = seen.shape[-1]
        T = Q + self.num_prefix_tokens + N
        query_rows = torch.cat([torch.ones(B, Q, Q + self.num_prefix_tokens, dtype=torch.bool,
                                           device=masks.device), seen], dim=2)  # (B, Q, T)
        rows = torch.cat([query_rows, torch.ones(B, T - Q, T, dtype=torch.bool, device=masks.device)], dim=1)
        zero = torch.zeros((), dtype=masks.dtype, device=masks.device)
        return torch.where(rows, zero, torch.full((), MASKED, dtype=masks.dtype, device=masks.device))[:, None]


def semantic_probs(masks: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """Per class and pixel, the sum over queries of P(class) x sigmoid(mask): (B, C, 4h, 4w), the 'no object'
    class left out (the processor's post_process_semantic_segmentation before its resizes)."""
    B, Q, H, W = masks.shape
    probs = classes.softmax(-1)[..., :-1]  # (B, Q, C)
    return (probs.transpose(1, 2) @ masks.sigmoid().reshape(B, Q, H * W)).reshape(B, -1, H, W)


__all__ = ["EomtHead", "LayerNorm2d", "MASKED", "semantic_probs"]
