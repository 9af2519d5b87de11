"""The PyTorch model: built from a spec (for an export), or rebuilt from a manifest (for the bench and tests)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ..artifacts.manifest import LabelsRecord, Manifest
from ..data.preprocess import Preprocess
from ..errors import VitexportError
from ..model.heads.detection_config import DetectionConfig
from ..model.readers.checkpoints import Checkpoint, load_checkpoint, load_into
from ..model.labels import head_classes, labels_record
from ..model.posembed import INTERPOLATIONS, infer_grid
from ..model.spec import ModelSpec
from ..model.build import build_model
from ..model.config import ViTConfig
from ..model.vit import VisionTransformer


@dataclass
class BuiltModel:
    model: VisionTransformer  # in eval mode, weights loaded
    preprocess: Preprocess  # how images become its input
    checkpoint: Checkpoint | None  # the weights read; None: random
    notes: list[str] = field(default_factory=list)  # what the user should know (resized, dropped head, ...)
    labels: LabelsRecord | None = None  # where its class names come from (None: it outputs features)


def build(spec: ModelSpec) -> BuiltModel:
    """Build the reference model and load its weights (random but deterministic without a checkpoint)."""
    if spec.pos_embed_interp not in INTERPOLATIONS:
        raise VitexportError(f"Unknown --pos-embed-interp {spec.pos_embed_interp!r}; choose one of: "
                             f"{', '.join(INTERPOLATIONS)}.")
    variant = spec.architecture()
    ckpt_path = spec.resolved_checkpoint()
    ckpt = load_checkpoint(ckpt_path) if ckpt_path is not None else None
    overrides = {k: ckpt.hints[k] for k in ("norm_eps", "qkv_bias") if ckpt is not None and k in ckpt.hints}
    overrides.update(spec.overrides)
    if ckpt is not None:
        overrides.update(ckpt.fields)  # what its tensors say: a pooler, a projection, registers, the head's input
    num_classes = spec.num_classes
    if num_classes is None and ckpt is not None:
        num_classes = ckpt.num_classes  # follow the checkpoint's head (0: a feature extractor)
    if num_classes is not None and num_classes < 0:
        raise VitexportError("--num-classes must be 0 (features) or positive.")
    cfg = variant.config(img_size=spec.img_size, num_classes=num_classes, **overrides)
    if spec.dynamic_img_size and cfg.rel_pos_bias and ckpt is not None and \
            ckpt.hints.get("rel_pos_resample") == "bilinear":
        raise VitexportError("--dynamic-img-size: transformers resamples this BEiT's relative position tables "
                             "bilinearly in every forward pass, and vitexport's dynamic-size BEiT resamples them as "
                             "timm does; export it at a fixed size (--img-size) instead.")
    if spec.dynamic_img_size:  # the position embedding stays at the checkpoint's grid; resampled per input
        cfg = replace(cfg, dynamic_img_size=True, pos_embed_interp=spec.pos_embed_interp,
                      pos_embed_grid=stored_grid(ckpt, cfg))
    if spec.sampling is not None:
        if not isinstance(cfg.dense, DetectionConfig):
            raise VitexportError("--sampling chooses a detector's deformable attention; this model has none.")
        cfg = replace(cfg, dense=replace(cfg.dense, sampling=spec.sampling))
    model = build_model(cfg, seed=spec.seed)
    notes = list(spec.notes)
    if ckpt is not None:
        notes += load_into(model, ckpt, spec.pos_embed_interp)
        ckpt.release()
    else:
        notes.append(f"No checkpoint: deterministic random weights (seed {spec.seed}). Latency is real, "
                     "accuracy is meaningless.")
    labels = labels_record(head_classes(cfg.num_classes, cfg.dense), spec.variant,
                           None if ckpt is None else ckpt.hints.get("labels"))
    return BuiltModel(model.eval(), spec.preprocess_for(cfg.img_size), ckpt, notes, labels)


def stored_grid(ckpt: Checkpoint | None, cfg: ViTConfig) -> tuple[int, int]:
    """The patch grid a checkpoint's position embedding covers (the config's own grid without a checkpoint)."""
    if ckpt is None or "pos_embed" not in ckpt.state_dict:
        return cfg.grid_size
    if ckpt.hints.get("grid"):
        return tuple(ckpt.hints["grid"])
    prefix = 0 if cfg.no_embed_class else cfg.num_prefix_tokens
    return infer_grid(int(ckpt.state_dict["pos_embed"].shape[-2]) - prefix)


def model_from_manifest(manifest: Manifest) -> VisionTransformer:
    """Rebuild the PyTorch model an export was made from (same config, same weights)."""
    cfg = ViTConfig.from_dict(manifest.config)
    ck = manifest.checkpoint
    if ck is None:
        return build_model(cfg, seed=int(manifest.seed or 0))
    path = Path(ck.path)
    if not path.exists() and ck.repo is not None:  # the Hugging Face cache was cleaned: fetch the same commit
        from ..model.readers.hub import HubRef, fetch

        path = fetch(HubRef(ck.repo, ck.revision)).weights
    if not path.exists():
        raise VitexportError(f"the checkpoint {path} named in the manifest is gone")
    ckpt = load_checkpoint(path)
    if ckpt.sha256 != ck.sha256:
        raise VitexportError(f"the checkpoint {path} changed since the export (sha256 differs)")
    model = build_model(cfg)
    load_into(model, ckpt, manifest.pos_embed_interp)
    return model.eval()
