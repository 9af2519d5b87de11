"""What a detection head is, as data: `DetectionConfig` holds a DETR-style detector's options over a ViT backbone
(RF-DETR: a windowed DINOv2, its C2f projector, the two-stage query selection and the deformable decoder), checked
when made. No torch here.

A detector is a backbone vitexport already builds (its `ViTConfig`) with this on top; the ViTConfig carries it in its
`dense` field (the field every head over a backbone uses), so a manifest records the whole model as one config.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ...errors import VitexportError
from .config import known_fields

DETECTION_HEADS = ("rf_detr",)  # the decoders of heads/detr.py
PROJECTOR_ACTS = ("silu", "relu", "gelu")  # transformers' ACT2CLS names the projector and decoder take
DECODER_ACTS = ("relu", "silu", "gelu")
SAMPLINGS = ("grid_sample", "gather")  # layers.deformable: ONNX GridSample, or gathers (equal; docs/DETECTION.md)
SCORES = ("sigmoid",)  # how a class logit becomes a score: one sigmoid a class, no background column
# the judged output first: each query's class logits and its box in one tensor (B, Q, labels + 4), what every
# backend's detections are post-processed from (parity.detections); then transformers' two: logits (B, Q, labels),
# pred_boxes (B, Q, 4) cx, cy, w, h of the input, normalised
DETECTION_OUTPUTS = ("query_outputs", "logits", "pred_boxes")
MAX_COUNT = 16384


def _count(where: str, name: str, v: Any, low: int = 1) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= MAX_COUNT:
        raise VitexportError(f"{where}'s {name} {v!r} is not a whole number from {low} to {MAX_COUNT}.")


@dataclass
class DetectionConfig:
    """A DETR-style detector over a ViT's intermediate tokens (transformers' RfDetrConfig)."""

    task: str = "detection"
    head: str = "rf_detr"  # DETECTION_HEADS
    # which tokens the projector reads: hidden-state indices (k: block k's output), through the backbone's final norm
    taps: tuple[int, ...] = (3, 6, 9, 12)
    tap_norm: bool = True
    # the backbone's windows: num_windows a side (1: none), each with its own copy of the class token; the blocks in
    # window_blocks attend within their window, the others over every window's tokens (the copies included)
    num_windows: int = 1
    window_blocks: tuple[int, ...] = ()
    d_model: int = 256  # the projector's output and the decoder's width
    hidden_expansion: float = 0.5  # the C2f projector's hidden width: d_model x this
    c2f_blocks: int = 3  # its bottlenecks (two 3x3 conv-LayerNorm-act each)
    projector_act: str = "silu"  # PROJECTOR_ACTS
    norm_eps: float = 1e-5  # the projector's convolutions' channel LayerNorms (layer_norm_eps)
    decoder_layers: int = 3
    self_attn_heads: int = 8
    cross_attn_heads: int = 16
    n_points: int = 4  # sampled points per head and level
    ffn_dim: int = 2048
    decoder_act: str = "relu"  # DECODER_ACTS
    num_queries: int = 300
    num_labels: int = 91  # one logit a class; RF-DETR's label index is COCO's category id (0 unused)
    sampling: str = "grid_sample"  # SAMPLINGS: how the deformable attention reads its points
    score: str = "sigmoid"  # SCORES
    top_k: int = 300  # the post-processing's detections an image: the best over queries x classes
    threshold: float = 0.5  # the library's default score threshold (predict's default)

    def __post_init__(self) -> None:
        where = "The detection head"
        self.taps = tuple(self.taps)
        self.window_blocks = tuple(self.window_blocks)
        for name, table in (("head", DETECTION_HEADS), ("projector_act", PROJECTOR_ACTS),
                            ("decoder_act", DECODER_ACTS), ("sampling", SAMPLINGS), ("score", SCORES)):
            if getattr(self, name) not in table:
                raise VitexportError(f"{where}'s {name} {getattr(self, name)!r} is not one vitexport builds; it "
                                     f"builds {', '.join(repr(t) for t in table)}.")
        if self.task != "detection":
            raise VitexportError(f"{where}'s task {self.task!r} is not 'detection'.")
        for name in ("d_model", "c2f_blocks", "decoder_layers", "self_attn_heads", "cross_attn_heads", "n_points",
                     "ffn_dim", "num_queries", "num_labels", "num_windows", "top_k"):
            _count(where, name, getattr(self, name), 0 if name == "c2f_blocks" else 1)
        if not self.taps or any(not isinstance(t, int) or isinstance(t, bool) or t < 1 for t in self.taps) or \
                list(self.taps) != sorted(set(self.taps)):
            raise VitexportError(f"{where}'s taps {list(self.taps)} are not distinct increasing block outputs.")
        if any(not isinstance(b, int) or isinstance(b, bool) or b < 0 for b in self.window_blocks):
            raise VitexportError(f"{where}'s window_blocks {list(self.window_blocks)} are not block indices.")
        for name in ("self_attn_heads", "cross_attn_heads"):
            if self.d_model % getattr(self, name):
                raise VitexportError(f"{where}'s d_model {self.d_model} does not divide by its {name} "
                                     f"{getattr(self, name)}.")
        hidden = self.d_model * self.hidden_expansion
        if not isinstance(self.hidden_expansion, (int, float)) or isinstance(self.hidden_expansion, bool) or \
                hidden < 1 or hidden != int(hidden):
            raise VitexportError(f"{where}'s hidden_expansion {self.hidden_expansion!r} does not give a whole "
                                 f"hidden width of its d_model {self.d_model}.")
        if self.d_model % 2:
            raise VitexportError(f"{where}'s d_model {self.d_model} is odd: its queries' sine embedding is half of it "
                                 f"a coordinate.")
        for name in ("norm_eps",):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < 1:
                raise VitexportError(f"{where}'s {name} {v!r} is not a LayerNorm epsilon between 0 and 1.")
        if not isinstance(self.threshold, (int, float)) or isinstance(self.threshold, bool) or \
                not 0 <= self.threshold <= 1:
            raise VitexportError(f"{where}'s threshold {self.threshold!r} is not a score from 0 to 1.")

    @property
    def hidden(self) -> int:
        """The C2f projector's hidden width."""
        return int(self.d_model * self.hidden_expansion)

    def check_backbone(self, cfg: Any) -> None:
        """What the head needs of its backbone (a ViTConfig): a class token (copied into each window), no classifier,
        the layers it taps, and a square patch grid that divides into its windows, at one size (transformers' own
        model scrambles the tokens of a non-square grid, and a dynamic grid could not be checked to divide)."""
        if not cfg.class_token:
            raise VitexportError("RF-DETR's backbone copies its class token into each window: it needs "
                                 "class_token=True.")
        if cfg.num_classes:
            raise VitexportError("A detector's backbone has no classification head (num_classes 0).")
        if cfg.reg_tokens:
            raise VitexportError("RF-DETR's windowed backbone has no register tokens.")
        if max(self.taps) > cfg.depth or any(b >= cfg.depth for b in self.window_blocks):
            raise VitexportError(f"The detection head taps or windows a block past the last of its {cfg.depth}-block "
                                 f"backbone.")
        h, w = cfg.grid_size
        nw = self.num_windows
        if cfg.dynamic_img_size:
            raise VitexportError("RF-DETR runs at one square size: export it with a fixed --img-size (a multiple of "
                                 f"the patch size x {nw} windows a side).")
        if h != w or h % nw:
            raise VitexportError(f"RF-DETR takes a square patch grid that divides into its {nw} windows a side; "
                                 f"{cfg.img_size[0]}x{cfg.img_size[1]} gives {h}x{w} patches: use a square --img-size "
                                 f"that is a multiple of {cfg.patch_size[0] * nw}.")
        if h * w < self.num_queries:
            raise VitexportError(f"RF-DETR picks its {self.num_queries} queries among the {h * w} positions of its "
                                 f"{h}x{w} feature map: use a larger --img-size.")

    @property
    def output(self) -> str:
        """The output every check judges: the queries' logits and boxes together."""
        return DETECTION_OUTPUTS[0]

    @property
    def outputs(self) -> tuple[str, ...]:
        return DETECTION_OUTPUTS

    def output_dims(self, grid: tuple[int, int], patch: tuple[int, int], dynamic: bool = False,
                    name: str | None = None) -> list[Any]:
        """An output's axes after the batch: queries x (labels + 4), queries x labels, or queries x 4."""
        return [self.num_queries, {"logits": self.num_labels, "pred_boxes": 4}.get(name or "", self.num_labels + 4)]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DetectionConfig":
        return cls(**known_fields(cls, d, "The detection head's config"))


__all__ = ["DECODER_ACTS", "DETECTION_HEADS", "DETECTION_OUTPUTS", "DetectionConfig", "PROJECTOR_ACTS", "SAMPLINGS"]
