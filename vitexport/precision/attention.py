"""The CPU INT8 graph's attention products: INT8 or FP32 (`attention_attempts`, the default's choice for long
sequences, decided by the held-out check), and the selection without them (`without_attention`)."""

from __future__ import annotations

from pathlib import Path

from ..artifacts.manifest import Manifest
from ..progress import Log
from ..validate.evaluate import ValidationSet
from .graphs import read_graph
from .groups import without_nodes
from .qdq import GemmSelection
from .settings import CalibOptions

LONG_SEQUENCE = 512  # tokens from which the CPU INT8 graph tries its attention products in INT8 too


def attention_attempts(precision: str, manifest: Manifest, opts: CalibOptions, held: ValidationSet | None,
                       log: Log) -> list[bool | None]:
    """The attention products of the CPU INT8 graph, as asked (--quantize-attention / --no-quantize-attention), or
    by default: for a sequence of LONG_SEQUENCE tokens or more, where the two products (2 N^2 D a block) outweigh
    much of the weight GEMMs (12 N D^2) and stop INT8 from paying, they are tried in INT8 first and kept only if the
    held-out check passes ([True, False]); a shorter one leaves them in FP32. None: as the options say (their
    default: the weight GEMMs only), nothing tried."""
    asked = opts.int8.quantize_attention
    if precision != "int8" or asked is not None:
        return [None]
    tokens = manifest.grid[0] * manifest.grid[1] + int(manifest.config.get("class_token", True)) + \
        int(manifest.config.get("reg_tokens", 0))
    if tokens < LONG_SEQUENCE:
        return [None]  # the weight GEMMs only, calibrated as the TensorRT graph is: one calibration for both
    if held is None:
        log.warn(f"{tokens} tokens: the attention products would pay in INT8, but without the held-out check "
                 f"(--no-check) nothing measures what that costs: they stay in FP32 (--quantize-attention forces "
                 f"them).")
        return [None]
    log.info(f"{tokens} tokens: the attention products are tried in INT8 too, and kept if the held-out check passes.")
    return [True, False]



def without_attention(fp32: Path, selection: GemmSelection) -> GemmSelection:
    """The selection with its attention products (MatMuls of two activations) left in float."""
    from ..tensorrt_engine.fusion import constant_names

    graph = read_graph(fp32).graph
    consts = constant_names(graph)
    products = {n.name for n in graph.node if n.op_type == "MatMul" and not any(i in consts for i in n.input[:2])}
    return without_nodes(selection, products)
