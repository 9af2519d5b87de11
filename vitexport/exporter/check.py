"""The export's proof: the ONNX file run by ONNX Runtime against the PyTorch model, on the same inputs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..artifacts.manifest import BatchCheck
from ..backends.ort_session import create_session
from ..errors import ParityError
from ..model.vit import VisionTransformer
from ..parity.accumulate import compare
from ..parity.compare import Thresholds, export_thresholds
from ..progress import QUIET, Log
from ..model.outputs import forward_outputs
from .to_onnx import INPUT_NAME, OUTPUT_NAME


def check_onnx_against_torch(onnx_path: Path, model: VisionTransformer, batches: tuple[int, ...] = (1, 3),
                             thresholds: Thresholds | None = None, seed: int = 0, log: Log = QUIET,
                             sizes: list[tuple[int, int]] | None = None,
                             outputs: tuple[str, ...] = (OUTPUT_NAME,)) -> list[BatchCheck]:
    """Run the ONNX in ONNX Runtime (CPU) and the model in PyTorch on the same random inputs, per batch size (and
    per image size, for a dynamic-size export): every output of `outputs` (model.outputs); a batch's check is
    that of its worst output."""
    def reference(x: torch.Tensor) -> list[np.ndarray]:
        # an image at a time: PyTorch's peak is one image's (an explicit (N, N) attention per head at SAM's 4,096
        # tokens is 0.8 GB an image), whatever batch ONNX Runtime is checked at
        with torch.no_grad():
            per_image = [forward_outputs(model, xi, outputs) for xi in x.split(1)]
        return [np.concatenate([o[k].numpy() for o in per_image]) for k in range(len(outputs))]

    return check_onnx(onnx_path, reference, outputs, model.cfg.in_chans, sizes or [model.cfg.img_size], batches,
                      thresholds, seed, log, per_size=sizes is not None, relative=model.cfg.dense is not None,
                      ranked=ranks_queries(model.cfg))


def ranks_queries(cfg) -> bool:
    """Whether a model picks its queries by rank (a detector's two-stage TopK), so that two proposals within float
    rounding of each other may swap between runtimes."""
    return getattr(cfg.dense, "task", None) == "detection"


MOVED_SHARE = 0.02  # a detector's queries per image that may take another proposal at a check, at least MOVED_MIN
MOVED_MIN = 2


def moved_queries(ref: np.ndarray, out: np.ndarray, bound: float | None) -> np.ndarray | None:
    """(B, Q) the queries of a ranked output (B, Q, X) beyond `bound`, when no image has more than its allowance
    (MOVED_SHARE of its queries, at least MOVED_MIN): those that took another proposal in a near-tie of the TopK;
    None when an image has more (the graph is judged as it is, and fails)."""
    if bound is None or ref.ndim != 3:
        return None
    moved = np.abs(ref - out).max(axis=2) > bound
    allowed = max(MOVED_MIN, int(MOVED_SHARE * ref.shape[1]))
    return moved if moved.sum(axis=1).max() <= allowed else None


def check_onnx(onnx_path: Path, reference: Callable[[torch.Tensor], list[np.ndarray]], outputs: tuple[str, ...],
               in_chans: int, sizes: list[tuple[int, int]], batches: tuple[int, ...],
               thresholds: Thresholds | None = None, seed: int = 0, log: Log = QUIET, against: str = "PyTorch",
               per_size: bool = False, relative: bool = False, ranked: bool = False) -> list[BatchCheck]:
    """ONNX Runtime's `outputs` against `reference(x)`'s (one array per output) on the same seeded random inputs,
    at every batch size and image size (per_size: each check records its size, a dynamic-size export's); a batch's
    check is that of its worst output. relative: the max abs bound scales with the output's magnitude, max(1,
    |ref|) (a dense map: a depth in metres or a disparity in the hundreds carries float32's relative error).
    ranked: a detector (ranks_queries): the few queries of an image that took another proposal in a near-tie of its
    two-stage TopK (moved_queries) are left out of the figures and counted in the check."""
    thresholds = thresholds or export_thresholds()
    sess = create_session(onnx_path, lean=True)  # run a few times: its peak matters, not its speed
    gen = torch.Generator().manual_seed(seed)
    checks = []
    for b, size in [(b, s) for s in sizes for b in batches]:
        x = torch.randn(b, in_chans, *size, generator=gen)
        refs = reference(x)
        outs = sess.run(list(outputs), {INPUT_NAME: x.numpy()})
        verdicts, moved = [], 0
        for name, ref, out in zip(outputs, refs, outs):
            if out.shape != ref.shape:
                raise ParityError(f"ONNX output {name} has shape {out.shape}, {against}'s {ref.shape}, at batch {b}.")
            bound = thresholds
            if relative and thresholds.max_abs is not None:
                bound = replace(thresholds, max_abs=thresholds.max_abs * max(1.0, float(np.abs(ref).max())))
            swapped = moved_queries(ref, out, bound.max_abs) if ranked else None
            if swapped is not None and swapped.any():
                out = np.where(swapped[..., None], ref, out)
                moved = max(moved, int(swapped.sum(axis=1).max()))
            verdicts.append(bound.judge(compare(ref, out)))
        verdict = min(verdicts, key=lambda v: (v.passed, -v.stats.max_abs))
        checks.append(BatchCheck(b, verdict.stats, verdict.passed, tuple(size) if per_size else None,
                                 moved if ranked else None))
        at = f" at {size[0]}x{size[1]}" if per_size else ""
        vs = "" if against == "PyTorch" else f" against {against}"
        swaps = f" ({moved} of {refs[0].shape[1]} queries of an image took another proposal: a near-tie in the " \
                f"two-stage TopK, left out)" if moved else ""
        log.info(f"batch {b:>3}{at}{vs}: max abs diff {verdict.stats.max_abs:.2e}, min cosine "
                 f"{verdict.stats.cos_min:.7f}{swaps} -> {'ok' if verdict.passed else 'FAIL'}")
    return checks


def require_parity(checks: list[BatchCheck], thresholds: Thresholds, against: str = "PyTorch",
                   relative: bool = False) -> None:
    """ParityError (exit 1) naming the worst figures when any batch missed (relative: the max abs bound was scaled
    by the output's magnitude, check_onnx)."""
    if all(c.passed for c in checks):
        return
    worst = max(c.stats.max_abs for c in checks)
    cos = min(c.stats.cos_min for c in checks)
    allowed = "" if thresholds.max_abs is None else \
        f" (allowed {thresholds.max_abs:g}{' x max(1, |output|)' if relative else ''})"
    raise ParityError(f"ONNX Runtime and {against} disagree: max abs diff {worst:.3g}{allowed}, "
                      f"min cosine {cos:.7f} (allowed {thresholds.cos_min:g}); the previous model (if any) was kept.")
