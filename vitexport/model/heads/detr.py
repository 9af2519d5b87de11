"""RF-DETR's head over a backbone's taps, read top-down (transformers' modeling_rf_detr, its module names kept):

    taps (B, C, H, W) each -> projector (C2f, channel LayerNorms) -> memory (B, H W, d)
    memory -> two-stage selection: a proposal per position, scored; the top num_queries positions' refined boxes
    learned queries + those boxes -> decoder layers (self-attention, deformable cross-attention, MLP; post-norm)
    -> class_embed: logits (B, Q, labels); bbox_embed: deltas refining the same boxes -> pred_boxes (B, Q, 4)

Boxes are normalised cx, cy, w, h of the input. The reference boxes are not refined from layer to layer (RF-DETR's
decoder keeps its initial ones), and inference uses the first of the training's query groups alone.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..layers.deformable import ms_deform_attn
from ..layers.mlp import Mlp
from ..layers.norm import LayerNorm2d
from .detection_config import DetectionConfig
from .sam_decoder import FeedForward, SamAttention

ACTS = {"silu": nn.SiLU, "relu": nn.ReLU, "gelu": nn.GELU}


# -- the projector: the taps, concatenated, to one map of d_model channels ---------------------------------------
class ConvNorm(nn.Module):
    """conv (no bias) -> channel LayerNorm -> act (transformers' RfDetrConvNormLayer)."""

    def __init__(self, cin: int, cout: int, kernel: int, eps: float, act: str):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, 1, padding=kernel // 2, bias=False)
        self.norm = LayerNorm2d(cout, eps=eps)
        self.activation = ACTS[act]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.norm(self.conv(x)))


class Bottleneck(nn.Module):
    """Two 3x3 ConvNorms, no residual (RfDetrRepVggBlock)."""

    def __init__(self, d: DetectionConfig):
        super().__init__()
        self.conv1 = ConvNorm(d.hidden, d.hidden, 3, d.norm_eps, d.projector_act)
        self.conv2 = ConvNorm(d.hidden, d.hidden, 3, d.norm_eps, d.projector_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x))


class C2f(nn.Module):
    """1x1 to two halves; the last runs through the bottlenecks, each output kept; all concatenated -> 1x1."""

    def __init__(self, d: DetectionConfig, cin: int):
        super().__init__()
        self.hidden = d.hidden
        self.conv1 = ConvNorm(cin, 2 * d.hidden, 1, d.norm_eps, d.projector_act)
        self.conv2 = ConvNorm((2 + d.c2f_blocks) * d.hidden, d.d_model, 1, d.norm_eps, d.projector_act)
        self.bottlenecks = nn.ModuleList(Bottleneck(d) for _ in range(d.c2f_blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(self.conv1(x).split(self.hidden, 1))  # 2 x (B, hidden, H, W)
        y = parts[-1]
        for block in self.bottlenecks:
            y = block(y)
            parts.append(y)
        return self.conv2(torch.cat(parts, 1))  # (B, d, H, W)


class Projector(nn.Module):
    """RfDetrScaleProjector: concatenated taps -> C2f -> channel LayerNorm (eps 1e-6, transformers' default)."""

    def __init__(self, d: DetectionConfig, width: int):
        super().__init__()
        self.projector_layer = C2f(d, width * len(d.taps))
        self.layer_norm = LayerNorm2d(d.d_model, eps=1e-6)

    def forward(self, taps: list[torch.Tensor]) -> torch.Tensor:
        return self.layer_norm(self.projector_layer(torch.cat(taps, dim=1)))


# -- boxes and the queries' position embedding --------------------------------------------------------------------
def refine_boxes(ref: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """cx, cy, w, h boxes moved by deltas: centre + delta x size, size x exp(delta)."""
    return torch.cat([delta[..., :2] * ref[..., 2:] + ref[..., :2], delta[..., 2:].exp() * ref[..., 2:]], -1)


def sine_embedding(boxes: torch.Tensor, feats: int, temperature: float = 10000.0) -> torch.Tensor:
    """(B, Q, 4) cx, cy, w, h in [0, 1] -> (B, Q, 4 feats): each coordinate's interleaved sin/cos, in the order
    y, x, w, h (DETR's)."""
    dim_t = torch.arange(feats, dtype=torch.float32, device=boxes.device)
    dim_t = temperature ** (2 * torch.div(dim_t, 2, rounding_mode="floor") / feats)  # (feats,)
    embs = []
    for coord in boxes.unbind(-1):
        e = coord[..., None] * (2 * math.pi) / dim_t  # (B, Q, feats)
        embs.append(torch.stack((e[..., 0::2].sin(), e[..., 1::2].cos()), dim=-1).flatten(-2))
    embs[0], embs[1] = embs[1], embs[0]
    return torch.cat(embs, dim=-1)


def proposals(B_like: torch.Tensor, grid: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One proposal per position of an h x w map: its cell's centre, size 0.05 (level 0), (1, h w, 4); and which
    are valid (every coordinate inside (0.01, 0.99)), (1, h w, 1). Constants of the export's fixed grid."""
    h, w = grid
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32),
                            indexing="ij")
    xy = torch.stack([(xs + 0.5) / w, (ys + 0.5) / h], -1).reshape(1, h * w, 2)
    boxes = torch.cat([xy, torch.full_like(xy, 0.05)], -1).to(B_like.device)  # (1, h w, 4)
    valid = ((boxes > 0.01) & (boxes < 0.99)).all(-1, keepdim=True)
    return boxes.masked_fill(~valid, 0.0), valid


# -- the decoder ---------------------------------------------------------------------------------------------------
class DeformableAttention(nn.Module):
    """Each query's sampling offsets and weights from itself; the value map projected; layers.deformable reads it."""

    def __init__(self, d: DetectionConfig, levels: int = 1):
        super().__init__()
        M, L, P = d.cross_attn_heads, levels, d.n_points
        self.heads, self.levels, self.points, self.sampling = M, L, P, d.sampling
        self.sampling_offsets = nn.Linear(d.d_model, M * L * P * 2)
        self.attention_weights = nn.Linear(d.d_model, M * L * P)
        self.value_proj = nn.Linear(d.d_model, d.d_model)
        self.output_proj = nn.Linear(d.d_model, d.d_model)

    def forward(self, x: torch.Tensor, ref: torch.Tensor, memory: torch.Tensor,
                shapes: list[tuple[int, int]]) -> torch.Tensor:
        """x (B, Q, d) with its position embedding, ref (B, Q, 4) boxes, memory (B, S, d) -> (B, Q, d)."""
        B, Q = x.shape[0], x.shape[1]
        M, L, P = self.heads, self.levels, self.points
        value = self.value_proj(memory).reshape(B, -1, M, memory.shape[-1] // M)  # (B, S, M, D)
        offsets = self.sampling_offsets(x).reshape(B, Q, M, L, P, 2)
        weights = self.attention_weights(x).reshape(B, Q, M, L * P).softmax(-1).reshape(B, Q, M, L, P)
        ref = ref[:, :, None, None, None, :]  # (B, Q, 1, 1, 1, 4)
        locations = ref[..., :2] + offsets / P * ref[..., 2:] * 0.5  # (B, Q, M, L, P, 2): within the box
        return self.output_proj(ms_deform_attn(value, shapes, locations, weights, self.sampling))


class DecoderLayer(nn.Module):
    """Post-norm: LN(x + self-attention), LN(x + deformable cross-attention), LN(x + MLP). The position embedding
    joins the queries and keys of the self-attention (not its values) and the cross-attention's queries."""

    def __init__(self, d: DetectionConfig):
        super().__init__()
        self.self_attn = SamAttention(d.d_model, d.self_attn_heads)
        self.self_attn_layer_norm = nn.LayerNorm(d.d_model)
        self.cross_attn = DeformableAttention(d)
        self.cross_attn_layer_norm = nn.LayerNorm(d.d_model)
        self.mlp = Mlp(d.d_model, d.ffn_dim, act_layer=ACTS[d.decoder_act])
        self.layer_norm = nn.LayerNorm(d.d_model)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, ref: torch.Tensor, memory: torch.Tensor,
                shapes: list[tuple[int, int]]) -> torch.Tensor:
        q = x + pos
        x = self.self_attn_layer_norm(x + self.self_attn(q, q, x))
        x = self.cross_attn_layer_norm(x + self.cross_attn(x + pos, ref, memory, shapes))
        return self.layer_norm(x + self.mlp(x))


class Decoder(nn.Module):
    """The layers over fixed reference boxes; the queries' position embedding computed once from them."""

    def __init__(self, d: DetectionConfig):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(d) for _ in range(d.decoder_layers))
        self.layernorm = nn.LayerNorm(d.d_model)
        self.ref_point_head = FeedForward(2 * d.d_model, d.d_model, d.d_model, 2)
        self.feats = d.d_model // 2

    def forward(self, x: torch.Tensor, ref: torch.Tensor, memory: torch.Tensor,
                shapes: list[tuple[int, int]]) -> torch.Tensor:
        pos = self.ref_point_head(sine_embedding(ref, self.feats))  # (B, Q, d)
        for layer in self.layers:
            x = layer(x, pos, ref, memory, shapes)
        return self.layernorm(x)


class DetrHead(nn.Module):
    """Projector map -> two-stage selection -> decoder -> (logits (B, Q, labels), pred_boxes (B, Q, 4))."""

    def __init__(self, d: DetectionConfig, width: int):
        super().__init__()
        self.d = d
        self.projector = Projector(d, width)
        self.reference_point_embed = nn.Embedding(d.num_queries, 4)
        self.query_feat = nn.Embedding(d.num_queries, d.d_model)
        self.enc_output = nn.Linear(d.d_model, d.d_model)
        self.enc_output_norm = nn.LayerNorm(d.d_model)
        self.enc_out_class_embed = nn.Linear(d.d_model, d.num_labels)
        self.enc_out_bbox_embed = FeedForward(d.d_model, d.d_model, 4, 3)
        self.decoder = Decoder(d)
        self.class_embed = nn.Linear(d.d_model, d.num_labels)
        self.bbox_embed = FeedForward(d.d_model, d.d_model, 4, 3)

    def select(self, memory: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """The num_queries positions whose proposal scores highest, as refined boxes (B, Q, 4)."""
        boxes, valid = proposals(memory, grid)  # (1, S, 4), (1, S, 1)
        q = self.enc_output_norm(self.enc_output(memory.masked_fill(~valid, 0.0)))  # (B, S, d)
        scores = self.enc_out_class_embed(q).masked_fill(~valid, float("-inf")).max(-1).values  # (B, S)
        refined = refine_boxes(boxes, self.enc_out_bbox_embed(q))  # (B, S, 4)
        top = torch.topk(scores, self.d.num_queries, dim=1).indices  # (B, Q)
        return torch.gather(refined, 1, top[..., None].expand(-1, -1, 4))

    def forward(self, taps: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        feature = self.projector(taps)  # (B, d, h, w)
        grid = (int(feature.shape[-2]), int(feature.shape[-1]))
        # contiguous, as the Linears read them: PT2E's INT8 linear fusion (torchao) fails on an expanded or
        # transposed activation of a symbolic batch
        memory = feature.flatten(2).transpose(1, 2).contiguous()  # (B, h w, d)
        B = memory.shape[0]
        ref = refine_boxes(self.select(memory, grid), self.reference_point_embed.weight[None])  # (B, Q, 4)
        x = self.query_feat.weight[None].repeat(B, 1, 1)  # (B, Q, d)
        h = self.decoder(x, ref, memory, [grid])
        return self.class_embed(h), refine_boxes(ref, self.bbox_embed(h))


__all__ = ["DetrHead", "refine_boxes", "sine_embedding"]
