"""SAM's second graph: the prompt encoder and mask decoder (`heads.sam_decoder.SamPromptDecoder`) written beside the
encoder's `model.onnx` as `decoder.onnx`, shaped as SAM's own export script shapes it (image_embeddings,
point_coords, point_labels, mask_input, has_mask_input in; masks and iou_predictions out), with a symbolic batch
and a symbolic number of points, and proved against PyTorch in ONNX Runtime for 1, 2 and 5 points, with and
without a box and a previous mask, before it replaces anything.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from ..errors import ParityError, VitexportError
from ..model.heads.sam_decoder import INPUT_NAMES, OUTPUT_NAMES, SamPromptDecoder
from ..paths import atomic_path
from ..tensorrt_engine.graph_rules import describe, rule_breakers
from .to_onnx import quiet_exporter

DECODER_ATOL = 1e-4  # x max(1, |masks|): float32's rounding through two attention layers, as the encoder's bound
CHECK_POINTS = (1, 2, 5)  # point counts checked (a box adds its two corners)


@dataclass
class DecoderCheck:
    """The decoder graph against PyTorch for one prompt shape."""

    points: int
    box: bool
    mask: bool
    max_abs: float  # over masks and iou_predictions
    bound: float
    passed: bool

    def to_dict(self) -> dict[str, Any]:
        return {"points": self.points, "box": self.box, "mask": self.mask, "max_abs": self.max_abs,
                "bound": self.bound, "passed": self.passed}


def io_shapes(decoder: SamPromptDecoder) -> dict[str, dict[str, list[Any]]]:
    """The graph's inputs and outputs, as the manifest records them."""
    c = decoder.cfg
    e, m, k = c.embedding_size, c.mask_size, c.num_mask_tokens
    return {"inputs": {"image_embeddings": ["batch", c.hidden_size, e, e], "point_coords": ["batch", "points", 2],
                       "point_labels": ["batch", "points"], "mask_input": ["batch", 1, m, m],
                       "has_mask_input": ["batch"]},
            "outputs": {"masks": ["batch", k, m, m], "iou_predictions": ["batch", k]}}


def _prompt(decoder: SamPromptDecoder, batch: int, points: int, box: bool, mask: bool,
            gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Seeded inputs: random embeddings, points inside the frame labelled 0/1, a box as two corner rows (2, 3) or
    the padding row (-1), a random previous mask or none."""
    c = decoder.cfg
    emb = torch.randn(batch, c.hidden_size, c.embedding_size, c.embedding_size, generator=gen)
    coords = torch.rand(batch, points, 2, generator=gen) * c.image_size
    labels = torch.randint(0, 2, (batch, points), generator=gen).float()
    if box:
        corners = torch.sort(torch.rand(batch, 2, 2, generator=gen) * c.image_size, dim=1).values
        extra, extra_labels = corners, torch.tensor([[2.0, 3.0]]).expand(batch, 2)
    else:
        extra, extra_labels = torch.zeros(batch, 1, 2), torch.full((batch, 1), -1.0)
    coords, labels = torch.cat([coords, extra], dim=1), torch.cat([labels, extra_labels], dim=1)
    mask_input = torch.randn(batch, 1, c.mask_size, c.mask_size, generator=gen) if mask else \
        torch.zeros(batch, 1, c.mask_size, c.mask_size)
    return emb, coords, labels, mask_input, torch.full((batch,), float(mask))


def _trace(decoder: SamPromptDecoder, opset: int):
    decoder = decoder.eval()
    decoder.set_fused_attn(False)
    example = _prompt(decoder, 2, 3, False, False, torch.Generator().manual_seed(0))
    batch = torch.export.Dim("batch", min=1, max=4096)
    points = torch.export.Dim("points", min=1, max=4096)
    shapes = ({0: batch}, {0: batch, 1: points}, {0: batch, 1: points}, {0: batch}, {0: batch})
    with quiet_exporter():
        program = torch.onnx.export(decoder, example, dynamo=True, input_names=list(INPUT_NAMES),
                                    output_names=list(OUTPUT_NAMES), dynamic_shapes=shapes, opset_version=opset,
                                    optimize=True, verbose=False)
    proto = program.model_proto
    if breakers := rule_breakers(proto):
        raise VitexportError(f"The exported decoder graph has {describe(breakers)}; this is a bug in vitexport's "
                             f"model, please report it with the model's name.")
    return proto


def check_decoder(onnx_path: Path, decoder: SamPromptDecoder, seed: int = 0) -> list[DecoderCheck]:
    """ONNX Runtime against PyTorch for 1, 2 and 5 points, with and without a box, and with a previous mask, at
    batch 2: masks and iou_predictions within DECODER_ATOL x max(1, |output|)."""
    from ..backends.ort_session import create_session

    sess = create_session(onnx_path)
    gen = torch.Generator().manual_seed(seed)
    checks = []
    cases = [(n, box, False) for n in CHECK_POINTS for box in (False, True)] + [(1, False, True)]
    for points, box, mask in cases:
        inputs = _prompt(decoder, 2, points, box, mask, gen)
        with torch.no_grad():
            refs = [t.numpy() for t in decoder(*inputs)]
        outs = sess.run(list(OUTPUT_NAMES), dict(zip(INPUT_NAMES, (t.numpy() for t in inputs))))
        worst, bound = 0.0, DECODER_ATOL
        for ref, out in zip(refs, outs):
            if out.shape != ref.shape:
                raise ParityError(f"The decoder graph's output has shape {out.shape}, PyTorch's {ref.shape}.")
            worst = max(worst, float(np.abs(out - ref).max()) / max(1.0, float(np.abs(ref).max())))
        checks.append(DecoderCheck(points, box, mask, worst, bound, bool(worst <= bound)))
    return checks


@contextmanager
def staged_decoder(decoder: SamPromptDecoder, out_path: Path, opset: int) -> Iterator[tuple[Path, list]]:
    """Export the decoder to a temporary beside `out_path`, check it, and yield (the temporary, its checks); it
    replaces `out_path` only if the block (and the check) succeeds."""
    import onnx

    proto = _trace(decoder, opset)
    with atomic_path(Path(out_path), suffix=".onnx") as tmp:
        onnx.save_model(proto, tmp)
        onnx.checker.check_model(str(tmp), full_check=True)
        checks = check_decoder(tmp, decoder)
        if not all(c.passed for c in checks):
            worst = max(checks, key=lambda c: c.max_abs)
            raise ParityError(f"ONNX Runtime and PyTorch disagree on the decoder graph: relative max abs diff "
                              f"{worst.max_abs:.3g} (allowed {worst.bound:g}) for {worst.points} points"
                              f"{' and a box' if worst.box else ''}; the previous model (if any) was kept.")
        yield tmp, checks
