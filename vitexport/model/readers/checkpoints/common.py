"""What the format modules share: the state-dict type and the `Checkpoint` a read gives, splitting a transformers checkpoint into its base model and
the heads around it, and fusing transformers' separate q, k, v projections into timm's one qkv."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ....artifacts.manifest import CheckpointRecord
from ....errors import VitexportError
from ..hub import origin

StateDict = dict[str, torch.Tensor]



@dataclass
class Checkpoint:
    state_dict: StateDict  # timm parameter names
    format: str  # a FORMATS module's NAME: 'timm' | 'timm-naflex' | 'jax' | 'hf-vit' | 'hf-dinov2' | 'hf-clip' | ...
    path: Path  # the weights file that was read
    sha256: str
    hints: dict = field(default_factory=dict)  # config facts the file carries (norm_eps, grid, labels, ...)
    fields: dict[str, Any] = field(default_factory=dict)  # ViTConfig fields its tensors decide (transformers)
    num_classes: int = field(init=False, default=0)  # the head's classes (0: none), kept when tensors are released

    def __post_init__(self) -> None:
        head = self.state_dict.get("head.weight")
        self.num_classes = int(head.shape[0]) if head is not None else 0

    def release(self) -> None:
        """Drop the tensors once they are in a model: an export then holds one copy of the weights, not two."""
        self.state_dict = {}

    def record(self) -> CheckpointRecord:
        """What the manifest keeps: the file, its bytes, and the hub repository and commit it came from."""
        hub = origin(self.path)
        if hub is None:
            return CheckpointRecord(str(self.path.resolve()), self.sha256, self.format)
        # inside the Hugging Face cache: the snapshot path (its config.json beside it), not the blob it links to
        return CheckpointRecord(str(self.path.absolute()), self.sha256, self.format, repo=hub[0], revision=hub[1])


def split_base(raw: dict, anchor: str) -> tuple[StateDict, StateDict]:
    """(the base model's tensors with its prefix removed, every other tensor) of a transformers checkpoint. The
    prefix is whatever precedes `anchor` (a name only the base model has): 'vit.' in ViTForImageClassification,
    'vision_model.' in CLIP, '' in a bare ViTModel."""
    hit = next((k for k in raw if k == anchor or k.endswith("." + anchor)), None)
    if hit is None:
        raise VitexportError(f"The checkpoint has no {anchor!r}: it is not the transformers model its names suggest.")
    prefix = hit[: len(hit) - len(anchor)]
    base = {k[len(prefix):]: torch.as_tensor(v) for k, v in raw.items() if k.startswith(prefix)}
    rest = {k: torch.as_tensor(v) for k, v in raw.items() if not k.startswith(prefix)} if prefix else {}
    for k in [k for k in rest if k.startswith(BASE_MODULES) and k not in base]:  # saved without the prefix
        base[k] = rest.pop(k)
    return base, rest


# a base model's own modules, which transformers 5 saves some heads' checkpoints without the prefix of (ViT-MSN's
# classifier: `vit.embeddings.*` beside `encoder.layer.*`)
BASE_MODULES = ("encoder.", "embeddings.", "layernorm.", "pooler.")


class QKV:
    """Collects one block's query, key and value (weight and bias) and fuses them as timm's qkv: (3D, D), (3D,)."""

    def __init__(self) -> None:
        self.parts: dict[tuple[int, str], dict[str, torch.Tensor]] = {}

    def add(self, block: int, which: str, kind: str, tensor: torch.Tensor) -> None:
        """which: 'q' | 'k' | 'v'; kind: 'weight' | 'bias'."""
        self.parts.setdefault((block, kind), {})[which] = tensor

    def fused(self, name: str = "attn.qkv") -> StateDict:
        out: StateDict = {}
        for (i, kind), p in sorted(self.parts.items()):
            if set(p) != {"q", "k", "v"}:
                raise VitexportError(f"The checkpoint's block {i} lacks some of its query, key and value {kind}s.")
            out[f"blocks.{i}.{name}.{kind}"] = torch.cat([p["q"], p["k"], p["v"]], dim=0)
        return out


def rename(sd: StateDict, table: list[tuple[str, str]], qkv: QKV | None = None,
           qkv_pattern: str | None = None) -> StateDict:
    """Rename by the first matching (regex, replacement) pair of `table`; names matching `qkv_pattern` (groups:
    block, q|k|v, weight|bias) go to `qkv`; names no rule knows stay as they are (reported as unexpected later)."""
    out: StateDict = {}
    for k, v in sd.items():
        if qkv is not None and qkv_pattern and (m := re.fullmatch(qkv_pattern, k)):
            qkv.add(int(m.group(1)), m.group(2)[0], m.group(3), v)
            continue
        for pattern, repl in table:
            if re.fullmatch(pattern, k):
                new = re.sub(f"^{pattern}$", repl, k)
                if new:
                    out[new] = v
                break
        else:
            out[k] = v
    return out


# transformers' ViT-style encoders (ViT, DeiT, DINOv2): blocks as saved (transformers 4 and 5) and as transformers 5
# names them in memory; their embeddings
HF_LAYER = r"(?:encoder\.layer|layers)\.(\d+)\."
HF_QKV = HF_LAYER + r"attention\.(?:attention\.)?(query|key|value|q_proj|k_proj|v_proj)\.(weight|bias)"
HF_EMBEDDINGS = [
    (r"embeddings\.cls_token", "cls_token"),
    (r"embeddings\.position_embeddings", "pos_embed"),
    (r"embeddings\.patch_embeddings\.projection\.(weight|bias)", r"patch_embed.proj.\1"),
    (r"embeddings\.mask_token", ""),  # masked-image modelling only
    (HF_LAYER + r"attention\.(?:output\.dense|o_proj)\.(weight|bias)", r"blocks.\1.attn.proj.\2"),
    (r"layernorm\.(weight|bias)", r"norm.\1"),
]


def convert_encoder(raw: dict, anchor: str, table: list[tuple[str, str]], qkv_pattern: str,
                    heads: dict[str, str], drop: tuple[str, ...] = ()) -> StateDict:
    """The base model renamed by `table` with its q/k/v fused, and the tensors around it: modules named in `heads`
    renamed (classifier -> head), names starting with `drop` left out, any other kept (reported as unexpected)."""
    base, rest = split_base(raw, anchor)
    qkv = QKV()
    out = rename(base, table, qkv, qkv_pattern)
    out.update(qkv.fused())
    for k, v in rest.items():
        module, _, kind = k.rpartition(".")
        if module in heads:
            out[f"{heads[module]}.{kind}"] = v
        elif not (drop and k.startswith(drop)):
            out[k] = v
    return out
