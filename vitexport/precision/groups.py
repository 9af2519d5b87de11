"""GEMM groups: the quantized nodes of a selection gathered by the layer they belong to, the unit that
sensitivity ranks and that the automatic fallback returns to float.

A node's layer is its module path, the part of its ONNX name before the last '/' (the exporter names a node
`<module>/<op>`: `blocks.3.attn.qkv/MatMul`). Per block that gives qkv, proj, fc1 and fc2; the two attention
products share the module `blocks.N.attn` and form one group; outside the blocks, the patch embedding and the
head, and the attention-pool head's q, kv, attention, proj and MLP (SigLIP). Separate projections are q, k and v
(EVA02, Sapiens2), SwiGLU's two input projections fc1_gate and fc1; other blocks' GEMMs are named by their module (a
parallel block's in_proj and out projections). Placements that quantize
other nodes (ModelOpt's LayerNorm inputs and residual Adds) get groups of their own by the same rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .selection import GemmSelection

_BLOCK = re.compile(r"^(?:.*\.)?blocks\.(\d+)(?:\.(.*))?$")
KIND_NAMES = {"attn.qkv": "qkv", "attn.proj": "proj", "mlp.fc1": "fc1", "mlp.fc2": "fc2", "attn": "attention",
              # separate projections (EVA02, Sapiens2, ...) and SwiGLU's two input projections
              "attn.q_proj": "q", "attn.k_proj": "k", "attn.v_proj": "v", "mlp.fc1_g": "fc1_gate", "mlp.fc1_x": "fc1",
              "patch_embed.proj": "patch_embed", "": "residual",
              # the attention-pool head (SigLIP's 'map'): its query, key/value, attention, projection and MLP
              "attn_pool.q": "pool_q", "attn_pool.kv": "pool_kv", "attn_pool": "pool_attention",
              "attn_pool.proj": "pool_proj", "attn_pool.mlp.fc1": "pool_fc1", "attn_pool.mlp.fc2": "pool_fc2"}


@dataclass(frozen=True)
class Group:
    """One layer's quantized nodes."""

    name: str  # the module path: 'blocks.3.attn.qkv', 'patch_embed.proj'
    block: int | None  # the transformer block, None outside the blocks
    kind: str  # 'qkv' | 'proj' | 'fc1' | 'fc2' | 'attention' | 'patch_embed' | 'head' | ...
    nodes: tuple[str, ...]  # its ONNX node names, in graph order

    def to_dict(self) -> dict:
        return {"name": self.name, "block": self.block, "kind": self.kind, "nodes": list(self.nodes)}


def module_of(node_name: str) -> str:
    """The module path of a node's name: before its last '/' (the whole name when it has none)."""
    return node_name.rsplit("/", 1)[0] if "/" in node_name else node_name


def group_of(module: str) -> tuple[int | None, str]:
    """(block, kind) of a module path."""
    m = _BLOCK.match(module)
    if m:
        rest = m.group(2) or ""
        return int(m.group(1)), KIND_NAMES.get(rest, rest.rsplit(".", 1)[-1])
    return None, KIND_NAMES.get(module, module.rsplit(".", 1)[-1])


def gemm_groups(selection: GemmSelection) -> list[Group]:
    """The groups of a selection's nodes, in the order their first node comes in the graph."""
    members: dict[str, list[str]] = {}
    for node in selection.nodes:
        members.setdefault(module_of(node), []).append(node)
    return [Group(name, *group_of(name), tuple(nodes)) for name, nodes in members.items()]


def without(selection: GemmSelection, groups: list[Group]) -> GemmSelection:
    """The selection with these groups' nodes left in float (the activations stay listed: their ranges are
    measured either way, and only the selected nodes' inputs get Q/DQ)."""
    return without_nodes(selection, {n for g in groups for n in g.nodes})


def without_nodes(selection: GemmSelection, drop: set[str]) -> GemmSelection:
    """The selection with these nodes left in float."""
    nodes = [n for n in selection.nodes if n not in drop]
    inputs = {n: k for n, k in selection.inputs.items() if n not in drop}
    return GemmSelection(nodes, list(selection.activations), inputs)
