"""PyTorch -> ONNX with a symbolic batch axis, checked against PyTorch in ONNX Runtime."""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import __version__
from .checkpoints import Checkpoint, load_checkpoint, load_into, resolve_weights, sha256_file
from .compare import ParityStats, compare
from .errors import ParityError, VitexportError
from .manifest import MANIFEST_NAME, write_manifest
from .model import VisionTransformer, build_model
from .paths import DIGITS_CHECKPOINT, artifacts_dir, shipped
from .posembed import DEFAULT_METHOD, METHODS
from .progress import QUIET, Log
from .variants import DEFAULT_VARIANT, DIGITS_VARIANT, Preprocess, get_variant

INPUT_NAME = "pixel_values"
OUTPUT_NAME = "logits"
DEFAULT_OPSET = 18
DEFAULT_ATOL = 1e-4  # max abs logit difference ONNX Runtime vs PyTorch (FP32); see docs/PARITY.md
DERIVED_FILES = ("model.fp16.onnx", "model.int8.onnx", "model.fp16.plan", "model.int8.plan", "model.fp32.plan",
                 "model.fp16.plan.json", "model.int8.plan.json", "model.fp32.plan.json")
PROTOBUF_LIMIT = 2 * 1024**3 - 64 * 1024**2  # stay clear of protobuf's 2 GiB cap: larger models use external data


@dataclass
class ModelSpec:
    """What to build: a named variant, optional checkpoint, and the overrides a user can give."""

    variant: str = DEFAULT_VARIANT
    checkpoint: Path | None = None
    img_size: tuple[int, int] | None = None
    num_classes: int | None = None
    pos_embed_interp: str = DEFAULT_METHOD
    seed: int = 0

    def resolved_checkpoint(self) -> Path | None:
        if self.checkpoint is not None:
            return Path(self.checkpoint)
        if self.variant == DIGITS_VARIANT and shipped(*DIGITS_CHECKPOINT).is_file():
            return shipped(*DIGITS_CHECKPOINT)  # the shipped trained digits model
        return None


@dataclass
class BuiltModel:
    model: VisionTransformer
    preprocess: Preprocess
    checkpoint: Checkpoint | None
    notes: list[str] = field(default_factory=list)


def build_config(spec: ModelSpec):
    """The model config a spec gives, without reading weights (the checkpoint's class count aside)."""
    variant = get_variant(spec.variant)
    return variant.config(img_size=spec.img_size, num_classes=spec.num_classes)


def build(spec: ModelSpec) -> BuiltModel:
    """Build the reference model and load its weights (random but deterministic without a checkpoint)."""
    if spec.pos_embed_interp not in METHODS:
        raise VitexportError(f"Unknown --pos-embed-interp {spec.pos_embed_interp!r}; choose one of: {', '.join(METHODS)}.")
    variant = get_variant(spec.variant)
    ckpt_path = spec.resolved_checkpoint()
    ckpt = load_checkpoint(ckpt_path) if ckpt_path is not None else None
    overrides: dict = {}
    if ckpt is not None:
        for key in ("norm_eps", "qkv_bias"):
            if key in ckpt.hints:
                overrides[key] = ckpt.hints[key]
    num_classes = spec.num_classes
    if num_classes is None and ckpt is not None:
        num_classes = ckpt.num_classes  # follow the checkpoint's head (0: a feature extractor)
    if num_classes is not None and num_classes < 0:
        raise VitexportError("--num-classes must be 0 (features) or positive.")
    cfg = variant.config(img_size=spec.img_size, num_classes=num_classes, **overrides)
    model = build_model(cfg, seed=spec.seed)
    notes: list[str] = []
    if ckpt is not None:
        notes += load_into(model, ckpt, spec.pos_embed_interp)
    else:
        notes.append(f"No checkpoint: deterministic random weights (seed {spec.seed}). Latency is real, "
                     "accuracy is meaningless.")
    return BuiltModel(model.eval(), variant.preprocess(cfg.img_size), ckpt, notes)


def spec_differences(spec: ModelSpec, manifest: dict) -> list[str]:
    """How an existing export differs from what `spec` asks for; empty when it is that model."""
    diffs = []
    if manifest.get("variant") != spec.variant:
        diffs.append(f"it is {manifest.get('variant')}, not {spec.variant}")
    have = (manifest.get("checkpoint") or {}).get("sha256")
    ckpt = spec.resolved_checkpoint()
    if ckpt is None and have:
        diffs.append("it was made from a checkpoint, not from random weights")
    elif ckpt is not None:
        if not ckpt.exists():
            raise VitexportError(f"Checkpoint {ckpt} does not exist.")
        if sha256_file(resolve_weights(ckpt)[0]) != have:
            diffs.append(f"it was made from {'random weights' if not have else 'another checkpoint'}, not {ckpt}")
    if spec.num_classes is not None and spec.num_classes != manifest.get("num_classes"):
        diffs.append(f"it has {manifest.get('num_classes')} classes, not {spec.num_classes}")
    if spec.pos_embed_interp != manifest.get("pos_embed_interp"):
        diffs.append(f"its position embedding was resized with {manifest.get('pos_embed_interp')}")
    return diffs


def default_output_dir(spec: ModelSpec, img_size: tuple[int, int]) -> Path:
    return artifacts_dir() / f"{spec.variant}-{img_size[0]}x{img_size[1]}"


# -- export -------------------------------------------------------------------------------------------------

def _scope_of(node) -> str:
    """The module path a node came from ('blocks.0.attn.qkv'), read from the exporter's metadata."""
    for p in node.metadata_props:
        if p.key == "namespace":
            mods = [part.split(":")[0].strip() for part in p.value.split("/")[:-1]]
            mods = [m for m in mods if m]
            return mods[-1] if mods else ""
    return ""


def _tidy_graph(model_proto) -> None:
    """Readable, stable node names ('blocks.3.mlp.fc1/MatMul') and no exporter metadata (it holds local paths)."""
    seen: dict[str, int] = {}
    for node in model_proto.graph.node:
        scope = _scope_of(node)
        base = f"{scope}/{node.op_type}" if scope else node.op_type
        count = seen.get(base, 0)
        seen[base] = count + 1
        node.name = base if count == 0 else f"{base}_{count}"
        del node.metadata_props[:]
    for vi in list(model_proto.graph.input) + list(model_proto.graph.output):
        del vi.metadata_props[:]
    del model_proto.metadata_props[:]


def _set_metadata(model_proto, meta: dict[str, str]) -> None:
    for k, v in meta.items():
        entry = model_proto.metadata_props.add()
        entry.key, entry.value = k, v


def export_onnx(model: VisionTransformer, out_path: Path, opset: int = DEFAULT_OPSET,
                metadata: dict[str, str] | None = None, example_batch: int = 2) -> Path:
    """Export with a symbolic batch axis to `out_path` atomically (external data beside it for > 2 GB models)."""
    import onnx

    if opset < 17:
        raise VitexportError(f"--opset {opset} is too old: LayerNormalization needs opset 17 or newer.")
    if example_batch < 2:
        raise VitexportError("The example batch must be at least 2 (size-1 dimensions get specialised).")
    model = model.eval()
    model.set_fused_attn(False)  # explicit MatMul/Softmax: what every runtime and quantizer understands
    cfg = model.cfg
    x = torch.randn(example_batch, cfg.in_chans, *cfg.img_size)
    batch = torch.export.Dim("batch", min=1, max=65536)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmpdir = Path(tempfile.mkdtemp(prefix=".export-", dir=out_path.parent))
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                model, (x,), dynamo=True, input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                dynamic_shapes={"x": {0: batch}}, opset_version=opset, optimize=True, verbose=False,
            )
        proto = program.model_proto
        _tidy_graph(proto)
        _set_metadata(proto, metadata or {})
        proto.producer_name, proto.producer_version = "vitexport", __version__
        nbytes = sum(p.numel() * p.element_size() for p in model.state_dict().values())
        external = nbytes > PROTOBUF_LIMIT
        tmp_onnx = tmpdir / out_path.name
        data_name = out_path.name + ".data"
        if external:
            onnx.save_model(proto, tmp_onnx, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=data_name, size_threshold=1024)
        else:
            onnx.save_model(proto, tmp_onnx)
        onnx.checker.check_model(str(tmp_onnx))  # by path: works for external data
        # data file first, then the model: a reader never sees a model without its weights
        old_data = out_path.parent / data_name
        if external:
            os.chmod(tmpdir / data_name, 0o644)  # onnx writes the data file 0600; artifacts get the usual mode
            os.replace(tmpdir / data_name, old_data)
        os.replace(tmp_onnx, out_path)
        if not external and old_data.exists():
            old_data.unlink()
    except VitexportError:
        raise
    except onnx.checker.ValidationError as e:
        raise VitexportError(f"The exported ONNX failed onnx.checker: {str(e).splitlines()[0]}") from None
    except OSError as e:
        raise VitexportError(f"Could not write {out_path}: {e.strerror or e}.") from None
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return out_path


# -- verification -------------------------------------------------------------------------------------------

@dataclass
class BatchCheck:
    batch: int
    stats: ParityStats
    passed: bool

    def to_dict(self) -> dict:
        return {"batch": self.batch, "passed": self.passed, **self.stats.to_dict()}


def check_onnx_against_torch(onnx_path: Path, model: VisionTransformer, batches: tuple[int, ...] = (1, 3),
                             atol: float = DEFAULT_ATOL, seed: int = 0, log: Log = QUIET) -> list[BatchCheck]:
    """Run the ONNX in ONNX Runtime (CPU) and the model in PyTorch on the same inputs, per batch size."""
    from .backends.ort_session import create_session

    sess = create_session(onnx_path)
    gen = torch.Generator().manual_seed(seed)
    cfg = model.cfg
    checks = []
    for b in batches:
        x = torch.randn(b, cfg.in_chans, *cfg.img_size, generator=gen)
        with torch.no_grad():
            ref = model(x).numpy()
        out = sess.run([OUTPUT_NAME], {INPUT_NAME: x.numpy()})[0]
        if out.shape != ref.shape:
            raise ParityError(f"ONNX output shape {out.shape} differs from PyTorch {ref.shape} at batch {b}.")
        stats = compare(ref, out)
        ok = stats.max_abs <= atol and stats.cos_min >= 0.99999
        checks.append(BatchCheck(b, stats, ok))
        log.info(f"batch {b:>3}: max abs diff {stats.max_abs:.2e}, min cosine {stats.cos_min:.7f} "
                 f"-> {'ok' if ok else 'FAIL'}")
    return checks


# -- the whole job ------------------------------------------------------------------------------------------

@dataclass
class ExportResult:
    onnx_path: Path
    manifest_path: Path
    manifest: dict
    checks: list[BatchCheck]
    notes: list[str]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)


def versions() -> dict[str, str]:
    import onnx
    import onnxruntime

    return {"vitexport": __version__, "torch": torch.__version__, "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__, "python": platform.python_version()}


def _provenance(manifest: dict) -> dict:
    """The fields that make two exports the same model."""
    ck = manifest.get("checkpoint") or {}
    return {"variant": manifest.get("variant"), "config": manifest.get("config"),
            "checkpoint_sha256": ck.get("sha256"), "seed": manifest.get("seed"),
            "pos_embed_interp": manifest.get("pos_embed_interp")}


def run_export(spec: ModelSpec, output: Path | None = None, opset: int = DEFAULT_OPSET,
               check_batches: tuple[int, ...] = (1, 3), atol: float = DEFAULT_ATOL, force: bool = False,
               log: Log = QUIET) -> ExportResult:
    """Build -> export -> check -> manifest. Raises ParityError (exit 1) when ONNX and PyTorch disagree."""
    with log.step(f"Building {spec.variant}"):
        built = build(spec)
    for n in built.notes:
        log.warn(n) if ("untrained" in n or "meaningless" in n or "dropped" in n) else log.info(n)
    model = built.model
    cfg = model.cfg
    out_dir = Path(output) if output is not None else default_output_dir(spec, cfg.img_size)
    if out_dir.suffix == ".onnx":
        onnx_path = out_dir
        out_dir = out_dir.parent
    else:
        onnx_path = out_dir / "model.onnx"
    if out_dir.exists() and not out_dir.is_dir():
        raise VitexportError(f"Output {out_dir} exists and is not a folder.")
    if onnx_path.is_dir():
        raise VitexportError(f"Output {onnx_path} is a folder; give a folder or a .onnx file path.")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise VitexportError(f"Cannot create the output folder {out_dir}: {e.strerror or e}.") from None
    if not os.access(out_dir, os.W_OK):
        raise VitexportError(f"The output folder {out_dir} is not writable.")

    ckpt = built.checkpoint
    manifest = {
        "format": "vitexport-manifest/1",
        "variant": spec.variant,
        "img_size": list(cfg.img_size),
        "patch_size": list(cfg.patch_size),
        "grid": list(cfg.grid_size),
        "num_classes": cfg.num_classes,
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.to_dict().items()},
        "preprocess": built.preprocess.to_dict(),
        "checkpoint": None if ckpt is None else {"path": str(ckpt.path.resolve()), "sha256": ckpt.sha256,
                                                 "format": ckpt.format},
        "seed": spec.seed if ckpt is None else None,
        "pos_embed_interp": spec.pos_embed_interp,
        "opset": opset,
        "onnx": onnx_path.name,
        "input_name": INPUT_NAME,
        "output_name": OUTPUT_NAME,
        "input_shape": ["batch", cfg.in_chans, *cfg.img_size],
        "output_shape": (["batch", cfg.num_classes] if cfg.num_classes else ["batch", cfg.embed_dim])
        if cfg.global_pool else ["batch", "tokens", cfg.num_classes or cfg.embed_dim],
        "versions": versions(),
    }
    existing = out_dir / MANIFEST_NAME
    previous: dict = {}
    if existing.is_file():
        try:
            previous = json.loads(existing.read_text())
        except (OSError, json.JSONDecodeError):
            previous = {}
    previous_onnx = out_dir / str(previous.get("onnx", onnx_path.name))
    if previous and (onnx_path.exists() or previous_onnx.exists()) and not force:
        if _provenance(previous) != _provenance(manifest):
            raise VitexportError(
                f"{out_dir} already holds an export of another model or checkpoint; pass --force to replace it "
                f"or --output to write elsewhere.")

    meta = {"vitexport.version": __version__, "vitexport.variant": spec.variant,
            "vitexport.preprocess": json.dumps(built.preprocess.to_dict()),
            "input_size": json.dumps(list(cfg.img_size)), "mean": json.dumps(list(built.preprocess.mean)),
            "std": json.dumps(list(built.preprocess.std)), "crop_pct": str(built.preprocess.crop_pct),
            "interpolation": built.preprocess.interpolation, "num_classes": str(cfg.num_classes),
            "pos_embed_interp": spec.pos_embed_interp}
    # export next to the target, check it there, and only then move it into place: a failed check never
    # replaces a good model
    staging = out_dir / f".staging-{os.getpid()}.onnx"
    try:
        with log.step(f"Exporting ONNX (opset {opset}, symbolic batch)"):
            export_onnx(model, staging, opset=opset, metadata=meta)
        with log.step(f"Checking ONNX Runtime against PyTorch at batch {', '.join(map(str, check_batches))}"):
            checks = check_onnx_against_torch(staging, model, check_batches, atol=atol, log=log)
        manifest["parity"] = {"atol": atol, "checks": [c.to_dict() for c in checks]}
        if not all(c.passed for c in checks):
            worst = max(c.stats.max_abs for c in checks)
            cos = min(c.stats.cos_min for c in checks)
            raise ParityError(f"ONNX Runtime and PyTorch disagree: max abs diff {worst:.3g} (allowed {atol:g}), "
                              f"min cosine {cos:.7f} (allowed 0.99999); the previous model (if any) was kept.")
        data = staging.with_name(staging.name + ".data")
        final_data = onnx_path.with_name(onnx_path.name + ".data")
        if data.exists():
            os.replace(data, final_data)
            _relink_external_data(staging, final_data.name)
        os.replace(staging, onnx_path)
        if not data.exists() and final_data.exists() and not _uses_external_data(onnx_path):
            final_data.unlink()  # left by an earlier, larger export of this name
    finally:
        for p in (staging, staging.with_name(staging.name + ".data")):
            if p.exists():
                p.unlink()
    manifest["onnx_sha256"] = sha256_file(onnx_path)
    manifest["onnx_bytes"] = onnx_path.stat().st_size
    manifest["precisions"] = {}
    if previous.get("onnx_sha256") == manifest["onnx_sha256"]:
        manifest["precisions"] = previous.get("precisions", {})  # same bytes: derived models stay valid
    else:
        for stale in DERIVED_FILES:  # made from another model: remove rather than leave a mismatched pair
            if (out_dir / stale).exists():
                (out_dir / stale).unlink()
                log.info(f"Removed {stale}: it was made from the previous model.")
    mpath = write_manifest(out_dir, manifest)
    return ExportResult(onnx_path, mpath, manifest, checks, built.notes)


def _uses_external_data(onnx_path: Path) -> bool:
    import onnx

    proto = onnx.load(str(onnx_path), load_external_data=False)
    return any(init.data_location == onnx.TensorProto.EXTERNAL for init in proto.graph.initializer)


def _relink_external_data(onnx_path: Path, location: str) -> None:
    """Point the tensors of a staged model at the final data file name."""
    import onnx

    proto = onnx.load(str(onnx_path), load_external_data=False)
    for init in proto.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save_model(proto, str(onnx_path))


def model_from_manifest(manifest: dict) -> VisionTransformer:
    """Rebuild the PyTorch model an export was made from (same config, same weights)."""
    from .model import ViTConfig

    cfg_dict = dict(manifest["config"])
    cfg = ViTConfig(**cfg_dict)
    ck = manifest.get("checkpoint")
    if not ck:
        return build_model(cfg, seed=int(manifest.get("seed") or 0))
    path = Path(ck["path"])
    if not path.exists():
        raise VitexportError(f"the checkpoint {path} named in the manifest is gone")
    ckpt = load_checkpoint(path)
    if ckpt.sha256 != ck["sha256"]:
        raise VitexportError(f"the checkpoint {path} changed since the export (sha256 differs)")
    model = build_model(cfg)
    load_into(model, ckpt, manifest.get("pos_embed_interp", DEFAULT_METHOD))
    return model.eval()
