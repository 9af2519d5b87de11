"""A dense predictor: a backbone of a family vitexport builds (`vit.VisionTransformer`: DINOv2, DPT's ViT) whose
intermediate tokens a head from `heads/` turns into a map (Depth Anything, DPT):

    image (B, 3, H, W) -> backbone.forward_intermediates(taps) -> neck -> head -> predicted_depth (B, H', W'),
                                                                               or logits (B, labels, H', W')

The backbone is the family's own model with its own parameter names (`backbone.blocks.0.attn.qkv.weight`), the
head's are transformers' (`neck.*`, `head.*`). The config is the backbone's ViTConfig, its `dense` field the head's.
"""

from __future__ import annotations

import torch
from torch import nn

from .base import TransformerBase
from .config import ViTConfig
from .heads.config import DenseConfig
from .heads.dpt import DepthHead, DPTNeck, SemanticHead


class DenseModel(nn.Module):
    """backbone -> taps -> DPT neck -> the task's head (depth or segmentation)."""

    def __init__(self, cfg: ViTConfig, backbone: TransformerBase):
        super().__init__()
        assert cfg.dense is not None
        self.cfg, self.dense = cfg, cfg.dense
        self.backbone = backbone
        self.neck = DPTNeck(self.dense, cfg.embed_dim, cfg.num_prefix_tokens, cfg.dynamic_img_size)
        self.head: nn.Module = SemanticHead(self.dense) if self.dense.task == "segmentation" else \
            DepthHead(self.dense, cfg.patch_size)

    # what the loaders and the export ask of any model, answered by the backbone
    @property
    def pos_grid(self) -> tuple[int, int]:
        return self.backbone.pos_grid

    @property
    def num_prefix_tokens(self) -> int:
        return self.backbone.num_prefix_tokens

    def grid(self, x: torch.Tensor) -> tuple:
        """The input's patch grid (symbolic in a dynamic-size export)."""
        P = self.cfg.patch_size
        return (x.shape[-2] // P[0], x.shape[-1] // P[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grid = self.grid(x)
        taps = self.backbone.forward_intermediates(x, self.dense.taps, norm=self.dense.tap_norm)
        return self.head(self.neck(taps, grid), grid)  # (B, H', W') or (B, labels, H', W')

    def prepare_export(self) -> None:
        self.backbone.prepare_export()

    def set_fused_attn(self, enabled: bool) -> None:
        self.backbone.set_fused_attn(enabled)

    def init_weights(self, seed: int = 0) -> "DenseModel":
        """The backbone's deterministic init; the head's convolutions the same way (lecun normal, zero biases),
        its transposed convolutions and norms from the same seed."""
        self.backbone.init_weights(seed)
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(seed + 1)
        try:
            for m in [*self.neck.modules(), *self.head.modules()]:
                if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
                    fan_in = m.weight[0].numel() if not isinstance(m, nn.ConvTranspose2d) else \
                        m.weight.shape[0] * m.weight[0, 0].numel()
                    nn.init.trunc_normal_(m.weight, std=(1.0 / fan_in) ** 0.5)
                    if m.bias is not None:
                        nn.init.normal_(m.bias, std=0.02)
                elif isinstance(m, nn.BatchNorm2d):  # running statistics as a trained model has them
                    nn.init.normal_(m.weight, 1.0, 0.1)
                    nn.init.normal_(m.bias, std=0.1)
                    m.running_mean.normal_(std=0.1)
                    m.running_var.uniform_(0.5, 1.5)
        finally:
            torch.random.set_rng_state(gen_state)
        return self


__all__ = ["DenseModel"]
