"""What a precision step is asked to do: plain data, read by the CLI without loading any numeric library."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .. import environment
from ..errors import VitexportError

if TYPE_CHECKING:
    from ..parity.compare import Thresholds

CALIB_METHODS = ("minmax", "entropy", "percentile")  # how activation ranges are chosen from calibration data
# FP16: op types kept in FP32. LayerNorm overflows in FP16; Pow and ReduceMean are a decomposed RmsNorm's mean of
# squares (and x^3 of the tanh GELU): |x| > 256 squared leaves FP16's range
DEFAULT_KEEP_FP32 = ("LayerNormalization", "Softmax", "Pow", "ReduceMean")
DEFAULT_PERCENTILE = 99.999
DEFAULT_ALPHA = 0.5  # SmoothQuant's migration strength (its paper's default): precision/smoothquant.py
PLACEMENTS = ("vitexport", "modelopt")  # the TensorRT INT8 graph's Q/DQ placement (precision/placement.py)


@dataclass
class Int8Settings:
    method: str = "percentile"  # one of CALIB_METHODS
    percentile: float = DEFAULT_PERCENTILE  # for the percentile method
    # also quantize Q.K^T and A.V (MatMul with two activations); None: the CPU graph of a long sequence does,
    # when its held-out check passes (precision/attention.attention_attempts)
    quantize_attention: bool | None = None
    exclude_nodes: list[str] = field(default_factory=list)  # node names, as in the exported graph
    exclude_blocks: list[int] = field(default_factory=list)  # whole transformer blocks kept in float
    placement: str = "vitexport"  # model.int8.trt.onnx only: one of PLACEMENTS (recorded in its qdq facts)
    smoothquant: float | None = None  # SmoothQuant's alpha for the LayerNorm-fed GEMMs (precision/smoothquant.py)
    # model.int8.onnx's weights: 7 or 8 bits; None: 8 where this CPU sums INT8 products exactly, else 7
    # (int8.cpu_weight_max); the ranges do not depend on it
    weight_bits: int | None = None
    min_cos: float | None = None  # fallback target: groups return to float until the min cosine reaches this
    max_drop: float | None = None  # fallback target: ... until the top-1 drop is within this many points
    # fallback target of a dense model: ... until its task figure reaches this (depth: AbsRel at most; segmentation:
    # pixel agreement at least; parity.dense)
    dense_target: float | None = None

    def to_dict(self) -> dict:
        """What the calibrated ranges depend on (the calibration key): the fallback targets choose among GEMMs
        after calibration, so they are not in it."""
        return {"method": self.method, "percentile": self.percentile if self.method == "percentile" else None,
                "quantize_attention": self.quantize_attention, "exclude_nodes": sorted(self.exclude_nodes),
                "exclude_blocks": sorted(self.exclude_blocks),
                **({"smoothquant": self.smoothquant} if self.smoothquant is not None else {})}

    def target(self) -> dict:
        """The fallback target asked for ({} for none), as recorded in the manifest."""
        return {k: v for k, v in (("min_cos", self.min_cos), ("max_drop", self.max_drop),
                                  ("dense_target", self.dense_target)) if v is not None}


def weight_bits_here(weight_bits: int | None) -> int:
    """The CPU INT8 graph's weight bits made on this CPU for `--weight-bits` (precision/qdq.py says why there are
    two): None chooses 8 where this CPU sums INT8 products exactly (environment.cpu_sums_int8_exactly), else 7. 8
    asked for on a CPU that saturates them is one sentence: the graph's check would run its wrong sums here."""
    exact = environment.cpu_sums_int8_exactly()
    if weight_bits is None:
        return 8 if exact else 7
    if weight_bits not in (7, 8):
        raise VitexportError(f"The CPU INT8 graph's weights have 7 or 8 bits, not {weight_bits}.")
    if weight_bits == 8 and not exact:
        raise VitexportError("This CPU (no VNNI or AMX) sums 8-bit INT8 weights with saturation, so a graph with "
                             "them cannot be checked here: make it on a CPU with VNNI or AMX, or leave --weight-bits "
                             "out.")
    return weight_bits


@dataclass
class CalibOptions:
    data: Path | None = None  # images or .npy batches; default: the shipped set for the model
    samples: int | None = None  # None: all (shipped photos: 13; digits: 200)
    int8: Int8Settings = field(default_factory=Int8Settings)
    keep_fp32: tuple[str, ...] = DEFAULT_KEEP_FP32  # FP16 only
    check: bool = True  # check the result against FP32 on held-out data
    check_data: Path | None = None  # held-out images for the parity check; default: the shipped held-out set
    check_labels: tuple[Path, ...] = ()  # label files for check_data (data.labelfile)
    thresholds: "Thresholds | None" = None  # None: the precision's defaults (compare.DEFAULT_THRESHOLDS)


# precision -> target -> the ONNX kinds made: the graph for CPU runtimes, the one shaped for TensorRT, or both
GRAPH_KINDS: dict[str, dict[str, tuple[str, ...]]] = {
    "fp16": {"cpu": ("fp16",), "tensorrt": ("fp16-trt",), "all": ("fp16", "fp16-trt")},
    "int8": {"cpu": ("int8",), "tensorrt": ("int8-trt",), "all": ("int8", "int8-trt")},
    "fp8": {"cpu": ("fp8",), "tensorrt": ("fp8",), "all": ("fp8",)},  # one FP8 graph: TensorRT's
}


def graph_kinds(precision: str, target: str) -> tuple[str, ...]:
    """The graphs `quantize` makes for a precision and a target (`quantize --target`, `vitexport.quantize`)."""
    return GRAPH_KINDS[precision][target]


def calib_options(calib_data: Path | str | None = None, calib_samples: int | None = None,
                  calib_method: str = "percentile", percentile: float = DEFAULT_PERCENTILE,
                  quantize_attention: bool | None = None, placement: str = "vitexport",
                  smoothquant: float | None = None, min_cos: float | None = None, max_drop: float | None = None,
                  dense_target: float | None = None, weight_bits: int | None = None,
                  exclude_node: tuple[str, ...] | list[str] = (), exclude_block: tuple[int, ...] | list[int] = (),
                  keep_fp32: str | tuple[str, ...] = DEFAULT_KEEP_FP32, check_data: Path | str | None = None,
                  check_labels: tuple[Path, ...] = (), no_check: bool = False) -> CalibOptions:
    """A precision step's options from what a user gave, as `quantize`'s flags name them (the CLI's calibration
    options and `vitexport.quantize` both make them here). keep_fp32: op types, or one comma-separated string."""
    ops = keep_fp32.split(",") if isinstance(keep_fp32, str) else keep_fp32
    if weight_bits is not None:
        weight_bits_here(weight_bits)  # a width this CPU cannot check: said before minutes of calibrating
    return CalibOptions(
        data=None if calib_data is None else Path(calib_data), samples=calib_samples,
        int8=Int8Settings(method=calib_method, percentile=percentile, quantize_attention=quantize_attention,
                          exclude_nodes=list(exclude_node), exclude_blocks=list(exclude_block), placement=placement,
                          smoothquant=smoothquant, min_cos=min_cos, max_drop=max_drop, dense_target=dense_target,
                          weight_bits=weight_bits),
        keep_fp32=tuple(op.strip() for op in ops if op.strip()),
        check=not no_check, check_data=None if check_data is None else Path(check_data),
        check_labels=tuple(check_labels))
