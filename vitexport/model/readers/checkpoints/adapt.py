"""Putting a converted checkpoint into a model: resize the position embedding (and BEiT's relative position bias
tables, SAM's decomposed tables) to the model's grid, drop a head of another class count, and name every tensor that does not fit in one
error."""

from __future__ import annotations

import math
import re
import warnings

from ....errors import VitexportError
from ...base import TransformerBase
from ...dense import DenseBase
from ...layers.decomposed import resize_rel_pos
from ...layers.relpos import EXTRA_TOKENS, resize_table, resize_table_bilinear
from ...posembed import resample_pos_embed
from .common import Checkpoint, StateDict

BACKBONE = "backbone."  # a dense model's backbone tensors (model.dense)

def describe_checkpoint(sd: StateDict) -> str:
    """A short description of the architecture a state dict holds, for error messages."""
    w = sd.get("patch_embed.proj.weight")
    depth = len({m.group(1) for k in sd if (m := re.match(r"blocks\.(\d+)\.", k))})
    if w is None:
        return f"depth {depth}"
    return f"width {w.shape[0]}, depth {depth}, patch {w.shape[-1]}"


def adapt_state_dict(
    sd: StateDict,
    model: TransformerBase,
    pos_embed_interp: str,
    old_grid: tuple[int, int] | None = None,
    rel_pos_resample: str = "geometric",
) -> tuple[StateDict, list[str]]:
    """Fit a checkpoint to the model: resize the position embedding, drop a head of another class count.

    rel_pos_resample: how BEiT's relative position tables are resampled to another window: 'geometric' (timm's,
    from BEiT's fine-tuning code) or 'bilinear' (transformers'). Returns the adapted state dict and warnings.
    Raises one readable error listing every missing,
    unexpected or mis-shaped tensor by name.
    """
    notes: list[str] = []
    sd = dict(sd)
    target = model.state_dict()
    grid = model.pos_grid  # the model's own grid, or a dynamic-size model's stored one
    if "pos_embed" in sd and "pos_embed" in target and (sd["pos_embed"].shape != target["pos_embed"].shape or (
            old_grid and tuple(old_grid) != grid)):
        prefix = 0 if model.no_embed_class else model.num_prefix_tokens
        pe = sd["pos_embed"]
        if pe.ndim == 2:
            pe = pe.unsqueeze(0)
        if pe.ndim == 4 and target["pos_embed"].ndim == 4 and pe.shape[-1] == target["pos_embed"].shape[-1]:
            # SAM's (1, h, w, D) grid, resampled as timm's resample_abs_pos_embed_nhwc does (bicubic, antialias)
            old = (int(pe.shape[1]), int(pe.shape[2]))
            flat = resample_pos_embed(pe.reshape(1, -1, pe.shape[-1]), grid, 0, old, pos_embed_interp)
            sd["pos_embed"] = flat.reshape(1, grid[0], grid[1], -1)
            notes.append(f"Resized the position embedding to a {grid[0]}x{grid[1]} grid ({pos_embed_interp}).")
        elif pe.shape[-1] == target["pos_embed"].shape[-1] and pe.ndim == 3:
            sd["pos_embed"] = resample_pos_embed(pe, grid, prefix, old_grid, pos_embed_interp,
                                                 model.cfg.pos_embed_square)
            notes.append(f"Resized the position embedding to a {grid[0]}x{grid[1]} grid ({pos_embed_interp}).")
    _resize_rel_pos_tables(sd, target, grid, notes, rel_pos_resample)
    _resize_decomposed_tables(sd, target, notes)
    head_w = sd.get("head.weight")
    if head_w is not None and "head.weight" not in target:
        notes.append("num_classes is 0: dropped the checkpoint's head; the model outputs features.")
        _drop_heads(sd)
    elif head_w is not None and head_w.shape != target["head.weight"].shape \
            and head_w.shape[1:] == target["head.weight"].shape[1:]:
        notes.append(f"The checkpoint's head has {head_w.shape[0]} classes, the model {target['head.weight'].shape[0]}:"
                     " dropped the checkpoint's head; the new head is untrained.")
        _drop_heads(sd)
    elif head_w is None and "head.weight" in target:
        notes.append("The checkpoint has no classification head: the head is untrained.")

    check_fit(sd, target, lambda k: k.startswith(("head.", "head_dist.")))
    return sd, notes


def check_fit(sd: StateDict, target: StateDict, optional=lambda k: False) -> None:
    """One error naming every missing (unless `optional`), unexpected or mis-shaped tensor of `sd` for `target`."""
    missing = [k for k in target if k not in sd and not optional(k)]
    unexpected = [k for k in sd if k not in target]
    mis_shaped = [f"{k} {tuple(sd[k].shape)} vs model {tuple(target[k].shape)}"
                  for k in sd if k in target and sd[k].shape != target[k].shape]
    if missing or unexpected or mis_shaped:
        parts = []
        for label, names in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", mis_shaped)):
            if names:
                shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
                parts.append(f"{len(names)} {label} ({shown})")
        raise VitexportError(
            f"The checkpoint ({describe_checkpoint(sd)}) does not fit the model "
            f"({describe_checkpoint(target)}): " + "; ".join(parts) + ".")


# how a relative position table is resampled to another window, and how the note names it
TABLE_RESAMPLING = {"geometric": (resize_table, "BEiT's geometric resampling"),
                    "bilinear": (resize_table_bilinear, "bilinear, as transformers does")}


def _resize_rel_pos_tables(sd: StateDict, target: StateDict, grid: tuple[int, int], notes: list[str],
                           method: str = "geometric") -> None:
    """BEiT's relative position bias tables trained at another window -> the model's window, as timm's checkpoint
    filter resamples them (a square trained window, unless the table already has the model's size)."""
    resized = 0
    for k, v in list(sd.items()):
        if not k.endswith("relative_position_bias_table") or k not in target or v.shape == target[k].shape:
            continue
        side = math.isqrt(int(v.shape[0]) - EXTRA_TOKENS)
        if side * side != v.shape[0] - EXTRA_TOKENS or side % 2 == 0 or v.ndim != 2 or \
                v.shape[1] != target[k].shape[1]:
            continue  # not a table of a square window: named as mis-shaped below
        sd[k] = TABLE_RESAMPLING[method][0](v, ((side + 1) // 2, (side + 1) // 2), grid)
        resized += 1
    if resized:
        notes.append(f"Resized {resized} relative position bias table{'s' if resized > 1 else ''} to a "
                     f"{grid[0]}x{grid[1]} grid ({TABLE_RESAMPLING[method][1]}).")


def _resize_decomposed_tables(sd: StateDict, target: StateDict, notes: list[str]) -> None:
    """SAM's per-axis tables of a global block trained at another grid -> the model's, resampled linearly as timm
    and transformers resample them in each forward pass (the windowed blocks' tables keep the window's size)."""
    resized = 0
    for k, v in list(sd.items()):
        if k.endswith(("attn.rel_pos_h", "attn.rel_pos_w")) and k in target and v.ndim == 2 and \
                v.shape != target[k].shape and v.shape[1] == target[k].shape[1]:
            sd[k] = resize_rel_pos(v, int(target[k].shape[0]))
            resized += 1
    if resized:
        notes.append(f"Resized {resized} decomposed relative position tables to the model's grid (linear).")


def _drop_heads(sd: StateDict) -> None:
    """The classifier and, for a distilled DeiT, the distillation head."""
    for k in ("head.weight", "head.bias", "head_dist.weight", "head_dist.bias"):
        sd.pop(k, None)


def load_into(model: TransformerBase | DenseBase, ckpt: Checkpoint, pos_embed_interp: str) -> list[str]:
    """Load a checkpoint into a model in place; returns warnings for the user. A dense model: its backbone's
    tensors fitted to the backbone, the head's taken as they are."""
    if isinstance(model, DenseBase):
        backbone = {k.removeprefix(BACKBONE): v for k, v in ckpt.state_dict.items() if k.startswith(BACKBONE)}
        head = model.fit_head({k: v for k, v in ckpt.state_dict.items() if not k.startswith(BACKBONE)})
        sd, notes = adapt_state_dict(backbone, model.backbone, pos_embed_interp, ckpt.hints.get("grid"))
        check_fit(head, {k: v for k, v in model.state_dict().items() if not k.startswith(BACKBONE)})
        sd = {**{BACKBONE + k: v for k, v in sd.items()}, **head}
    else:
        sd, notes = adapt_state_dict(ckpt.state_dict, model, pos_embed_interp, ckpt.hints.get("grid"),
                                     ckpt.hints.get("rel_pos_resample", "geometric"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.load_state_dict(sd, strict=False)
    if isinstance(model, DenseBase):
        model.loaded()
    return notes
