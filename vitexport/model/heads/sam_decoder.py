"""SAM's prompt encoder and mask decoder (Segment Anything, https://arxiv.org/abs/2304.02643) as one exportable
module, `SamPromptDecoder`, with transformers' SamModel parameter names (its vision encoder aside), so a SamModel's
state dict loads into it through `decoder_state_dict`. The image encoder runs once per image; this graph runs once
per prompt set, on its image embedding:

    image_embeddings (B, C, E, E)     the vision encoder's output (C = hidden_size 256, E = embedding_size 64)
    point_coords (B, N, 2), point_labels (B, N)      prompts in the encoder's input frame (image_size 1024)
    mask_input (B, 1, 4E, 4E), has_mask_input (B,)   a previous low-resolution mask's logits, and whether to use it

1. Prompt encoder. Each point's (x + 0.5, y + 0.5) / image_size is encoded by random Fourier features (the shared
   `shared_image_embedding`, (2, C/2): sin and cos of 2 pi (2p - 1) @ G), and its label picks what is added:
   1 foreground, 0 background, 2 and 3 a box's top-left and bottom-right corners (point_embed.0..3); -1 is "not a
   point" (the padding row a prompt without a box ends with: its Fourier features replaced by `not_a_point_embed`);
   -10 a row to ignore (a zero embedding, transformers' pad label). As in SAM's own ONNX script, every label is an
   elementwise mask (labels == k) multiplied and added, so the graph has no branch and any N.
   The dense embedding is the mask input's embedding (two stride-2 convs with channels-first LayerNorms and GELU,
   a 1x1 conv: (B, C, E, E)) where has_mask_input is 1, the learned `no_mask_embed` where it is 0.

2. Mask decoder. Tokens [iou token, M mask tokens, N prompt embeddings] (B, 1 + M + N, C) and the image
   (embedding + dense embedding) with its image-wide positional embedding (the same Fourier features at each cell's
   centre) go through a two-way transformer: per layer, token self-attention, tokens -> image cross-attention, an
   MLP on the tokens, image -> tokens cross-attention (the positional embeddings added to queries and keys each
   time, the first layer's self-attention without them), then a last tokens -> image attention. The image is
   upscaled x4 (two 2x2 transposed convs, GELU), each mask token's MLP gives C/8 weights, and their product with
   the upscaled image gives the mask logits (B, M, 4E, 4E); the iou token's MLP gives one quality score per mask.

The graph returns every mask token's output: index 0 the single-mask output (SAM's multimask_output=False), 1: the
multimask outputs. `select_mask` is SAM's ONNX script's choice between them; `prompts_to_inputs` turns a user's
points and box into the graph's inputs.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from ...errors import VitexportError
from ..layers.attention import attend
from ..layers.norm import LayerNorm2d
from .config import PromptDecoderConfig

# the point labels of the graph's point_labels input
NOT_A_POINT = -1  # a padding row: its embedding is not_a_point_embed (SAM's and transformers' -1)
BACKGROUND, FOREGROUND = 0, 1  # a click outside / inside the object
BOX_TOP_LEFT, BOX_BOTTOM_RIGHT = 2, 3  # a box's two corners
IGNORED = -10  # a row whose embedding is zero (transformers' pad label)
INPUT_NAMES = ("image_embeddings", "point_coords", "point_labels", "mask_input", "has_mask_input")
OUTPUT_NAMES = ("masks", "iou_predictions")
# transformers' key of the Fourier features' tied copy in the prompt encoder (the module reads the shared one)
TIED_KEY = "prompt_encoder.shared_embedding.positional_embedding"
SHARED_KEY = "shared_image_embedding.positional_embedding"


def _act(name: str) -> nn.Module:
    """'gelu' (exact, erf) or 'relu', as transformers' ACT2FN builds them."""
    return nn.GELU() if name == "gelu" else nn.ReLU()


# --- 1. the prompt encoder ------------------------------------------------------------------------------------------

class FourierEmbedding(nn.Module):
    """Random Fourier features of points in [0, 1]^2 (transformers' SamPositionalEmbedding, without its copy)."""

    def __init__(self, num_pos_feats: int):
        super().__init__()
        # a Gaussian matrix (2, F); SAM draws it with std hidden/2 of the vision encoder, the checkpoint holds it
        self.positional_embedding = nn.Parameter(torch.randn(2, num_pos_feats))

    def forward(self, coords: torch.Tensor) -> torch.Tensor:
        """(..., 2) x, y in [0, 1] -> (..., 2F): sin and cos of 2 pi (2 coords - 1) @ G."""
        x = 2 * coords - 1  # (..., 2) in [-1, 1]
        x = x @ self.positional_embedding  # (..., F)
        x = (2 * math.pi) * x
        return torch.cat([torch.sin(x), torch.cos(x)], dim=-1)  # (..., 2F)


class MaskEmbedding(nn.Module):
    """A (B, 1, 4E, 4E) mask's logits -> (B, C, E, E): two stride-2 2x2 convs (each with a channels-first LayerNorm
    and the activation), a 1x1 conv."""

    def __init__(self, cfg: PromptDecoderConfig):
        super().__init__()
        quarter = cfg.mask_input_channels // 4
        self.activation = _act(cfg.prompt_act)
        self.conv1 = nn.Conv2d(1, quarter, kernel_size=2, stride=2)
        self.conv2 = nn.Conv2d(quarter, cfg.mask_input_channels, kernel_size=2, stride=2)
        self.conv3 = nn.Conv2d(cfg.mask_input_channels, cfg.hidden_size, kernel_size=1)
        self.layer_norm1 = LayerNorm2d(quarter, eps=cfg.prompt_norm_eps)
        self.layer_norm2 = LayerNorm2d(cfg.mask_input_channels, eps=cfg.prompt_norm_eps)

    def forward(self, masks: torch.Tensor) -> torch.Tensor:
        x = self.activation(self.layer_norm1(self.conv1(masks)))  # (B, mask_input_channels / 4, 2E, 2E)
        x = self.activation(self.layer_norm2(self.conv2(x)))  # (B, mask_input_channels, E, E)
        return self.conv3(x)  # (B, C, E, E)


class PromptEncoder(nn.Module):
    """Points (with their labels) -> sparse embeddings; a mask input (or none) -> the dense embedding. The Fourier
    features are the model's shared ones, passed in (transformers' prompt encoder holds a tied copy)."""

    def __init__(self, cfg: PromptDecoderConfig):
        super().__init__()
        self.image_size = cfg.image_size
        self.mask_embed = MaskEmbedding(cfg)
        self.no_mask_embed = nn.Embedding(1, cfg.hidden_size)
        self.point_embed = nn.ModuleList([nn.Embedding(1, cfg.hidden_size) for _ in range(cfg.num_point_embeddings)])
        self.not_a_point_embed = nn.Embedding(1, cfg.hidden_size)

    def embed_points(self, coords: torch.Tensor, labels: torch.Tensor, fourier: FourierEmbedding) -> torch.Tensor:
        """coords (B, N, 2) in the image_size frame, labels (B, N) -> (B, N, C), each label an elementwise mask."""
        coords = (coords + 0.5) / self.image_size  # (B, N, 2): each pixel's centre, in [0, 1]
        emb = fourier(coords)  # (B, N, C)
        labels = labels.unsqueeze(-1)  # (B, N, 1), broadcast over the channels
        kept = (labels != NOT_A_POINT).to(emb.dtype) * (labels != IGNORED).to(emb.dtype)  # (B, N, 1)
        emb = emb * kept + self.not_a_point_embed.weight * (labels == NOT_A_POINT).to(emb.dtype)  # (B, N, C)
        for k, embed in enumerate(self.point_embed):  # background, foreground, the box's corners
            emb = emb + embed.weight * (labels == k).to(emb.dtype)  # (B, N, C)
        return emb

    def embed_mask(self, mask_input: torch.Tensor, has_mask_input: torch.Tensor) -> torch.Tensor:
        """mask_input (B, 1, 4E, 4E), has_mask_input (B,) 0 or 1 -> the dense embedding (B, C, E, E)."""
        has = has_mask_input.to(mask_input.dtype).reshape(-1, 1, 1, 1)  # (B, 1, 1, 1)
        no_mask = self.no_mask_embed.weight.reshape(1, -1, 1, 1)  # (1, C, 1, 1)
        return has * self.mask_embed(mask_input) + (1 - has) * no_mask  # (B, C, E, E)


# --- 2. the mask decoder --------------------------------------------------------------------------------------------

class SamAttention(nn.Module):
    """Multi-head attention whose q, k, v are projected to hidden_size / downsample_rate (transformers' names)."""

    def __init__(self, hidden_size: int, num_heads: int, downsample_rate: int = 1):
        super().__init__()
        self.internal_dim = hidden_size // downsample_rate
        self.num_heads = num_heads
        self.head_dim = self.internal_dim // num_heads
        self.scale = self.head_dim**-0.5
        self.q_proj = nn.Linear(hidden_size, self.internal_dim)
        self.k_proj = nn.Linear(hidden_size, self.internal_dim)
        self.v_proj = nn.Linear(hidden_size, self.internal_dim)
        self.out_proj = nn.Linear(self.internal_dim, hidden_size)
        self.fused_attn = False  # the explicit MatMul -> Softmax -> MatMul form (set_fused_attn flips it)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, internal) -> (B, H, N, hd)."""
        return x.reshape(x.shape[0], -1, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """query (B, Nq, C), key and value (B, Nk, C) -> (B, Nq, C)."""
        q, k, v = self._heads(self.q_proj(query)), self._heads(self.k_proj(key)), self._heads(self.v_proj(value))
        x = attend(q, k, v, self.scale, self.fused_attn)  # (B, H, Nq, hd)
        x = x.transpose(1, 2).reshape(x.shape[0], -1, self.internal_dim)  # (B, Nq, internal)
        return self.out_proj(x)  # (B, Nq, C)


class MLPBlock(nn.Module):
    """The tokens' MLP in each two-way layer."""

    def __init__(self, hidden_size: int, mlp_dim: int, act: str):
        super().__init__()
        self.lin1 = nn.Linear(hidden_size, mlp_dim)
        self.lin2 = nn.Linear(mlp_dim, hidden_size)
        self.act = _act(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin2(self.act(self.lin1(x)))


class TwoWayAttentionBlock(nn.Module):
    """Token self-attention, tokens -> image, token MLP, image -> tokens; each followed by a residual and a norm."""

    def __init__(self, cfg: PromptDecoderConfig, skip_first_layer_pe: bool):
        super().__init__()
        C, heads, rate, eps = cfg.hidden_size, cfg.decoder_heads, cfg.attention_downsample_rate, cfg.decoder_norm_eps
        self.self_attn = SamAttention(C, heads, 1)
        self.layer_norm1 = nn.LayerNorm(C, eps=eps)
        self.cross_attn_token_to_image = SamAttention(C, heads, rate)
        self.layer_norm2 = nn.LayerNorm(C, eps=eps)
        self.mlp = MLPBlock(C, cfg.decoder_mlp_dim, cfg.decoder_act)
        self.layer_norm3 = nn.LayerNorm(C, eps=eps)
        self.layer_norm4 = nn.LayerNorm(C, eps=eps)
        self.cross_attn_image_to_token = SamAttention(C, heads, rate)
        self.skip_first_layer_pe = skip_first_layer_pe  # the first layer: the tokens replaced, no embedding added

    def forward(self, queries: torch.Tensor, keys: torch.Tensor, query_pe: torch.Tensor,
                key_pe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """queries (B, T, C) the tokens, keys (B, E*E, C) the image; query_pe the prompt tokens themselves, key_pe
        the image-wide positional embedding (1, E*E, C)."""
        if self.skip_first_layer_pe:
            queries = self.self_attn(queries, queries, queries)  # (B, T, C)
        else:
            q = queries + query_pe
            queries = queries + self.self_attn(q, q, queries)  # (B, T, C)
        queries = self.layer_norm1(queries)

        q, k = queries + query_pe, keys + key_pe
        queries = self.layer_norm2(queries + self.cross_attn_token_to_image(q, k, keys))  # (B, T, C)

        queries = self.layer_norm3(queries + self.mlp(queries))  # (B, T, C)

        q, k = queries + query_pe, keys + key_pe
        keys = self.layer_norm4(keys + self.cross_attn_image_to_token(k, q, queries))  # (B, E*E, C)
        return queries, keys


class TwoWayTransformer(nn.Module):
    """The two-way layers, then a last tokens -> image attention and a LayerNorm (eps 1e-5: transformers builds it
    with nn.LayerNorm's default, not the config's)."""

    def __init__(self, cfg: PromptDecoderConfig):
        super().__init__()
        self.layers = nn.ModuleList([TwoWayAttentionBlock(cfg, skip_first_layer_pe=i == 0)
                                     for i in range(cfg.decoder_layers)])
        self.final_attn_token_to_image = SamAttention(cfg.hidden_size, cfg.decoder_heads,
                                                      cfg.attention_downsample_rate)
        self.layer_norm_final_attn = nn.LayerNorm(cfg.hidden_size)  # eps 1e-5

    def forward(self, tokens: torch.Tensor, image: torch.Tensor,
                image_pe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (B, T, C), image (B, C, E, E), image_pe (1, C, E, E) -> tokens (B, T, C), image (B, E*E, C)."""
        keys = image.flatten(2).transpose(1, 2)  # (B, E*E, C)
        key_pe = image_pe.flatten(2).transpose(1, 2)  # (1, E*E, C)
        queries = tokens
        for layer in self.layers:
            queries, keys = layer(queries, keys, tokens, key_pe)
        q, k = queries + tokens, keys + key_pe
        queries = self.layer_norm_final_attn(queries + self.final_attn_token_to_image(q, k, keys))  # (B, T, C)
        return queries, keys


class FeedForward(nn.Module):
    """Linears with ReLU between them (transformers' SamFeedForward): proj_in, depth - 2 hidden layers, proj_out."""

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, depth: int):
        super().__init__()
        self.activation = nn.ReLU()
        self.proj_in = nn.Linear(input_dim, hidden_dim)
        self.proj_out = nn.Linear(hidden_dim, output_dim)
        self.layers = nn.ModuleList([nn.Linear(hidden_dim, hidden_dim) for _ in range(depth - 2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.activation(self.proj_in(x))
        for layer in self.layers:
            x = self.activation(layer(x))
        return self.proj_out(x)


class MaskDecoder(nn.Module):
    """Output tokens + prompt embeddings, the image + the dense embedding -> every mask token's mask logits and the
    iou predictions."""

    def __init__(self, cfg: PromptDecoderConfig):
        super().__init__()
        C, M = cfg.hidden_size, cfg.num_mask_tokens
        self.hidden_size, self.num_mask_tokens = C, M
        self.embedding_size, self.mask_size = cfg.embedding_size, cfg.mask_size  # static sides: the graph's shapes
        self.iou_token = nn.Embedding(1, C)
        self.mask_tokens = nn.Embedding(M, C)
        self.transformer = TwoWayTransformer(cfg)
        self.upscale_conv1 = nn.ConvTranspose2d(C, C // 4, kernel_size=2, stride=2)
        self.upscale_conv2 = nn.ConvTranspose2d(C // 4, C // 8, kernel_size=2, stride=2)
        self.upscale_layer_norm = LayerNorm2d(C // 4, eps=1e-6)  # transformers' SamLayerNorm default, not config's
        self.activation = nn.GELU()
        self.output_hypernetworks_mlps = nn.ModuleList([FeedForward(C, C, C // 8, 3) for _ in range(M)])
        self.iou_prediction_head = FeedForward(C, cfg.iou_head_hidden_dim, M, cfg.iou_head_depth)

    def forward(self, image_embeddings: torch.Tensor, image_pe: torch.Tensor, sparse: torch.Tensor,
                dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """image_embeddings and dense (B, C, E, E), image_pe (1, C, E, E), sparse (B, N, C) -> masks (B, M, 4E, 4E),
        iou predictions (B, M)."""
        C, M, E, S = self.hidden_size, self.num_mask_tokens, self.embedding_size, self.mask_size
        output_tokens = torch.cat([self.iou_token.weight, self.mask_tokens.weight], dim=0)  # (1 + M, C)
        output_tokens = output_tokens.unsqueeze(0).expand(sparse.shape[0], -1, -1)  # (B, 1 + M, C)
        tokens = torch.cat([output_tokens, sparse], dim=1)  # (B, 1 + M + N, C)

        image = image_embeddings + dense  # (B, C, E, E)
        queries, keys = self.transformer(tokens, image, image_pe)  # (B, 1 + M + N, C), (B, E*E, C)
        iou_token_out = queries[:, 0, :]  # (B, C)
        mask_tokens_out = queries[:, 1:1 + M, :]  # (B, M, C)

        image = keys.transpose(1, 2).reshape(-1, C, E, E)  # (B, C, E, E)
        up = self.activation(self.upscale_layer_norm(self.upscale_conv1(image)))  # (B, C/4, 2E, 2E)
        up = self.activation(self.upscale_conv2(up))  # (B, C/8, 4E, 4E)
        hyper_in = torch.stack([mlp(mask_tokens_out[:, i, :]) for i, mlp in enumerate(self.output_hypernetworks_mlps)],
                               dim=1)  # (B, M, C/8): each mask token's weights over the upscaled channels
        masks = hyper_in @ up.flatten(2)  # (B, M, 4E*4E)
        masks = masks.reshape(-1, M, S, S)  # (B, M, 4E, 4E)
        iou_pred = self.iou_prediction_head(iou_token_out)  # (B, M)
        return masks, iou_pred


# --- the whole graph ------------------------------------------------------------------------------------------------

class SamPromptDecoder(nn.Module):
    """SAM's prompt encoder and mask decoder over an image embedding: transformers' SamModel without its vision
    encoder, in the input and output form of SAM's ONNX script (all mask tokens' outputs, no selection, no resize)."""

    def __init__(self, cfg: PromptDecoderConfig | None = None):
        super().__init__()
        self.cfg = cfg = cfg or PromptDecoderConfig()
        self.shared_image_embedding = FourierEmbedding(cfg.num_pos_feats)
        self.prompt_encoder = PromptEncoder(cfg)
        self.mask_decoder = MaskDecoder(cfg)

    def set_fused_attn(self, enabled: bool) -> None:
        """PyTorch's fused attention kernel (eager) or the explicit MatMul/Softmax form (what is exported)."""
        for m in self.modules():
            if hasattr(m, "fused_attn"):
                m.fused_attn = enabled

    def image_positional_embeddings(self) -> torch.Tensor:
        """The Fourier features at each embedding cell's centre ((i + 0.5) / E), (1, C, E, E), as transformers'
        SamModel.get_image_wide_positional_embeddings computes them."""
        E = self.cfg.embedding_size
        g = self.shared_image_embedding.positional_embedding
        centres = (torch.arange(E, device=g.device, dtype=g.dtype) + 0.5) / E  # (E,)
        grid = torch.stack([centres[None, :].expand(E, E), centres[:, None].expand(E, E)], dim=-1)  # (E, E, 2): x, y
        return self.shared_image_embedding(grid).permute(2, 0, 1).unsqueeze(0)  # (1, C, E, E)

    def forward(self, image_embeddings: torch.Tensor, point_coords: torch.Tensor, point_labels: torch.Tensor,
                mask_input: torch.Tensor, has_mask_input: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """image_embeddings (B, C, E, E); point_coords (B, N, 2) x, y in the image_size frame; point_labels (B, N)
        (1, 0, 2, 3, -1, -10); mask_input (B, 1, 4E, 4E); has_mask_input (B,) -> masks (B, M, 4E, 4E) low-resolution
        logits of every mask token (0 the single-mask output, 1: the multimask ones), iou_predictions (B, M)."""
        sparse = self.prompt_encoder.embed_points(point_coords, point_labels, self.shared_image_embedding)  # (B, N, C)
        dense = self.prompt_encoder.embed_mask(mask_input, has_mask_input)  # (B, C, E, E)
        return self.mask_decoder(image_embeddings, self.image_positional_embeddings(), sparse, dense)

    def example_inputs(self, batch: int = 1, num_points: int = 2) -> tuple[torch.Tensor, ...]:
        """Random inputs of the graph's shapes (an export's example): foreground points, no mask input."""
        cfg = self.cfg
        return (torch.randn(batch, cfg.hidden_size, cfg.embedding_size, cfg.embedding_size),
                torch.rand(batch, num_points, 2) * cfg.image_size,
                torch.ones(batch, num_points),
                torch.zeros(batch, 1, cfg.mask_size, cfg.mask_size),
                torch.zeros(batch))


def decoder_state_dict(sd: dict[str, Any]) -> dict[str, Any]:
    """A transformers SamModel's state dict -> SamPromptDecoder's: without the vision encoder's tensors and the
    prompt encoder's tied copy of the Fourier features (which stands in for the shared one where that is missing)."""
    out = {k: v for k, v in sd.items() if not k.startswith("vision_encoder.") and k != TIED_KEY}
    if SHARED_KEY not in out and TIED_KEY in sd:
        out[SHARED_KEY] = sd[TIED_KEY]
    return out


# --- the graph's inputs and its outputs' choice (numpy) -------------------------------------------------------------

def prompts_to_inputs(points: Sequence[tuple[float, float, int]], box: tuple[float, float, float, float] | None,
                      scale_xy: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """A user's points (x, y, label 1 foreground or 0 background) and box (x1, y1, x2, y2), in original-image
    pixels -> the graph's point_coords (N, 2) and point_labels (N,), float32: each coordinate scaled by scale_xy
    (new_w / old_w, new_h / old_h, as transformers' processor; the pixel-centre + 0.5 is in the graph), the box as
    its two corners labelled 2 and 3 after the points, else one padding point (0, 0) labelled -1."""
    sx, sy = scale_xy
    coords: list[tuple[float, float]] = []
    labels: list[float] = []
    for p in points:
        if len(p) != 3 or p[2] not in (BACKGROUND, FOREGROUND):
            raise VitexportError(f"The point prompt {tuple(p)!r} is not (x, y, label) with label 1 (foreground) or 0 "
                                 f"(background).")
        coords.append((p[0] * sx, p[1] * sy))
        labels.append(float(p[2]))
    if box is not None:
        if len(box) != 4:
            raise VitexportError(f"The box prompt {tuple(box)!r} is not (x1, y1, x2, y2).")
        coords += [(box[0] * sx, box[1] * sy), (box[2] * sx, box[3] * sy)]
        labels += [float(BOX_TOP_LEFT), float(BOX_BOTTOM_RIGHT)]
    else:
        coords.append((0.0, 0.0))
        labels.append(float(NOT_A_POINT))
    return np.asarray(coords, dtype=np.float32).reshape(-1, 2), np.asarray(labels, dtype=np.float32)


def select_mask(iou_predictions: np.ndarray, num_points: int) -> int:
    """SAM's ONNX script's choice of one mask (select_masks): with more than two graph points (padding and box
    corners counted) the single-mask output (index 0, +1000), else the best-scored multimask output (0 at -1000)."""
    iou = np.asarray(iou_predictions, dtype=np.float64).reshape(-1)  # (M,)
    reweight = np.zeros_like(iou)
    reweight[0] = 1000.0
    return int(np.argmax(iou + (num_points - 2.5) * reweight))
