"""`export` (by name, checkpoint or model object) and `quantize`: the steps that make model files."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import VitexportError
from .results import ExportResult, Progress, QuantizeResult, _log, _parity

if TYPE_CHECKING:
    from ..ensure import Artifact
    from ..model.spec import ExportOptions


def _model_ref(model: str | Path | None, checkpoint: str | Path | None) -> tuple[str | None, str | Path | None]:
    """`model` as the CLI's -m and -c: a name (ARCH, ARCH.TAG) is -m; an hf-hub: reference or an existing path is
    the checkpoint (its config names the model)."""
    if model is None:
        return None, checkpoint
    text = str(model)
    if text.startswith("hf-hub:") or isinstance(model, Path) or Path(text).exists():
        if checkpoint is not None:
            raise VitexportError(f"{text} is a checkpoint already; give `checkpoint` with a model name only.")
        return None, text
    return text, checkpoint


def export(model: str | Path | None = None, *, checkpoint: str | Path | None = None,
           img_size: int | tuple[int, int] | None = None, num_classes: int | None = None,
           output: str | Path | None = None, dynamic_img_size: bool = False,
           img_size_range: tuple[tuple[int, int], tuple[int, int]] | None = None, outputs: str | None = None,
           pos_embed_interp: str | None = None, opset: int | None = None, atol: float | None = None,
           check_batches: tuple[int, ...] = (1, 3), force: bool = False, sampling: str | None = None,
           progress: Progress | None = None) -> ExportResult:
    """`vitexport onnx`: build the model, load its weights, export ONNX with a symbolic batch and check it against
    PyTorch in ONNX Runtime. `model`: a timm architecture or tagged name, an hf-hub: reference, or a checkpoint file
    or folder (its config names the model); None: the default model. `output`: the folder (default
    models/<variant>-<H>x<W>/). `sampling`: a detector's deformable attention, 'grid_sample' or 'gather' (None: its
    default; docs/DETECTION.md). Raises ParityError when ONNX Runtime and PyTorch disagree."""
    from ..ensure import ensure_artifact
    from ..model.spec import spec_for
    from ..preflight import check_export

    if model is not None and not isinstance(model, (str, Path)):
        if checkpoint is not None or img_size is not None or num_classes is not None:
            raise VitexportError("A model object is exported with its own weights, image size and head: give "
                                 "checkpoint, img_size and num_classes with a model name only.")
        return _export_object(model, output=output, dynamic_img_size=dynamic_img_size,
                              img_size_range=img_size_range, outputs=outputs, pos_embed_interp=pos_embed_interp,
                              opset=opset, atol=atol, check_batches=check_batches, force=force, progress=progress,
                              sampling=sampling)
    name, ckpt = _model_ref(model, checkpoint)
    size = (img_size, img_size) if isinstance(img_size, int) else img_size
    spec = spec_for(name, ckpt, size, num_classes=num_classes, pos_embed_interp=pos_embed_interp,
                    dynamic_img_size=dynamic_img_size, img_size_range=img_size_range)
    opts = _export_options(check_batches, force, outputs, opset, atol, sampling=sampling)
    check_export(spec, opts.check_batches)
    artifact = ensure_artifact(None if output is None else Path(output), "fp32", spec=spec, export_opts=opts,
                               fresh=True, log=_log(progress))
    return _export_result(artifact)


def _export_options(check_batches: tuple[int, ...], force: bool, outputs: str | None, opset: int | None,
                    atol: float | None, **reference: Any) -> "ExportOptions":
    """ExportOptions from export()'s keywords (None: the option's default); `reference`: a model object's."""
    from ..model.spec import ExportOptions

    opts = ExportOptions(check_batches=tuple(check_batches), force=force, outputs=outputs, **reference)
    if opset is not None:
        opts.opset = opset
    if atol is not None:
        opts.atol = atol
    return opts


def _export_result(artifact: "Artifact") -> ExportResult:
    result = artifact.export
    checks = [] if result is None else [_parity(c.stats, "pass" if c.passed else "fail") for c in result.checks]
    against = [] if result is None else \
        [_parity(c.stats, "pass" if c.passed else "fail") for c in result.object_checks]
    return ExportResult(folder=artifact.folder.path, onnx=artifact.path, manifest=artifact.folder.manifest_path,
                        checks=checks, notes=[] if result is None else list(result.notes), object_checks=against)


def _export_object(obj: object, *, output: str | Path | None, dynamic_img_size: bool,
                   img_size_range: tuple[tuple[int, int], tuple[int, int]] | None, outputs: str | None,
                   pos_embed_interp: str | None, opset: int | None, atol: float | None,
                   check_batches: tuple[int, ...], force: bool, progress: Progress | None,
                   sampling: str | None = None) -> ExportResult:
    """A timm or transformers model object: its weights and what it is written as a checkpoint folder inside the
    model folder (model.readers.objects), exported like any checkpoint, and checked against the object's own forward."""
    import shutil
    import tempfile

    from ..ensure import ensure_artifact
    from ..model.readers.objects import OBJECT_OUTPUTS, cpu_copy, describe_object, drop_source, object_output, \
        prune_sources, write_checkpoint
    from ..model.spec import ModelSpec, safe_name, spec_for
    from ..preflight import check_export

    held = describe_object(obj)
    what = f"the {type(obj).__name__} object"
    if held.kind == "timm":
        from ..model.variants import get_variant

        try:
            get_variant(held.name)
        except VitexportError:
            raise VitexportError(f"{what[0].upper()}{what[1:]} is timm's {held.name}, which vitexport does not build "
                                 f"(`vitexport models` lists the architectures it does).") from None

    def spec_at(ckpt: Path) -> ModelSpec:
        try:
            spec = spec_for(None, ckpt, None, pos_embed_interp=pos_embed_interp, dynamic_img_size=dynamic_img_size,
                            img_size_range=img_size_range)
        except VitexportError as e:
            raise VitexportError(str(e).replace(str(ckpt), what)) from None
        if held.kind == "transformers" and spec.arch is not None:  # named after its type, not the folder's digest
            from dataclasses import replace

            name = safe_name(held.name) or "transformers"
            spec = replace(spec, variant=name, arch=replace(spec.arch, name=name))
        return spec

    log = _log(progress)
    module = cpu_copy(held)  # written out, then the check's reference
    with tempfile.TemporaryDirectory(prefix="vitexport-object-") as tmp:
        log.info(f"Writing {what}'s weights ({held.kind} {held.name})")
        staged = write_checkpoint(held, module, Path(tmp))
        folder = Path(output) if output is not None else spec_at(staged).default_folder().path
        final = folder / staged.relative_to(tmp)
        existed = final.is_dir()
        if not existed:
            final.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(staged), str(final))
    opts = _export_options(check_batches, force, outputs, opset, atol, sampling=sampling,
                           reference=lambda x, names: [object_output(held, module, x, n) for n in names],
                           reference_outputs=OBJECT_OUTPUTS[held.kind], reference_name=what)
    try:
        spec = spec_at(final)
        check_export(spec, opts.check_batches)
        artifact = ensure_artifact(folder, "fp32", spec=spec, export_opts=opts, fresh=True, log=log)
    except BaseException:
        if not existed:  # the weights another export of this folder was made from are never touched
            drop_source(final)
        raise
    prune_sources(folder, keep=final)  # the weights of a model this export replaced
    return _export_result(artifact)


def quantize(folder: str | Path, precision: str, *, target: str = "cpu", calib_data: str | Path | None = None,
             calib_samples: int | None = None, check: bool = True, check_data: str | Path | None = None,
             quantize_attention: bool | None = None, smoothquant: float | None = None,
             min_cos: float | None = None, max_drop: float | None = None, dense_target: float | None = None,
             weight_bits: int | None = None, progress: Progress | None = None) -> list[QuantizeResult]:
    """`vitexport quantize --fp16 | --int8 | --fp8 [--target cpu|tensorrt|all]` on an exported folder (or its
    model.onnx): each graph made and checked against FP32 on held-out images, one result per graph. Raises
    ParityError when a graph misses its bounds (the file is not kept). weight_bits: the CPU INT8 graph's weights, 7
    or 8 bits (None: 8 where this CPU sums INT8 products exactly, with VNNI or AMX, else 7)."""
    from ..ensure import ensure_artifact
    from ..precision.settings import GRAPH_KINDS, calib_options, graph_kinds

    if precision not in GRAPH_KINDS:
        raise VitexportError(f"Unknown precision {precision!r}: choose one of {', '.join(GRAPH_KINDS)}.")
    if target not in GRAPH_KINDS[precision]:
        raise VitexportError(f"Unknown target {target!r}: choose one of {', '.join(GRAPH_KINDS[precision])}.")
    if precision == "fp16" and smoothquant is not None:
        raise VitexportError("smoothquant is for int8 and fp8.")
    if weight_bits is not None and "int8" not in graph_kinds(precision, target):
        raise VitexportError("weight_bits sets the CPU INT8 graph's weights (int8 with target cpu or all).")
    calib = calib_options(calib_data=calib_data, calib_samples=calib_samples, quantize_attention=quantize_attention,
                          smoothquant=smoothquant, min_cos=min_cos, max_drop=max_drop, dense_target=dense_target,
                          weight_bits=weight_bits, check_data=check_data,
                          no_check=not check)
    log, results = _log(progress), []
    for kind in graph_kinds(precision, target):
        artifact = ensure_artifact(Path(folder), kind, calib=calib, fresh=True, log=log)
        made = artifact.precision
        verdict = None if made is None else made.verdict
        results.append(QuantizeResult(kind=kind, onnx=artifact.path, made=artifact.made,
                                      parity=None if verdict is None else _parity(verdict.stats, verdict.status)))
    return results
