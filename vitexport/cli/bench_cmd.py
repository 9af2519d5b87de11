"""`vitexport bench`: parity and latency of every available backend on the same real inputs."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import click

from ..errors import VitexportError
from ..parity.compare import DEFAULT_THRESHOLDS, Thresholds
from .groups import MODEL, QUIET, TARGET, OptionGroup, command_line, opt, report_file, use

# the values a bound can take: a NaN would switch it off, a cosine above 1 fail every backend
_BOUNDS = {"max_abs": (0.0, math.inf), "cos_min": (-1.0, 1.0), "cos_mean": (-1.0, 1.0), "top1_agree": (0.0, 1.0),
           "acc_drop": (0.0, 100.0)}


def _bound(field_name: str, value: str) -> float | None:
    if value.lower() == "none":
        return None
    number, (lo, hi) = float(value), _BOUNDS.get(field_name, (-math.inf, math.inf))
    if not (math.isfinite(number) and lo <= number <= hi):
        raise click.BadParameter(f"{field_name}={value} is not a finite number in [{lo:g}, {hi:g}] ('none' "
                                 f"switches the bound off)")
    return number


def _thresholds(ctx: click.Context, param: click.Parameter, specs: tuple[str, ...]) -> dict[str, Thresholds]:
    """--threshold int8.cos_min=0.99 -> {'int8': Thresholds(...)} on top of the defaults."""
    out: dict[str, Thresholds] = {}
    for s in specs:
        try:
            key, value = s.split("=", 1)
            prec, field_name = key.split(".", 1)
            base = out.get(prec) or DEFAULT_THRESHOLDS[prec]
            if field_name not in Thresholds.__dataclass_fields__:
                raise KeyError(field_name)
            out[prec] = replace(base, **{field_name: _bound(field_name, value)})
        except click.BadParameter as e:
            raise click.BadParameter(f"{s!r}: {e.message}", ctx=ctx, param=param) from None
        except (ValueError, KeyError):
            raise click.BadParameter(f"{s!r}: expected PRECISION.FIELD=VALUE, e.g. int8.cos_min=0.99 "
                                     f"(fields: {', '.join(Thresholds.__dataclass_fields__)})",
                                     ctx=ctx, param=param) from None
    return out


def _bench_options(data, labels, annotations, max_images, workers, batches, iterations, min_time, warmup, threads,
                   backends, thresholds, strict, judge_output, knn_k, knn_t, depth_scale):
    """BenchOptions' fields; the command makes them one after its checks (bench.py loads torch)."""
    if labels and data is None:
        raise click.UsageError("--labels labels the images of --data; give --data too.")
    if annotations and data is None:
        raise click.UsageError("--annotations gives the boxes of the images of --data; give --data too.")
    return dict(data=data, labels=tuple(labels), judge_output=judge_output, knn_k=knn_k, knn_t=knn_t, max_images=max_images, workers=workers, batches=tuple(batches) or None,
                iterations=iterations, min_time=min_time, warmup=warmup, threads=threads, backends=tuple(backends),
                thresholds=thresholds, strict=strict, depth_scale=depth_scale, annotations=annotations)


BENCH = OptionGroup(
    "opts",
    lambda: [
        opt("--data", type=click.Path(exists=True, path_type=Path), default=None,
            help="Image folder (class subfolders give labels, named by class index, WordNet synset or class name; "
                 "every image is used), or .npy inputs. Default: the shipped held-out set for the model."),
        opt("--labels", type=click.Path(exists=True, dir_okay=False, path_type=Path), multiple=True, metavar="FILE",
            help="Label file for a flat image folder (repeatable, one of each kind): CSV/TSV of file name (extension optional) and label (class index, WordNet synset or class name), ImageNet's LOC_val_solution.csv, or ImageNet-ReaL's real.json (ReaL accuracy as well)."),
        opt("--annotations", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
            metavar="FILE",
            help="A detector's --data: COCO's instances JSON of its images (mAP, AP50, AP per size against it). "
                 "Without it, YOLO labels are read where there are any: IMAGE.txt beside an image, or labels/ "
                 "beside images/ (class cx cy w h, normalised; classes.txt names the classes)."),
        opt("--depth-scale", type=click.FloatRange(min=0, min_open=True), default=1000.0, show_default=True,
            help="A depth model's --data: the ground-truth maps beside the images (IMAGE.depth.png, 16-bit, or "
                 "IMAGE.depth.npy; 0: no value) hold depth x this in their PNGs (1000: millimetres; KITTI: 256). "
                 "Segmentation: IMAGE.mask.png of class indices, 255 ignored."),
        opt("--max-images", type=click.IntRange(min=1), default=None,
            help="Use this many images, spread evenly over --data (the same ones for every backend)."),
        opt("--workers", type=click.IntRange(min=1), default=None,
            help="Threads decoding images (each image is decoded once per run). Default: one per core and one more, at most 8."),
        opt("--batch", "batches", type=click.IntRange(min=1), multiple=True,
            help="Batch sizes (repeatable). Default: 1, 8 (GPU: 1, 8, 32)."),
        opt("--iterations", type=click.IntRange(min=1), default=None,
            help="Timed runs per backend and batch, at least. Default: 5 (or 4 s of runs, 3 runs at least), then "
                 "until the median moves less than 2 %, 10 runs or 6 s of runs (the runs are reported; a median "
                 "still moving is named under the table)."),
        opt("--min-time", type=click.FloatRange(min=0), default=1.0, show_default=True,
            help="Seconds of timed runs, at least."),
        opt("--warmup", type=click.IntRange(min=0), default=1, show_default=True,
            help="Untimed runs at each batch size before timing it (after the parity pass has run the backend)."),
        opt("--threads", type=click.IntRange(min=1), default=None,
            help="CPU threads for PyTorch, ONNX Runtime and OpenVINO. Default: every core this process may use "
                 "(its affinity: taskset, a container's cpuset)."),
        opt("--backend", "backends", multiple=True,
            help="Only backends whose name contains this (repeatable), e.g. 'onnxruntime', 'int8'."),
        opt("--threshold", "thresholds", multiple=True, metavar="PREC.FIELD=VALUE", callback=_thresholds,
            help="Override a parity threshold, e.g. int8.cos_min=0.99 (see docs/PARITY.md)."),
        opt("--strict", is_flag=True,
            help="Exit 1 when any backend misses a parity threshold, when the set is too small to decide one "
                 "(inconclusive: docs/PARITY.md), or when files of the data folder had to be skipped."),
        opt("--judge-output", type=click.Choice(["logits", "pooled"]), default=None,
            help="The output every row is judged by, of an export made with --outputs: pooled judges the embedding "
                 "by its k-NN top-1 and nearest neighbours. Default: logits, or pooled for a model without a head."),
        opt("--knn-k", type=click.IntRange(min=1), default=20, show_default=True,
            help="An embedding model (no classification head): neighbours voting in its k-NN top-1 (DINO's)."),
        opt("--knn-t", type=click.FloatRange(min=0, min_open=True), default=0.07, show_default=True,
            help="An embedding model: the k-NN's temperature (votes weighted exp(similarity / T))."),
    ],
    _bench_options,
)


def _endpoint_options(endpoints, endpoint_model, endpoint_version, endpoint_precision, concurrency, timeout,
                      shared_memory):
    """bench/served.EndpointOptions' fields; every URL checked before any work."""
    if not endpoints:
        given = [flag for flag, v in (("--endpoint-model", endpoint_model), ("--endpoint-version", endpoint_version),
                                      ("--endpoint-precision", endpoint_precision),
                                      ("--concurrency", concurrency),
                                      ("--shared-memory", shared_memory == "system")) if v]
        if given:
            raise click.UsageError(f"{', '.join(given)} describe(s) a served model; give its --endpoint URL too.")
    from ..backends.endpoint import parse_endpoint

    for url in endpoints:
        parse_endpoint(url)
    return dict(urls=tuple(dict.fromkeys(endpoints)), model=endpoint_model, version=endpoint_version or "",
                precision=endpoint_precision, timeout=timeout, shared_memory=shared_memory == "system",
                **({"concurrency": tuple(dict.fromkeys(concurrency))} if concurrency else {}))


ENDPOINT = OptionGroup(
    "endpoint",
    lambda: [
        opt("--endpoint", "endpoints", multiple=True, metavar="URL",
            help="A served model to bench as well: http://HOST:PORT or grpc://HOST:PORT of a Triton (KServe v2) "
                 "server (repeatable). Its metadata is checked against the folder, its answers judged like every "
                 "row, its latency measured under load (--concurrency); a failure exits non-zero."),
        opt("--endpoint-model", default=None, metavar="NAME",
            help="The model's name on the server. Default: the name `vitexport triton` gives, "
                 "<variant>-<precision>."),
        opt("--endpoint-version", default=None, metavar="V", help="Its version. Default: the server's latest."),
        opt("--endpoint-precision", type=click.Choice(["fp32", "fp16", "int8"]), default=None,
            help="The bounds to judge it by. Default: what its name ends with (-fp16, -int8), else fp32."),
        opt("--concurrency", type=click.IntRange(min=1), multiple=True,
            help="Requests kept in flight while timing a served model (repeatable). Default: 1 and 8."),
        opt("--timeout", type=click.FloatRange(min=0, min_open=True), default=30.0, show_default=True,
            help="Seconds any one call to a server may take."),
        opt("--shared-memory", type=click.Choice(["none", "system"]), default="none", show_default=True,
            help="system: send inputs and receive outputs through system shared memory registered with the server "
                 "(a server on this host), as perf_analyzer's --shared-memory system does."),
    ],
    _endpoint_options,
)


@dataclass
class ReportFiles:
    json: Path | None = None
    markdown: Path | None = None
    csv: Path | None = None
    plot: Path | None = None
    html: Path | None = None


REPORT = OptionGroup(
    "files",
    lambda: [
        opt("--json", "json_path", type=click.Path(path_type=Path), default=None, callback=report_file),
        opt("--markdown", "markdown_path", type=click.Path(path_type=Path), default=None, callback=report_file),
        opt("--csv", "csv_path", type=click.Path(path_type=Path), default=None, callback=report_file),
        opt("--plot", "plot_path", type=click.Path(path_type=Path), default=None, callback=report_file,
            help="PNG: accuracy (or top-1 agreement) against throughput, a point per backend and batch, with the "
                 "Pareto front."),
        opt("--html", "html_path", type=click.Path(path_type=Path), default=None, callback=report_file,
            help="One self-contained page (no network): the run, the rows (sortable), the accuracy/throughput "
                 "chart, each row's latency distribution, and the images where rows differ from the reference "
                 "(flipped top-1s, changed neighbours, a dense model's worst maps)."),
    ],
    lambda json_path, markdown_path, csv_path, plot_path, html_path: ReportFiles(json_path, markdown_path, csv_path,
                                                                                plot_path, html_path),
)


@click.command("bench")
@use(TARGET, MODEL, BENCH, ENDPOINT)
@click.option("--no-prepare", is_flag=True,
              help="Do not export or convert missing artifacts: bench only what exists (missing ones are listed).")
@click.option("--aoti", is_flag=True,
              help="Also make PyTorch's compiled CPU packages when missing (bf16 and PT2E INT8, `vitexport aoti`: a "
                   "few minutes at ViT-B), shown as the rows 'pytorch cpu bf16 (compiled)' and 'pytorch cpu int8 "
                   "(pt2e)'; packages already in the folder are benched without it.")
@use(REPORT, QUIET)
def bench_command(target, spec, opts, endpoint, no_prepare, aoti, files, log):
    """Run every available backend on the same inputs: parity against PyTorch FP32, and latency.

    MODEL_DIR is an exported model folder. Without it, the folder of --model (default: the default
    model) is used; missing ONNX, FP16 and INT8 artifacts are prepared first.
    """
    from ..preflight import check_bench

    check_bench(target, spec, opts["batches"])  # a --batch that cannot fit: refused before torch is even loaded
    from ..benchmark.outputs import write_outputs
    from ..benchmark.report import print_table
    from ..benchmark.run import BenchOptions, outcome, prepare_bench, run_bench
    from ..benchmark.served import EndpointOptions

    sizes = spec.bench_sizes if target is not None or len(spec.bench_sizes) > 1 else ()
    opts = BenchOptions(**opts, img_sizes=sizes or None, endpoints=EndpointOptions(**endpoint))
    folder = prepare_bench(target, spec, prepare=not no_prepare, sizes=opts.img_sizes, judge_output=opts.judge_output,
                           data=opts.data, aoti=aoti, log=log)
    report = run_bench(folder, opts, log)
    report.command = command_line()
    print_table(report)
    try:
        written = write_outputs(report, files.json, files.markdown, files.csv, files.plot, files.html)
    except OSError as e:
        raise VitexportError(f"Could not write the report: {e.strerror or e} ({e.filename}).") from None
    for p in written:
        click.echo(f"wrote {p}")
    error, warning = outcome(report, opts.strict)
    if error is not None:
        raise error
    if warning:
        click.echo(f"warning: {warning}", err=True)
