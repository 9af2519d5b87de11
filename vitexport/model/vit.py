"""The reference Vision Transformer, read top-down.

A faithful re-implementation of timm's ``VisionTransformer`` (An Image is Worth 16x16 Words,
https://arxiv.org/abs/2010.11929). Parameter names match timm's, so a timm state dict loads as is.

Reading order: PatchEmbed -> Attention -> Mlp -> LayerScale / DropPath -> Block -> ViTConfig -> VisionTransformer.
Shapes use B = batch, N = tokens, D = embed dim, H = heads, hd = head dim, P = patch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import partial
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import VitexportError
from .posembed import interpolate_pos_embed


def to_2tuple(x: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    """An int or a pair -> (height, width)."""
    if isinstance(x, int):
        return (x, x)
    h, w = x
    return (int(h), int(w))


class PatchEmbed(nn.Module):
    """Image to patch embedding: (B, C, H, W) -> (B, N, D), one token per non-overlapping P x P patch."""

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        embed_dim: int = 768,
        bias: bool = True,
    ):
        super().__init__()
        self.img_size = to_2tuple(img_size)
        self.patch_size = to_2tuple(patch_size)
        for side, (s, p) in zip(("height", "width"), zip(self.img_size, self.patch_size)):
            if s % p != 0:
                raise VitexportError(f"Image {side} {s} is not a multiple of the patch size {p}.")
        self.grid_size = (self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1])
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        # a convolution with kernel = stride = patch size is a linear map applied to each patch
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size, bias=bias)
        self.norm = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)  # (B, D, H/P, W/P)
        x = x.flatten(2).transpose(1, 2)  # (B, N, D)
        return self.norm(x)


class Attention(nn.Module):
    """Multi-head self-attention with one fused qkv projection."""

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, attn_drop: float = 0.0,
                 proj_drop: float = 0.0):
        super().__init__()
        if dim % num_heads != 0:
            raise VitexportError(f"Embedding width {dim} is not divisible by {num_heads} heads.")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = nn.Identity()
        self.k_norm = nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        # PyTorch's fused kernel in eager mode; the explicit MatMul/Softmax form is what gets exported
        self.fused_attn = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (3, B, H, N, hd)
        q, k, v = qkv.unbind(0)  # each (B, H, N, hd)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)
        else:
            attn = (q * self.scale) @ k.transpose(-2, -1)  # (B, H, N, N)
            attn = attn.softmax(dim=-1)
            attn = self.attn_drop(attn)
            x = attn @ v  # (B, H, N, hd)
        x = x.transpose(1, 2).reshape(B, N, C)  # (B, N, D)
        x = self.proj(x)
        return self.proj_drop(x)


class Mlp(nn.Module):
    """fc1 -> GELU -> dropout -> fc2 -> dropout; hidden width = mlp_ratio * D."""

    def __init__(self, in_features: int, hidden_features: int, act_layer: type[nn.Module] = nn.GELU,
                 drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.norm = nn.Identity()
        self.fc2 = nn.Linear(hidden_features, in_features)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.drop1(self.act(self.fc1(x)))  # (B, N, hidden)
        return self.drop2(self.fc2(self.norm(x)))  # (B, N, D)


class LayerScale(nn.Module):
    """Per-channel learnable scaling of a residual branch (CaiT); gamma starts at init_values."""

    def __init__(self, dim: int, init_values: float = 1e-5):
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class DropPath(nn.Module):
    """Stochastic depth: drop a whole residual branch per sample while training."""

    def __init__(self, drop_prob: float = 0.0):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1.0 - self.drop_prob
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)  # (B, 1, 1)
        return x * mask / keep


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = False,
                 init_values: float | None = None, proj_drop: float = 0.0, attn_drop: float = 0.0,
                 drop_path: float = 0.0, norm_layer: type[nn.Module] | partial = nn.LayerNorm,
                 act_layer: type[nn.Module] = nn.GELU, mlp_layer: type[nn.Module] = Mlp):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = Attention(dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop)
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = mlp_layer(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=proj_drop)
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))  # (B, N, D)
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))  # (B, N, D)
        return x


GlobalPool = Literal["token", "avg", ""]


@dataclass
class ViTConfig:
    """Everything that decides a ViT's shapes and forward pass."""

    img_size: tuple[int, int] = (224, 224)  # (H, W) of the input image
    patch_size: tuple[int, int] = (16, 16)  # (P_h, P_w); H and W must be multiples
    in_chans: int = 3
    num_classes: int = 1000  # 0 -> no head: the model returns pooled features
    global_pool: GlobalPool = "token"  # 'token': class token, 'avg': mean of patch tokens, '': no pooling
    embed_dim: int = 768  # D
    depth: int = 12  # number of blocks
    num_heads: int = 12  # H; head_dim = D / H
    mlp_ratio: float = 4.0  # MLP hidden width / D
    qkv_bias: bool = True
    init_values: float | None = None  # LayerScale init; None -> no LayerScale
    class_token: bool = True
    no_embed_class: bool = False  # True -> the position embedding covers patch tokens only
    pre_norm: bool = False  # LayerNorm after the embedding (CLIP style); also drops the patch conv bias
    fc_norm: bool | None = None  # LayerNorm after pooling instead of before it; None -> on when global_pool='avg'
    norm_eps: float = 1e-6  # LayerNorm epsilon (Hugging Face checkpoints use 1e-12)
    drop_rate: float = 0.0  # dropout after the position embedding, in the blocks and before the head
    attn_drop_rate: float = 0.0  # dropout on the attention matrix
    drop_path_rate: float = 0.0  # stochastic depth, linearly increasing over the blocks
    # any image size (multiples of the patch): the position embedding, stored at pos_embed_grid, is resampled to
    # each input's grid in the forward pass with pos_embed_interp (timm's dynamic_img_size)
    dynamic_img_size: bool = False
    pos_embed_grid: tuple[int, int] | None = None  # the grid the stored position embedding covers; None: img_size's
    pos_embed_interp: str = "bicubic-antialias"  # posembed.INTERPOLATIONS; used only with dynamic_img_size

    def __post_init__(self) -> None:
        self.img_size = to_2tuple(self.img_size)
        self.patch_size = to_2tuple(self.patch_size)
        if self.pos_embed_grid is not None:
            self.pos_embed_grid = to_2tuple(self.pos_embed_grid)
        if self.global_pool not in ("token", "avg", ""):
            raise VitexportError(f"global_pool must be 'token', 'avg' or '', not {self.global_pool!r}.")
        if self.global_pool == "token" and not self.class_token:
            raise VitexportError("global_pool='token' needs class_token=True.")

    @property
    def grid_size(self) -> tuple[int, int]:
        return (self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1])

    @property
    def pos_grid(self) -> tuple[int, int]:
        """The grid of the stored position embedding."""
        return self.pos_embed_grid or self.grid_size

    def to_dict(self) -> dict:
        return asdict(self)


class VisionTransformer(nn.Module):
    """ViT: patch embedding + position embedding -> transformer blocks -> pooling -> linear head."""

    def __init__(self, cfg: ViTConfig | None = None, **overrides):
        super().__init__()
        cfg = cfg or ViTConfig(**overrides)
        self.cfg = cfg
        D = cfg.embed_dim
        norm_layer = partial(nn.LayerNorm, eps=cfg.norm_eps)
        use_fc_norm = cfg.global_pool == "avg" if cfg.fc_norm is None else cfg.fc_norm

        self.num_classes = cfg.num_classes
        self.global_pool = cfg.global_pool
        self.num_features = self.embed_dim = D
        self.num_prefix_tokens = 1 if cfg.class_token else 0
        self.no_embed_class = cfg.no_embed_class
        self.dynamic_img_size = cfg.dynamic_img_size
        self.pos_grid = cfg.pos_grid

        self.patch_embed = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, D, bias=not cfg.pre_norm)
        num_patches = self.pos_grid[0] * self.pos_grid[1]
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.class_token else None
        embed_len = num_patches if cfg.no_embed_class else num_patches + self.num_prefix_tokens
        self.pos_embed = nn.Parameter(torch.randn(1, embed_len, D) * 0.02)  # (1, N_pos, D)
        self.pos_drop = nn.Dropout(cfg.drop_rate)
        self.norm_pre = norm_layer(D) if cfg.pre_norm else nn.Identity()

        # stochastic depth rate rises linearly over the blocks (plain floats: no tensor work at construction)
        dpr = [cfg.drop_path_rate * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]
        self.blocks = nn.Sequential(*[
            Block(D, cfg.num_heads, cfg.mlp_ratio, cfg.qkv_bias, cfg.init_values, proj_drop=cfg.drop_rate,
                  attn_drop=cfg.attn_drop_rate, drop_path=dpr[i], norm_layer=norm_layer)
            for i in range(cfg.depth)
        ])
        self.norm = norm_layer(D) if not use_fc_norm else nn.Identity()
        self.fc_norm = norm_layer(D) if use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head = nn.Linear(D, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()

    # -- initialisation (timm's scheme) -----------------------------------------------------------------------
    def init_weights(self, seed: int = 0) -> "VisionTransformer":
        """Deterministic timm-style init: trunc-normal(0.02) Linear weights and position embedding, zero biases."""
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
            if self.cls_token is not None:
                nn.init.normal_(self.cls_token, std=1e-6)
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    nn.init.trunc_normal_(m.weight, std=0.02)
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)
                elif isinstance(m, nn.Conv2d):
                    # lecun normal (timm's 'jax' scheme for the patch conv), so every tensor comes from the seed
                    fan_in = m.in_channels * m.kernel_size[0] * m.kernel_size[1]
                    nn.init.trunc_normal_(m.weight, std=math.sqrt(1.0 / fan_in))
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)
        finally:
            torch.random.set_rng_state(gen_state)
        return self

    def set_fused_attn(self, enabled: bool) -> None:
        for m in self.modules():
            if isinstance(m, Attention):
                m.fused_attn = enabled

    # -- forward ------------------------------------------------------------------------------------------
    def _pos_embed(self, x: torch.Tensor, grid: tuple | None = None) -> torch.Tensor:
        """Add the position embedding (resampled to `grid` when given) and (before or after it) prepend the class
        token."""
        pos_embed = self.pos_embed
        if grid is not None:
            prefix = 0 if self.no_embed_class else self.num_prefix_tokens
            pos_embed = interpolate_pos_embed(pos_embed, grid, prefix, self.pos_grid, self.cfg.pos_embed_interp)
        if self.no_embed_class:
            x = x + pos_embed  # (B, N, D)
            if self.cls_token is not None:
                x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)  # (B, 1+N, D)
        else:
            if self.cls_token is not None:
                x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)  # (B, 1+N, D)
            x = x + pos_embed
        return self.pos_drop(x)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        grid = None
        if self.dynamic_img_size:  # the input's patch grid (symbolic in a dynamic-size export)
            grid = (x.shape[-2] // self.patch_embed.patch_size[0], x.shape[-1] // self.patch_embed.patch_size[1])
        x = self.patch_embed(x)  # (B, N, D)
        x = self._pos_embed(x, grid)  # (B, prefix+N, D)
        x = self.norm_pre(x)
        x = self.blocks(x)
        return self.norm(x)  # (B, prefix+N, D)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if self.global_pool == "avg":
            x = x[:, self.num_prefix_tokens:].mean(dim=1)  # (B, D)
        elif self.global_pool == "token":
            x = x[:, 0]  # (B, D)
        x = self.fc_norm(x)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)  # (B, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


def build_model(cfg: ViTConfig, seed: int = 0) -> VisionTransformer:
    """A model in eval mode with deterministic weights (overwrite them with a checkpoint to use it)."""
    return VisionTransformer(cfg).init_weights(seed).eval()


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = [
    "Attention", "Block", "DropPath", "LayerScale", "Mlp", "PatchEmbed", "ViTConfig", "VisionTransformer",
    "build_model", "count_params",
]
