"""The reference Vision Transformer, read top-down.

A faithful re-implementation of timm's ``VisionTransformer`` (An Image is Worth 16x16 Words,
https://arxiv.org/abs/2010.11929) with every option timm's registered ViT architectures use (DINOv2, CLIP, SigLIP,
DeiT and DeiT3, MAE, AugReg, the "sbb" sizes, ...). Parameter names match timm's, so a timm state dict loads as
is. The building blocks live in `layers/`; this file composes them:

    image -> PatchEmbed -> [class, distillation, register tokens] + position embedding -> norm_pre
          -> blocks -> norm -> pool (token | avg | max | avgmax | map | token_avg) -> fc_norm -> pre_logits -> head

Shapes use B = batch, N = tokens, D = embed dim.
"""

from __future__ import annotations

import torch
from torch import nn

from .base import TransformerBase, embed_tokens
from .config import ViTConfig
from .layers.attention import Attention
from .layers.blocks import BLOCK_LAYERS, Block, BlockArgs, DropPath, LayerScale
from .layers.mlp import Mlp
from .layers.norm import act_factory, norm_factory
from .layers.patch import PatchEmbed
from .layers.pool import AttentionPoolLatent
from .posembed import interpolate_pos_embed


class PreLogits(nn.Module):
    """A Linear after pooling, with tanh or no activation: timm's former representation layer (same names, so its
    old checkpoints load), transformers' ViT/DeiT pooler, CLIP's visual projection (no bias, no activation)."""

    def __init__(self, in_features: int, out_features: int, act: str = "tanh", bias: bool = True):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features, bias=bias)
        self.act = nn.Tanh() if act == "tanh" else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class VisionTransformer(TransformerBase):
    """ViT: patch embedding + position embedding -> transformer blocks -> pooling -> linear head."""

    def __init__(self, cfg: ViTConfig | None = None, **overrides):
        super().__init__()
        cfg = cfg or ViTConfig(**overrides)
        self.cfg = cfg
        D = cfg.embed_dim
        norm_layer = norm_factory(cfg.norm_layer, cfg.norm_eps)

        self.num_classes = cfg.num_classes
        self.global_pool = cfg.global_pool
        self.num_features = self.embed_dim = D
        self.num_prefix_tokens = cfg.num_prefix_tokens
        self.no_embed_class = cfg.no_embed_class
        self.dynamic_img_size = cfg.dynamic_img_size
        self.pos_grid = cfg.pos_grid

        embed_norm = norm_factory(cfg.embed_norm_layer, cfg.embed_norm_eps) if cfg.embed_norm_layer else None
        self.patch_embed = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, D, bias=not cfg.pre_norm,
                                      norm_layer=embed_norm)
        num_patches = self.pos_grid[0] * self.pos_grid[1]
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.distilled else None
        self.reg_token = nn.Parameter(torch.zeros(1, cfg.reg_tokens, D)) if cfg.reg_tokens else None
        embed_len = num_patches if cfg.no_embed_class else num_patches + self.num_prefix_tokens
        self.pos_embed = nn.Parameter(torch.randn(1, embed_len, D) * 0.02)  # (1, N_pos, D)
        self.pos_drop = nn.Dropout(cfg.drop_rate)
        self.norm_pre = norm_layer(D) if cfg.pre_norm else nn.Identity()

        parts = BlockArgs(D, cfg.num_heads, cfg.mlp_ratio, cfg.qkv_bias, cfg.qk_norm, cfg.scale_attn_norm,
                          cfg.scale_mlp_norm, cfg.proj_bias, cfg.init_values, norm_layer, act_factory(cfg.act_layer),
                          cfg.mlp_layer, cfg.attn_layer, proj_drop=cfg.drop_rate, attn_drop=cfg.attn_drop_rate)
        # stochastic depth rate rises linearly over the blocks (plain floats: no tensor work at construction)
        dpr = [cfg.drop_path_rate * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]
        block = BLOCK_LAYERS[cfg.block_fn]
        self.blocks = nn.Sequential(*[block(parts, depth=i, drop_path=dpr[i]) for i in range(cfg.depth)])
        use_fc_norm = cfg.uses_fc_norm
        self.norm = norm_layer(D) if cfg.final_norm and not use_fc_norm else nn.Identity()
        pool_mlp = cfg.mlp_ratio if cfg.pool_mlp_ratio is None else cfg.pool_mlp_ratio  # 0: no MLP (AIMv2)
        self.attn_pool = AttentionPoolLatent(D, cfg.pool_heads or cfg.num_heads, pool_mlp,
                                             norm_layer=norm_layer, act_layer=parts.act_layer) \
            if cfg.global_pool == "map" else None
        self.fc_norm = norm_layer(D) if cfg.final_norm and use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.pre_logits = PreLogits(D * (2 if cfg.global_pool == "token_avg" else 1), cfg.pre_logits_size,
                                    cfg.pre_logits_act, cfg.pre_logits_bias) if cfg.pre_logits_size else nn.Identity()
        self.num_features = cfg.num_features
        self.head = nn.Linear(cfg.num_features, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        if cfg.distilled:
            self.head_dist = nn.Linear(D, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()

    # -- forward ------------------------------------------------------------------------------------------
    def _pos_embed(self, x: torch.Tensor, grid: tuple | None = None) -> torch.Tensor:
        """Add the position embedding (resampled to `grid` when given) and, before or after it, prepend the prefix
        tokens (class, distillation, registers)."""
        pos_embed = self.pos_embed
        if grid is not None:
            prefix = 0 if self.no_embed_class else self.num_prefix_tokens
            pos_embed = interpolate_pos_embed(pos_embed, grid, prefix, self.pos_grid, self.cfg.pos_embed_interp,
                                              self.cfg.pos_embed_square)
        prefix_tokens = [t for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        return self.pos_drop(embed_tokens(x, prefix_tokens, pos_embed, self.no_embed_class))

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        """Image (B, C, H, W) -> the tokens the first block reads (B, prefix+N, D)."""
        grid = None
        if self.dynamic_img_size:  # the input's patch grid (symbolic in a dynamic-size export)
            grid = (x.shape[-2] // self.patch_embed.patch_size[0], x.shape[-1] // self.patch_embed.patch_size[1])
        x = self.patch_embed(x)  # (B, N, D)
        x = self._pos_embed(x, grid)  # (B, prefix+N, D)
        return self.norm_pre(x)

    def block_kwargs(self, grid: tuple, extra_prefix: int = 0) -> dict:
        """What each block takes beside the tokens: nothing (a RoPE family's table, eva.Eva.block_kwargs)."""
        return {}

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self._embed(x))
        return self.norm(x)  # (B, prefix+N, D)

    def forward_intermediates(self, x: torch.Tensor, indices: tuple[int, ...], norm: bool = False) -> list[torch.Tensor]:
        """The tokens after the blocks a head taps (timm's forward_intermediates, in transformers' numbering: index 0
        is the embedding output, index k the output of block k), each (B, prefix+N, D), through the final norm when
        `norm`. The blocks past the last tap are not run."""
        x = self._embed(x)
        taps = [x] if 0 in indices else []
        for i, blk in enumerate(self.blocks[:max(indices)]):
            x = blk(x)
            if i + 1 in indices:
                taps.append(x)
        return [self.norm(t) for t in taps] if norm else taps

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if self.cfg.distilled:  # the class and distillation tokens, each through its own head, averaged
            x, x_dist = self.head_drop(x[:, 0]), self.head_drop(x[:, 1])  # (B, D) each
            return (x + x_dist) / 2 if pre_logits else (self.head(x) + self.head_dist(x_dist)) / 2
        return super().forward_head(x, pre_logits)


__all__ = ["Attention", "Block", "DropPath", "LayerScale", "Mlp", "PatchEmbed", "ViTConfig", "VisionTransformer"]
