"""What to build and how to export it: a named variant, an optional checkpoint, the overrides a user can give,
and the export's options.

Plain data, no torch: the CLI turns its options into these objects before anything heavy is imported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..artifacts.folder import ModelFolder
from ..data.preprocess import Preprocess
from ..errors import VitexportError
from ..parity.compare import EXPORT_THRESHOLDS
from ..paths import shipped_checkpoint
from .archs import Architecture, Tag
from .config import to_2tuple
from .posembed import DEFAULT_INTERPOLATION
from .variants import DEFAULT_VARIANT, get_variant

if TYPE_CHECKING:
    from ..artifacts.manifest import Manifest
    from .config import ViTConfig
    from .readers.hub import HubModel


@dataclass
class ModelSpec:
    variant: str = DEFAULT_VARIANT  # a name from variants.VARIANTS
    checkpoint: Path | str | None = None  # weights file or folder, or 'hf-hub:ORG/NAME[@REVISION]'; None: shipped
    # weights of the variant, else random
    img_size: tuple[int, int] | None = None  # (H, W); None: the variant's
    num_classes: int | None = None  # None: the checkpoint's head, else the variant's; 0: features
    pos_embed_interp: str = DEFAULT_INTERPOLATION  # how to resize the position embedding (posembed.INTERPOLATIONS)
    seed: int = 0  # of the random weights, when there is no checkpoint
    preprocess: Preprocess | None = None  # the checkpoint's own (a hub config's); None: the variant's
    overrides: dict[str, Any] = field(default_factory=dict)  # ViTConfig fields the checkpoint's config sets
    dynamic_img_size: bool = False  # an export that takes any image size in img_size_range (img_size: the default)
    img_size_range: "SizeRange | None" = None  # ((min H, min W), (max H, max W)); None: default_range()
    bench_sizes: tuple[tuple[int, int], ...] = ()  # `bench --img-size A --img-size B`: the sizes to time
    # a model no table names (a transformers config of any size): its architecture, `variant` its name
    arch: Architecture | None = None
    sampling: str | None = None  # a detector's deformable attention form (ExportOptions.sampling); None: its default
    notes: list[str] = field(default_factory=list)  # what the user should know about the spec (assumptions)

    def architecture(self) -> Architecture:
        return self.arch if self.arch is not None else get_variant(self.variant)

    def resolved_checkpoint(self) -> Path | None:
        """The weights file or folder to read: a hub reference is fetched through the Hugging Face cache."""
        from .readers.hub import fetch, parse_ref

        if (ref := parse_ref(self.checkpoint)) is not None:
            return fetch(ref).weights
        if self.checkpoint is not None:
            return Path(self.checkpoint)
        return shipped_checkpoint(self.variant)  # the shipped trained digits model, or None

    def config(self) -> "ViTConfig":
        """The model config this spec gives, without reading weights (the checkpoint's class count aside).

        A size the user asks for must be a multiple of the patch (an architecture's own size need not be: timm's
        so400m/14 at 384 drops the last pixels of each side, and so does vitexport)."""
        arch = self.architecture()
        if self.img_size is not None and tuple(self.img_size) != arch.img_size:
            patch = to_2tuple(self.overrides.get("patch_size", arch.args.get("patch_size", 16)))
            for side, s, p in zip(("height", "width"), self.img_size, patch):
                if s % p:
                    raise VitexportError(f"Image {side} {s} is not a multiple of the patch size {p}.")
        return arch.config(img_size=self.img_size, num_classes=self.num_classes, **self.overrides)

    def preprocess_for(self, img_size: tuple[int, int]) -> Preprocess:
        """How images become inputs of `img_size`: the checkpoint's preprocessing when it has one, else the variant's."""
        if self.preprocess is None:
            return self.architecture().preprocess(img_size)
        return replace(self.preprocess, input_size=tuple(img_size))

    def default_folder(self) -> ModelFolder:
        """models/<variant>-<H>x<W>: where this spec's export goes without --output."""
        return ModelFolder.default_for(self.variant, self.img_size or self.architecture().img_size,
                                       self.dynamic_img_size)

    def differences(self, manifest: "Manifest") -> list[str]:
        """How an existing export differs from what this spec asks for; empty when it is that model."""
        from .readers.checkpoints import resolve_weights, weights_digest  # imports torch: only when an export is compared

        diffs = []
        if manifest.variant != self.variant:
            diffs.append(f"it is {manifest.variant}, not {self.variant}")
        have = None if manifest.checkpoint is None else manifest.checkpoint.sha256
        ckpt = self.resolved_checkpoint()
        if ckpt is None and have:
            diffs.append("it was made from a checkpoint, not from random weights")
        elif ckpt is not None:
            if not ckpt.exists():
                raise VitexportError(f"Checkpoint {ckpt} does not exist.")
            if weights_digest(resolve_weights(ckpt)[0]) != have:
                diffs.append(f"it was made from {'random weights' if not have else 'another checkpoint'}, not {ckpt}")
        if self.num_classes is not None and self.num_classes != manifest.num_classes:
            diffs.append(f"it has {manifest.num_classes} classes, not {self.num_classes}")
        if self.pos_embed_interp != manifest.pos_embed_interp:
            diffs.append(f"its position embedding was resized with {manifest.pos_embed_interp}")
        return diffs


def spec_for(model: str | None = None, checkpoint: Path | str | None = None,
             img_size: tuple[int, int] | None = None, *, num_classes: int | None = None,
             pos_embed_interp: str | None = None, dynamic_img_size: bool = False,
             img_size_range: tuple[tuple[int, int], tuple[int, int]] | None = None) -> ModelSpec:
    """The spec of the model options a user gave (`-m`, `-c`, `--img-size`, ...; the CLI's option group and
    `vitexport.export` both make it here): user_spec after the options are checked against one another."""
    if img_size_range is not None and not dynamic_img_size:
        raise VitexportError("--img-size-range needs --dynamic-img-size.")
    return user_spec(model, checkpoint, img_size=img_size, num_classes=num_classes, pos_embed_interp=pos_embed_interp,
                     dynamic_img_size=dynamic_img_size, img_size_range=img_size_range)


def user_spec(model: str | None = None, checkpoint: Path | str | None = None, **kw: Any) -> ModelSpec:
    """A spec from what a user typed: `model` a variant or a timm tagged name (fetched from timm/<name> on the
    hub), `checkpoint` a path or 'hf-hub:ORG/NAME[@REVISION]'. A checkpoint's config (a hub repository's, or a local
    folder's config.json) gives the model unless `model` names one: a timm config its architecture, a transformers
    config the sizes and options it describes. kw: the other ModelSpec fields (pos_embed_interp None: the
    checkpoint's own code's, else vitexport's default)."""
    from .readers.hub import describe, fetch, local_config, parse_ref, tagged_ref

    ref = parse_ref(checkpoint)
    if model is not None and (tagged := tagged_ref(model)) is not None:
        if checkpoint is not None:
            raise VitexportError(f"{model} names pretrained weights already; drop -c/--checkpoint, or give the "
                                 f"untagged variant {model.partition('.')[0]} with it.")
        ref, checkpoint, model = tagged, str(tagged), model.partition(".")[0]
    if ref is not None:
        hub, name = describe(fetch(ref)), ref.repo_id.split("/")[1]
    elif checkpoint is not None and (local := local_config(Path(checkpoint))) is not None:
        from .readers.hub import describe_config

        folder = Path(checkpoint) if Path(checkpoint).is_dir() else Path(checkpoint).parent
        hub, name = describe_config(local[0], local[1], str(folder)), folder.resolve().name
    else:
        kw["pos_embed_interp"] = kw.get("pos_embed_interp") or own_interpolation(model) or DEFAULT_INTERPOLATION
        return ModelSpec(variant=model or DEFAULT_VARIANT, checkpoint=checkpoint, **kw)
    return _described_spec(hub, model, checkpoint if ref is None else str(ref), name, kw)


def own_interpolation(variant: str | None) -> str | None:
    """How an architecture's own code resamples its position embedding, when the table says (NaFlexViT's towers
    resample theirs with their own method); None: vitexport's default."""
    if variant is None:
        return None
    try:
        return get_variant(variant).args.get("pos_embed_interp")
    except VitexportError:
        return None  # an unknown name: refused with its sentence where the spec is used


def _described_spec(hub: "HubModel", model: str | None, checkpoint: Path | str, name: str,
                    kw: dict[str, Any]) -> ModelSpec:
    kw["pos_embed_interp"] = kw.get("pos_embed_interp") or hub.pos_embed_interp or \
        own_interpolation(model or hub.variant) or DEFAULT_INTERPOLATION
    arch = None
    if hub.kind == "transformers":  # any size: an architecture of its own, named after -m or after the files
        if model is not None:
            _check_named_shape(model, hub, checkpoint)
        pp = hub.preprocess
        arch = Architecture(model or safe_name(name) or "transformers", "transformers", dict(hub.overrides), {
            "transformers": Tag("transformers", pp.input_size, 0, pp.mean, pp.std, pp.crop_pct, pp.crop_mode,
                                pp.interpolation)} if pp else {})
    variant = model or (arch.name if arch else hub.variant)
    if variant is None:
        raise VitexportError(f"{checkpoint} holds {hub.architecture}, which is not one of the architectures "
                             f"vitexport builds (timm's VisionTransformer family: `vitexport models` lists them); "
                             f"pass -m with the architecture of the same shape.")
    default_size = (arch or get_variant(variant)).img_size
    if kw.get("img_size") is None and hub.preprocess is not None and hub.preprocess.input_size != default_size:
        kw["img_size"] = hub.preprocess.input_size  # the checkpoint's own size (timm's model_args img_size)
    return ModelSpec(variant=variant, checkpoint=checkpoint, preprocess=hub.preprocess,
                     overrides={} if arch else hub.overrides, arch=arch, notes=list(hub.notes), **kw)


SHAPE_FIELDS = (("width", "embed_dim"), ("depth", "depth"), ("heads", "num_heads"), ("patch", "patch_size"),
                ("MLP ratio", "mlp_ratio"))


def _shape(fields: dict[str, Any]) -> dict[str, Any]:
    from .config import ViTConfig

    cfg = ViTConfig(**{k: v for k, v in fields.items() if k in ViTConfig.__dataclass_fields__})
    return {label: getattr(cfg, key) for label, key in SHAPE_FIELDS}


def _show(shape: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        return f"{v[0]}x{v[1]}" if isinstance(v, tuple) else f"{v:g}" if isinstance(v, float) else str(v)

    return ", ".join(f"{label} {fmt(v)}" for label, v in shape.items())


def _check_named_shape(model: str, hub: "HubModel", where: Path | str) -> None:
    """-m with a transformers folder: the folder's config gives the model, -m only names it, so the two must be the
    same shape (width, depth, heads, patch, MLP ratio), else one sentence saying how they differ."""
    named, held = _shape(get_variant(model).config_fields()), _shape(hub.overrides)
    if named != held:
        differ = {k: held[k] for k in held if held[k] != named[k]}
        raise VitexportError(f"-m {model} is {_show({k: named[k] for k in differ})}, but {where} holds a "
                             f"transformers {hub.architecture} of {_show(differ)} ({_show(held)}); drop -m to "
                             f"export the folder's model as its config describes it.")


def safe_name(text: str) -> str:
    """A name usable as a folder and a Triton model name: letters, digits, '.', '_' and '-'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip(".-")[:100]


DEFAULT_OPSET = 18
MIN_OPSET = 17  # LayerNormalization

SizeRange = tuple[tuple[int, int], tuple[int, int]]  # ((min H, min W), (max H, max W))
MIN_GRID = 2  # patches per side at least: the exporter specialises a dimension of size 1


def default_range(img_size: tuple[int, int], patch: tuple[int, int]) -> SizeRange:
    """Half to twice the default size on each side, in whole patches (at least MIN_GRID of them)."""
    def side(n: int, p: int, factor: float) -> int:
        return max(MIN_GRID, int(n * factor) // p) * p

    return ((side(img_size[0], patch[0], 0.5), side(img_size[1], patch[1], 0.5)),
            (side(img_size[0], patch[0], 2.0), side(img_size[1], patch[1], 2.0)))


def check_range(rng: SizeRange, img_size: tuple[int, int], patch: tuple[int, int]) -> SizeRange:
    """A range whose sides are multiples of the patch, at least MIN_GRID patches, min <= default <= max."""
    (h0, w0), (h1, w1) = rng
    for what, (h, w) in (("minimum", (h0, w0)), ("maximum", (h1, w1))):
        if h % patch[0] or w % patch[1]:
            raise VitexportError(f"--img-size-range: the {what} {h}x{w} is not a multiple of the patch size "
                                 f"{patch[0]}x{patch[1]}.")
        if h < MIN_GRID * patch[0] or w < MIN_GRID * patch[1]:
            raise VitexportError(f"--img-size-range: the {what} {h}x{w} is under {MIN_GRID} patches a side "
                                 f"({MIN_GRID * patch[0]}x{MIN_GRID * patch[1]}).")
    if not (h0 <= img_size[0] <= h1 and w0 <= img_size[1] <= w1):
        raise VitexportError(f"--img-size-range {h0}x{w0}..{h1}x{w1} does not hold the default size "
                             f"{img_size[0]}x{img_size[1]} (--img-size).")
    return ((h0, w0), (h1, w1))


def second_size(img_size: tuple[int, int], rng: SizeRange) -> tuple[int, int]:
    """The other size a dynamic export's converted files are checked at: the range's smallest height by its largest
    width (non-square; the position embedding is shrunk on one axis and stretched on the other, so antialiasing
    acts; about as many tokens as the default size for a default range), else another corner of the range."""
    (h0, w0), (h1, w1) = rng
    for size in ((h0, w1), (h1, w0), (h1, w1), (h0, w0)):
        if tuple(size) != tuple(img_size):
            return size
    return tuple(img_size)


def check_sizes(img_size: tuple[int, int], rng: SizeRange) -> list[tuple[int, int]]:
    """The sizes a dynamic export is checked at: the default, the largest, and a non-square one."""
    (h0, w0), (h1, w1) = rng
    odd = (h0, w1) if h0 != w1 else (h1, w0)
    sizes = [tuple(img_size), (h1, w1)] + ([odd] if odd[0] != odd[1] else [])
    return list(dict.fromkeys(sizes))


@dataclass
class ExportOptions:
    opset: int = DEFAULT_OPSET  # ONNX opset (>= MIN_OPSET)
    check_batches: tuple[int, ...] = (1, 3)  # batch sizes ONNX Runtime is checked at against PyTorch
    atol: float = EXPORT_THRESHOLDS.max_abs  # max abs logit difference allowed at that check (docs/PARITY.md)
    force: bool = False  # replace an existing export of another model or checkpoint
    outputs: str | None = None  # --outputs: comma-separated names (model.outputs); None: the model's default
    sampling: str | None = None  # --sampling: a detector's deformable attention (heads.detection_config.SAMPLINGS)
    # a model object the export must match too (vitexport.export(obj)): reference(x, names) returns the object's
    # own value of each output named, for an input batch x (a torch tensor); `reference_outputs` are the outputs
    # it can give (the exported ones among them are checked)
    reference: Callable[[Any, tuple[str, ...]], list[Any]] | None = None
    reference_outputs: tuple[str, ...] = ()
    reference_name: str = "the model object"
