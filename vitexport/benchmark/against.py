"""One backend's outputs on every input of the run against the reference's: the reference (PyTorch FP32 eager, or
the next FP32 row when it cannot run) keeps its outputs on disk for the rows after it; an embedding model's rows
are also judged by their k-NN (parity.knn)."""

from __future__ import annotations

import os

from ..backends.base import Runner
from ..data.stream import OutputStore
from ..errors import VitexportError
from ..parity.knn import Neighbours, knn_figures, neighbour_changes, neighbours
from ..progress import Log
from ..validate.evaluate import Evaluation, ValidationSet, evaluate


class Reference:
    """PyTorch FP32 eager on the CPU (first in the list); if it cannot run, the next FP32 backend stands in. Its
    outputs are kept on disk for the backends after it; an embedding model's also its k-NN (parity.knn)."""

    def __init__(self, knn: tuple[int, float] | None = None) -> None:
        self.store: OutputStore | None = None
        self.name = "none"
        self.throughput: dict[int, float] = {}  # batch -> images/s
        self.knn = knn  # (k, T) when the outputs are embeddings
        self.neighbours: Neighbours | None = None


def parity_pass(runner: Runner, vset: ValidationSet, ref: Reference, log: Log) -> tuple[Evaluation, bool]:
    """The runner on every input against the reference (or as the reference, when none ran yet and it is FP32)."""
    is_reference = ref.store is None and runner.precision == "fp32"
    if ref.store is None and not is_reference:
        raise VitexportError("the PyTorch FP32 reference is unavailable")
    store = OutputStore(vset.inputs.dir) if is_reference or ref.knn else None
    try:
        ev = evaluate(runner.infer_all, vset.inputs, vset.truth, reference=None if is_reference else ref.store,
                      record=store, label=runner.name, log=log)
        if ref.knn and store is not None and len(vset) > 1:
            _judge_embeddings(ev, store, vset, ref, is_reference, log)
    finally:
        if store is not None and not is_reference:
            os.unlink(store.path)
    if is_reference:
        ref.store, ref.name = store, runner.name
    return ev, is_reference


def _judge_embeddings(ev: Evaluation, store: OutputStore, vset: ValidationSet, ref: Reference, is_reference: bool,
                      log: Log) -> None:
    """An embedding model's k-NN figures against the reference's (parity.knn), into the evaluation's stats."""
    assert ref.knn is not None
    with log.step(f"k-NN of {len(vset):,} embeddings (k={ref.knn[0]}, T={ref.knn[1]:g})"):
        nb = neighbours(store.read, len(vset), vset.set_labels, *ref.knn)
    if is_reference:
        ref.neighbours = nb
    assert ref.neighbours is not None
    for k, v in knn_figures(ref.neighbours, nb, vset.set_labels).items():
        setattr(ev.stats, k, v)
    if not is_reference:  # an embedding's top-1 flips mean nothing: the images whose nearest neighbour changed
        ev.examples = neighbour_changes(ref.neighbours, nb)
