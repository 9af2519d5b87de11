"""What an engine built from an ONNX graph must show: its quantized GEMMs, and its attention sites TensorRT can fuse.

Read from the graph alone (no tensorrt import); vitexport.tensorrt_engine.engine_info checks a built engine against it.

An attention site is Q.K^T -> (Mul/Div) -> (Add) -> Softmax -> .V, the pattern TensorRT's multi-head attention
fusion and NVIDIA ModelOpt's ONNX quantizer match (`modelopt/onnx/quantization/graph_utils.py`
`match_fp8_mha_pattern`): a MatMul of two activations, at most one Mul or Div by a constant, at most one Add of a
bias on the logits (BEiT's relative position bias), a Softmax, and a MatMul that reads the Softmax (through a Q/DQ
pair when the products are quantized). A Cast anywhere between them, as in a graph that keeps Softmax in FP32, is no
site: TensorRT cannot fuse it. A site whose queries and keys come out of a rotary embedding (x * cos + rotate(x) *
sin: the RoPE ViTs) is the same pattern for TensorRT, the rotation elementwise work before Q.K^T; the site says it
is rotary, and biased, so the engine check names what it expected to find fused.

Whether TensorRT fuses a site into one kernel, as its developer guide lists it ("Multi-Head Attention Fusion";
quoted in NVIDIA/TensorRT#2981 and #4167): compute capability 7.5 or later; the two products read FP16, BF16 or
INT8 (FP8 on 8.9 or later); FP16/BF16 head size 16 <= H <= 256 with H % 8 == 0; INT8 head size 16, 32 or 64 and
sequences of at most 512, with Q/DQ before the first product, after Softmax and after the second. TensorRT may
still choose not to fuse on performance grounds, so an engine check that fails on an unfused site names it.
"""

from __future__ import annotations

from dataclasses import dataclass

LINEAR_OPS = ("MatMul", "Gemm", "Conv")
_FLOAT_NAMES = {1: "fp32", 10: "fp16", 16: "bf16"}  # onnx.TensorProto element types of the products' inputs
FP8_TYPES = (17, 18, 19, 20)  # onnx.TensorProto FLOAT8E4M3FN, FLOAT8E4M3FNUZ, FLOAT8E5M2, FLOAT8E5M2FNUZ


def constant_names(graph) -> set[str]:
    """The tensors of a graph known before it runs: its initializers and the outputs of its Constant nodes."""
    return {i.name for i in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}


@dataclass(frozen=True)
class AttentionSite:
    bmm1: str  # the Q.K^T MatMul's node name
    softmax: str
    bmm2: str  # the Softmax.V MatMul's node name
    dtype: str  # what the products read: 'fp32' | 'fp16' | 'bf16' | 'int8' | 'fp8' | 'unknown'
    head_size: int | None  # V's last axis (None: symbolic or not inferred)
    seq_len: int | None  # the keys' axis (None: symbolic, e.g. a dynamic image size)
    bias: str | None = None  # the Add of a bias on the logits (relative position bias), None without
    rotary: bool = False  # its queries and keys are rotated by a RoPE table

    @property
    def nodes(self) -> tuple[str, str, str]:
        return self.bmm1, self.softmax, self.bmm2

    def describe(self) -> str:
        """'blocks.3.attn/MatMul (RoPE, relative position bias): FP16, head size 64, 197 tokens'."""
        traits = ", ".join(t for t, on in (("RoPE", self.rotary), ("relative position bias", self.bias)) if on)
        return (f"{self.bmm1}{f' ({traits})' if traits else ''}: {self.dtype.upper()}, head size "
                f"{self.head_size or '?'}, {self.seq_len or '?'} tokens")


def quantized_gemms(model) -> list[str]:
    """The names of the GEMM nodes of a Q/DQ graph that read a DequantizeLinear output (the INT8 ones), in order."""
    dq = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return [n.name for n in model.graph.node if n.op_type in LINEAR_OPS and any(i in dq for i in n.input[:2])]


def why_not_fused(site: AttentionSite) -> str | None:
    """Why TensorRT cannot fuse this site into its multi-head attention kernel, or None when it can."""
    h = site.head_size
    if site.dtype in ("fp16", "bf16", "fp8"):
        if h is None or not (16 <= h <= 256 and h % 8 == 0):
            return f"head size {h or '?'} is not a multiple of 8 from 16 to 256"
        return None
    if site.dtype == "int8":
        if h not in (16, 32, 64):
            return f"INT8 head size {h or '?'} is not 16, 32 or 64"
        if site.seq_len is None or site.seq_len > 512:
            return f"INT8 sequence length {site.seq_len or '?'} is not at most 512"
        return None
    return f"its products read {site.dtype}, not FP16, BF16, INT8 or FP8"


class _Graph:
    """A graph's tensors by name: who makes each, who reads it, its type; what the site search asks of them."""

    def __init__(self, graph) -> None:
        self.producer = {o: n for n in graph.node for o in n.output}
        self.consumers: dict[str, list] = {}
        for n in graph.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.consts = constant_names(graph)
        self.types = {v.name: v.type.tensor_type for v in [*graph.value_info, *graph.input, *graph.output]}
        self.inits = {i.name: i for i in graph.initializer}

    def through_dq(self, name: str) -> tuple[str, object | None]:
        """(the tensor before a Q -> DQ pair, the DQ node), or (name, None) when no DQ makes it."""
        dq = self.producer.get(name)
        if dq is not None and dq.op_type == "DequantizeLinear":
            q = self.producer.get(dq.input[0])
            return (q.input[0] if q is not None and q.op_type == "QuantizeLinear" else dq.input[0]), dq
        return name, None

    def dtype_of(self, name: str) -> str:
        src, dq = self.through_dq(name)
        if dq is not None:
            zp = self.inits.get(dq.input[2]) if len(dq.input) > 2 else None
            return "fp8" if zp is not None and zp.data_type in FP8_TYPES else "int8"
        t = self.types.get(name)
        return _FLOAT_NAMES.get(t.elem_type, "unknown") if t is not None else "unknown"

    def dim(self, name: str, axis: int) -> int | None:
        t = self.types.get(name)
        if t is None or not t.HasField("shape") or len(t.shape.dim) < abs(axis):
            return None
        d = t.shape.dim[axis]
        return d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None

    def logits_of(self, node):
        """The MatMul a Softmax's input comes from, through at most one constant Mul/Div (None: no site)."""
        if node is not None and node.op_type in ("Mul", "Div") and any(i in self.consts for i in node.input):
            node = self.producer.get(next(i for i in node.input if i not in self.consts))
        return node if node is not None and node.op_type == "MatMul" else None

    def rotated(self, name: str, depth: int = 6) -> bool:
        """The tensor comes out of x * cos + rotate(x) * sin (an Add of two Muls), through moves and casts."""
        node = self.producer.get(self.through_dq(name)[0])
        for _ in range(depth):
            if node is None:
                return False
            if node.op_type == "Add" and all(getattr(self.producer.get(i), "op_type", "") == "Mul"
                                             for i in node.input):
                return True
            if node.op_type == "Concat":  # the prefix tokens, unrotated, before the rotated patch tokens
                return any(self.rotated(i, depth - 1) for i in node.input)
            if node.op_type not in ("Transpose", "Reshape", "Mul", "Div", "Cast", "Squeeze", "Unsqueeze"):
                return False
            node = self.producer.get(node.input[0])
        return False

    def site_at(self, soft) -> AttentionSite | None:
        """The attention site whose Softmax is `soft`, or None when the pattern does not hold around it."""
        before, bias = self.producer.get(soft.input[0]), None
        if before is not None and before.op_type == "Add":  # logits + bias: the side that leads to Q.K^T
            side = next((mm for i in before.input if (mm := self.logits_of(self.producer.get(i))) is not None), None)
            before, bias = side, (before.name if side is not None else None)
        else:
            before = self.logits_of(before)
        if before is None or any(self.through_dq(i)[0] in self.consts for i in before.input):
            return None
        after = self.consumers.get(soft.output[0], [])
        if len(after) == 1 and after[0].op_type == "QuantizeLinear":  # softmax -> Q -> DQ -> MatMul
            dqs = self.consumers.get(after[0].output[0], [])
            after = self.consumers.get(dqs[0].output[0], []) if len(dqs) == 1 else []
        if len(after) != 1 or after[0].op_type != "MatMul" or self.through_dq(after[0].input[1])[0] in self.consts:
            return None
        bmm2 = after[0]
        return AttentionSite(before.name, soft.name, bmm2.name, self.dtype_of(before.input[0]),
                             self.dim(bmm2.input[1], -1), self.dim(bmm2.input[1], -2), bias,
                             self.rotated(before.input[0]) and self.rotated(before.input[1]))


def attention_sites(model) -> list[AttentionSite]:
    """Every Q.K^T -> Softmax -> .V site of an ONNX ModelProto (shapes inferred here when the graph has none)."""
    import onnx

    graph = model.graph
    if not graph.value_info:
        graph = onnx.shape_inference.infer_shapes(model).graph
    g = _Graph(graph)
    return [site for soft in graph.node if soft.op_type == "Softmax" and (site := g.site_at(soft)) is not None]


def plan_expectations(onnx_path) -> tuple[list[str], list[AttentionSite]]:
    """What an engine built from this ONNX must show: (the GEMMs its Q/DQ quantize, the attention sites TensorRT can
    fuse), read without the graph's external data."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    return quantized_gemms(model), [s for s in attention_sites(model) if why_not_fused(s) is None]
