"""A candidate against the reference over every image of a set, batch by batch: the inputs come from the run's
InputCache, the reference's outputs either from running it in step (a held-out check: two sessions, one batch at
a time) or from its OutputStore (the bench: the reference ran first), and only per-image figures are kept."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..data.stream import ImageSet, InputCache, OutputStore
from ..parity.accumulate import ParityAccumulator
from ..parity.compare import ParityStats
from ..progress import QUIET, Log

Infer = Callable[[np.ndarray], np.ndarray]  # (B, 3, H, W) float32 -> (B, ...) outputs
EVAL_BATCH = 32  # images per inference call while streaming (engines with a smaller range are chunked)


@dataclass
class Evaluation:
    stats: ParityStats
    per_class: list[dict] = field(default_factory=list)
    seconds: float = 0.0  # inference, reference included when it ran in step
    read_seconds: float = 0.0  # reading and normalising the cached inputs

    def timing(self) -> dict:
        n = self.stats.n
        return {"inference_s": round(self.seconds, 3), "read_s": round(self.read_seconds, 3),
                "images_per_s": round(n / self.seconds, 1) if self.seconds > 0 else None}


def evaluate(candidate: Infer, inputs: InputCache, labels: np.ndarray | None, *,
             reference: Infer | OutputStore | None = None, record: OutputStore | None = None,
             label: str = "evaluating", batch: int = EVAL_BATCH, log: Log = QUIET) -> Evaluation:
    """Run `candidate` on every input and compare it with the reference.

    reference: a function run on the same batch, the reference's stored outputs, or None when the candidate is the
    reference itself (its figures against itself are exact; `record` keeps its outputs for the backends after it).
    """
    acc = ParityAccumulator(inputs.n, labels)
    infer_s = read_s = 0.0
    with log.bar(label, inputs.n) as advance:
        t_read = time.perf_counter()
        for start, x in inputs.batches(batch):
            t0 = time.perf_counter()
            read_s += t0 - t_read
            out = np.asarray(candidate(x))
            if callable(reference):
                ref = np.asarray(reference(x))
            elif reference is not None:
                ref = reference.read(start, len(x))
            else:
                ref = out
            infer_s += time.perf_counter() - t0
            if record is not None:
                record.append(out)
            acc.update(start, ref, out)
            advance(len(x))
            t_read = time.perf_counter()
    if record is not None:
        record.finish()
    return Evaluation(acc.stats(), acc.per_class(), infer_s, read_s)


@dataclass
class ValidationSet:
    """The images of a run, decoded once into `inputs`, with the model's labels when the folders give them."""

    images: ImageSet
    inputs: InputCache
    labels: np.ndarray | None

    @property
    def source(self) -> str:
        return self.images.source

    def __len__(self) -> int:
        return self.inputs.n

    def close(self) -> None:
        self.inputs.close()

    def __enter__(self) -> "ValidationSet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_validation(root, pp, num_classes: int, max_images: int | None = None, workers: int | None = None,
                    log: Log = QUIET) -> ValidationSet:
    """List `root`, take `max_images` spread over it, decode each image once (with a progress bar); labels from
    class folders when they name the model's classes (else a warning saying why not)."""
    from ..data.images import labels_for_model
    from ..data.stream import default_workers, open_images

    images = open_images(root, max_images)
    labels, why = labels_for_model(images, num_classes)
    if why:
        log.warn(f"Class folders of {images.source} not used as labels: {why}.")
    subset = f" ({len(images):,} of {images.total:,}, spread evenly)" if len(images) < images.total else ""
    workers = workers or default_workers()
    with log.step(f"Decoding {len(images):,} inputs from {images.source}{subset} with {workers} workers"):
        with log.bar("decoding", len(images)) as advance:
            inputs = InputCache(images, pp, workers, progress=advance)
    d = inputs.decode
    log.info(f"Decoded {d.images:,} inputs in {d.seconds:.1f}s ({d.images / max(d.seconds, 1e-9):,.0f}/s)"
             + (f", labels from {len(images.classes or [])} class folders" if labels is not None else ""))
    if images.skipped:
        log.warn(images.skipped.summary(images.source) + f" Every backend is judged on the other {inputs.n:,}.")
    if labels is not None and inputs.n < len(images):
        labels = labels[inputs.kept]  # the labels of the images the cache holds
    return ValidationSet(images, inputs, labels)
