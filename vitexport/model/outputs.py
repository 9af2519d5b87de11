"""The outputs a user may ask of a ViT, each a named ONNX output (`vitexport onnx --outputs`), as timm computes them:

- `logits`: the head's output (B, classes): `forward_head(forward_features(x))`;
- `pooled`: the pre-logits embedding (B, D): `forward_head(forward_features(x), pre_logits=True)`;
- `tokens`: the final-norm tokens, prefix included (B, prefix + N, D): `forward_features(x)`;
- `registers`: the register tokens of a model that has them (B, R, D);
- `patch`: the patch tokens alone (B, N, D).

The prefix is [class, distillation, registers] in that order (VisionTransformer._pos_embed).

SAM's image encoder (family 'sam') has `image_embeddings`, the neck's map (B, C, h, w) its prompt decoder reads
(timm's forward_features, transformers' get_image_embeddings), and `pooled` / `logits` over its mean.

A dense model (model.dense) has the outputs its library names (heads.config.DenseConfig.outputs): `predicted_depth`
(B, H', W') for depth, `logits` (B, labels, H', W') for DPT's segmentation, EoMT's `class_queries_logits` and
`masks_queries_logits` beside the `semantic_probs` its checks judge.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import VitexportError
from .config import ViTConfig
from .heads.config import EOMT_OUTPUTS
from .heads.detection_config import DETECTION_OUTPUTS

OUTPUTS = ("logits", "pooled", "tokens", "registers", "patch")
SAM_OUTPUTS = ("image_embeddings", "pooled", "logits")  # SAM's encoder: the neck's map, its mean, the head's
TOKEN_OUTPUTS = ("tokens", "registers", "patch")  # a token sequence: what SAM's grid and neck do not give
# a dense head's (heads.config.DenseConfig.outputs) and a detector's (heads.detection_config)
DENSE_OUTPUTS = ("predicted_depth", *EOMT_OUTPUTS, *DETECTION_OUTPUTS)
EMBEDDINGS = ("pooled",)  # outputs judged as embeddings (parity.knn)


def available(cfg: ViTConfig) -> list[str]:
    """The outputs this model has."""
    if cfg.dense is not None:
        return list(cfg.dense.outputs)
    if cfg.family == "sam":
        return [o for o in SAM_OUTPUTS if o != "logits" or cfg.num_classes > 0]
    return [o for o in OUTPUTS if (o != "logits" or cfg.num_classes > 0) and (o != "registers" or cfg.reg_tokens)
            and (o != "pooled" or cfg.global_pool or cfg.distilled)]


def default_outputs(cfg: ViTConfig) -> tuple[str, ...]:
    """`logits` with a head, `pooled` without (a model without pooling: `tokens`); a dense head's own output."""
    if cfg.dense is not None:
        return cfg.dense.outputs
    if cfg.num_classes > 0:
        return ("logits",)
    if cfg.family == "sam":
        return ("image_embeddings",)
    return ("pooled",) if "pooled" in available(cfg) else ("tokens",)


def parse_outputs(text: str | None, cfg: ViTConfig) -> tuple[str, ...]:
    """A comma-separated list of outputs, checked against the model: one sentence when one is unknown or absent."""
    if text is None:
        return default_outputs(cfg)
    names = [t.strip().lower() for t in text.split(",") if t.strip()]
    known = SAM_OUTPUTS if cfg.family == "sam" else OUTPUTS
    if not names:
        raise VitexportError(f"--outputs is empty; give some of {', '.join(known)}.")
    has = available(cfg)
    for n in names:
        if n not in OUTPUTS + SAM_OUTPUTS + DENSE_OUTPUTS:
            raise VitexportError(f"--outputs {n!r} is not an output vitexport knows; choose from {', '.join(known)}.")
        if n not in has and cfg.dense is not None:
            raise VitexportError(f"--outputs {n}: this dense model gives {', '.join(has)} only.")
        if n not in has:
            why = {"logits": "it has no classification head (--num-classes 0)", "registers": "it has no register "
                   "tokens", "pooled": "it does not pool its tokens (global_pool '')",
                   "image_embeddings": "it is not SAM's image encoder"}.get(n, "SAM's encoder gives a map, not tokens")
            raise VitexportError(f"--outputs {n}: this model has no {n} output: {why}; it has {', '.join(has)}.")
    if len(set(names)) != len(names):
        raise VitexportError(f"--outputs {text}: an output is named twice.")
    return tuple(names)


def shapes(cfg: ViTConfig, outputs: tuple[str, ...]) -> dict[str, list]:
    """Each output's shape as the manifest records it: 'batch' first, symbolic token counts for a dynamic size."""
    if cfg.dense is not None:
        return {o: ["batch", *cfg.dense.output_dims(cfg.grid_size, cfg.patch_size, cfg.dynamic_img_size, o)]
                for o in outputs}
    if cfg.family == "sam":
        h, w = cfg.grid_size
        return {o: {"image_embeddings": ["batch", cfg.num_features, h, w], "pooled": ["batch", cfg.num_features],
                    "logits": ["batch", cfg.num_classes]}[o] for o in outputs}
    n = "patches" if cfg.dynamic_img_size else cfg.grid_size[0] * cfg.grid_size[1]
    total = "tokens" if cfg.dynamic_img_size else n + cfg.num_prefix_tokens
    d, c = cfg.num_features, cfg.num_classes or cfg.num_features
    table = {"logits": ["batch", c] if cfg.global_pool or cfg.distilled else ["batch", total, c],
             "pooled": ["batch", d], "tokens": ["batch", total, d], "registers": ["batch", cfg.reg_tokens, d],
             "patch": ["batch", n, d]}
    return {o: table[o] for o in outputs}


def primary(outputs: tuple[str, ...] | list[str], cfg: ViTConfig | None = None) -> str:
    """The output every check and backend judges by default: a dense or detection head's own (when exported), else
    logits when there, else pooled, else the first."""
    if cfg is not None and cfg.dense is not None and cfg.dense.output in outputs:
        return cfg.dense.output
    return next((o for o in ("logits", "pooled") if o in outputs), outputs[0])


def compute(model: nn.Module, features: torch.Tensor, name: str) -> torch.Tensor:
    """One output from the final-norm tokens (B, prefix + N, D) of `model` (a VisionTransformer)."""
    n_prefix, regs = model.num_prefix_tokens, model.cfg.reg_tokens
    if name == "image_embeddings":  # SAM: forward_features is the neck's map
        return features
    if name == "tokens":
        return features
    if name == "patch":
        return features[:, n_prefix:]
    if name == "registers":
        return features[:, n_prefix - regs:n_prefix]
    if name == "pooled":
        return model.forward_head(features, pre_logits=True)
    if name == "logits":
        return model.forward_head(features)
    raise ValueError(f"unknown output {name!r}")


def forward_outputs(model: nn.Module, x: torch.Tensor, names: tuple[str, ...]) -> list[torch.Tensor]:
    """The named outputs of `model` on images x: a ViT's from its final-norm tokens, a dense model's its own."""
    if model.cfg.dense is not None:  # its outputs, in DenseConfig.outputs' order
        out = model(x)
        everything = dict(zip(model.cfg.dense.outputs, out if isinstance(out, tuple) else (out,)))
        return [everything[n] for n in names]
    features = model.forward_features(x)
    return [compute(model, features, n) for n in names]


class WithOutputs(nn.Module):
    """A VisionTransformer whose forward returns the named outputs (a tuple; one output: the tensor itself)."""

    def __init__(self, model: nn.Module, outputs: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.outputs = model, tuple(outputs)
        self.cfg = model.cfg

    def set_fused_attn(self, enabled: bool) -> None:
        self.model.set_fused_attn(enabled)

    def forward(self, x: torch.Tensor):
        outs = tuple(forward_outputs(self.model, x, self.outputs))
        return outs[0] if len(outs) == 1 else outs
