"""What precision each layer of a built engine runs in, read from TensorRT's engine inspector. No tensorrt import.

The runner gets the text with `engine.create_engine_inspector().get_engine_information(LayerInformationFormat.JSON)`
(plans are built with `ProfilingVerbosity.DETAILED`, else the inspector lists layer names only). This module turns
it into `LayerFact`s. The JSON differs between versions, so every field is optional here:

- TensorRT 10.x: `{"Layers": [...], "Bindings": ["input", ...]}`; each layer has `Name`, `LayerType` (e.g. `gemm`,
  `kgen`, `CaskConvolution`, `Reformat`), optional `ParameterType`, `TacticName`, and `Inputs`/`Outputs` whose
  tensors carry `Dimensions` and one `"Format/Datatype"` string: `"Half"`, `"Int8"`, `"Float"` (Myelin layers) or
  `"Row major linear FP16 format"`, `"Thirty-two wide channel vectorized row major Int8 format"` (Cask layers).
  Shapes seen in NVIDIA/TensorRT issues #3737, #4020, #4397, samples/sampleEditableTimingCache/README.md and the
  trt-engine-explorer parser (tools/experimental/trt-engine-explorer/trex, release/10.13).
- TensorRT 11.x: `Bindings` is replaced by `"I/O Tensors"` (objects with `Name`, `IOMode`, `DataType`, ...) and the
  `Format/Datatype` field is split (TensorRT 11.0 migration guide, "Migrating IEngineInspector Usage from
  TensorRT 10.x to 11.x"); tensors carry `Format` and `DataType` (spelt `Datatype` in the TensorRT 11.1 repo's
  `.agents/skills/trt-perf-analysis` schema). Both spellings are read. Not yet seen in a real 11.x engine here.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ..errors import VitexportError

# narrowest first: the precision of a GEMM is that of its narrowest non-scalar operand (scales, biases and
# alpha/beta scalars are wider and do not say what the multiply ran in)
PRECISION_ORDER = ("int4", "fp4", "int8", "fp8", "fp16", "bf16", "fp32", "fp64", "int32", "int64", "uint8", "bool")

_TYPE_WORDS = {
    "int8": "int8", "i8": "int8", "fp8": "fp8", "e4m3": "fp8", "float8": "fp8", "float8e4m3fn": "fp8",
    "int4": "int4", "fp4": "fp4", "fp4e2m1": "fp4",
    "fp16": "fp16", "half": "fp16", "float16": "fp16", "bf16": "bf16", "bfloat16": "bf16",
    "fp32": "fp32", "float": "fp32", "float32": "fp32", "tf32": "fp32", "double": "fp64", "fp64": "fp64",
    "int32": "int32", "int64": "int64", "uint8": "uint8", "bool": "bool",
}
_TYPE_KEYS = ("DataType", "Datatype", "Format/Datatype", "Format/DataType", "Format")
# tactic names of GEMM kernels, e.g. sm80_xmma_gemm_f16f16_f16f16_f16_nn_n_..., ..._i8i8_i8i32_f32_...
_TACTIC_HINTS = (("int8", re.compile(r"i8i8|int8|imma", re.I)), ("fp8", re.compile(r"e4m3|fp8", re.I)),
                 ("bf16", re.compile(r"bf16", re.I)), ("fp16", re.compile(r"f16f16|fp16|h16|hmma|h884|h1688", re.I)),
                 ("fp32", re.compile(r"tf32|f32f32|sgemm|fp32", re.I)))
_GEMM_WORDS = ("gemm", "matrixmultiply", "matmul", "convolution", "conv", "fullyconnected")
_ATTENTION_WORDS = ("mha", "attention")
# a fused attention kernel by its tactic or Myelin's layer name: _gemm_mha_v2_myl3_6, fmha_v2_..., flash_attention;
# not "[MATRIX_MULTIPLY]_[scaled_dot_product_attention]_..." (an unfused product, NVIDIA/TensorRT#3665)
_FUSED_MHA = re.compile(r"fmha|_mha|mha_v\d|flash_attention", re.I)
_FUSED_GEMM = re.compile(r"gemm", re.I)
_ONNX_LAYER = re.compile(r"\[ONNX Layer: ([^\]]*)\]")  # TensorRT 10 joins several with \x1f
_FUSED_GEMM_NAME = re.compile(r"^__myl_(Fc|MatMul|Gemm)", re.I)


@dataclass(frozen=True)
class LayerFact:
    name: str
    kind: str  # 'gemm' (MatMul/Conv/FC), 'attention' (fused MHA), 'opaque' (a Myelin node without detail), 'other'
    precision: str  # 'int8' | 'fp8' | 'fp16' | 'bf16' | 'fp32' | ... | 'unknown'
    layer_type: str
    input_types: tuple[str, ...]
    output_types: tuple[str, ...]
    tactic: str
    onnx_nodes: tuple[str, ...] = ()  # the ONNX nodes it computes, from its Metadata ("[ONNX Layer: name]", one each)


@dataclass(frozen=True)
class EngineLayers:
    layout: str  # '10.x' (Bindings), '11.x' (I/O Tensors), 'unknown'
    layers: tuple[LayerFact, ...]

    def of_kind(self, *kinds: str) -> list[LayerFact]:
        return [f for f in self.layers if f.kind in kinds]

    def summary(self) -> dict[str, Any]:
        """{'layout', 'layers', 'gemm': {precision: count}, 'attention': {...}, 'opaque': n} for reports."""
        out: dict[str, Any] = {"layout": self.layout, "layers": len(self.layers)}
        for kind in ("gemm", "attention"):
            out[kind] = dict(Counter(f.precision for f in self.of_kind(kind)))
        out["opaque"] = len(self.of_kind("opaque"))
        return out


def dtype_of(text: Any) -> str | None:
    """'Row major linear FP16 format' -> 'fp16', 'Half' -> 'fp16', 'Int8' -> 'int8'; None when no type word."""
    if not isinstance(text, str):
        return None
    for word in re.split(r"[^0-9A-Za-z]+", text.lower()):
        if word in _TYPE_WORDS:
            return _TYPE_WORDS[word]
    return None


def _tensor_type(desc: Any) -> str | None:
    if isinstance(desc, str):
        return dtype_of(desc)
    if not isinstance(desc, dict):
        return None
    for key in _TYPE_KEYS:
        t = dtype_of(desc.get(key))
        if t is not None:
            return t
    return None


def _is_scalar(desc: Any) -> bool:
    dims = desc.get("Dimensions") if isinstance(desc, dict) else None
    if not isinstance(dims, list):
        return False
    n = 1
    for d in dims:
        if isinstance(d, (int, float)) and not isinstance(d, bool):
            n *= max(int(d), 0) if d >= 0 else 2  # a symbolic (-1) axis: not a scalar
    return n <= 1


def _tensors(layer: dict[str, Any], key: str) -> list[Any]:
    value = layer.get(key)
    return value if isinstance(value, list) else []


def _narrowest(types: Iterable[str]) -> str | None:
    present = set(types)
    ranked = [t for t in PRECISION_ORDER if t in present]
    return ranked[0] if ranked else None


def _kind(layer: dict[str, Any], name: str, tactic: str) -> str:
    words = " ".join(str(layer.get(k, "")) for k in ("LayerType", "ParameterType")).lower()
    if "myelin" in words or name.startswith("{ForeignNode"):
        return "opaque"
    if any(w in words for w in _ATTENTION_WORDS) or _FUSED_MHA.search(tactic) or _FUSED_MHA.search(name):
        return "attention"
    if any(w in words for w in _GEMM_WORDS) or (not words.strip() and "gemm" in tactic.lower()):
        return "gemm"
    # Myelin fuses a GEMM with its epilogue (bias, GELU) into one `fusion` layer: its tactic or name says GEMM
    # (NVIDIA/TensorRT#4397: __myl_Fc_myl0_69, sm80_xmma_gemm_f16f16_..._by_fusion_tactic)
    if "fusion" in words and (_FUSED_GEMM.search(tactic) or _FUSED_GEMM_NAME.search(name)):
        return "gemm"
    return "other"


def layer_fact(layer: dict[str, Any]) -> LayerFact:
    name = str(layer.get("Name", ""))
    tactic = str(layer.get("TacticName") or layer.get("Tactic") or layer.get("TacticValue") or "")
    kind = _kind(layer, name, tactic)
    inputs = _tensors(layer, "Inputs")
    ins = tuple(t or "unknown" for t in map(_tensor_type, inputs))
    outs = tuple(t or "unknown" for t in map(_tensor_type, _tensors(layer, "Outputs")))
    operands = [d for d in inputs + _tensors(layer, "Constants") if not _is_scalar(d)]
    precision = _narrowest(t for t in map(_tensor_type, operands) if t is not None)
    if precision is None and kind in ("gemm", "attention"):
        precision = next((p for p, rx in _TACTIC_HINTS if rx.search(tactic)), None)
    if precision is None:
        precision = _narrowest(t for t in outs if t != "unknown")
    layer_type = str(layer.get("LayerType") or layer.get("ParameterType") or "")
    nodes = tuple(n.strip() for n in _ONNX_LAYER.findall(str(layer.get("Metadata") or "")) if n.strip())
    return LayerFact(name, kind, precision or "unknown", layer_type, ins, outs, tactic, nodes)


def parse_engine_information(info: str | dict[str, Any] | list[Any]) -> EngineLayers:
    """The inspector's JSON (text or parsed) -> per-layer facts; one sentence when it cannot say anything."""
    data: Any = info
    if isinstance(info, str):
        try:
            data = json.loads(info)
        except json.JSONDecodeError as e:
            raise VitexportError(f"The engine inspector's output is not JSON ({e.msg} at {e.pos}).") from None
    layout = "unknown"
    if isinstance(data, dict):
        layout = "11.x" if "I/O Tensors" in data else "10.x" if "Bindings" in data else "unknown"
        data = next((data[k] for k in ("Layers", "layers") if isinstance(data.get(k), list)), None)
    if not isinstance(data, list) or not data:
        raise VitexportError("The engine inspector listed no layers.")
    if not any(isinstance(layer, dict) for layer in data):
        raise VitexportError("The engine inspector listed layer names only: the plan was built without "
                             "ProfilingVerbosity.DETAILED; rebuild it with this vitexport.")
    return EngineLayers(layout, tuple(layer_fact(layer) for layer in data if isinstance(layer, dict)))


def precision_problems(engine: EngineLayers, expected: str, forbidden: Sequence[str] = ("fp32", "fp64")) -> list[str]:
    """Why the GEMMs of an engine built for `expected` ('int8' | 'fp16') do not prove it; empty when they do.

    Expected: at least one GEMM in that precision; none in a forbidden one; no layer hidden in an opaque node.
    """
    gemms = engine.of_kind("gemm")
    problems = []
    if not gemms:
        problems.append(f"no GEMM layer found among {len(engine.layers)} layers")
    elif not any(f.precision == expected for f in gemms):
        seen = dict(Counter(f.precision for f in gemms))
        problems.append(f"no {expected} GEMM (GEMM precisions: {seen})")
    for f in engine.of_kind("gemm", "attention"):
        if f.precision in forbidden:
            problems.append(f"{f.kind} {f.name!r} runs in {f.precision} (inputs {list(f.input_types)}, "
                            f"tactic {f.tactic or '?'})")
    opaque = engine.of_kind("opaque")
    if opaque:
        problems.append(f"{len(opaque)} layer(s) are opaque Myelin nodes, e.g. {opaque[0].name!r}")
    return problems


def selection_problems(engine: EngineLayers, nodes: Sequence[str], expected: str) -> list[str]:
    """Why the quantized GEMMs of the graph (`nodes`, its ONNX node names) did not all run in `expected`; empty when
    each is computed by a GEMM or attention layer of that precision, found through the layers' Metadata.

    A partial fallback (one quantized GEMM left in FP16) fails here, where "at least one INT8 GEMM" passes.
    """
    where = _by_onnx_node(engine)
    if nodes and not where:
        return [_no_metadata(len(nodes), "quantized GEMMs")]
    problems = []
    for n in nodes:
        layers = [f for f in where.get(n, []) if f.kind in ("gemm", "attention")]
        if not where.get(n):
            problems.append(f"quantized GEMM {n!r} is in no layer's metadata")
        elif not layers:
            other = where[n][0]
            problems.append(f"quantized GEMM {n!r} runs in {other.kind} layer {other.name!r} "
                            f"({other.layer_type or '?'}), not in a GEMM")
        elif not any(f.precision == expected for f in layers):
            f = layers[0]
            problems.append(f"quantized GEMM {n!r} runs in {f.precision} in {f.name!r} (tactic {f.tactic or '?'})")
    return problems


def attention_problems(engine: EngineLayers, sites: Sequence[Any]) -> list[str]:
    """Why the attention sites TensorRT can fuse (tensorrt_engine.fusion.AttentionSite: bmm1, softmax, bmm2) were
    not each computed by one fused attention layer; empty when they were. Q.K^T and .V in separate GEMM layers, with
    a Softmax between, is the unfused attention that costs the FP16 and INT8 engines their speed."""
    where = _by_onnx_node(engine)
    if sites and not where:
        return [_no_metadata(len(sites), "attention sites")]
    problems = []
    for site in sites:
        fused = [f for f in where.get(site.bmm1, []) if f.kind == "attention" and site.bmm2 in f.onnx_nodes]
        if fused:
            continue
        ran = [f"{f.kind} {f.name!r}" for n in (site.bmm1, site.bmm2) for f in where.get(n, [])[:1]]
        traits = ", ".join(t for t, on in (("RoPE", getattr(site, "rotary", False)),
                                           ("relative position bias", getattr(site, "bias", None))) if on)
        problems.append(f"attention {site.bmm1!r} -> {site.bmm2!r}{f' ({traits})' if traits else ''} is not fused "
                        f"into one attention layer ({'; '.join(ran) if ran else 'in no layer metadata'})")
    return problems


def engine_problems(engine: EngineLayers, expected: str, quantized: Sequence[str] = (),
                    sites: Sequence[Any] = ()) -> list[str]:
    """Every reason an engine built for `expected` does not run as its graph asks: no FP32 GEMM or attention,
    each of the graph's `quantized` GEMMs in `expected` (INT8 or FP8), and each fusable attention site fused."""
    problems = precision_problems(engine, expected)
    if quantized:
        problems += selection_problems(engine, quantized, expected)
    return problems + attention_problems(engine, sites)


def _no_metadata(count: int, what: str) -> str:
    return (f"no layer names its ONNX nodes (Metadata), so the {count} {what} cannot be found; the plan must be "
            f"built with ProfilingVerbosity.DETAILED")


def _by_onnx_node(engine: EngineLayers) -> dict[str, list[LayerFact]]:
    where: dict[str, list[LayerFact]] = {}
    for f in engine.layers:
        for n in f.onnx_nodes:
            where.setdefault(n, []).append(f)
    return where
