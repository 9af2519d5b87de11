"""The CPU INT8 graph's attention products: INT8 or FP32 (`attention_attempts`, the default's choice for long
sequences, decided by the held-out check), and the selection without them (`without_attention`)."""

from __future__ import annotations

from pathlib import Path

from ..artifacts.manifest import Manifest
from ..progress import Log
from ..validate.evaluate import ValidationSet
from .graphs import read_graph
from .groups import without_nodes
from .selection import GemmSelection
from .settings import CalibOptions

LONG_SEQUENCE = 256  # tokens from which the CPU INT8 graph may try its attention products in INT8 too
ATTENTION_SHARE = 0.08  # ... when they are at least this share of a block's multiply-adds
GATED_MLPS = ("swiglu", "glu", "swiglu_packed")


def sequence_tokens(manifest: Manifest) -> int:
    """The tokens of the model's sequence: its patch grid, the class token and the register tokens."""
    cfg = manifest.config
    return manifest.grid[0] * manifest.grid[1] + int(cfg.get("class_token", True)) + int(cfg.get("reg_tokens", 0))


def attention_share(config: dict, tokens: int) -> float:
    """The share of a block's multiply-adds a token spends in the two attention products (Q.K^T and A.V: 2 N D)
    against the weight GEMMs (q/k/v and proj: 4 D^2; the MLP: 2 D H, a gated one 3 D H): 2N / (2N + 4D + m H)."""
    dim = int(config.get("embed_dim", 768))
    hidden = dim * float(config.get("mlp_ratio", 4.0))
    mats = 3 if config.get("mlp_layer", "mlp") in GATED_MLPS else 2
    return 2 * tokens / (2 * tokens + 4 * dim + mats * hidden)


def attention_attempts(precision: str, manifest: Manifest, opts: CalibOptions, held: ValidationSet | None,
                       log: Log) -> list[bool | None]:
    """The attention products of the CPU INT8 graph, as asked (--quantize-attention / --no-quantize-attention), or
    by default: for a sequence of LONG_SEQUENCE tokens or more whose two products are ATTENTION_SHARE or more of a
    block's work (`attention_share`), where leaving them in FP32 stops INT8 from paying, they are tried in INT8
    first and kept only if the held-out check passes ([True, False]); otherwise they stay in FP32. None: as the
    options say (their default: the weight GEMMs only), nothing tried."""
    asked = opts.int8.quantize_attention
    if precision != "int8" or asked is not None:
        return [None]
    tokens = sequence_tokens(manifest)
    share = attention_share(manifest.config, tokens)
    if tokens < LONG_SEQUENCE or share < ATTENTION_SHARE:
        return [None]  # the weight GEMMs only, calibrated as the TensorRT graph is: one calibration for both
    if held is None:
        log.warn(f"{tokens} tokens ({share:.0%} of the work in attention): the attention products would pay in INT8, but without the held-out check "
                 f"(--no-check) nothing measures what that costs: they stay in FP32 (--quantize-attention forces "
                 f"them).")
        return [None]
    log.info(f"{tokens} tokens ({share:.0%} of the work in attention): the attention products are tried in INT8 too, and kept if the held-out check passes.")
    return [True, False]


def without_attention(fp32: Path, selection: GemmSelection) -> GemmSelection:
    """The selection with its attention products (MatMuls of two activations) left in float."""
    from ..tensorrt_engine.fusion import constant_names

    graph = read_graph(fp32).graph
    consts = constant_names(graph)
    products = {n.name for n in graph.node if n.op_type == "MatMul" and not any(i in consts for i in n.input[:2])}
    return without_nodes(selection, products)
