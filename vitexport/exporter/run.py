"""`vitexport onnx` as a library call: build -> export -> check against PyTorch -> manifest.

A failed check never replaces a previous good model; an export of other weights never silently replaces an
existing one (force=True does); files made from a previous export with other bytes are removed.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..artifacts.folder import ModelFolder
from ..artifacts.manifest import BatchCheck, ExportParity, Manifest
from ..artifacts.workspace import writing
from ..environment import versions
from ..errors import VitexportError
from ..model.spec import ExportOptions, ModelSpec, SizeRange, check_range, check_sizes, default_range
from ..parity.compare import EXPORT_THRESHOLDS, export_thresholds
from ..paths import sha256_file
from ..preflight import check_export, check_opset
from ..progress import QUIET, Log
from .check import check_onnx, check_onnx_against_torch, ranks_queries, require_parity
from .decoder import io_shapes, staged_decoder
from ..model.outputs import default_outputs, parse_outputs, primary
from ..model.outputs import shapes as output_shapes
from .to_onnx import INPUT_NAME, OUTPUT_NAME, onnx_metadata, staged_onnx
from .torch_model import BuiltModel, build


@dataclass
class ExportResult:
    folder: ModelFolder
    onnx_path: Path
    manifest: Manifest
    checks: list[BatchCheck]
    notes: list[str]
    object_checks: list[BatchCheck] = field(default_factory=list)  # against ExportOptions.reference, when given

    @property
    def manifest_path(self) -> Path:
        return self.folder.manifest_path

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)


def size_range(spec: ModelSpec, built: BuiltModel) -> SizeRange | None:
    """A dynamic-size export's image size range (the spec's, checked, or the default); None for a fixed size."""
    cfg = built.model.cfg
    if not cfg.dynamic_img_size:
        return None
    return check_range(spec.img_size_range or default_range(cfg.img_size, cfg.patch_size), cfg.img_size,
                       cfg.patch_size)


def new_manifest(spec: ModelSpec, built: BuiltModel, onnx_name: str, opset: int,
                 img_size_range: SizeRange | None = None, outputs: tuple[str, ...] | None = None) -> Manifest:
    """The manifest of an export, before its file exists (no digests, no parity yet); img_size_range: a
    dynamic-size export's (size_range); outputs: the graph's (model.outputs; None: the model's default)."""
    cfg, ckpt = built.model.cfg, built.checkpoint
    outputs = outputs or default_outputs(cfg)
    shape = output_shapes(cfg, outputs)
    return Manifest(
        variant=spec.variant, img_size=cfg.img_size, patch_size=cfg.patch_size, grid=cfg.grid_size,
        num_classes=cfg.num_classes,
        config={k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.to_dict().items()},
        preprocess=built.preprocess,
        checkpoint=None if ckpt is None else ckpt.record(), labels=built.labels,
        seed=spec.seed if ckpt is None else None, pos_embed_interp=spec.pos_embed_interp, opset=opset,
        onnx=onnx_name, input_name=INPUT_NAME, output_name=primary(outputs, cfg),
        input_shape=["batch", cfg.in_chans, *(("height", "width") if cfg.dynamic_img_size else cfg.img_size)],
        output_shape=shape[primary(outputs, cfg)], versions=versions(with_python=True), img_size_range=img_size_range,
        outputs=None if outputs == (OUTPUT_NAME,) else shape,
    )


def _target(spec: ModelSpec, output: Path | None, built: BuiltModel) -> ModelFolder:
    folder = ModelFolder.for_output(output) if output is not None else \
        ModelFolder.default_for(spec.variant, built.model.cfg.img_size, built.model.cfg.dynamic_img_size)
    if folder.onnx().is_dir():
        raise VitexportError(f"Output {folder.onnx()} is a folder; give a folder or a .onnx file path.")
    return folder.create()


def _previous(folder: ModelFolder, manifest: Manifest, force: bool) -> Manifest | None:
    """The manifest of the export already in the folder (None if unreadable); refuses another model without force,
    and a folder whose manifest cannot be read (so nobody can tell what it holds) too."""
    if not folder.has_manifest():
        return None
    try:
        previous = folder.read_manifest()
    except VitexportError as e:
        held = [p for p in [folder.onnx(), *folder.derived_files()] if p.exists()]
        if held and not force:
            why = str(e).split(";")[0].rstrip(".")
            raise VitexportError(f"{folder.path} holds {held[0].name}, but its manifest cannot be read ({why}), so "
                                 f"nothing says which model it is; pass --force to replace it, or --output to write "
                                 f"elsewhere.") from None
        return None
    present = folder.onnx().exists() or (folder.path / previous.onnx).exists()
    if present and not force and previous.provenance() != manifest.provenance():
        raise VitexportError(f"{folder.path} already holds an export of another model or checkpoint; pass --force "
                             f"to replace it or --output to write elsewhere.")
    return previous


def _keep_or_remove_derived(folder: ModelFolder, manifest: Manifest, previous: Manifest | None, log: Log) -> None:
    """Same bytes as before: derived models stay valid. Other bytes: remove them rather than leave a mismatch."""
    if previous is not None and previous.onnx_sha256 == manifest.onnx_sha256:
        manifest.precisions = previous.precisions
        return
    for stale in folder.derived_files():
        if stale.exists():
            stale.unlink()
            log.info(f"Removed {stale.name}: it was made from the previous model.")


def run_export(spec: ModelSpec, output: Path | None = None, opts: ExportOptions | None = None,
               log: Log = QUIET) -> ExportResult:
    """Build -> export -> check -> manifest. Raises ParityError (exit 1) when ONNX and PyTorch disagree.

    Refused before any work: an opset the installed onnx does not know, an --img-size or check batch that cannot
    fit in memory. The folder is locked from the check of what it holds to the manifest (workspace.writing).
    """
    opts = opts or ExportOptions()
    if opts.sampling is not None:
        spec = replace(spec, sampling=opts.sampling)
    check_opset(opts.opset)
    check_export(spec, opts.check_batches)
    with log.step(f"Building {spec.variant}"):
        built = build(spec)
    for n in built.notes:
        log.warn(n) if ("untrained" in n or "meaningless" in n or "dropped" in n) else log.info(n)
    rng = size_range(spec, built)  # a range that cannot be: refused before the folder is made
    parse_outputs(opts.outputs, built.model.cfg)  # so are outputs the model does not have
    folder = _target(spec, output, built)
    with writing(folder, log, temporaries=False):  # torch keeps its own cache under the system's temp folder
        return _export_into(folder, spec, built, opts, rng, log)


def _export_into(folder: ModelFolder, spec: ModelSpec, built: BuiltModel, opts: ExportOptions,
                 rng: SizeRange | None, log: Log) -> ExportResult:
    onnx_path = folder.onnx()
    outputs = parse_outputs(opts.outputs, built.model.cfg)
    manifest = new_manifest(spec, built, onnx_path.name, opts.opset, rng, outputs)
    previous = _previous(folder, manifest, opts.force)
    thresholds = export_thresholds(opts.atol)
    if opts.atol == EXPORT_THRESHOLDS.max_abs and getattr(built.model, "thresholded", False):
        thresholds = replace(thresholds, max_abs=None)  # a threshold in the graph: the cosine bound judges
        log.info("EoMT's attention masks threshold mask logits at 0, which float rounding may cross in another "
                 "runtime: the export is judged by its cosine to PyTorch (another --atol sets a max abs bound too).")
    meta = onnx_metadata(spec.variant, built.preprocess, built.model.cfg.num_classes, spec.pos_embed_interp, rng)
    batches = ", ".join(map(str, opts.check_batches))
    sizes = None if rng is None else check_sizes(built.model.cfg.img_size, rng)
    axes = "symbolic batch" if rng is None else \
        f"symbolic batch and image size {rng[0][0]}x{rng[0][1]} to {rng[1][0]}x{rng[1][1]}"
    at = "" if sizes is None else " and image size " + ", ".join(f"{h}x{w}" for h, w in sizes)
    with ExitStack() as stack:  # the export is moved into place only after its check passed
        with log.step(f"Exporting ONNX (opset {opts.opset}, {axes})"):
            staged = stack.enter_context(staged_onnx(built.model, onnx_path, opts.opset, meta, img_size_range=rng,
                                                     outputs=outputs))
        with log.step(f"Checking ONNX Runtime against PyTorch at batch {batches}{at}"):
            checks = check_onnx_against_torch(staged, built.model, opts.check_batches, thresholds, log=log,
                                              sizes=sizes, outputs=outputs)
        require_parity(checks, thresholds, relative=built.model.cfg.dense is not None)
        object_checks = []
        names = tuple(o for o in outputs if o in opts.reference_outputs)
        if opts.reference is not None and names:
            cfg, reference = built.model.cfg, opts.reference
            with log.step(f"Checking ONNX Runtime against {opts.reference_name} at batch {batches}"):
                object_checks = check_onnx(staged, lambda x: reference(x, names), names, cfg.in_chans,
                                           [cfg.img_size], opts.check_batches, thresholds, log=log,
                                           against=opts.reference_name, ranked=ranks_queries(cfg))
            require_parity(object_checks, thresholds, opts.reference_name)
        decoder = getattr(built.model, "decoder", None)
        if decoder is not None:  # SAM: the prompt encoder and mask decoder, moved into place with the encoder
            with log.step("Exporting and checking the prompt decoder graph (1, 2 and 5 points, a box, a mask)"):
                staged_dec, dec_checks = stack.enter_context(staged_decoder(decoder, folder.decoder(), opts.opset))
            manifest.decoder = {"onnx": folder.decoder().name, "sha256": sha256_file(staged_dec),
                                "bytes": staged_dec.stat().st_size, **io_shapes(decoder),
                                "checks": [c.to_dict() for c in dec_checks]}
            worst = max(c.max_abs for c in dec_checks)
            log.info(f"decoder graph: relative max abs diff {worst:.2e} over {len(dec_checks)} prompt shapes -> ok")
    if manifest.decoder is None and folder.decoder().exists():
        folder.decoder().unlink()  # a previous export's decoder: not this model's
        log.info(f"Removed {folder.decoder().name}: it was the previous model's.")
    manifest.parity = ExportParity(opts.atol, checks)
    manifest.onnx_sha256, manifest.onnx_bytes = sha256_file(onnx_path), onnx_path.stat().st_size
    _keep_or_remove_derived(folder, manifest, previous, log)
    folder.write_manifest(manifest)
    return ExportResult(folder, onnx_path, manifest, checks, built.notes, object_checks)
