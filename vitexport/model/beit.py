"""BEiT, read top-down: timm's ``Beit`` (timm/models/beit.py; BEiT https://arxiv.org/abs/2106.08254 and BEiT v2
https://arxiv.org/abs/2208.06366). Parameter names match timm's, so its state dicts load as they are.

What it adds to `vit.VisionTransformer` is a relative position bias on the attention logits (`layers/relpos.py`):
one learned table per block (in its attention, `relative_position_bias_table`) or one shared by all
(`rel_pos_bias`), read at the relative offsets of the patch grid. Its blocks are EVA's (`layers/blocks.EvaBlock`:
q/v biases without a key bias, LayerScale as `gamma_1`/`gamma_2`):

    image -> PatchEmbed -> [class token] (+ position embedding) -> blocks(x, relative positions) -> norm
          -> pool (avg | token) -> fc_norm -> head

At an image size other than the trained one, a checkpoint's tables are resampled to the new window when it is
loaded (`checkpoints.adapt`), as timm's checkpoint filter does; a dynamic-size model resamples them in the graph for
each input's grid (`layers/relpos.TableResampler`), as timm's `set_input_size` would for that size.
"""

from __future__ import annotations

import torch
from torch import nn

from .base import TransformerBase, embed_tokens
from .config import ViTConfig
from .layers.blocks import EVA_BLOCK_LAYERS, BlockArgs
from .layers.norm import act_factory, norm_factory
from .layers.patch import PatchEmbed
from .layers.relpos import RelativePositionBias, RelPosGrid, TableResampler, relative_position_index
from .posembed import interpolate_pos_embed

MAX_DYNAMIC_GRID = 64  # patches a side a dynamic-size BEiT takes (its tables' resampling weights are constants)


class Beit(TransformerBase):
    """A ViT whose attention logits get a learned bias for each relative offset between two patches."""

    def __init__(self, cfg: ViTConfig | None = None, **overrides):
        super().__init__()
        cfg = cfg or ViTConfig(family="beit", **overrides)
        self.cfg = cfg
        D = cfg.embed_dim
        norm_layer = norm_factory(cfg.norm_layer, cfg.norm_eps)

        self.num_classes = cfg.num_classes
        self.global_pool = cfg.global_pool
        self.num_features = self.embed_dim = D
        self.num_prefix_tokens = 1  # the class token
        self.no_embed_class = False
        self.dynamic_img_size = cfg.dynamic_img_size
        self.pos_grid = cfg.grid_size

        self.patch_embed = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, D)
        grid = self.patch_embed.grid_size
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
        self.pos_embed = nn.Parameter(torch.zeros(1, grid[0] * grid[1] + 1, D)) if cfg.abs_pos_embed else None
        self.pos_drop = nn.Dropout(cfg.drop_rate)
        # which table row each (query, key) pair reads, at this grid: a constant of the graph
        self.register_buffer("rel_pos_index", relative_position_index(grid), persistent=False)  # (N+1, N+1)
        self.rel_pos_bias = RelativePositionBias(grid, cfg.num_heads) if cfg.rel_pos_bias == "shared" else None
        # at a dynamic size the tables are resampled to each input's grid, in the graph
        self.max_grid = (max(MAX_DYNAMIC_GRID, grid[0]), max(MAX_DYNAMIC_GRID, grid[1]))
        self.resampler = TableResampler(grid, self.max_grid) if cfg.dynamic_img_size and cfg.rel_pos_bias \
            else None

        parts = BlockArgs(D, cfg.num_heads, cfg.mlp_ratio, cfg.qkv_bias, cfg.qk_norm, cfg.scale_attn_norm,
                          cfg.scale_mlp_norm, cfg.proj_bias, cfg.init_values, norm_layer, act_factory(cfg.act_layer),
                          cfg.mlp_layer, "attn", proj_drop=cfg.drop_rate, attn_drop=cfg.attn_drop_rate,
                          hidden_features=cfg.hidden_features, k_bias=cfg.k_bias,
                          rel_pos_window=grid if cfg.rel_pos_bias == "block" else None)
        dpr = [cfg.drop_path_rate * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]
        self.blocks = nn.ModuleList([EVA_BLOCK_LAYERS["block"](parts, depth=i, drop_path=dpr[i])
                                     for i in range(cfg.depth)])
        use_fc_norm = cfg.uses_fc_norm
        self.norm = norm_layer(D) if cfg.final_norm and not use_fc_norm else nn.Identity()
        self.attn_pool = None
        self.fc_norm = norm_layer(D) if cfg.final_norm and use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.pre_logits = nn.Identity()
        self.head = nn.Linear(D, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        pos_embed, rel_pos = self.pos_embed, RelPosGrid(self.rel_pos_index)
        if self.dynamic_img_size:  # the input's patch grid, symbolic in a dynamic-size export
            P = self.patch_embed.patch_size
            grid = (x.shape[-2] // P[0], x.shape[-1] // P[1])
            if pos_embed is not None:
                pos_embed = interpolate_pos_embed(pos_embed, grid, 1, self.pos_grid, self.cfg.pos_embed_interp)
            if self.resampler is not None:
                rel_pos = RelPosGrid(relative_position_index(grid), self.resampler.axes(grid))
        x = self.patch_embed(x)  # (B, N, D)
        x = self.pos_drop(embed_tokens(x, [self.cls_token], pos_embed, False))  # (B, 1+N, D)
        shared = self.rel_pos_bias(rel_pos) if self.rel_pos_bias is not None else None  # (1, H, 1+N, 1+N)
        for blk in self.blocks:
            x = blk(x, attn_bias=shared, rel_pos=rel_pos)
        return self.norm(x)  # (B, 1+N, D)


__all__ = ["Beit"]
