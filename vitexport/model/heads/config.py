"""What a dense head is, as data: `PromptDecoderConfig` holds SAM's prompt encoder and mask decoder (`sam_decoder`);
`DenseConfig` holds the options of the heads in `heads/` (DPT's reassemble,
fusion and depth head as Depth Anything and DPT configure them, DPT's segmentation head), checked when made. No
torch here.

A dense model is a backbone vitexport already builds (its `ViTConfig`) with one of these on top; the ViTConfig
carries it in its `dense` field, so a manifest records the whole model as one config.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from ...errors import VitexportError

# what the head predicts: 'depth' (one map, `predicted_depth`), 'segmentation' (a map of class scores, `logits`)
TASKS = ("depth", "segmentation")
OUTPUT_NAMES = {"depth": "predicted_depth", "segmentation": "logits"}  # each task's output, as transformers names it
READOUTS = ("ignore", "add", "project")  # what DPT does with the class token of each tap
READOUT_ACTS = ("gelu", "gelu_tanh", "quick_gelu", "silu")  # the 'project' readout's activation (model.config's)
DEPTH_TYPES = ("relative", "metric")  # the last activation: ReLU, or a sigmoid scaled by max_depth
# how each fusion block upsamples: 'next' to the next (larger) map's size, x2 after the last (Depth Anything); 'x2'
# always (DPT)
FUSION_UPSAMPLES = ("next", "x2")
# the depth head's upsampling: to the input's patch grid x patch (Depth Anything), or x2 of the fused map (DPT)
HEAD_UPSAMPLES = ("patch", "x2")
MAX_CHANNELS = 16384
HEADS = ("dpt", "eomt")  # DPT's reassemble, fusion and head over taps; EoMT's queries in the last blocks
# EoMT's outputs: the judged semantic map (vitexport's, folded into the graph) and transformers' two
EOMT_OUTPUTS = ("semantic_probs", "class_queries_logits", "masks_queries_logits")
ACTS = ("gelu", "relu")  # SAM's prompt encoder's and mask decoder's activations


@dataclass
class DenseConfig:
    """A DPT-style dense head over a ViT's intermediate tokens (transformers' DepthAnythingConfig and DPTConfig)."""

    task: str = "depth"  # TASKS
    head: str = "dpt"  # HEADS
    # which tokens the neck reads: indices of the backbone's hidden states (0 the embedding output, k block k's)
    taps: tuple[int, ...] = (9, 10, 11, 12)
    tap_norm: bool = True  # the backbone's final norm on every tap (transformers' Dinov2Backbone; DPT's ViT: off)
    readout: str = "ignore"  # READOUTS
    readout_act: str = "gelu"  # READOUT_ACTS: after the 'project' readout's Linear (DPT's hidden_act); EoMT's head's
    # the neck lays each tap's N tokens out as a sqrt(N) x sqrt(N) grid whatever the input's shape (DPT's own ViT):
    # square inputs only, at one size
    square_grid: bool = False
    reassemble_factors: tuple[float, ...] = (4, 2, 1, 0.5)  # per tap: >1 transposed conv up, 1 none, <1 conv down
    neck_hidden_sizes: tuple[int, ...] = (48, 96, 192, 384)  # per tap: channels after the 1x1 projection
    fusion_hidden_size: int = 64
    fusion_upsample: str = "next"  # FUSION_UPSAMPLES
    fusion_batch_norm: bool = False  # BatchNorm in the fusion's residual units (DPT's use_batch_norm_in_fusion...)
    fusion_bias: bool = True  # biases of the residual units' convolutions
    head_in_index: int = -1  # which fused map the head reads
    head_hidden_size: int = 32
    head_upsample: str = "patch"  # HEAD_UPSAMPLES
    head_projection: bool = False  # DPT's add_projection: a 3x3 conv + ReLU before the head (256 channels)
    num_labels: int = 0  # segmentation: the classes scored at each pixel
    depth_type: str = "relative"  # DEPTH_TYPES
    max_depth: float = 1.0  # the output's scale (metric depth: its range in metres)
    # EoMT: its queries, the blocks they join (the backbone's last query_blocks), the x2 upsamplings of the patch
    # tokens the masks are read at, and the patch grid it runs at (transformers' EoMT takes its image_size alone)
    num_queries: int = 0
    query_blocks: int = 0
    upscale_blocks: int = 0
    grid: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        self.taps = tuple(self.taps)
        self.reassemble_factors = tuple(self.reassemble_factors)
        self.neck_hidden_sizes = tuple(self.neck_hidden_sizes)
        self.grid = tuple(self.grid) if self.grid is not None else None  # type: ignore[assignment]
        for name, table in (("task", TASKS), ("head", HEADS), ("readout", READOUTS), ("readout_act", READOUT_ACTS),
                            ("depth_type", DEPTH_TYPES),
                            ("fusion_upsample", FUSION_UPSAMPLES), ("head_upsample", HEAD_UPSAMPLES)):
            if getattr(self, name) not in table:
                raise VitexportError(f"The dense head's {name} {getattr(self, name)!r} is not one vitexport builds; "
                                     f"it builds {', '.join(repr(t) for t in table)}.")
        n = len(self.taps)
        if not n or len(self.reassemble_factors) != n or len(self.neck_hidden_sizes) != n:
            raise VitexportError(f"The dense head taps {n} layers but has {len(self.reassemble_factors)} reassemble "
                                 f"factors and {len(self.neck_hidden_sizes)} neck sizes: it needs one of each a tap.")
        if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in self.taps) or \
                len(set(self.taps)) != n or list(self.taps) != sorted(self.taps):
            raise VitexportError(f"The dense head's taps {list(self.taps)} are not distinct increasing layer indices.")
        for f in self.reassemble_factors:
            if not (f == 1 or (f > 1 and f == int(f)) or (0 < f < 1 and (1 / f) == int(1 / f))):
                raise VitexportError(f"The dense head's reassemble factor {f} is not 1, a whole upsampling factor, "
                                     f"or 1/k.")
        for c in (*self.neck_hidden_sizes, self.fusion_hidden_size, self.head_hidden_size):
            if not isinstance(c, int) or isinstance(c, bool) or not 0 < c <= MAX_CHANNELS:
                raise VitexportError(f"The dense head's channel count {c!r} is not 1..{MAX_CHANNELS}.")
        if self.fusion_hidden_size < 2:
            raise VitexportError("The dense head's fusion_hidden_size must be at least 2 (the head halves it).")
        if not -n <= self.head_in_index < n:
            raise VitexportError(f"The dense head's head_in_index {self.head_in_index} is not one of its {n} maps.")
        if self.head_projection and self.fusion_hidden_size != 256:
            raise VitexportError("DPT's head projection (add_projection) is 256 channels wide: it needs "
                                 "fusion_hidden_size 256.")
        if not 0 < float(self.max_depth) < 1e6:
            raise VitexportError(f"The dense head's max_depth {self.max_depth!r} is not a positive depth.")
        self._check_task()

    def _check_task(self) -> None:
        if self.head == "eomt":
            self._check_eomt()
        if self.task == "depth":
            return
        if not isinstance(self.num_labels, int) or isinstance(self.num_labels, bool) or \
                not 0 < self.num_labels <= MAX_CHANNELS:
            raise VitexportError(f"A segmentation head scores 1..{MAX_CHANNELS} labels, not {self.num_labels!r}.")
        if self.head == "dpt" and (self.head_upsample != "x2" or self.head_projection):
            raise VitexportError("DPT's segmentation head upsamples x2 and has no projection (head_upsample 'x2', "
                                 "head_projection false).")

    def _check_eomt(self) -> None:
        if self.task != "segmentation":
            raise VitexportError("EoMT's head segments: its task is 'segmentation'.")
        for name in ("num_queries", "query_blocks", "upscale_blocks"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not (0 <= v <= MAX_CHANNELS) or \
                    (v == 0 and name != "upscale_blocks"):
                raise VitexportError(f"EoMT's {name} {v!r} is not a count vitexport builds.")
        if self.grid is None or len(self.grid) != 2 or not all(isinstance(g, int) and g > 0 for g in self.grid):
            raise VitexportError(f"EoMT's patch grid {self.grid!r} is not a size.")

    def check_backbone(self, cfg: Any) -> None:
        """What a dense head needs of its backbone (a ViTConfig): a class token (DPT's readout, EoMT's prefix), no
        classifier, the layers it taps or joins, and the sizes it runs at."""
        if not cfg.class_token:
            raise VitexportError("A dense head reads each tap's class token: its backbone needs class_token=True.")
        if cfg.num_classes:
            raise VitexportError("A dense model has no classification head (num_classes 0).")
        size = "a dynamic size" if cfg.dynamic_img_size else f"{cfg.img_size[0]}x{cfg.img_size[1]}"
        if self.head == "eomt":
            assert self.grid is not None
            if self.query_blocks > cfg.depth:
                raise VitexportError(f"EoMT's queries join {self.query_blocks} blocks of a {cfg.depth}-block backbone.")
            if cfg.dynamic_img_size or cfg.grid_size != self.grid:
                raise VitexportError(f"transformers' EoMT runs at its image_size alone ("
                                     f"{self.grid[0] * cfg.patch_size[0]}x{self.grid[1] * cfg.patch_size[1]}, its "
                                     f"{self.grid[0]}x{self.grid[1]} patch grid), not at {size}; export it at that size.")
            return
        if max(self.taps) > cfg.depth:
            raise VitexportError(f"The dense head taps layer {max(self.taps)} of a {cfg.depth}-block backbone.")
        if self.square_grid and (cfg.dynamic_img_size or cfg.grid_size[0] != cfg.grid_size[1]):
            raise VitexportError(f"DPT's own ViT lays its tokens out as a square grid, so it takes square inputs of "
                                 f"one size, not {size}: export it at a fixed square --img-size.")

    @property
    def output(self) -> str:
        """The output every check judges: the library's own (`predicted_depth`, or `logits` for segmentation); EoMT's
        semantic map (`semantic_probs`, beside transformers' class and mask logits)."""
        return EOMT_OUTPUTS[0] if self.head == "eomt" else OUTPUT_NAMES[self.task]

    @property
    def outputs(self) -> tuple[str, ...]:
        """Every output of the graph, the judged one first."""
        return EOMT_OUTPUTS if self.head == "eomt" else (self.output,)

    def output_size(self, grid: tuple[int, int], patch: tuple[int, int]) -> tuple[int, int]:
        """(H', W') of the output for a patch grid: the grid x patch (Depth Anything), or what DPT's x2 steps make
        of the coarsest reassembled map (32 x ceil(grid / 2) a side for factors 4, 2, 1, 1/2 and the head on the
        last fused map, half that on the one before), for depth and segmentation alike (a segmentation output has
        num_labels channels before these two axes)."""
        if self.head_upsample == "patch":
            return (grid[0] * patch[0], grid[1] * patch[1])

        def side(g: int) -> int:
            sizes = [g * int(f) if f >= 1 else (g - 1) // int(1 / f) + 1 for f in self.reassemble_factors]
            fused = self.head_in_index % len(sizes)  # the map the head reads, in fusion order (coarsest first)
            return sizes[-1] * 2 ** (fused + 2)  # x2 in each fusion layer up to it and in the head

        return (side(grid[0]), side(grid[1]))

    def output_dims(self, grid: tuple[int, int], patch: tuple[int, int], dynamic: bool = False,
                    name: str | None = None) -> list[Any]:
        """The output's axes after the batch, as a manifest records them: [labels,] H', W' (symbolic for a
        dynamic-size export: 'out_height', 'out_width'); EoMT's by name: queries x (labels + 1), queries x mask
        size, labels x mask size."""
        if self.head == "eomt":
            side = 2 ** self.upscale_blocks
            hw_ = [grid[0] * side, grid[1] * side]
            return {"class_queries_logits": [self.num_queries, self.num_labels + 1],
                    "masks_queries_logits": [self.num_queries, *hw_]}.get(name or "", [self.num_labels, *hw_])
        hw: list[Any] = ["out_height", "out_width"] if dynamic else list(self.output_size(grid, patch))
        return ([self.num_labels] if self.task == "segmentation" else []) + hw

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DenseConfig":
        return cls(**known_fields(cls, d, "The dense head's config"))


@dataclass
class PromptDecoderConfig:
    """SAM's prompt encoder and mask decoder; the defaults are SAM ViT-B's (and ViT-L's and ViT-H's) transformers
    config."""

    hidden_size: int = 256  # prompt and decoder width: the image embedding's channels
    image_size: int = 1024  # the image encoder's input side: the frame point coordinates are in
    embedding_size: int = 64  # the image embedding's side (image_size / the encoder's patch size)
    num_pos_feats: int = 128  # random Fourier features, (2, num_pos_feats): their sin and cos are hidden_size wide
    mask_input_channels: int = 16  # the mask embedding's width before its 1x1 conv (a quarter of it after conv1)
    num_point_embeddings: int = 4  # the labels 0..3: background, foreground, box top-left, box bottom-right
    prompt_act: str = "gelu"  # ACTS: the mask embedding's activation
    prompt_norm_eps: float = 1e-6  # the mask embedding's two channels-first LayerNorms
    decoder_layers: int = 2  # two-way transformer layers
    decoder_heads: int = 8  # attention heads (of every attention, the downsampled cross-attentions too)
    decoder_mlp_dim: int = 2048  # the token MLP's hidden width
    decoder_act: str = "relu"  # ACTS: the token MLP's activation (the upscaling's is GELU, the heads' ReLU)
    attention_downsample_rate: int = 2  # the cross-attentions project to hidden_size / this
    num_multimask_outputs: int = 3  # mask tokens besides the single-mask one
    iou_head_depth: int = 3  # Linears of the iou head
    iou_head_hidden_dim: int = 256  # the iou head's hidden width
    decoder_norm_eps: float = 1e-6  # the two-way layers' LayerNorms (not the final one: 1e-5, transformers')

    def __post_init__(self) -> None:
        for name in ("hidden_size", "image_size", "embedding_size", "num_pos_feats", "mask_input_channels",
                     "num_point_embeddings", "decoder_layers", "decoder_heads", "decoder_mlp_dim",
                     "attention_downsample_rate", "num_multimask_outputs", "iou_head_depth", "iou_head_hidden_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise VitexportError(f"The prompt decoder's {name} {v!r} is not a positive whole number.")
        for name in ("prompt_act", "decoder_act"):
            if getattr(self, name) not in ACTS:
                raise VitexportError(f"The prompt decoder's {name} {getattr(self, name)!r} is not one vitexport "
                                     f"builds; it builds {', '.join(repr(a) for a in ACTS)}.")
        for name in ("prompt_norm_eps", "decoder_norm_eps"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < 1:
                raise VitexportError(f"The prompt decoder's {name} {v!r} is not a LayerNorm epsilon between 0 and 1.")
        if 2 * self.num_pos_feats != self.hidden_size:
            raise VitexportError(f"The prompt decoder's num_pos_feats {self.num_pos_feats} gives "
                                 f"{2 * self.num_pos_feats} Fourier features (sin and cos), not its hidden_size "
                                 f"{self.hidden_size}.")
        if self.hidden_size % 8:
            raise VitexportError(f"The prompt decoder's hidden_size {self.hidden_size} is not a multiple of 8 (the "
                                 f"mask upscaling narrows it to a quarter, then an eighth).")
        if self.hidden_size % self.attention_downsample_rate:
            raise VitexportError(f"The prompt decoder's hidden_size {self.hidden_size} does not divide by its "
                                 f"attention_downsample_rate {self.attention_downsample_rate}.")
        inner = self.hidden_size // self.attention_downsample_rate
        if self.hidden_size % self.decoder_heads or inner % self.decoder_heads:
            raise VitexportError(f"The prompt decoder's decoder_heads {self.decoder_heads} do not divide its "
                                 f"attention widths {self.hidden_size} and {inner}.")
        if self.mask_input_channels % 4:
            raise VitexportError(f"The prompt decoder's mask_input_channels {self.mask_input_channels} is not a "
                                 f"multiple of 4 (the mask embedding's first conv gives a quarter of them).")
        if self.num_point_embeddings != 4:
            raise VitexportError(f"The prompt decoder's num_point_embeddings {self.num_point_embeddings} is not 4 "
                                 f"(SAM embeds background, foreground and a box's two corners).")

    def check_reads(self, channels: int, grid: tuple[int, int], img_size: tuple[int, int]) -> None:
        """One sentence unless the encoder's embedding, (channels, *grid) of an img_size input, is what this reads."""
        e = self.embedding_size
        if self.hidden_size != channels or (e, e) != tuple(grid) or (self.image_size,) * 2 != tuple(img_size):
            raise VitexportError(f"SAM's prompt decoder reads a {self.hidden_size} x {e} x {e} embedding of a "
                                 f"{self.image_size}-pixel input; the encoder gives {channels} x {grid[0]} x "
                                 f"{grid[1]} at {img_size[0]}x{img_size[1]}.")

    @property
    def mask_size(self) -> int:
        """The low-resolution masks' side (and the mask input's): 4 x the embedding's, 256."""
        return 4 * self.embedding_size

    @property
    def num_mask_tokens(self) -> int:
        """The masks the graph returns: the single-mask output and the multimask ones."""
        return self.num_multimask_outputs + 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PromptDecoderConfig":
        return cls(**known_fields(cls, d, "The prompt decoder's config"))


def known_fields(cls: Any, d: dict[str, Any], what: str) -> dict[str, Any]:
    """`d` when each key is a field of the dataclass `cls`; one sentence naming the fields this version does not
    know (a manifest or table written by a newer vitexport)."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(k for k in d if k not in known)
    if unknown:
        raise VitexportError(f"{what} has fields vitexport does not know: {', '.join(unknown)}.")
    return d
