"""The feed-forward part of a block: ``mlp`` (fc1 -> act -> fc2), ``swiglu`` (two input projections, one gated by
the activation), ``glu`` / ``swiglu_packed`` (one fc1 whose output halves are value and gate).

Each takes (width, hidden width, activation class, optional norm before fc2, bias); hidden = int(D * mlp_ratio).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn


class Mlp(nn.Module):
    """fc1 -> act -> (norm) -> fc2."""

    def __init__(self, in_features: int, hidden_features: int, out_features: int | None = None,
                 act_layer: type[nn.Module] = nn.GELU, norm_layer: Callable[[int], nn.Module] | None = None,
                 bias: bool = True, drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features, bias=bias)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.norm = norm_layer(hidden_features) if norm_layer is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden_features, out_features or in_features, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.drop1(self.act(self.fc1(x)))  # (B, N, hidden)
        return self.drop2(self.fc2(self.norm(x)))  # (B, N, D)


class SwiGLU(nn.Module):
    """act(fc1_g(x)) * fc1_x(x) -> (norm) -> fc2: the gate and the value from two separate projections."""

    def __init__(self, in_features: int, hidden_features: int, act_layer: type[nn.Module] = nn.SiLU,
                 norm_layer: Callable[[int], nn.Module] | None = None, bias: bool = True, drop: float = 0.0):
        super().__init__()
        self.fc1_g = nn.Linear(in_features, hidden_features, bias=bias)
        self.fc1_x = nn.Linear(in_features, hidden_features, bias=bias)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.norm = norm_layer(hidden_features) if norm_layer is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden_features, in_features, bias=bias)
        self.drop2 = nn.Dropout(drop)

    @classmethod
    @torch.no_grad()
    def from_packed(cls, glu: "GluMlp") -> "SwiGLU":
        """A packed GLU MLP as two projections, for an export: the same function (fc1's gate and value halves become
        fc1_g and fc1_x; act, norm and fc2 are glu's own). One GEMM whose output is split in halves costs runtimes
        a copy of the split: OpenVINO runs it with a reference kernel, after a dequantization it cannot fuse."""
        fc1 = glu.fc1
        hidden, width = fc1.out_features // 2, fc1.in_features
        m = cls(width, hidden, bias=fc1.bias is not None).to(device=fc1.weight.device, dtype=fc1.weight.dtype)
        gate, value = (slice(hidden, None), slice(None, hidden)) if glu.gate_last else \
            (slice(None, hidden), slice(hidden, None))
        for proj, rows in ((m.fc1_g, gate), (m.fc1_x, value)):
            proj.weight.copy_(fc1.weight[rows])
            if fc1.bias is not None:
                proj.bias.copy_(fc1.bias[rows])
        m.act, m.drop1, m.norm, m.fc2, m.drop2 = glu.act, glu.drop1, glu.norm, glu.fc2, glu.drop2
        return m.train(glu.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.fc1_g(x)) * self.fc1_x(x)  # (B, N, hidden)
        return self.drop2(self.fc2(self.norm(self.drop1(x))))  # (B, N, D)


class GluMlp(nn.Module):
    """One fc1 of twice the width, split in halves (value, gate); gate_last=False puts the gate first (timm's
    SwiGLUPacked, DINOv2's packed SwiGLU). fc2 reads hidden/2 channels."""

    def __init__(self, in_features: int, hidden_features: int, act_layer: type[nn.Module] = nn.Sigmoid,
                 norm_layer: Callable[[int], nn.Module] | None = None, bias: bool = True, drop: float = 0.0,
                 gate_last: bool = True):
        super().__init__()
        self.gate_last = gate_last
        self.fc1 = nn.Linear(in_features, hidden_features, bias=bias)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.norm = norm_layer(hidden_features // 2) if norm_layer is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden_features // 2, in_features, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1, x2 = self.fc1(x).chunk(2, dim=-1)  # each (B, N, hidden/2)
        x = x1 * self.act(x2) if self.gate_last else self.act(x1) * x2
        return self.drop2(self.fc2(self.norm(self.drop1(x))))  # (B, N, D)


def glu_gate_first(*args, **kwargs) -> GluMlp:
    return GluMlp(*args, gate_last=False, **kwargs)


MLP_LAYERS: dict[str, Callable[..., nn.Module]] = {"mlp": Mlp, "swiglu": SwiGLU, "glu": GluMlp,
                                                   "swiglu_packed": glu_gate_first}
