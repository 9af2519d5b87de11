"""DPT's dense head (Vision Transformers for Dense Prediction, https://arxiv.org/abs/2103.13413), as Depth Anything
and DPT in transformers build it, read top-down:

    taps (B, prefix+N, D) each -> reassemble: drop or read out the class token, tokens to a (B, D, h, w) map,
    1x1 conv, resize by its factor -> 3x3 conv to the fusion width -> fusion, coarsest first: residual units,
    bilinear upsampling (align_corners) and a 1x1 conv -> depth head: conv, upsample, conv, ReLU, 1x1 conv, ReLU
    (relative depth) or sigmoid x max_depth (metric depth) -> (B, H', W'); or DPT's segmentation head: conv, batch
    norm, ReLU, 1x1 conv to the labels, upsample -> (B, labels, H', W')

Module and parameter names are transformers' (`neck.reassemble_stage.layers.0.projection`, ...), so its checkpoints
load by a short table (`checkpoints/hf_dense.py`). Shapes: B batch, D the backbone's width, h x w the patch grid.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.norm import act_factory
from .config import DenseConfig


class ReassembleLayer(nn.Module):
    """A (B, D, h, w) map -> 1x1 conv to `channels` -> resized by `factor` (transposed conv up, strided conv down)."""

    def __init__(self, width: int, channels: int, factor: float):
        super().__init__()
        self.projection = nn.Conv2d(width, channels, kernel_size=1)
        if factor > 1:
            self.resize: nn.Module = nn.ConvTranspose2d(channels, channels, kernel_size=int(factor),
                                                        stride=int(factor), padding=0)
        elif factor == 1:
            self.resize = nn.Identity()
        else:
            self.resize = nn.Conv2d(channels, channels, kernel_size=3, stride=int(1 / factor), padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.resize(self.projection(x))


class ReassembleStage(nn.Module):
    """Each tap's tokens -> an image-like map at its own scale; the class token dropped ('ignore'), added to every
    patch token ('add') or concatenated to each and projected back ('project', Linear + the model's activation, GELU
    by default). DPT's own ViT lays the N tokens out sqrt(N) x sqrt(N) whatever the input: its config
    (DenseConfig.square_grid) admits square inputs only, where that is the input's grid."""

    def __init__(self, cfg: DenseConfig, width: int, num_prefix_tokens: int):
        super().__init__()
        self.readout, self.num_prefix_tokens = cfg.readout, num_prefix_tokens
        self.layers = nn.ModuleList([ReassembleLayer(width, c, f)
                                     for c, f in zip(cfg.neck_hidden_sizes, cfg.reassemble_factors)])
        if cfg.readout == "project":
            act = act_factory(cfg.readout_act)
            self.readout_projects = nn.ModuleList([nn.Sequential(nn.Linear(2 * width, width), act())
                                                   for _ in cfg.taps])

    def forward(self, taps: list[torch.Tensor], grid: tuple) -> list[torch.Tensor]:
        out = []
        for i, t in enumerate(taps):
            cls, x = t[:, 0], t[:, self.num_prefix_tokens:]  # (B, D), (B, N, D)
            if self.readout == "project":
                x = self.readout_projects[i](torch.cat([x, cls.unsqueeze(1).expand_as(x)], dim=-1))  # (B, N, D)
            elif self.readout == "add":
                x = x + cls.unsqueeze(1)
            B, _, D = x.shape
            x = x.reshape(B, grid[0], grid[1], D).permute(0, 3, 1, 2)  # (B, D, h, w)
            out.append(self.layers[i](x))
        return out


class ResidualUnit(nn.Module):
    """Pre-activation residual unit: x + conv(ReLU(conv(ReLU(x)))), batch norm after each conv when asked."""

    def __init__(self, channels: int, batch_norm: bool, bias: bool):
        super().__init__()
        self.activation1, self.activation2 = nn.ReLU(), nn.ReLU()
        self.convolution1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1, bias=bias)
        self.convolution2 = nn.Conv2d(channels, channels, kernel_size=3, padding=1, bias=bias)
        self.batch_norm1 = nn.BatchNorm2d(channels) if batch_norm else nn.Identity()
        self.batch_norm2 = nn.BatchNorm2d(channels) if batch_norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.batch_norm1(self.convolution1(self.activation1(x)))
        h = self.batch_norm2(self.convolution2(self.activation2(h)))
        return h + x


class FusionLayer(nn.Module):
    """(the running map, the next tap's map) -> residual unit on the tap's map added, residual unit, bilinear
    upsampling with align_corners, 1x1 conv. `resize_skip`: resize the tap's map to the running one whatever their
    sizes (a dynamic-size graph, where DPT's x2 steps overshoot an odd map for some inputs only; at equal sizes the
    resize is exact)."""

    def __init__(self, cfg: DenseConfig, resize_skip: bool = False):
        super().__init__()
        c = cfg.fusion_hidden_size
        self.resize_skip = resize_skip
        self.projection = nn.Conv2d(c, c, kernel_size=1, bias=True)
        self.residual_layer1 = ResidualUnit(c, cfg.fusion_batch_norm, cfg.fusion_bias)
        self.residual_layer2 = ResidualUnit(c, cfg.fusion_batch_norm, cfg.fusion_bias)

    def forward(self, x: torch.Tensor, skip: torch.Tensor | None, size: tuple | None) -> torch.Tensor:
        if skip is not None:
            if self.resize_skip or skip.shape[-2:] != x.shape[-2:]:  # DPT's x2 upsampling overshoots an odd map
                skip = F.interpolate(skip, size=x.shape[-2:], mode="bilinear", align_corners=False)
            x = x + self.residual_layer1(skip)
        x = self.residual_layer2(x)
        if size is None:
            x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)
        else:
            x = F.interpolate(x, size=size, mode="bilinear", align_corners=True)
        return self.projection(x)


class FusionStage(nn.Module):
    """The fusion layers, coarsest map first. `dynamic`: a dynamic-size graph (DPT's skips always resized)."""

    def __init__(self, cfg: DenseConfig, dynamic: bool = False):
        super().__init__()
        self.to_next = cfg.fusion_upsample == "next"
        self.layers = nn.ModuleList([FusionLayer(cfg, dynamic and not self.to_next) for _ in cfg.taps])

    def forward(self, maps: list[torch.Tensor]) -> list[torch.Tensor]:
        maps = maps[::-1]  # coarsest first
        fused: list[torch.Tensor] = []
        x = None
        for i, (m, layer) in enumerate(zip(maps, self.layers)):
            size = tuple(maps[i + 1].shape[-2:]) if self.to_next and i + 1 < len(maps) else None
            x = layer(m, None, size) if x is None else layer(x, m, size)
            fused.append(x)
        return fused


class DPTNeck(nn.Module):
    """Reassemble, a 3x3 conv (no bias) per map to the fusion width, fusion: the maps the head reads."""

    def __init__(self, cfg: DenseConfig, width: int, num_prefix_tokens: int, dynamic: bool = False):
        super().__init__()
        self.reassemble_stage = ReassembleStage(cfg, width, num_prefix_tokens)
        self.convs = nn.ModuleList([nn.Conv2d(c, cfg.fusion_hidden_size, kernel_size=3, padding=1, bias=False)
                                    for c in cfg.neck_hidden_sizes])
        self.fusion_stage = FusionStage(cfg, dynamic)

    def forward(self, taps: list[torch.Tensor], grid: tuple) -> list[torch.Tensor]:
        maps = self.reassemble_stage(taps, grid)
        return self.fusion_stage([conv(m) for conv, m in zip(self.convs, maps)])


class SemanticHead(nn.Module):
    """A fused map (B, F, h', w') -> class scores (B, labels, 2h', 2w'): transformers' DPTSemanticSegmentationHead,
    3x3 conv (no bias), batch norm, ReLU, [dropout: identity at inference], 1x1 conv to the labels, x2 bilinear
    upsampling (align_corners). Its `head.N` names are transformers'."""

    def __init__(self, cfg: DenseConfig):
        super().__init__()
        f = cfg.fusion_hidden_size
        self.head_in_index = cfg.head_in_index
        self.head = nn.Sequential(nn.Conv2d(f, f, kernel_size=3, padding=1, bias=False), nn.BatchNorm2d(f),
                                  nn.ReLU(), nn.Identity(), nn.Conv2d(f, cfg.num_labels, kernel_size=1))

    def forward(self, maps: list[torch.Tensor], grid: tuple) -> torch.Tensor:
        x = self.head(maps[self.head_in_index])
        return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)  # (B, labels, H', W')


class DepthHead(nn.Module):
    """A fused map (B, F, h', w') -> depth (B, H', W'): 3x3 conv to F/2, bilinear upsampling (align_corners) to the
    input's grid x patch (Depth Anything) or x2 (DPT), 3x3 conv, ReLU, 1x1 conv to one channel, ReLU or sigmoid,
    x max_depth."""

    def __init__(self, cfg: DenseConfig, patch_size: tuple[int, int]):
        super().__init__()
        f = cfg.fusion_hidden_size
        self.head_in_index, self.patch_size, self.upsample = cfg.head_in_index, patch_size, cfg.head_upsample
        self.projection = nn.Conv2d(256, 256, kernel_size=3, padding=1) if cfg.head_projection else None
        self.conv1 = nn.Conv2d(f, f // 2, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(f // 2, cfg.head_hidden_size, kernel_size=3, padding=1)
        self.activation1 = nn.ReLU()
        self.conv3 = nn.Conv2d(cfg.head_hidden_size, 1, kernel_size=1)
        self.activation2: nn.Module = nn.ReLU() if cfg.depth_type == "relative" else nn.Sigmoid()
        self.max_depth = float(cfg.max_depth)

    def forward(self, maps: list[torch.Tensor], grid: tuple) -> torch.Tensor:
        x = maps[self.head_in_index]
        if self.projection is not None:
            x = torch.relu(self.projection(x))
        x = self.conv1(x)
        if self.upsample == "patch":
            size = (grid[0] * self.patch_size[0], grid[1] * self.patch_size[1])
            x = F.interpolate(x, size=size, mode="bilinear", align_corners=True)
        else:
            x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)
        x = self.conv3(self.activation1(self.conv2(x)))
        x = self.activation2(x)
        if self.max_depth != 1.0:
            x = x * self.max_depth
        return x.squeeze(1)  # (B, H', W')


__all__ = ["DPTNeck", "DepthHead", "FusionStage", "ReassembleStage", "ResidualUnit", "SemanticHead"]
