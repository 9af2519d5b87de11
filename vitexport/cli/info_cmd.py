"""`vitexport info [MODEL_DIR] [--clean]`: what a model folder holds, each file verified, and what is stale."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import VitexportError
from .groups import QUIET, use


def _kind(m) -> str:
    """What the model gives: its classes, or a dense model's task and outputs."""
    dense = m.dense
    if dense is None:
        return f"{m.num_classes or 'no'} classes"
    task = dense.get("task")
    what = f"depth ({dense.get('depth_type', 'relative')})" if task == "depth" else \
        f"detection ({dense.get('num_labels')} labels, {dense.get('num_queries')} queries)" if task == "detection" \
        else f"segmentation ({dense.get('num_labels')} labels)"
    head = {'dpt': 'DPT', 'eomt': 'EoMT', 'rf_detr': 'RF-DETR'}.get(dense.get('head', 'dpt'), '')
    return f"{head} {what}: {', '.join(m.output_names)}"


def _describe(status) -> list[str]:
    """The lines of one folder: the model, how it was exported, each file present with its verified digest."""
    from ..backends.ort_session import session_options

    m = status.manifest
    ck = "random weights" if m.checkpoint is None else \
        f"{m.checkpoint.path} ({m.checkpoint.format}, sha256 {m.checkpoint.sha256[:12]})"
    parity = "" if m.parity is None else ", checked at batch " + ", ".join(
        f"{c.batch}{'' if c.img_size is None else f' at {c.img_size[0]}x{c.img_size[1]}'} "
        f"({'passed' if c.passed else 'FAILED'})" for c in m.parity.checks)
    sizes = "" if m.img_size_range is None else \
        f" (default; any size from {m.img_size_range[0][0]}x{m.img_size_range[0][1]} to " \
        f"{m.img_size_range[1][0]}x{m.img_size_range[1][1]}, position embedding resampled with {m.pos_embed_interp})"
    versions = ", ".join(f"{k} {v}" for k, v in m.versions.items() if v)
    lines = [f"{status.folder.path}",
             f"  model     {m.variant} {m.img_size[0]}x{m.img_size[1]}{sizes}, {_kind(m)}, {ck}",
             f"  export    opset {m.opset}{parity}; {versions}",
             f"  manifest  {m.format}",
             "  files"]
    for c in status.present:
        size = f"{c.path.stat().st_size:>12,} B"
        if c.ok:
            lines.append(f"    ok          {c.path.name:<26}{size}  sha256 {c.sha256}")
        else:
            lines.append(f"    {c.status.upper():<11} {c.path.name:<26}{size}  {c.reason}; {c.remedy}")
    for kind, rec in m.precisions.items():
        if rec.fp32_nodes:  # FP16 parts kept in FP32 by their measured ranges
            top = max((float(k.get("max") or 0) for k in rec.fp32_nodes), default=0.0)
            lines.append(f"  fp32      {kind}: {len(rec.fp32_nodes)} nodes kept in FP32 (tensors up to {top:.2g}): "
                         + ", ".join(k.get("node", "?") for k in rec.fp32_nodes[:4])
                         + (f" and {len(rec.fp32_nodes) - 4} more" if len(rec.fp32_nodes) > 4 else ""))
        # a file ONNX Runtime's default session options refuse (FP8; a folder written before the field: its rule)
        if needed := rec.onnxruntime or session_options(kind):
            options = ", ".join(f"{k}={v}" for k, v in needed.items())
            lines.append(f"  runtime   {rec.file}: ONNX Runtime runs it with {options} (its default, "
                         f"ORT_ENABLE_ALL, rewrites the FP8 Q/DQ into kernels without FP8 inputs); predict and bench "
                         f"set it")
    for p in status.orphans:
        lines.append(f"  STALE     {p.name}: a sidecar without its plan")
    if status.rejected:
        lines.append(f"  rejected  {', '.join(p.name for p in status.rejected)} (failed their parity check; kept "
                     f"for inspection)")
    if status.caches:
        total = sum(p.stat().st_size for p in status.caches)
        lines.append(f"  caches    {len(status.caches)} calibration cache(s), {total:,} B")
    for d in status.debris:
        lines.append(f"  LEFTOVER  {d.describe()}")
    return lines


@click.command("info")
@click.argument("model_dir", required=False, type=click.Path(path_type=Path), metavar="[MODEL_DIR]")
@click.option("--clean", is_flag=True, help="Remove stale files (derived files that do not verify, sidecars without "
                                             "a plan) and the leftovers of interrupted runs. Never the FP32 export.")
@use(QUIET)
def info_command(model_dir: Path | None, clean: bool, log):
    """Show a model folder: its manifest, every file with its verified sha256, and what is stale.

    Without MODEL_DIR: one line per model folder under models/ ($VITEXPORT_MODELS). Exits 1 when a file
    present does not verify (run with --clean to remove the stale ones).
    """
    from ..artifacts.folder import ModelFolder
    from ..artifacts.status import clean as clean_folder
    from ..artifacts.status import folder_status, model_folders, summary

    if model_dir is None:
        folders = model_folders()
        if not folders:
            raise VitexportError("No model folders under models/ (or $VITEXPORT_MODELS); give MODEL_DIR.")
    else:
        if not model_dir.exists():
            from ..model.variants import missing_path_sentence

            raise VitexportError(missing_path_sentence(model_dir, takes_name=False))
        folders = [ModelFolder.containing(model_dir)]
        if not folders[0].has_manifest():
            from ..model.readers.hub import checkpoint_refusal

            if (refusal := checkpoint_refusal(model_dir)) is not None:
                raise VitexportError(refusal)
    failed = 0
    for folder in folders:
        if clean:
            removed = clean_folder(folder, log)
            click.echo(f"{folder.path}: removed {len(removed)} file(s)" + (
                f": {', '.join(p.name for p in removed)}" if removed else ""))
        try:
            status = folder_status(folder)
        except VitexportError as e:
            if model_dir is not None:
                raise
            failed += 1
            click.echo(f"{folder.path}  {e}")
            continue
        failed += len(status.failed) + len(status.orphans)
        click.echo("\n".join(_describe(status)) if model_dir is not None else f"{folder.path}  {summary(status)}")
    if failed:
        raise VitexportError(f"{failed} problem(s) found; `vitexport info --clean` removes stale files and leftovers "
                             f"(a wrong FP32 export is replaced by re-exporting).", exit_code=1)
