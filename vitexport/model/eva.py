"""The RoPE vision transformers, read top-down: timm's ``Eva`` (timm/models/eva.py) and the families built on it,
EVA and EVA02 (https://arxiv.org/abs/2303.11331), DINOv3 (https://arxiv.org/abs/2508.10104), Meta's Perception
Encoder, naver's RoPE ViTs (https://arxiv.org/abs/2403.13298), the sbb RoPE ViTs, Sapiens2 and LingBot-Vision.
Parameter names match timm's, so its state dicts load as they are.

What it adds to `vit.VisionTransformer` is where position comes from: a rotary embedding of the patch grid
(`layers/rope.py`) handed to every block, with or without an absolute position embedding. Its blocks are EVA's
(`layers/blocks.EvaBlock`, post-norm `EvaPostNormBlock`) around the shared `Attention` (q/v biases without a key
bias, separate q/k/v projections, grouped-query attention) and MLPs (SwiGLU packed or not, aligned, normed):

    image -> PatchEmbed -> [class, register tokens] (+ position embedding) -> norm_pre
          -> blocks(x, rope(grid)) -> norm -> pool (token | avg | map over every token) -> fc_norm -> head

Shapes use B = batch, N = tokens, D = embed dim; the grid is the input's patch grid (symbolic in a dynamic-size
export, so the RoPE table is computed in the graph; a constant at a fixed size).
"""

from __future__ import annotations

import torch
from torch import nn

from .base import TransformerBase, embed_tokens
from .config import ViTConfig
from .layers.attention import Attention
from .layers.blocks import EVA_BLOCK_LAYERS, BlockArgs
from .layers.norm import act_factory, norm_factory
from .layers.patch import PatchEmbed
from .layers.pool import AttentionPoolLatent
from .layers.rope import make_rope, with_prefix
from .posembed import interpolate_pos_embed


class Eva(TransformerBase):
    """A ViT whose blocks rotate queries and keys by the patches' positions (RoPE)."""

    def __init__(self, cfg: ViTConfig | None = None, **overrides):
        super().__init__()
        cfg = cfg or ViTConfig(family="eva", **overrides)
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

        self.patch_embed = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, D, bias=not cfg.pre_norm)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.class_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, cfg.reg_tokens, D)) if cfg.reg_tokens else None
        num_patches = self.pos_grid[0] * self.pos_grid[1]
        embed_len = num_patches if cfg.no_embed_class else num_patches + self.num_prefix_tokens
        self.pos_embed = nn.Parameter(torch.zeros(1, embed_len, D)) if cfg.abs_pos_embed else None  # (1, N_pos, D)
        self.pos_drop = nn.Dropout(cfg.drop_rate)
        head_dim = D // cfg.num_heads
        self.rope = make_rope(cfg.rope, head_dim, cfg.depth, cfg.num_heads, cfg.rope_temperature,
                              cfg.rope_ref_grid, cfg.rope_grid_offset, cfg.rope_grid_indexing,
                              cfg.rope_rotate_half) if cfg.rope else None
        # at a fixed size the table is a constant (sin and cos computed here, not in the graph); mixed RoPE's depends
        # on its learned frequencies, so it is computed from them when the weights are final (prepare_export)
        constant = self.rope is not None and not cfg.dynamic_img_size and cfg.rope != "mixed"
        self.register_buffer("rope_table", self._table(self.patch_embed.grid_size) if constant else None,
                             persistent=False)
        self.norm_pre = norm_layer(D) if cfg.pre_norm else nn.Identity()

        parts = BlockArgs(D, cfg.num_heads, cfg.mlp_ratio, cfg.qkv_bias, cfg.qk_norm, cfg.scale_attn_norm,
                          cfg.scale_mlp_norm, cfg.proj_bias, cfg.init_values, norm_layer, act_factory(cfg.act_layer),
                          cfg.mlp_layer, "attn", proj_drop=cfg.drop_rate, attn_drop=cfg.attn_drop_rate,
                          hidden_features=cfg.hidden_features, qkv_fused=cfg.qkv_fused, k_bias=cfg.k_bias,
                          num_kv_heads=cfg.num_kv_heads, rotate_half=cfg.rope_rotate_half if cfg.rope else None,
                          attn_only_layer_scale=cfg.attn_only_layer_scale)
        dpr = [cfg.drop_path_rate * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]
        block = EVA_BLOCK_LAYERS[cfg.block_fn]
        self.blocks = nn.ModuleList([block(parts, depth=i, drop_path=dpr[i]) for i in range(cfg.depth)])
        use_fc_norm = cfg.uses_fc_norm
        self.norm = norm_layer(D) if cfg.final_norm and not use_fc_norm else nn.Identity()
        # EVA's attention pool (Perception Encoder) has its own heads and MLP ratio, and GELU whatever the blocks use
        pool_mlp = cfg.mlp_ratio if cfg.pool_mlp_ratio is None else cfg.pool_mlp_ratio  # 0: no MLP (AIMv2)
        self.attn_pool = AttentionPoolLatent(D, cfg.pool_heads or cfg.num_heads, pool_mlp,
                                             norm_layer=norm_layer, act_layer=nn.GELU) \
            if cfg.global_pool == "map" else None
        self.fc_norm = norm_layer(D) if cfg.final_norm and use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.pre_logits = nn.Identity()
        self.head = nn.Linear(D, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()

    def prepare_export(self) -> None:
        """Before an export, with the final weights: the shared steps, then each RoPE'd attention in the form
        runtimes fuse, the same function (`Attention.rope_as_halves`, `unfuse_qkv`, `fold_scale`), then the
        fixed-size table computed again in the halves layout (a mixed RoPE's from its frequencies as they are now),
        so the graph holds it as a constant."""
        super().prepare_export()
        if self.rope is None:
            return
        for m in self.modules():
            if isinstance(m, Attention) and m.rotate_half is not None:
                m.rope_as_halves()
                m.unfuse_qkv()
                m.fold_scale()
        self.rope.rotate_half = True
        if not self.dynamic_img_size:
            with torch.no_grad():
                self.register_buffer("rope_table", self._table(self.patch_embed.grid_size), persistent=False)

    def _table(self, grid: tuple, extra_prefix: int = 0) -> torch.Tensor:
        """The RoPE table of the whole sequence: the patch grid's, after rows that leave the prefix (and
        `extra_prefix` tokens joined before it) as it is."""
        return with_prefix(self.rope(grid), self.num_prefix_tokens + extra_prefix)

    # -- forward ------------------------------------------------------------------------------------------
    def _pos_embed(self, x: torch.Tensor, grid: tuple | None) -> torch.Tensor:
        """Prepend the class and register tokens and add the absolute position embedding, if the model has one
        (resampled to `grid` when given)."""
        pos_embed = self.pos_embed
        if pos_embed is not None and grid is not None:
            prefix = 0 if self.no_embed_class else self.num_prefix_tokens
            pos_embed = interpolate_pos_embed(pos_embed, grid, prefix, self.pos_grid, self.cfg.pos_embed_interp)
        prefix_tokens = [t for t in (self.cls_token, self.reg_token) if t is not None]
        return self.pos_drop(embed_tokens(x, prefix_tokens, pos_embed, self.no_embed_class))

    def _grid(self, x: torch.Tensor) -> tuple:
        """The patch grid of images x: symbolic in a dynamic-size export, Python ints (a constant table) otherwise."""
        P = self.patch_embed.patch_size
        return (x.shape[-2] // P[0], x.shape[-1] // P[1]) if self.dynamic_img_size else self.patch_embed.grid_size

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> the tokens the first block reads (B, prefix+N, D)."""
        grid = self._grid(x) if self.dynamic_img_size else None
        return self.norm_pre(self._pos_embed(self.patch_embed(x), grid))

    def block_kwargs(self, grid: tuple, extra_prefix: int = 0) -> dict:
        """What each block takes beside the tokens: the RoPE table of the grid (mixed RoPE's: one per block, indexed
        by the caller), its rows of the prefix tokens (and of `extra_prefix` tokens joined before them: EoMT's
        queries) unrotated."""
        if self.rope is None:
            return {}
        if not extra_prefix and self.rope_table is not None:
            return {"rope": self.rope_table}
        return {"rope": self._table(grid, extra_prefix)}

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        # rope: (prefix+N, 2*hd); mixed: (depth, heads, prefix+N, 2*hd)
        rope = self.block_kwargs(self._grid(x)).get("rope")
        x = self._embed(x)  # (B, prefix+N, D)
        for i, blk in enumerate(self.blocks):
            x = blk(x, rope=rope[i] if rope is not None and rope.ndim == 4 else rope)
        return self.norm(x)  # (B, prefix+N, D)


__all__ = ["Eva"]
