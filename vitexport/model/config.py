"""What a ViT is, as data: ViTConfig holds timm's VisionTransformer arguments (the ones that decide the shapes and
the forward pass), checked when made, so a config from a hub file or a manifest that vitexport cannot build, or that
is absurd, is one sentence before any tensor is allocated. No torch here.

`family` says which model reads it: ``vit`` (`vit.VisionTransformer`: timm's VisionTransformer and DeiT, the
NaFlexViT towers, transformers' ViTs), ``eva`` (`eva.Eva`: the RoPE ViTs of timm's eva.py, EVA to DINOv3),
``beit`` (`beit.Beit`: relative position bias) or ``sam`` (`sam.SamViT`: Segment Anything's image encoder, windowed
attention with decomposed relative positions and a convolutional neck). The fields past `pos_embed_interp` are what
the last three add; their defaults are the classic ViT's.

The names of the parts (`NORM_LAYERS`, `ACT_LAYERS`, ...) are the keys of the tables in `layers/`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from ..errors import VitexportError
from .heads.config import DenseConfig, PromptDecoderConfig, known_fields
from .heads.detection_config import DetectionConfig

DEFAULT_NORM_EPS = 1e-6  # timm's LayerNorm and RmsNorm
GLOBAL_POOLS = ("token", "avg", "avgmax", "max", "map", "token_avg", "")
NORM_LAYERS = ("layernorm", "rmsnorm")
ACT_LAYERS = ("gelu", "gelu_tanh", "quick_gelu", "silu")
MLP_LAYERS = ("mlp", "swiglu", "glu", "swiglu_packed")
BLOCK_FNS = ("block", "res_post", "parallel_scaling", "diff_parallel_scaling", "parallel_things")
ATTN_LAYERS = ("attn", "diff")
PRE_LOGITS_ACTS = ("tanh", "")  # the representation layer's activation ('' none: a plain projection)
FAMILIES = ("vit", "eva", "beit", "sam")
ROPE_KINDS = ("", "cat", "dinov3", "mixed")  # layers/rope.py ('' no RoPE)
ROPE_INDEXING = ("ij", "xy")
# BEiT's relative position bias: none, one table per block, one shared; SAM's decomposed tables (one per axis)
REL_POS_BIASES = ("", "block", "shared", "decomposed")
CHOICES = {"global_pool": GLOBAL_POOLS, "norm_layer": NORM_LAYERS, "act_layer": ACT_LAYERS, "mlp_layer": MLP_LAYERS,
           "block_fn": BLOCK_FNS, "attn_layer": ATTN_LAYERS, "pre_logits_act": PRE_LOGITS_ACTS, "family": FAMILIES,
           "rope": ROPE_KINDS, "rope_grid_indexing": ROPE_INDEXING, "rel_pos_bias": REL_POS_BIASES}
# what each family's model builds, beyond the options every family shares
FAMILY_BLOCKS = {"vit": BLOCK_FNS, "eva": ("block", "res_post"), "beit": ("block",), "sam": ("block",)}
FAMILY_MLPS = {"vit": MLP_LAYERS, "eva": ("mlp", "swiglu", "swiglu_packed"), "beit": ("mlp", "swiglu"),
               "sam": ("mlp",)}
# sanity bounds for numbers a config file may hold: far beyond any published ViT, far below what breaks arithmetic
MAX_SIDE = 16384  # pixels of an input side
MAX_WIDTH = 65536  # embed_dim
MAX_DEPTH = 1024
MAX_TOKENS = 4096  # register tokens


def to_2tuple(x: Any) -> tuple[int, int]:
    """An int or a pair -> (height, width)."""
    if isinstance(x, int) and not isinstance(x, bool):
        return (x, x)
    if isinstance(x, (list, tuple)) and len(x) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in x):
        return (int(x[0]), int(x[1]))
    raise VitexportError(f"{x!r} is not a size (an integer or a pair of integers).")


@dataclass
class ViTConfig:
    """Everything that decides a ViT's shapes and forward pass (timm's VisionTransformer arguments, as data)."""

    img_size: tuple[int, int] = (224, 224)  # (H, W) of the input image
    patch_size: tuple[int, int] = (16, 16)  # (P_h, P_w); H and W must be multiples
    in_chans: int = 3
    num_classes: int = 1000  # 0 -> no head: the model returns pooled features
    # 'token' | 'avg' | 'avgmax' | 'max' | 'map' (attention pool) | 'token_avg' (the class token and the mean of the
    # patch tokens side by side: 2 x D, transformers' Dinov2ForImageClassification) | '' (no pooling)
    global_pool: str = "token"
    embed_dim: int = 768  # D
    depth: int = 12  # number of blocks
    num_heads: int = 12  # H; head_dim = D / H
    mlp_ratio: float = 4.0  # MLP hidden width / D
    qkv_bias: bool = True
    qk_norm: bool = False  # a norm on each head's q and k
    scale_attn_norm: bool = False  # a norm before the attention's output projection
    scale_mlp_norm: bool = False  # a norm before the MLP's fc2
    proj_bias: bool = True  # biases of the attention projection and the MLP
    init_values: float | None = None  # LayerScale init; None -> no LayerScale
    class_token: bool = True
    reg_tokens: int = 0  # register tokens after the class token (DINOv2 with registers)
    no_embed_class: bool = False  # True -> the position embedding covers patch tokens only
    pre_norm: bool = False  # a norm after the embedding (CLIP style); also drops the patch conv bias
    final_norm: bool = True  # a norm after the blocks (before or after pooling, see fc_norm)
    fc_norm: bool | None = None  # the final norm after pooling; None -> on for avg/avgmax/max pooling
    pool_include_prefix: bool = False  # avg/max pooling over the prefix tokens too
    distilled: bool = False  # DeiT's distillation token and second head, averaged with the first
    # a Linear after pooling, before the head (timm's former representation layer, transformers' ViT pooler, CLIP's
    # visual projection): its width (0: none), activation and bias
    pre_logits_size: int = 0
    pre_logits_act: str = "tanh"
    pre_logits_bias: bool = True
    norm_layer: str = "layernorm"  # 'layernorm' | 'rmsnorm'
    norm_eps: float = DEFAULT_NORM_EPS  # LayerNorm epsilon (Hugging Face checkpoints use 1e-12, CLIP 1e-5)
    embed_norm_layer: str | None = None  # a norm inside the patch embedding ('layernorm' | 'rmsnorm')
    embed_norm_eps: float = DEFAULT_NORM_EPS
    act_layer: str = "gelu"  # 'gelu' | 'gelu_tanh' | 'quick_gelu' | 'silu'
    mlp_layer: str = "mlp"  # 'mlp' | 'swiglu' | 'glu' | 'swiglu_packed'
    block_fn: str = "block"  # 'block' | 'res_post' | 'parallel_scaling' | 'diff_parallel_scaling' | 'parallel_things'
    attn_layer: str = "attn"  # 'attn' | 'diff' (differential attention)
    drop_rate: float = 0.0  # dropout after the position embedding, in the blocks and before the head
    attn_drop_rate: float = 0.0  # dropout on the attention matrix
    drop_path_rate: float = 0.0  # stochastic depth, linearly increasing over the blocks
    # any image size (multiples of the patch): the position embedding, stored at pos_embed_grid, is resampled to
    # each input's grid in the forward pass with pos_embed_interp (timm's dynamic_img_size)
    dynamic_img_size: bool = False
    pos_embed_grid: tuple[int, int] | None = None  # the grid the stored position embedding covers; None: img_size's
    pos_embed_interp: str = "bicubic-antialias"  # posembed.INTERPOLATIONS; used only with dynamic_img_size
    # resample the position embedding to a square of the grid's longer side, then crop (NaFlexViT's
    # pos_embed_ar_preserving: C-RADIO)
    pos_embed_square: bool = False

    # -- the RoPE and relative-position families (eva.py, beit.py) --------------------------------------------------
    family: str = "vit"  # 'vit' | 'eva' | 'beit': the model class
    abs_pos_embed: bool = True  # a learned absolute position embedding (timm's use_abs_pos_emb)
    rope: str = ""  # rotary position embedding: '' | 'cat' | 'dinov3' | 'mixed' (layers/rope.py)
    rope_temperature: float = 10000.0
    rope_grid_offset: float = 0.0  # added to the grid positions
    rope_grid_indexing: str = "ij"  # 'ij': (row, column) channels; 'xy': (column, row)
    rope_rotate_half: bool = False  # rotation layout: halves (True) or interleaved pairs (False)
    rope_ref_grid: tuple[int, int] | None = None  # positions rescaled to this grid (EVA's ref_feat_shape)
    rel_pos_bias: str = ""  # BEiT's relative position bias: '' | 'block' | 'shared'
    qkv_fused: bool = True  # one qkv projection; False: q_proj, k_proj, v_proj
    k_bias: bool = True  # False: the key projection has no bias (EVA's and BEiT's q/v biases)
    num_kv_heads: tuple[int, ...] | None = None  # key/value heads of each block (grouped-query attention)
    mlp_align_to: int = 0  # SwiGLU's hidden width rounded up to a multiple of this (DINOv3 S+, H+, 7B)
    attn_only_layer_scale: bool = False  # LayerScale on the attention branch only (Sapiens2)
    pool_heads: int | None = None  # the attention pool's heads; None: num_heads
    pool_mlp_ratio: float | None = None  # the attention pool's MLP ratio; None: mlp_ratio; 0: no MLP, no norm
    # SAM (family 'sam'; pos_embed_grid set: transformers', at that grid alone): windows of this many tokens a side
    window_size: int = 0  # (0: global attention everywhere)
    global_attn_indexes: tuple[int, ...] = ()  # the blocks that attend over the whole grid
    neck_chans: int = 0  # the neck's width (0: a LayerNorm2d instead, timm's classifier form)
    sam_decoder: PromptDecoderConfig | None = None  # SamModel's prompt decoder (heads.sam_decoder); None: none

    # -- a dense predictor (model.dense): the head over this backbone's intermediate tokens; None: the ViT itself
    dense: DenseConfig | DetectionConfig | None = None

    def __post_init__(self) -> None:
        if isinstance(self.dense, dict):  # from a manifest
            head = DetectionConfig if self.dense.get("task") == "detection" else DenseConfig
            self.dense = head.from_dict(self.dense)
        if isinstance(self.sam_decoder, dict):
            self.sam_decoder = PromptDecoderConfig.from_dict(self.sam_decoder)
        self._check_types()
        self.img_size = to_2tuple(self.img_size)
        self.patch_size = to_2tuple(self.patch_size)
        if self.pos_embed_grid is not None:
            self.pos_embed_grid = to_2tuple(self.pos_embed_grid)
        if self.rope_ref_grid is not None:
            self.rope_ref_grid = to_2tuple(self.rope_ref_grid)
        self.num_kv_heads = self._kv_heads(self.num_kv_heads)
        self.global_attn_indexes = self._indexes(self.global_attn_indexes)
        for name, table in CHOICES.items():
            if getattr(self, name) not in table:
                raise VitexportError(f"{name}={getattr(self, name)!r} is not one vitexport builds; it builds "
                                     f"{', '.join(repr(k) for k in table)}.")
        self._check_ranges()
        if self.embed_norm_layer is not None and self.embed_norm_layer not in NORM_LAYERS:
            raise VitexportError(f"embed_norm_layer={self.embed_norm_layer!r} is not one vitexport builds; it builds "
                                 f"{', '.join(repr(k) for k in NORM_LAYERS)}.")
        if self.global_pool in ("token", "token_avg") and not self.class_token:
            raise VitexportError(f"global_pool={self.global_pool!r} needs class_token=True.")
        if self.distilled and (self.global_pool != "token" or self.reg_tokens):
            raise VitexportError("A distilled ViT reads its class and distillation tokens: it needs "
                                 "global_pool='token' and no register tokens.")
        if self.distilled and self.pre_logits_size:
            raise VitexportError("A distilled ViT has no representation layer (pre_logits_size).")
        if self.block_fn in ("parallel_scaling", "diff_parallel_scaling") and (
                self.scale_attn_norm or self.scale_mlp_norm):
            raise VitexportError(f"block_fn={self.block_fn!r} has no scale_attn_norm / scale_mlp_norm.")
        self._check_family()
        if self.dense is not None:
            self.dense.check_backbone(self)

    def _indexes(self, v: Any) -> tuple[int, ...]:
        """SAM's global blocks, sorted; an index past the last block names none (timm's tiny variants keep them)."""
        if isinstance(v, (list, tuple)) and all(type(i) is int and 0 <= i < MAX_DEPTH for i in v):
            return tuple(sorted(set(v)))
        raise VitexportError(f"The model config's global_attn_indexes {v!r} are not block indices.")

    def _kv_heads(self, v: Any) -> tuple[int, ...] | None:
        """num_kv_heads as one entry per block: an int stands for every block; None entries mean num_heads."""
        if v is None:
            return None
        if isinstance(v, int) and not isinstance(v, bool):
            v = [v] * self.depth
        if not isinstance(v, (list, tuple)) or len(v) != self.depth or not all(
                x is None or (isinstance(x, int) and not isinstance(x, bool)) for x in v):
            raise VitexportError(f"The model config's num_kv_heads {v!r} is not a head count, or one per block "
                                 f"({self.depth}).")
        heads = tuple(self.num_heads if x is None else x for x in v)
        for h in heads:
            if not (0 < h <= self.num_heads and self.num_heads % h == 0):
                raise VitexportError(f"The model config's num_kv_heads {h} does not divide its {self.num_heads} "
                                     f"heads.")
        return None if all(h == self.num_heads for h in heads) else heads

    def _check_family(self) -> None:
        """What each model class builds; everything else is one sentence naming the option."""
        fam = self.family

        if self.block_fn not in FAMILY_BLOCKS[fam]:
            raise VitexportError(f"block_fn={self.block_fn!r} is not one the {fam} family builds; it builds "
                                 f"{', '.join(repr(k) for k in FAMILY_BLOCKS[fam])}.")
        if self.mlp_layer not in FAMILY_MLPS[fam]:
            raise VitexportError(f"mlp_layer={self.mlp_layer!r} is not one the {fam} family builds; it builds "
                                 f"{', '.join(repr(k) for k in FAMILY_MLPS[fam])}.")
        if fam != "vit":
            for name, default in (("attn_layer", "attn"), ("distilled", False), ("pre_logits_size", 0),
                                  ("embed_norm_layer", None), ("pos_embed_square", False)):
                if getattr(self, name) != default:
                    raise VitexportError(f"{name}={getattr(self, name)!r} is a VisionTransformer option: a "
                                         f"{fam}-family model has none.")
        else:
            for name, default in (("rope", ""), ("rel_pos_bias", ""), ("qkv_fused", True), ("k_bias", True),
                                  ("num_kv_heads", None), ("attn_only_layer_scale", False), ("abs_pos_embed", True),
                                  ("mlp_align_to", 0)):
                if getattr(self, name) != default:
                    raise VitexportError(f"{name}={getattr(self, name)!r} needs family='eva' or 'beit' (a "
                                         f"VisionTransformer has no such option).")
        self._check_sam()
        if self.rope and fam != "eva":
            raise VitexportError(f"rope={self.rope!r} needs family='eva'.")
        if self.rel_pos_bias and fam != ("sam" if self.rel_pos_bias == "decomposed" else "beit"):
            raise VitexportError(f"rel_pos_bias={self.rel_pos_bias!r} needs family="
                                 f"{'sam' if self.rel_pos_bias == 'decomposed' else 'beit'!r}.")
        if self.rope and (self.embed_dim // self.num_heads) % 4:
            raise VitexportError(f"RoPE needs a head size divisible by 4; {self.embed_dim} / {self.num_heads} heads "
                                 f"is {self.embed_dim // self.num_heads}.")
        if self.rope == "mixed" and self.rope_rotate_half:
            raise VitexportError("Mixed RoPE rotates interleaved pairs: it needs rope_rotate_half=False.")
        if self.num_kv_heads is not None and self.qkv_fused:
            raise VitexportError("Grouped-query attention (num_kv_heads) needs separate q/k/v projections "
                                 "(qkv_fused=False).")
        if self.block_fn == "res_post" and fam == "eva" and (self.qk_norm or self.attn_only_layer_scale or
                                                             self.num_kv_heads is not None):
            raise VitexportError("The post-norm EVA block has no qk_norm, num_kv_heads or attn_only_layer_scale.")
        if fam == "beit" and (self.reg_tokens or not self.class_token or self.no_embed_class or self.pre_norm):
            raise VitexportError("A BEiT model has one class token, no registers, and embeds its class token "
                                 "(class_token=True, reg_tokens=0, no_embed_class=False, pre_norm=False).")
        if fam == "beit" and self.global_pool not in ("avg", "token", ""):
            raise VitexportError(f"A BEiT model pools 'avg', 'token' or '' (not {self.global_pool!r}).")
        if self.mlp_align_to and self.mlp_layer != "swiglu":
            raise VitexportError("mlp_align_to rounds SwiGLU's hidden width: it needs mlp_layer='swiglu'.")

    def _check_sam(self) -> None:
        """SAM's encoder: a grid of patch tokens alone, at one size (transformers': its own), windows and a neck of
        sensible sizes, a prompt decoder that reads its embedding."""
        if self.family != "sam":
            if self.window_size or self.global_attn_indexes or self.neck_chans or self.sam_decoder is not None:
                raise VitexportError("window_size, global_attn_indexes, neck_chans and sam_decoder are SAM's options: "
                                     "they need family='sam'.")
            return
        g, p = self.pos_embed_grid, self.patch_size
        for bad, why in (
                (self.class_token or self.reg_tokens or self.no_embed_class or self.distilled,
                 "SAM's image encoder has no class or register tokens (class_token=False, reg_tokens=0)"),
                (self.global_pool not in ("avg", ""), f"SAM's encoder pools 'avg' or '', not {self.global_pool!r}"),
                (self.dynamic_img_size, "SAM's encoder runs at one size: export it at a fixed --img-size"),
                (self.attn_layer != "attn" or not self.qkv_fused or not self.k_bias or self.num_kv_heads is not None,
                 "SAM's attention is one fused qkv projection with its biases"),
                (not 0 <= self.window_size <= MAX_SIDE or not 0 <= self.neck_chans <= MAX_WIDTH,
                 f"SAM's window_size {self.window_size} or neck_chans {self.neck_chans} is out of range"),
                (g is not None and g != self.grid_size, f"transformers' SAM runs at its image_size alone ("
                 f"{g[0] * p[0]}x{g[1] * p[1]}), not at {self.img_size[0]}x{self.img_size[1]}; export it at that "
                 f"size" if g else "")):
            if bad:
                raise VitexportError(why + ".")
        if self.sam_decoder is not None:
            self.sam_decoder.check_reads(self.neck_chans, self.grid_size, self.img_size)

    def _check_types(self) -> None:
        """Every field of the type it is declared with (a bool is not an int; an int may stand for a float)."""
        for f in fields(self):
            v, t = getattr(self, f.name), str(f.type)
            if v is None and "None" in t:
                continue
            if t.startswith("bool"):
                ok = isinstance(v, bool)
            elif t.startswith("int"):
                ok = isinstance(v, int) and not isinstance(v, bool)
            elif t.startswith("float"):
                ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            elif t.startswith("str"):
                ok = isinstance(v, str)
            else:  # sizes: checked by to_2tuple
                continue
            if not ok:
                raise VitexportError(f"The model config's {f.name} is {v!r}, not a {t.split(' ')[0]}.")

    def _check_ranges(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise VitexportError(f"The model config's {what}.")

        need(all(0 < s <= MAX_SIDE for s in self.img_size), f"img_size {self.img_size} is not 1..{MAX_SIDE} a side")
        need(all(0 < p <= s for p, s in zip(self.patch_size, self.img_size)),
             f"patch_size {self.patch_size} is not 1..img_size {self.img_size}")
        need(0 < self.in_chans <= 64, f"in_chans {self.in_chans} is not 1..64")
        need(0 <= self.num_classes <= 10**6, f"num_classes {self.num_classes} is not 0..1000000")
        need(0 < self.embed_dim <= MAX_WIDTH, f"embed_dim {self.embed_dim} is not 1..{MAX_WIDTH}")
        need(0 <= self.depth <= MAX_DEPTH, f"depth {self.depth} is not 0..{MAX_DEPTH}")
        need(0 < self.num_heads <= self.embed_dim and self.embed_dim % self.num_heads == 0,
             f"embed_dim {self.embed_dim} is not divisible into {self.num_heads} heads")
        need(0 < self.mlp_ratio <= 64 and self.hidden_features > 0, f"mlp_ratio {self.mlp_ratio} is not in (0, 64]")
        need(self.mlp_layer not in ("glu", "swiglu_packed") or self.hidden_features % 2 == 0,
             f"{self.mlp_layer} MLP splits its hidden width {self.hidden_features} in halves: it must be even")
        need(0 <= self.pre_logits_size <= MAX_WIDTH, f"pre_logits_size {self.pre_logits_size} is not 0..{MAX_WIDTH}")
        need(0 <= self.reg_tokens <= MAX_TOKENS, f"reg_tokens {self.reg_tokens} is not 0..{MAX_TOKENS}")
        need(0 < self.norm_eps < 1 and 0 < self.embed_norm_eps < 1, "norm eps is not in (0, 1)")
        need(0 < self.rope_temperature <= 1e9, f"rope_temperature {self.rope_temperature} is not in (0, 1e9]")
        need(abs(self.rope_grid_offset) <= MAX_SIDE, f"rope_grid_offset {self.rope_grid_offset} is absurd")
        need(self.rope_ref_grid is None or all(0 < s <= MAX_SIDE for s in self.rope_ref_grid),
             f"rope_ref_grid {self.rope_ref_grid} is not 1..{MAX_SIDE} a side")
        need(0 <= self.mlp_align_to <= 4096, f"mlp_align_to {self.mlp_align_to} is not 0..4096")
        need(self.pool_heads is None or (0 < self.pool_heads <= self.embed_dim and self.embed_dim % self.pool_heads
                                         == 0), f"embed_dim {self.embed_dim} is not divisible into {self.pool_heads}"
                                                " pool heads")
        need(self.pool_mlp_ratio is None or 0 <= self.pool_mlp_ratio <= 64,
             f"pool_mlp_ratio {self.pool_mlp_ratio} is not in [0, 64] (0: no MLP)")
        need(self.init_values is None or abs(self.init_values) < 1e6, f"init_values {self.init_values} is absurd")

    @property
    def grid_size(self) -> tuple[int, int]:
        return (self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1])

    @property
    def pos_grid(self) -> tuple[int, int]:
        """The grid of the stored position embedding."""
        return self.pos_embed_grid or self.grid_size

    @property
    def num_prefix_tokens(self) -> int:
        """Class, distillation and register tokens, in that order, before the patch tokens."""
        return int(self.class_token) + int(self.distilled) + self.reg_tokens

    @property
    def hidden_features(self) -> int:
        """The MLP's hidden width: int(D * mlp_ratio); EVA's packed SwiGLU doubles it (value and gate in one fc1),
        an aligned SwiGLU rounds it up to a multiple of mlp_align_to."""
        h = int(self.embed_dim * self.mlp_ratio)
        if self.family == "eva" and self.mlp_layer == "swiglu_packed":
            h *= 2
        if self.mlp_align_to:
            h += -h % self.mlp_align_to
        return h

    @property
    def num_features(self) -> int:
        """The width of what the head reads: the pooled vector, or the representation layer's output."""
        if self.pre_logits_size:
            return self.pre_logits_size
        if self.family == "sam":
            return self.neck_chans or self.embed_dim
        return 2 * self.embed_dim if self.global_pool == "token_avg" else self.embed_dim

    @property
    def uses_fc_norm(self) -> bool:
        if self.fc_norm is not None:
            return self.fc_norm
        return self.global_pool == "avg" if self.family != "vit" else self.global_pool in ("avg", "avgmax", "max")

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.dense is not None:
            d["dense"] = self.dense.to_dict()
        if self.sam_decoder is not None:
            d["sam_decoder"] = self.sam_decoder.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ViTConfig":
        """A config from a manifest or a table; fields this version does not know are refused by name."""
        return cls(**known_fields(cls, d, "The model config"))
