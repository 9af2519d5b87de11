"""A detector: a backbone of a family vitexport builds (`vit.VisionTransformer`: RF-DETR's DINOv2) run in windows,
its taps as maps, a DETR head of `heads/detr.py` over them (RF-DETR):

    image (B, 3, H, W) -> backbone: embed -> n x n windows, each with its class token -> blocks (windowed or global)
    -> taps (final norm, class copies dropped, windows put back) (B, D, h, w) -> DetrHead
    -> logits (B, Q, labels), pred_boxes (B, Q, 4) normalised cx, cy, w, h, and the two side by side
       (query_outputs (B, Q, labels + 4): the one output every backend is judged by)

The backbone keeps its family's parameter names (`backbone.blocks.0.attn.qkv.weight`), the head transformers'
(`head.decoder.layers.0.cross_attn.sampling_offsets.weight`). A windowed block attends within each window; a
global one over every window's tokens at once, the class copies included (transformers' RfDetrDinov2Layer): the
block's other parts are per token, so either runs as the backbone's own block over a reshaped batch.
"""

from __future__ import annotations

import torch

from .base import TransformerBase
from .config import ViTConfig
from .dense import DenseBase
from .heads.detection_config import DetectionConfig
from .heads.detr import DetrHead
from .layers.window import join_windows, split_windows, token_map, token_windows


class DetrModel(DenseBase):
    """RF-DETR: a windowed backbone's taps -> DetrHead."""

    dense: DetectionConfig  # type: ignore[assignment]

    def __init__(self, cfg: ViTConfig, backbone: TransformerBase):
        super().__init__(cfg, backbone)
        self.head = DetrHead(self.dense, cfg.embed_dim)

    def fit_head(self, head: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The first query group's rows of the query tables (a checkpoint holds every training group's)."""
        Q = self.dense.num_queries
        return {k: v[:Q] if k in ("head.query_feat.weight", "head.reference_point_embed.weight") else v
                for k, v in head.items()}

    def taps(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The tapped blocks' outputs as maps (B, D, h, w); the blocks past the last tap are not run."""
        d, bb = self.dense, self.backbone
        grid, n = self.cfg.grid_size, d.num_windows
        h = bb._embed(x)  # (B, 1 + N, D)
        h = token_windows(h, grid, n) if n > 1 else h  # (B n^2, 1 + N / n^2, D)
        maps = []
        for i, blk in enumerate(bb.blocks[:max(d.taps)]):
            if n > 1 and i not in d.window_blocks:
                h = split_windows(blk(join_windows(h, n)), n)
            else:
                h = blk(h)
            if i + 1 in d.taps:
                t = bb.norm(h) if d.tap_norm else h
                maps.append(token_map(t, grid, n) if n > 1 else
                            t[:, 1:].transpose(1, 2).reshape(t.shape[0], -1, *grid))
        return maps

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> (query_outputs (B, Q, labels + 4), logits (B, Q, labels), pred_boxes (B, Q, 4))."""
        logits, boxes = self.head(self.taps(x))
        return torch.cat([logits, boxes], dim=-1), logits, boxes


__all__ = ["DetrModel"]
