"""Segment Anything's image encoder (Kirillov et al. 2023, https://arxiv.org/abs/2304.02643; the plain ViT backbone of
ViTDet, https://arxiv.org/abs/2203.16527), read top-down. timm's ``VisionTransformerSAM`` parameter names, so a
timm state dict loads as is (transformers' and the original checkpoints through `readers/checkpoints`):

    image -> PatchEmbed -> (B, h, w, D) + position embedding (1, h, w, D)
          -> blocks: attention inside 14 x 14 windows (the grid padded to a multiple), over the whole grid in the
             global blocks, each with decomposed relative position tables at the size it attends over
          -> neck: 1x1 conv -> LayerNorm2d -> 3x3 conv -> LayerNorm2d  -> image embedding (B, 256, h, w)
          -> [avg pool -> head]  (timm's classifier form: a LayerNorm2d for the neck)

The blocks are ``block``'s parts (`layers/blocks.WindowBlock`), the attention vitexport's own with the decomposed
tables (`layers/decomposed.py`), the windows `layers/window.py`: no second attention or MLP. The input runs at one
size: a checkpoint trained at another has its position embedding and global tables resampled when it is loaded
(`readers/checkpoints/adapt.py`), as timm resamples them in each forward pass. The prompt encoder and mask decoder
that read the embedding are `heads/sam_decoder.py`, a graph of their own.

Shapes: B batch, h x w the patch grid, D the width, C the neck's channels.
"""

from __future__ import annotations

import torch
from torch import nn

from .base import TransformerBase
from .config import ViTConfig
from .heads.sam_decoder import SamPromptDecoder
from .layers.blocks import BlockArgs, WindowBlock
from .layers.norm import LayerNorm2d, act_factory, norm_factory
from .layers.patch import PatchEmbed

NECK_EPS = 1e-6  # the neck's LayerNorm2d, in timm and transformers alike


class SamViT(TransformerBase):
    """SAM's ViT: windowed and global attention over a patch grid, a convolutional neck to the image embedding."""

    def __init__(self, cfg: ViTConfig | None = None, **overrides):
        super().__init__()
        cfg = cfg or ViTConfig(family="sam", class_token=False, global_pool="avg", **overrides)
        self.cfg = cfg
        D = cfg.embed_dim
        norm_layer = norm_factory(cfg.norm_layer, cfg.norm_eps)

        self.num_classes = cfg.num_classes
        self.global_pool = cfg.global_pool
        self.embed_dim = D
        self.num_prefix_tokens = 0
        self.no_embed_class = True
        self.dynamic_img_size = False
        self.pos_grid = cfg.grid_size

        self.patch_embed = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, D, bias=not cfg.pre_norm)
        grid = self.patch_embed.grid_size
        self.pos_embed = nn.Parameter(torch.zeros(1, grid[0], grid[1], D)) if cfg.abs_pos_embed else None
        self.pos_drop = nn.Dropout(cfg.drop_rate)
        self.norm_pre = norm_layer(D) if cfg.pre_norm else nn.Identity()

        parts = BlockArgs(D, cfg.num_heads, cfg.mlp_ratio, cfg.qkv_bias, cfg.qk_norm, False, False, True,
                          cfg.init_values, norm_layer, act_factory(cfg.act_layer), "mlp", "attn",
                          proj_drop=cfg.drop_rate, attn_drop=cfg.attn_drop_rate, window_size=cfg.window_size,
                          global_blocks=cfg.global_attn_indexes,
                          decomposed_grid=grid if cfg.rel_pos_bias == "decomposed" else None)
        dpr = [cfg.drop_path_rate * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]
        self.blocks = nn.Sequential(*[WindowBlock(parts, depth=i, drop_path=dpr[i]) for i in range(cfg.depth)])
        C = cfg.neck_chans
        if C:  # timm's nn.Sequential indices: neck.0 .. neck.3
            self.neck = nn.Sequential(nn.Conv2d(D, C, kernel_size=1, bias=False), LayerNorm2d(C, eps=NECK_EPS),
                                      nn.Conv2d(C, C, kernel_size=3, padding=1, bias=False),
                                      LayerNorm2d(C, eps=NECK_EPS))
        else:  # the classifier form: the neck is the final norm
            self.neck = LayerNorm2d(D, eps=NECK_EPS)
        self.num_features = cfg.num_features
        self.attn_pool = None
        self.fc_norm = nn.Identity()
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.pre_logits = nn.Identity()
        self.head = nn.Linear(self.num_features, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        # SamModel's prompt encoder and mask decoder: not part of forward, exported as a graph of their own
        self.decoder = SamPromptDecoder(cfg.sam_decoder) if cfg.sam_decoder is not None else None

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        """Image (B, 3, H, W) -> the token grid the first block reads (B, h, w, D)."""
        x = self.patch_embed(x)  # (B, h*w, D)
        x = x.reshape(x.shape[0], self.pos_grid[0], self.pos_grid[1], -1)  # (B, h, w, D)
        if self.pos_embed is not None:
            x = x + self.pos_embed
        return self.norm_pre(self.pos_drop(x))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Image (B, 3, H, W) -> the image embedding (B, C, h, w) (timm's forward_features; transformers'
        get_image_embeddings)."""
        x = self.blocks(self._embed(x))  # (B, h, w, D)
        return self.neck(x.permute(0, 3, 1, 2))  # (B, C, h, w)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, h, w) -> (B, C): the mean over the grid (timm's ClassifierHead 'avg'), or the map as it is."""
        return x.mean(dim=(2, 3)) if self.global_pool == "avg" else x


__all__ = ["SamViT"]
