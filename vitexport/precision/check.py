"""The held-out check of a converted graph: the FP32 ONNX and the candidate run over the same held-out inputs on ONNX
Runtime's CPU provider, one model in memory at a time, judged with the precision's bounds (parity.compare). A graph
that stores tensors in FP16 is also run with every tensor stored in its own type (ranges.first_non_finite): ONNX
Runtime's CPU provider computes chains of FP16 ops in FP32 and would hide an overflow TensorRT would hit."""

from __future__ import annotations

from pathlib import Path

from ..artifacts.manifest import Manifest
from ..backends.ort_session import create_session, optimization_for, session_infer
from ..data.stream import OutputStore
from ..parity.compare import ParityVerdict, Thresholds, describe, judge
from ..progress import QUIET, Log
from ..validate.evaluate import ValidationSet, evaluate
from .ranges import first_non_finite, stores_fp16

OVERFLOW_SCAN = 64  # held-out inputs run with every tensor stored as the graph says


def fp32_reference(fp32: Path, held: ValidationSet, manifest: Manifest, where: Path, log: Log = QUIET) -> OutputStore:
    """The FP32 ONNX's outputs over the held-out set (ONNX Runtime's CPU provider), kept on disk in `where`; its
    session is let go once they are, so the model compared with them is the only one in memory (a model of several
    GB would otherwise be there twice). The caller removes the file (store.path)."""
    store = OutputStore(where)
    try:
        evaluate(session_infer(create_session(fp32), manifest.input_name, manifest.output_name), held.inputs,
                 held.truth, record=store, label="FP32 reference", log=log)  # the session is freed once it returns
    except BaseException:
        store.path.unlink(missing_ok=True)
        raise
    return store


def check_against_fp32(fp32: Path, candidate: Path, held: ValidationSet, precision: str, manifest: Manifest,
                       thresholds: Thresholds | None = None, log: Log = QUIET,
                       reference: OutputStore | None = None) -> ParityVerdict:
    """The candidate ONNX against the FP32 one on ONNX Runtime's CPU provider: FP32 first (fp32_reference, unless
    its outputs are given as `reference`), then the candidate."""
    infer = session_infer(create_session(candidate, optimize=optimization_for(precision)), manifest.input_name,
                          manifest.output_name)
    verdict = judge_against_fp32(fp32, infer, held, precision, manifest, thresholds, log, reference)
    if not verdict.failures and stores_fp16(candidate):
        with log.step(f"Looking for FP16 overflow in every tensor on up to {OVERFLOW_SCAN} held-out inputs"):
            hit = first_non_finite(candidate, (x for _, x in held.inputs.batches(8, stop=OVERFLOW_SCAN)),
                                   manifest.input_name)
        if hit is not None:
            verdict.failures.append(f"NaN/Inf in tensor {hit[0]} ({hit[2]} node {hit[1]}) stored in FP16")
    log.info(f"{precision.upper()} vs FP32 on {len(held):,} held-out inputs: {describe(verdict.stats)}")
    for line in verdict.inconclusive:
        log.warn(f"{precision.upper()} check {line}.")
    return verdict


def judge_against_fp32(fp32: Path, infer, held: ValidationSet, precision: str, manifest: Manifest,
                       thresholds: Thresholds | None = None, log: Log = QUIET,
                       reference: OutputStore | None = None) -> ParityVerdict:
    """A candidate's `infer` ((B, 3, H, W) -> outputs: a graph's session, a package) against the FP32 ONNX on the
    held-out set, judged with the precision's bounds: FP32 first (fp32_reference, unless given), then the candidate."""
    store = reference or fp32_reference(fp32, held, manifest, held.inputs.dir, log)
    try:
        ev = evaluate(infer, held.inputs, held.truth, reference=store, label=f"checking {precision}", log=log)
    finally:
        if reference is None:
            store.path.unlink(missing_ok=True)
    return judge(ev.stats, precision, thresholds)
