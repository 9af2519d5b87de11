"""transformers' dense predictors -> the dense model's names: the backbone's tensors through its family's converter
under `backbone.`, the neck's and head's as transformers names them (`model.heads.dpt` keeps its module names).

Three formats, told apart by tensor names alone (all have `neck.fusion_stage.layers.0.projection.weight`):

- `hf-depth-anything`: `DepthAnythingForDepthEstimation`: a DINOv2 `backbone.*`, a head of `head.conv1..3`;
- `hf-dpt-dinov2`: `DPTForDepthEstimation` over a DINOv2 `backbone.*`: its head `head.head.0/2/4` (a Sequential
  with an upsampling between) is Depth Anything's conv1..3;
- `hf-dpt`: `DPTForDepthEstimation` and `DPTForSemanticSegmentation` with DPT's own ViT (`dpt.*`, converted as
  transformers' ViT; its final norm `dpt.layernorm` loads as the backbone's unused `norm`). A segmentation head
  (`head.head.1` its batch norm) keeps transformers' names; the auxiliary head (`auxiliary_head.*`) is left out:
  transformers runs it at inference and discards its output (it only feeds the training loss).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import hf_dinov2, hf_vit
from .common import StateDict

ANCHOR = "neck.fusion_stage.layers.0.projection.weight"
BACKBONE = "backbone."
_DEPTH_HEAD = {"head.head.0.": "head.conv1.", "head.head.2.": "head.conv2.", "head.head.4.": "head.conv3."}
_DROPPED = ("auxiliary_head.",)


def _rest(raw: dict, backbone_prefix: str) -> StateDict:
    """The neck's and head's tensors: a DPT depth head's Sequential indices as Depth Anything's names; a
    segmentation head (its batch norm at head.head.1) as it is; the auxiliary head left out."""
    seg = "head.head.1.running_mean" in raw
    out: StateDict = {}
    for k, v in raw.items():
        if k.startswith(backbone_prefix) or k.startswith(_DROPPED):
            continue
        if not seg:
            k = next((new + k[len(old):] for old, new in _DEPTH_HEAD.items() if k.startswith(old)), k)
        out[k] = torch.as_tensor(v)
    return out


def _backbone(raw: dict, prefix: str, convert: Callable[[dict], StateDict]) -> StateDict:
    return {BACKBONE + k: v for k, v in convert({k[len(prefix):]: v for k, v in raw.items()
                                                 if k.startswith(prefix)}).items()}


@dataclass(frozen=True)
class DenseFormat:
    """One dense model's checkpoint: `matches`, `convert` and `fields` as the other format modules have them."""

    NAME: str
    backbone_prefix: str  # the backbone's tensors in the file
    family: Any  # its converter module (hf_dinov2, hf_vit)
    head_anchor: str  # a name only this format's head has

    def matches(self, keys: set[str]) -> bool:
        return ANCHOR in keys and self.head_anchor in keys and \
            any(k.startswith(self.backbone_prefix + "embeddings.") for k in keys)

    def convert(self, raw: dict) -> StateDict:
        out = _backbone(raw, self.backbone_prefix, self.family.convert)
        out.update(_rest(raw, self.backbone_prefix))
        return out

    def fields(self, sd: StateDict) -> dict[str, Any]:
        """ViTConfig fields the backbone's tensors decide (registers, the class token); nothing is pooled."""
        f = self.family.fields({k[len(BACKBONE):]: v for k, v in sd.items() if k.startswith(BACKBONE)})
        f["global_pool"] = ""
        return f


DEPTH_ANYTHING = DenseFormat("hf-depth-anything", BACKBONE, hf_dinov2, "head.conv1.weight")
DPT_DINOV2 = DenseFormat("hf-dpt-dinov2", BACKBONE, hf_dinov2, "head.head.0.weight")
DPT = DenseFormat("hf-dpt", "dpt.", hf_vit, "head.head.0.weight")
FORMATS = (DEPTH_ANYTHING, DPT_DINOV2, DPT)
