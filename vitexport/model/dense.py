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
from ..errors import VitexportError
from .heads.dpt import DepthHead, DPTNeck, SemanticHead
from .heads.eomt import EomtHead, semantic_probs


class DenseBase(nn.Module):
    """What every dense model shares: the backbone and what the loaders and the export ask of it, the input's patch
    grid, and a deterministic init of the head."""

    head: nn.Module

    def __init__(self, cfg: ViTConfig, backbone: TransformerBase):
        super().__init__()
        assert cfg.dense is not None
        self.cfg, self.dense = cfg, cfg.dense
        self.backbone = backbone

    def loaded(self) -> None:
        """Called once a checkpoint's tensors are in (checkpoints.load_into)."""

    def fit_head(self, head: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A checkpoint's head tensors as this head takes them (checkpoints.load_into): as they are."""
        return head

    @property
    def thresholded(self) -> bool:
        """Whether the graph thresholds a computed value (EoMT's masks): float rounding in another runtime may cross
        it and move an output by more than any max abs bound, so the export is judged by its cosine."""
        return False

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

    def prepare_export(self) -> None:
        self.backbone.prepare_export()

    def set_fused_attn(self, enabled: bool) -> None:
        self.backbone.set_fused_attn(enabled)

    def head_modules(self) -> list[nn.Module]:
        return [m for name, m in self.named_children() if name != "backbone" for m in m.modules()]

    def init_weights(self, seed: int = 0) -> "DenseBase":
        """The backbone's deterministic init; the head's convolutions the same way (lecun normal, zero biases),
        its transposed convolutions and norms from the same seed."""
        self.backbone.init_weights(seed)
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(seed + 1)
        try:
            for m in self.head_modules():
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
                elif isinstance(m, nn.Embedding):
                    nn.init.normal_(m.weight)
        finally:
            torch.random.set_rng_state(gen_state)
        return self


class DenseModel(DenseBase):
    """backbone -> taps -> DPT neck -> the task's head (depth or segmentation)."""

    def __init__(self, cfg: ViTConfig, backbone: TransformerBase):
        super().__init__(cfg, backbone)
        self.neck = DPTNeck(self.dense, cfg.embed_dim, cfg.num_prefix_tokens, cfg.dynamic_img_size)
        self.head = SemanticHead(self.dense) if self.dense.task == "segmentation" else \
            DepthHead(self.dense, cfg.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grid = self.grid(x)
        taps = self.backbone.forward_intermediates(x, self.dense.taps, norm=self.dense.tap_norm)
        return self.head(self.neck(taps, grid), grid)  # (B, H', W') or (B, labels, H', W')


class EomtModel(DenseBase):
    """EoMT: the backbone's blocks with the head's queries joining before the last `query_blocks`, their attention
    masked by their own masks, then the class and mask logits (heads.eomt)."""

    def __init__(self, cfg: ViTConfig, backbone: TransformerBase):
        super().__init__(cfg, backbone)
        self.head = EomtHead(self.dense, cfg.embed_dim, self.dense.readout_act, cfg.num_prefix_tokens)
        self.mask_plan: tuple[bool, ...] | None = None  # per query block: a new mask (read from the weights)

    def plan(self) -> tuple[bool, ...]:
        """Which query blocks compute their mask anew: attn_mask_probs > 0 (0 keeps the previous block's); a value
        strictly between 0 and 1 is transformers' random masking, which no graph reproduces: one sentence."""
        probs = [float(p) for p in self.head.attn_mask_probs.tolist()]
        if any(0 < p < 1 for p in probs):
            raise VitexportError(f"This EoMT checkpoint's attn_mask_probs {probs} hold a value between 0 and 1: "
                                 f"transformers then masks a random share of its queries in each forward pass, "
                                 f"which no exported graph reproduces.")
        return tuple(p > 0 for p in probs)

    def loaded(self) -> None:
        self.mask_plan = self.plan()

    @property
    def thresholded(self) -> bool:
        return any(self.mask_plan if self.mask_plan is not None else self.plan())

    def prepare_export(self) -> None:
        super().prepare_export()
        self.mask_plan = self.plan()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> (semantic_probs (B, C, 4h, 4w), class_queries_logits (B, Q, C + 1), masks_queries_logits (B, Q, 4h,
        4w))."""
        bb, grid = self.backbone, self.dense.grid
        plan = self.mask_plan if self.mask_plan is not None else self.plan()
        first = len(bb.blocks) - self.dense.query_blocks
        h = bb._embed(x)  # (B, prefix + N, D)
        bias, kw = None, bb.block_kwargs(grid)
        for i, blk in enumerate(bb.blocks):
            if i == first:
                queries = self.head.query.weight[None].expand(h.shape[0], -1, -1)
                h = torch.cat([queries, h], dim=1)  # (B, Q + prefix + N, D)
                kw = bb.block_kwargs(grid, self.dense.num_queries)  # the queries' RoPE rows unrotated
            if i >= first and plan[i - first]:
                masks, _ = self.head.predict(bb.norm(h), grid)
                bias = self.head.attention_bias(masks, grid)  # (B, 1, T, T)
            h = blk(h, **kw) if bias is None else blk(h, attn_bias=bias, **kw)
        masks, classes = self.head.predict(bb.norm(h), grid)
        return semantic_probs(masks, classes), classes, masks


__all__ = ["DenseBase", "DenseModel", "EomtModel"]
