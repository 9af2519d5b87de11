"""Multi-scale deformable attention's core (Deformable DETR's `ms_deform_attn_core_pytorch`): each query reads, per
head and feature level, a few points of the value map at fractional locations, bilinearly, and sums them with its
attention weights. The one function every DETR decoder here uses (RF-DETR, LW-DETR).

Two forms of the bilinear read, equal to each other (tests), chosen by `sampling`:

- ``grid_sample``: `F.grid_sample(bilinear, zeros, align_corners=False)`, as transformers runs it; ONNX `GridSample`,
  4-D, which TensorRT parses (and has been seen to miscompile in some versions: docs/DETECTION.md);
- ``gather``: the same arithmetic written out: the four neighbours of each location read with `GatherElements` from
  the value map padded by one zero pixel, weighted by the bilinear weights. Plain Pad/Gather/Floor/Clip/Mul/Add that
  every runtime runs the same way.

Shapes are read from the tensors with -1 reshapes, never as traced integers of the batch, so an export keeps its
batch axis symbolic.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SAMPLINGS = ("grid_sample", "gather")


def bilinear_gather(value: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
    """value (N, C, H, W), loc (N, Q, P, 2) as x, y in [0, 1] -> (N, C, Q, P): grid_sample(value, 2 loc - 1,
    'bilinear', 'zeros', align_corners=False) as gathers."""
    H, W = value.shape[-2], value.shape[-1]
    x = loc[..., 0] * W - 0.5  # (N, Q, P): pixel coordinates, pixel centres at whole numbers
    y = loc[..., 1] * H - 0.5
    x0, y0 = torch.floor(x), torch.floor(y)
    fx, fy = x - x0, y - y0
    padded = F.pad(value, (1, 1, 1, 1))  # (N, C, H + 2, W + 2): a zero border reads as 'zeros' padding
    flat = padded.flatten(2)  # (N, C, (H + 2)(W + 2))
    C = value.shape[1]
    # each corner's index in the padded map: a corner outside the map reads the zero border, one further out is
    # clamped onto it; in float (TensorRT's Clip takes no integers), each tensor clamped once (the exporter writes a
    # second clamp of one tensor with dangling bounds)
    xs = [(c.clamp(-1, W) + 1).to(torch.int64) for c in (x0, x0 + 1)]
    ys = [(c.clamp(-1, H) + 1).to(torch.int64) for c in (y0, y0 + 1)]
    out = None
    for yi, wy in zip(ys, (1 - fy, fy)):
        for xi, wx in zip(xs, (1 - fx, fx)):
            idx = (yi * (W + 2) + xi).flatten(1)  # (N, Q * P)
            got = torch.gather(flat, 2, idx[:, None, :].expand(-1, C, -1))  # (N, C, Q * P)
            term = got.reshape(got.shape[0], C, *loc.shape[1:3]) * (wx * wy)[:, None]  # (N, C, Q, P)
            out = term if out is None else out + term
    assert out is not None
    return out


def sample(value: torch.Tensor, loc: torch.Tensor, sampling: str) -> torch.Tensor:
    """value (N, C, H, W), loc (N, Q, P, 2) in [0, 1] -> (N, C, Q, P), by `sampling` (SAMPLINGS)."""
    if sampling == "gather":
        return bilinear_gather(value, loc)
    return F.grid_sample(value, 2 * loc - 1, mode="bilinear", padding_mode="zeros", align_corners=False)


def ms_deform_attn(value: torch.Tensor, shapes: list[tuple[int, int]], locations: torch.Tensor,
                   weights: torch.Tensor, sampling: str = "grid_sample") -> torch.Tensor:
    """Multi-scale deformable attention.

    value (B, S, M, D): M heads of width D over the S = sum(H_l W_l) tokens of the levels `shapes` (Python ints);
    locations (B, Q, M, L, P, 2) as x, y in [0, 1]; weights (B, Q, M, L, P), already softmaxed
    -> (B, Q, M * D).
    """
    B, _, M, D = value.shape
    Q, L, P = locations.shape[1], locations.shape[3], locations.shape[4]
    per_level = value.split([h * w for h, w in shapes], dim=1)
    sampled = []
    for lvl, (h, w) in enumerate(shapes):
        v = per_level[lvl].flatten(2).transpose(1, 2).reshape(-1, D, h, w)  # (B * M, D, H_l, W_l)
        loc = locations[:, :, :, lvl].transpose(1, 2).flatten(0, 1)  # (B * M, Q, P, 2)
        sampled.append(sample(v, loc, sampling))  # (B * M, D, Q, P)
    w = weights.transpose(1, 2).reshape(-1, 1, Q, L * P)  # (B * M, 1, Q, L * P)
    out = (torch.stack(sampled, dim=-2).flatten(-2) * w).sum(-1)  # (B * M, D, Q)
    return out.reshape(-1, M * D, Q).transpose(1, 2).contiguous()  # (B, Q, M * D), as the output Linear reads it


__all__ = ["SAMPLINGS", "bilinear_gather", "ms_deform_attn", "sample"]
