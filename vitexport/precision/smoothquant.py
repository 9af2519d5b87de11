"""SmoothQuant (Xiao et al., 2023) for the GEMMs a LayerNorm feeds (qkv and fc1 in a ViT): the activation outliers
of a few channels moved into the weights, folded so the graph gains no op.

Per input channel j of the LayerNorm's output X and the weight W (K x N, rows are input channels):

    s_j = max|X_j| ** alpha / max_n |W_jn| ** (1 - alpha)

LayerNorm's scale and bias are divided by s (its output becomes X / s) and each row j of W is multiplied by s_j, so
(X / s) @ (s * W) = X @ W: the FP32 graph computes what it computed (to rounding), while the tensor INT8 quantizes
per tensor has its outlier channels shrunk and the weights, quantized per output channel, take them. max|X_j| comes
from the calibration data (calibrate's per-channel mode); a channel never active, or a zero weight row, keeps s = 1.

A LayerNorm is smoothed when its scale (and bias) are constants and every reader of its output is a MatMul with a
constant (K, N) weight. The folded values are new initializers of that LayerNorm and those MatMuls (an exporter
shares one initializer among equal tensors: every LayerNorm's scale of ones, say), so nothing else changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import VitexportError
# alpha (settings.DEFAULT_ALPHA): 1 moves all of X's range into W, 0 all of W's into X

SCALE_RANGE = (1e-3, 1e3)  # s is clipped to this: a near-zero channel or weight row never makes s explode, and
# LayerNorm's scale / s and W * s stay well inside FP16's normal range in the graphs shaped for TensorRT
EXTERNAL_OVER = 1 << 30  # a smoothed model over this many bytes keeps its weights in external data


@dataclass(frozen=True)
class SmoothSite:
    """A LayerNorm and the MatMuls it feeds, with the initializers the folding changes."""

    norm: str  # the LayerNormalization node
    tensor: str  # its output: what calibration measures per channel
    scale: str  # its scale initializer
    bias: str | None  # its bias initializer
    gemms: tuple[str, ...]  # the MatMuls reading its output
    weights: tuple[str, ...]  # their (K, N) weight initializers


def smooth_sites(graph, only: set[str] | None = None) -> list[SmoothSite]:
    """The LayerNorms that can be smoothed (module docstring), those feeding at least one node of `only` when given
    (the GEMMs that will be quantized)."""
    inits = {i.name: i for i in graph.initializer}
    readers: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    outputs = {o.name for o in graph.output}
    sites = []
    for n in graph.node:
        if n.op_type != "LayerNormalization" or len(n.input) < 2 or n.input[1] not in inits:
            continue
        if any(i not in inits for i in n.input[1:3] if i) or n.output[0] in outputs:
            continue
        gemms = readers.get(n.output[0], [])
        if not gemms or any(g.op_type != "MatMul" or g.input[0] != n.output[0] or g.input[1] not in inits
                            or len(inits[g.input[1]].dims) != 2 for g in gemms):
            continue
        if only is not None and not any(g.name in only for g in gemms):
            continue
        sites.append(SmoothSite(n.name, n.output[0], n.input[1], n.input[2] if len(n.input) > 2 and n.input[2]
                                else None, tuple(g.name for g in gemms), tuple(g.input[1] for g in gemms)))
    return sites


def smoothing_scales(x_max: np.ndarray, weights: list[np.ndarray], alpha: float) -> np.ndarray:
    """s per input channel (module docstring), from the activation's per-channel maxima and the (K, N) weights."""
    if not 0 <= alpha <= 1:
        raise VitexportError(f"The SmoothQuant alpha must be within [0, 1], got {alpha:g}.")
    x = np.asarray(x_max, dtype=np.float64)
    w = np.max([np.abs(np.asarray(m, dtype=np.float64)).max(axis=1) for m in weights], axis=0)
    if x.shape != w.shape:
        raise VitexportError(f"Per-channel maxima of {x.shape[0]} channels for a weight of {w.shape[0]} rows.")
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.power(x, alpha) / np.power(w, 1 - alpha)
    s = np.where((x > 0) & (w > 0) & np.isfinite(s), s, 1.0)
    return np.clip(s, *SCALE_RANGE).astype(np.float32)


def write_smoothed(fp32_path: Path, dst: Path, sites: list[SmoothSite], x_max: dict[str, list[float]],
                   alpha: float) -> dict[str, float]:
    """The FP32 model at fp32_path with every site smoothed, saved at dst (its weights in dst's folder, external
    when large). Returns per LayerNorm the largest factor s applied (how far its outliers were moved)."""
    import onnx
    from onnx import numpy_helper

    from .convert import load_weights

    model = load_weights(Path(fp32_path))  # every weight inline, read one at a time
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    nodes = {n.name: n for n in graph.node}

    def put(node_name: str, k: int, array: np.ndarray) -> None:
        """The node's input k becomes a new initializer holding `array`."""
        node = nodes[node_name]
        name = f"{node.input[k]}.smoothed.{node_name}"
        graph.initializer.append(numpy_helper.from_array(array.astype(np.float32), name))
        node.input[k] = name

    moved = {}
    for site in sites:
        weights = [numpy_helper.to_array(inits[w]) for w in site.weights]
        s = smoothing_scales(np.asarray(x_max[site.tensor]), weights, alpha)
        put(site.norm, 1, numpy_helper.to_array(inits[site.scale]) / s)
        if site.bias is not None:
            put(site.norm, 2, numpy_helper.to_array(inits[site.bias]) / s)
        for gemm, w in zip(site.gemms, weights):
            put(gemm, 1, w * s[:, None])
        moved[site.norm] = float(s.max())
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for init in [i for i in graph.initializer if i.name not in read]:  # the originals no node reads any more
        graph.initializer.remove(init)
    big = model.ByteSize() > EXTERNAL_OVER
    onnx.save_model(model, str(dst), save_as_external_data=big, all_tensors_to_one_file=True,
                    location=Path(dst).name + ".data")
    return moved
