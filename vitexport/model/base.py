"""What every vision transformer of vitexport shares past its blocks, and how its random weights are made.

`TransformerBase` is the top of `vit.VisionTransformer`, `eva.Eva` and `beit.Beit`: the prefix tokens and the
position embedding added to the patch tokens (`embed_tokens`), pooling (token, avg, ... or the attention pool),
fc_norm and the head (`forward_head`, timm's cut point: `forward = forward_head(forward_features(x))`), the switch
between PyTorch's fused attention and the explicit form the export writes, and a deterministic timm-style init.
Each model builds its own parts in `__init__` and its own `forward_features`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import ViTConfig
from .layers.mlp import GluMlp, SwiGLU
from .layers.pool import global_pool_nlc


def embed_tokens(x: torch.Tensor, prefix: list[torch.Tensor], pos_embed: torch.Tensor | None,
                 no_embed_class: bool) -> torch.Tensor:
    """Prefix tokens (each (1, n, D), in order) prepended to the patch tokens x (B, N, D), and the position embedding
    added: to the patch tokens only (no_embed_class), else to the whole sequence."""
    B = x.shape[0]
    tokens = [t.expand(B, -1, -1) for t in prefix]  # each (B, n, D)
    if no_embed_class:
        if pos_embed is not None:
            x = x + pos_embed  # (B, N, D)
        return torch.cat(tokens + [x], dim=1) if tokens else x  # (B, prefix+N, D)
    if tokens:
        x = torch.cat(tokens + [x], dim=1)  # (B, prefix+N, D)
    return x + pos_embed if pos_embed is not None else x


class TransformerBase(nn.Module):
    """Pooling, head and initialisation shared by the model classes; subclasses set the attributes used here."""

    cfg: ViTConfig
    num_prefix_tokens: int
    attn_pool: nn.Module | None
    fc_norm: nn.Module
    head_drop: nn.Module
    pre_logits: nn.Module
    head: nn.Module

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - every model has its own
        raise NotImplementedError

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """(B, prefix+N, D) -> (B, D)."""
        if self.attn_pool is not None:
            return self.attn_pool(x if self.cfg.pool_include_prefix else x[:, self.num_prefix_tokens:])
        return global_pool_nlc(x, self.cfg.global_pool, self.num_prefix_tokens, self.cfg.pool_include_prefix)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.fc_norm(self.pool(x))
        x = self.pre_logits(self.head_drop(x))  # (B, num_features)
        return x if pre_logits else self.head(x)  # (B, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def prepare_export(self) -> None:
        """Before an export, with the final weights: the same function in the form runtimes run fastest; here, each
        packed GLU MLP as two projections (`SwiGLU.from_packed`). Subclasses add their own steps."""
        for parent in list(self.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, GluMlp):
                    setattr(parent, name, SwiGLU.from_packed(child))

    def set_fused_attn(self, enabled: bool) -> None:
        """PyTorch's fused attention kernel (eager) or the explicit MatMul/Softmax form (what is exported)."""
        for m in self.modules():
            if hasattr(m, "fused_attn"):
                m.fused_attn = enabled

    def init_weights(self, seed: int = 0) -> "TransformerBase":
        """Deterministic timm-style init: trunc-normal(0.02) Linear weights and position embedding, zero biases,
        every other learned tensor from the same seed (norms start at one, LayerScale at init_values)."""
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            if getattr(self, "pos_embed", None) is not None:
                nn.init.trunc_normal_(self.pos_embed, std=0.02)
            if getattr(self, "cls_token", None) is not None:
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
            # parts the classic ViT lacks come after, so its random weights stay what they were
            for name, p in self.named_parameters():
                leaf = name.rsplit(".", 1)[-1]
                if leaf in ("reg_token", "dist_token"):
                    nn.init.normal_(p, std=1e-6 if leaf == "reg_token" else 0.02)
                elif leaf == "latent":
                    nn.init.trunc_normal_(p, std=p.shape[-1] ** -0.5)
                elif leaf.startswith("lambda_"):
                    nn.init.normal_(p, std=0.1)
                elif leaf in ("q_bias", "v_bias", "relative_position_bias_table"):
                    nn.init.normal_(p, std=0.02)
                elif leaf == "freqs":  # mixed RoPE: frequencies of magnitude ~1 / 10^(i / hd), random directions
                    nn.init.normal_(p, std=0.5)
        finally:
            torch.random.set_rng_state(gen_state)
        return self
