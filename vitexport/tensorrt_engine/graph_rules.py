"""What no graph vitexport writes may hold: the ops TensorRT's ONNX parser refuses, or cannot use where RoPE and
dynamic image sizes put them.

Users who take RoPE ViTs to TensorRT themselves meet these: an `If` or `Loop` traced from a size test, a
`ScatterND` built by an in-place write into a position table (TensorRT: "an IScatterLayer cannot be used to compute
a shape tensor", baaivision/EVA#117), a `NonZero` from a mask; `Scan` has no TensorRT layer. vitexport's models
compute their position tables with Range, arithmetic, Gather and Concat only, and every graph is checked when it is
written (`rule_breakers`): a graph that breaks the rule is a vitexport bug, named node by node.

`parser_refusals` adds what TensorRT's ONNX parser itself refuses, op by op with the restrictions of its support
matrix (onnx_support.unsupported). The export does not apply it: a graph TensorRT cannot parse still serves ONNX
Runtime and OpenVINO, and the one such graph vitexport writes on request (an antialiased position-embedding Resize)
is refused by `vitexport trt` in one sentence before any parse (options.refuse_antialias).
"""

from __future__ import annotations

FORBIDDEN_OPS = ("If", "Loop", "Scan", "ScatterND", "NonZero")


def _nodes(graph):
    """Every node of a graph, those of its subgraphs (an If's branches, a Loop's body) included."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _nodes(attr.g)
            for g in attr.graphs:
                yield from _nodes(g)


def rule_breakers(model) -> list[str]:
    """'NAME (OP)' for each node of an ONNX ModelProto whose op is one of FORBIDDEN_OPS, in graph order."""
    graphs = [model.graph] + [f for f in getattr(model, "functions", [])]
    return [f"{n.name or n.output[0]} ({n.op_type})" for g in graphs for n in _nodes(g) if n.op_type in FORBIDDEN_OPS]


def parser_refusals(model) -> list[str]:
    """rule_breakers' 'NAME (OP)', then a line per node TensorRT's ONNX parser (10.12 or newer) refuses: 'node NAME
    (OP): why' (onnx_support.unsupported), but for an antialiased Resize, which `vitexport trt` refuses itself."""
    from .onnx_support import ANTIALIAS, unsupported

    return rule_breakers(model) + unsupported(model, skip={ANTIALIAS})


def describe(breakers: list[str], limit: int = 5) -> str:
    """'N nodes TensorRT's parser refuses (first `limit` of them, and how many more)'."""
    shown = ", ".join(breakers[:limit]) + (f" and {len(breakers) - limit} more" if len(breakers) > limit else "")
    return f"{len(breakers)} node{'s' if len(breakers) != 1 else ''} TensorRT's parser refuses ({shown})"
