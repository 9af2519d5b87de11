"""`vitexport quantize --fp16 | --int8 [--target cpu|tensorrt|all] | --fp8`: precision in the ONNX graph, checked vs
FP32."""

from __future__ import annotations

from pathlib import Path

import click

from ..precision.settings import GRAPH_KINDS, graph_kinds
from .groups import CALIB, MODEL, QUIET, TARGET, command_line, one_flag, report_file, use

@click.command("quantize")
@click.option("--fp16", is_flag=True, help="Mixed FP16, FP32 inputs/outputs.")
@click.option("--int8", is_flag=True, help="Symmetric INT8 Q/DQ from calibration.")
@click.option("--fp8", is_flag=True, help="FP8 (E4M3) Q/DQ from calibration, shaped for TensorRT on Hopper/Ada "
                                          "(ONNX Runtime's CPU provider runs it too, for its accuracy).")
@click.option("--target", "graph_target", type=click.Choice(list(GRAPH_KINDS["int8"])), default="cpu",
              show_default=True,
              help="The graph for CPU runtimes (FP16: LayerNorm and Softmax in FP32; INT8: FP32 between the INT8 "
                   "GEMMs), the one shaped for TensorRT (every other op in FP16), or both (INT8: from one "
                   "calibration).")
@click.option("--sensitivity", is_flag=True,
              help="INT8/FP8: measure what each GEMM group (per block qkv, proj, fc1, fc2; the patch embedding, ...) "
                   "costs alone quantized, on the held-out data; print them sorted by cost. Writes no model.")
@click.option("--json", "json_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="With --sensitivity: one record per group (ONNX node names, block, kind, figures) to this file.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="With --sensitivity: a bar plot of the groups' costs, PNG (needs matplotlib).")
@click.option("--html", "html_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              callback=report_file,
              help="Also the bench's page for the graph just made (`bench --html`), judged on the check's held-out "
                   "data against PyTorch FP32 on ONNX Runtime's CPU provider: where it differs (flipped images, a "
                   "dense model's worst maps), so the effect of a fallback or SmoothQuant can be seen. Not timed.")
@use(TARGET, MODEL, CALIB, QUIET)
def quantize_command(fp16, int8, fp8, graph_target, sensitivity, json_path, plot_path, html_path, target, spec, calib,
                     log):
    """Write model.fp16.onnx, model.int8.onnx (or, with --target tensorrt, model.fp16.trt.onnx, model.int8.trt.onnx),
    or model.fp8.onnx beside an exported model, checked against FP32.

    MODEL_DIR is an exported model folder (or its model.onnx). Without it, the folder of --model
    (default: the default model) is used, exported first if absent.
    """
    precision = one_flag(fp16=fp16, int8=int8, fp8=fp8)
    if precision is None:
        raise click.UsageError("Choose --fp16, --int8 or --fp8.")
    if precision == "fp16" and calib.int8.smoothquant is not None:
        raise click.UsageError("--smoothquant is for --int8 and --fp8.")
    kinds = graph_kinds(precision, graph_target)
    if calib.int8.weight_bits is not None and "int8" not in kinds:
        raise click.UsageError("--weight-bits sets the CPU INT8 graph's weights (--int8 with --target cpu or all); "
                               "TensorRT's and FP8's have 8-bit ones.")
    if (json_path or plot_path) and not sensitivity:
        raise click.UsageError("--json and --plot write what --sensitivity measures; add --sensitivity.")
    if html_path is not None:
        _check_page(kinds, sensitivity)
    if sensitivity:
        return _sensitivity(precision, kinds, target, spec, calib, json_path, plot_path, log)
    if target is not None:  # hashed for its check and parsed while the modules below are imported
        _prefetch_fp32(Path(target))
    from ..ensure import ensure_artifact
    from ..errors import ParityError

    for kind in kinds:
        try:
            artifact = ensure_artifact(target, kind, spec=spec, calib=calib, fresh=True, log=log)
        except ParityError:
            if html_path is not None:  # the page is wanted most when the check fails: that of the rejected graph
                from ..ensure import open_model

                _write_page(open_model(target, spec, log=log), (kind,), calib, html_path, log, rejected=True)
            raise
        v = artifact.precision.verdict if artifact.precision else None
        if v is not None:
            click.echo(f"Parity vs FP32: {'passed' if v.passed else v.status} ({v.stats.n} held-out inputs, "
                       f"min cosine {v.stats.cos_min:.5f}"
                       + (f", top-1 {v.stats.acc_ref:.2%} -> {v.stats.acc:.2%}" if v.stats.acc is not None else "")
                       + ")")
        fb = _fallback_of(artifact.path, kind)
        if fb is not None:
            speed = fb.get("speed", {})
            asked = ", ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in fb["target"].items())
            click.echo(f"Kept in float for {asked} "
                       f"({fb['status']}): {len(fb['float_groups'])} of {fb['groups']} GEMM groups"
                       + (f" ({', '.join(fb['float_groups'])})" if fb["float_groups"] else "")
                       + (f"; ONNX Runtime CPU latency {speed['slowdown']:.2f}x every group quantized"
                          if speed else ""))
        click.echo(f"{kind.upper()} model: {artifact.path}")
    if html_path is not None:
        _write_page(artifact.folder, kinds, calib, html_path, log)


def _check_page(kinds: tuple[str, ...], sensitivity: bool) -> None:
    """--html's refusals, before any work (its path: report_file, as bench's)."""
    from ..benchmark.run import ORT_KINDS

    if sensitivity:
        raise click.UsageError("--html shows the graph quantize makes; --sensitivity makes none.")
    if not any(k in ORT_KINDS["cpu"] for k in kinds):
        raise click.UsageError(f"--html judges the graph on ONNX Runtime's CPU provider, which does not run "
                               f"{', '.join(kinds)} (shaped for TensorRT); leave out --html or --target tensorrt.")


def _write_page(folder, kinds: tuple[str, ...], calib, path: Path, log, rejected: bool = False) -> None:
    """The bench's page of the graphs just made (or of the one its check rejected), on the check's data, parity
    only."""
    from ..artifacts.folder import artifact_kind
    from ..benchmark.outputs import write_outputs
    from ..benchmark.run import ORT_KINDS, BenchOptions, run_bench
    from ..paths import default_heldout_dir

    shown = [k for k in kinds if k in ORT_KINDS["cpu"]]
    # the rejected graph is outside the manifest: its row is added as a file of its own, named apart
    names = [f"{k} (rejected)" for k in shown] if rejected else shown
    extra = tuple((n, artifact_kind(k).precision, folder.rejected(k)) for n, k in zip(names, shown)) if rejected else ()
    manifest = folder.read_manifest()
    rows = tuple(f"onnxruntime cpu {n}" for n in names)
    report = run_bench(folder, BenchOptions(data=calib.check_data or default_heldout_dir(manifest.variant),
                                            labels=calib.check_labels, rows=rows, timed=False, extra=extra), log)
    report.command = command_line()
    report.options["made_by"] = "quantize"  # the page's title; and what each graph was made with, as recorded
    report.options["records"] = {} if rejected else {
        k: {f: v for f, v in manifest.precisions[k].to_dict().items() if f != "check"}
        for k in kinds if k in manifest.precisions}
    for p in write_outputs(report, html_path=path):
        click.echo(f"Page: {p}")


def _sensitivity(precision, kinds, target, spec, calib, json_path, plot_path, log):
    if precision == "fp16":
        raise click.UsageError("--sensitivity measures the GEMMs of --int8 or --fp8.")
    if len(kinds) > 1:
        raise click.UsageError("--sensitivity measures one graph: choose --target cpu or --target tensorrt.")
    if calib.int8.target():
        raise click.UsageError("--sensitivity only measures; --min-cos/--max-drop/--dense-target make a model: run "
                               "them apart.")
    from ..artifacts.workspace import writing
    from ..ensure import open_model
    from ..paths import pyplot
    from ..precision.prepare import run_sensitivity
    from ..precision.sensitivity_report import plot, table, write_json

    if plot_path:
        pyplot()  # matplotlib missing: said now, not after the measuring

    folder = open_model(target, spec, log=log)
    with writing(folder, log):  # the calibration cache is the folder's
        sens = run_sensitivity(folder, kinds[0], calib, log)
    click.echo(table(sens))
    if json_path:
        write_json(sens, str(folder.path), json_path)
        click.echo(f"JSON: {json_path}")
    if plot_path:
        plot(sens, plot_path)
        click.echo(f"Plot: {plot_path}")


def _fallback_of(path: Path, kind: str) -> dict | None:
    """The manifest's record of a --min-cos/--max-drop fallback for the file just made, if it had one."""
    from ..artifacts.folder import ModelFolder

    rec = ModelFolder(path.parent).read_manifest().precisions.get(kind)
    return rec.calibration.fallback if rec is not None and rec.calibration is not None else None


def _prefetch_fp32(target: Path) -> None:
    from ..artifacts.folder import ModelFolder
    from ..artifacts.verify import prefetch_digest
    from ..errors import VitexportError
    from ..precision.graphs import prefetch

    try:
        fp32 = ModelFolder.containing(target).onnx()
        prefetch_digest(fp32)
        prefetch(fp32)
    except (OSError, VitexportError):
        pass  # the command's own checks say what is wrong with the folder
