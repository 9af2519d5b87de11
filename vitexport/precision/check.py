"""The held-out check of a converted graph: the FP32 ONNX and the candidate run over the same held-out inputs on ONNX
Runtime's CPU provider, one model in memory at a time, judged with the precision's bounds (parity.compare)."""

from __future__ import annotations

from pathlib import Path

from ..artifacts.manifest import Manifest
from ..backends.ort_session import create_session, optimization_for, session_infer
from ..data.stream import OutputStore
from ..parity.compare import ParityVerdict, Thresholds, describe, judge
from ..progress import QUIET, Log
from ..validate.evaluate import ValidationSet, evaluate


def fp32_reference(fp32: Path, held: ValidationSet, manifest: Manifest, where: Path, log: Log = QUIET) -> OutputStore:
    """The FP32 ONNX's outputs over the held-out set (ONNX Runtime's CPU provider), kept on disk in `where`; its
    session is let go once they are, so the model compared with them is the only one in memory (a model of several
    GB would otherwise be there twice). The caller removes the file (store.path)."""
    store = OutputStore(where)
    try:
        evaluate(session_infer(create_session(fp32), manifest.input_name, manifest.output_name), held.inputs,
                 held.labels, record=store, label="FP32 reference", log=log)  # the session is freed once it returns
    except BaseException:
        store.path.unlink(missing_ok=True)
        raise
    return store


def check_against_fp32(fp32: Path, candidate: Path, held: ValidationSet, precision: str, manifest: Manifest,
                       thresholds: Thresholds | None = None, log: Log = QUIET,
                       reference: OutputStore | None = None) -> ParityVerdict:
    """The candidate ONNX against the FP32 one on ONNX Runtime's CPU provider: FP32 first (fp32_reference, unless
    its outputs are given as `reference`), then the candidate."""
    store = reference or fp32_reference(fp32, held, manifest, held.inputs.dir, log)
    try:
        ev = evaluate(session_infer(create_session(candidate, optimize=optimization_for(precision)),
                                    manifest.input_name, manifest.output_name),
                      held.inputs, held.labels, reference=store, label=f"checking {precision}", log=log)
    finally:
        if reference is None:
            store.path.unlink(missing_ok=True)
    verdict = judge(ev.stats, precision, thresholds)
    log.info(f"{precision.upper()} vs FP32 on {len(held):,} held-out inputs: {describe(verdict.stats)}")
    for line in verdict.inconclusive:
        log.warn(f"{precision.upper()} check {line}.")
    return verdict
