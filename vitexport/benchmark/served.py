"""`bench --endpoint URL`: served models as rows of the bench.

Each URL gives one row, fed the same inputs and judged against the same reference as every local backend. Its
server is asked first, before the reference runs (a server that is down, or serves another model, is one sentence
before minutes of work), then again when its row comes. Its latency is taken under load at each concurrency level
(bench/load.py) instead of one request at a time. A row that fails part-way keeps what it measured and says how far
it got; the bench then fails, with or without --strict: the user asked for that server.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..artifacts.manifest import Manifest
from ..backends.endpoint import DEFAULT_TIMEOUT, EndpointRunner, Expected
from ..errors import VitexportError
from ..progress import QUIET, Log
from .latency import takes_batch
from .load import measure_load

DEFAULT_CONCURRENCY = (1, 8)


@dataclass
class EndpointOptions:
    urls: tuple[str, ...] = ()
    model: str | None = None  # default: the name `vitexport triton` gives the folder's model at `precision`
    version: str = ""  # default: the server's latest
    precision: str | None = None  # default: what the model's name says (`-int8`, `-fp16`), else fp32
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    timeout: float = DEFAULT_TIMEOUT
    shared_memory: bool = False  # inputs and outputs through system shared memory (a server on this host)


def expected(manifest: Manifest) -> Expected:
    h, w = manifest.img_size
    pp = manifest.preprocess
    out = manifest.output_shape_of(manifest.output_name)[1:]
    if not all(isinstance(d, int) for d in out):  # a dynamic-size map: its size is the images'
        raise VitexportError(f"A served model is benched at one size; this folder's {manifest.output_name} has the "
                             f"sizes {out} (a dynamic-size export).")
    return Expected(manifest.input_name, manifest.output_name, (3, int(h), int(w)), tuple(out),
                    tuple(pp.mean), tuple(pp.std))


def endpoint_runners(manifest: Manifest, opts: EndpointOptions) -> list[EndpointRunner]:
    """One runner per URL, for the model the options name."""
    name = opts.model or f"{manifest.variant}-{opts.precision or 'fp32'}"
    want = expected(manifest)
    return [EndpointRunner(url, name, want, opts.version, opts.precision, opts.timeout, opts.shared_memory)
            for url in opts.urls]


def probe(runners: list[EndpointRunner], log: Log = QUIET) -> None:
    """Each server reached and its model checked against the folder, before any work; one sentence otherwise."""
    for r in runners:
        with log.step(f"Checking {r.where}"):
            r.load()
            r.close()


def time_served(runner: EndpointRunner, sample, batches: tuple[int, ...], opts: EndpointOptions, window_s: float,
                warmup: int, info: dict, log: Log = QUIET) -> list:
    """Latency at each batch the server takes (the others noted in the row's `info`) and each concurrency level."""
    out = []
    for b in batches:
        if not takes_batch(runner, b, info, log):
            continue
        x = sample(b)
        for c in opts.concurrency:
            with log.step(f"{runner.name}: batch {b}, {c} in flight"):
                out.append(measure_load(runner, x, c, window_s=window_s, warmup=warmup, log=log))
    return out


def partial(runner: EndpointRunner, total: int, e: VitexportError) -> str:
    """Why a served row stopped, and how far it got."""
    return f"{e} (after {runner.answered:,} of {total:,} images answered)"
