"""`vitexport bench`: parity and latency of every available backend on the same real inputs."""

from __future__ import annotations

from pathlib import Path

import click

from ..bench import BenchOptions, run_bench
from ..compare import Thresholds
from ..errors import ParityError, VitexportError
from .groups import MODEL_KEYS, handle_errors, make_log, pop_keys, quiet_option, spec_from, target_options


def _threshold_overrides(specs: tuple[str, ...]) -> dict[str, Thresholds]:
    """--threshold int8.cos_min=0.99 -> {'int8': Thresholds(...)} on top of the defaults."""
    from dataclasses import replace

    from ..compare import DEFAULT_THRESHOLDS

    out: dict[str, Thresholds] = {}
    for s in specs:
        try:
            key, value = s.split("=", 1)
            prec, field_name = key.split(".", 1)
            base = out.get(prec) or DEFAULT_THRESHOLDS[prec]
            if field_name not in Thresholds.__dataclass_fields__:
                raise KeyError(field_name)
            out[prec] = replace(base, **{field_name: None if value.lower() == "none" else float(value)})
        except (ValueError, KeyError):
            raise click.BadParameter(f"{s!r}: expected PRECISION.FIELD=VALUE, e.g. int8.cos_min=0.99 "
                                     f"(fields: {', '.join(Thresholds.__dataclass_fields__)})",
                                     param_hint="--threshold") from None
    return out


@click.command("bench")
@target_options
@click.option("--data", type=click.Path(path_type=Path), default=None,
              help="Image folder (class subfolders give labels). Default: the shipped held-out set for the model.")
@click.option("--batch", "batches", type=int, multiple=True, help="Batch sizes (repeatable). Default: 1, 8 (GPU: 1, 8, 32).")
@click.option("--iterations", type=int, default=10, show_default=True, help="Timed runs per backend and batch, at least.")
@click.option("--min-time", type=float, default=1.0, show_default=True, help="Seconds of timed runs, at least.")
@click.option("--warmup", type=int, default=2, show_default=True)
@click.option("--threads", type=int, default=None, help="CPU threads for PyTorch and ONNX Runtime. Default: all cores.")
@click.option("--backend", "backends", multiple=True,
              help="Only backends whose name contains this (repeatable), e.g. 'onnxruntime', 'int8'.")
@click.option("--threshold", "threshold_specs", multiple=True, metavar="PREC.FIELD=VALUE",
              help="Override a parity threshold, e.g. int8.cos_min=0.99 (see docs/PARITY.md).")
@click.option("--strict", is_flag=True, help="Exit 1 when any backend misses a parity threshold.")
@click.option("--no-prepare", is_flag=True,
              help="Do not export or convert missing artifacts: bench only what exists (missing ones are listed).")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None)
@click.option("--markdown", "markdown_path", type=click.Path(path_type=Path), default=None)
@click.option("--csv", "csv_path", type=click.Path(path_type=Path), default=None)
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=None, help="PNG of throughput vs batch.")
@quiet_option
@handle_errors
def bench_command(model_path, data, batches, iterations, min_time, warmup, threads, backends, threshold_specs,
                  strict, no_prepare, json_path, markdown_path, csv_path, plot_path, quiet, **kwargs):
    """Run every available backend on the same inputs: parity against PyTorch FP32, and latency.

    MODEL_DIR is an exported model folder. Without it, the folder of --model (default: the default
    model) is used; missing ONNX, FP16 and INT8 artifacts are prepared first.
    """
    from ..precision import CalibOptions
    from ..precision.prepare import prepare_precision, resolve_model_dir
    from ..report import print_table, write_outputs

    for name, v in (("--iterations", iterations), ("--warmup", warmup)):
        if v < 0 or (name == "--iterations" and v < 1):
            raise click.BadParameter("must be positive", param_hint=name)
    if min_time < 0:
        raise click.BadParameter("must be >= 0", param_hint="--min-time")
    if threads is not None and threads < 1:
        raise click.BadParameter("must be at least 1", param_hint="--threads")
    if any(b < 1 for b in batches):
        raise click.BadParameter("batch sizes must be at least 1", param_hint="--batch")
    thresholds = _threshold_overrides(threshold_specs)
    outputs = {"--json": json_path, "--markdown": markdown_path, "--csv": csv_path, "--plot": plot_path}
    for flag, path in outputs.items():  # before minutes of work, not after
        if path is not None and (path.is_dir() or not (path.parent.is_dir() or not path.parent.exists())):
            raise click.BadParameter(f"{path} is a folder or lies under a file; give a file path", param_hint=flag)
    if data is not None and not data.exists():
        raise click.BadParameter(f"{data} does not exist", param_hint="--data")
    log = make_log(quiet)
    spec = spec_from(**pop_keys(kwargs, MODEL_KEYS))
    folder, manifest = resolve_model_dir(model_path, log, spec, export=not no_prepare)
    if not no_prepare:
        for prec in ("fp16", "int8"):
            # default options; the bench measures parity itself, on its own inputs
            try:
                prepare_precision(folder, prec, CalibOptions(check=False), log)
            except ParityError:
                raise
            except VitexportError as e:  # the backend is then listed as unavailable, with its file missing
                log.warn(f"Could not prepare the {prec.upper()} model: {e}")
        folder, manifest = resolve_model_dir(folder, log)
    opts = BenchOptions(data=data, batches=tuple(batches) or None, iterations=iterations, min_time=min_time,
                        warmup=warmup, threads=threads, backends=tuple(backends), thresholds=thresholds, strict=strict)
    report = run_bench(folder, manifest, opts, log)
    print_table(report)
    try:
        written = write_outputs(report, json_path, markdown_path, csv_path, plot_path)
    except OSError as e:
        raise VitexportError(f"Could not write the report: {e.strerror or e} ({e.filename}).") from None
    for p in written:
        click.echo(f"wrote {p}")
    if not report.passed:
        failed = [r.name for r in report.results if r.available and r.parity and not r.parity["passed"]]
        msg = f"Parity missed by: {', '.join(failed)}."
        if strict:
            raise ParityError(msg)
        click.echo(f"warning: {msg} (--strict makes this exit 1)", err=True)
