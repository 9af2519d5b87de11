"""Decomposed relative position (MViTv2, ViTDet, Segment Anything): the attention logit of query (qy, qx) and key
(ky, kx) gets q . Rh[qy - ky] + q . Rw[qx - kx], one learned table per axis (`rel_pos_h`, `rel_pos_w`: 2 side - 1
rows of head_dim), read with the query itself, so the bias is per query, per head, and per image.

A table trained at one side is used at another by resampling its rows linearly (align_corners False), as timm and
transformers do (`get_rel_pos`); with a fixed grid that happens once, when the weights are loaded
(`resize_rel_pos`), and the export holds a constant gather. The two einsums of the reference code
("bhwc,hkc->bhwk", "bhwc,wkc->bhwk") are written as batched MatMuls: the same sums, in the op every runtime,
quantizer and TensorRT's parser takes as it is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def resize_rel_pos(table: torch.Tensor, length: int) -> torch.Tensor:
    """A (L, C) table -> (length, C), resampled linearly along L (align_corners False), as timm's and transformers'
    get_rel_pos resample it; unchanged at its own length."""
    if table.shape[0] == length:
        return table
    rows = F.interpolate(table.float().T[None], size=length, mode="linear")  # (1, C, length)
    return rows[0].T.to(table.dtype)  # (length, C)


def rel_pos_rows(q_size: int, k_size: int, table: torch.Tensor) -> torch.Tensor:
    """The table's row for each (query, key) offset along one axis: (q_size, k_size, C); the table resampled to
    2 max(q, k) - 1 rows first when it has another length; a shorter axis's coordinates stretched to the longer's."""
    table = resize_rel_pos(table, 2 * max(q_size, k_size) - 1)
    q = torch.arange(q_size, dtype=torch.float32)[:, None] * max(k_size / q_size, 1.0)
    k = torch.arange(k_size, dtype=torch.float32)[None, :] * max(q_size / k_size, 1.0)
    index = (q - k) + (k_size - 1) * max(q_size / k_size, 1.0)  # (q_size, k_size)
    return table[index.long()]  # (q_size, k_size, C)


def decomposed_bias(q: torch.Tensor, rows_h: torch.Tensor, rows_w: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """The logits' bias from the (unscaled) queries q (B, heads, h*w, C) of an h x w grid attending to a grid of
    the same size: (B, heads, h*w, h*w). rows_h (h, h, C), rows_w (w, w, C) from `rel_pos_rows`."""
    B, H, N, C = q.shape
    h, w = grid
    r_q = q.reshape(B, H, h, w, C)  # (B, heads, h, w, C)
    rel_h = r_q @ rows_h.transpose(-1, -2)  # (B, heads, h, w, C) @ (h, C, kh) -> (B, heads, h, w, kh)
    rel_w = (r_q.transpose(2, 3) @ rows_w.transpose(-1, -2)).transpose(2, 3)  # (B, heads, h, w, kw)
    bias = rel_h[..., :, None] + rel_w[..., None, :]  # (B, heads, h, w, kh, kw)
    return bias.reshape(B, H, N, N)
