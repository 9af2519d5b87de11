"""SAM judged by its masks: a backend's image embeddings and the FP32 reference's go through the same decoder graph
(`decoder.onnx`, FP32, in ONNX Runtime) with the same fixed prompts, and the masks are compared by IoU.

The prompts (`PROMPTS`) are fractions of the encoder's input frame, where the image lies from the top left (SAM's
processor pads below and right): five single foreground points, a foreground and a background point together, and
two boxes. For each prompt the mask is the one SAM's own script picks from the reference's scores (`select_mask`),
and the candidate's mask of the same index is compared with it, so a candidate is judged on the mask a user would
have got, not on a choice that flipped between two near-equal scores. A mask is the decoder's low-resolution logits
(4 x the embedding's side: 256 for SAM) above 0; two empty masks agree (IoU 1).

Per image: the mean IoU over its prompts and the worst; over the set, the mean of the images' means with its 95 %
t-interval (`parity.stats.mean_interval`), and the worst prompt of any image.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import VitexportError

# (points [(x, y, label)], box (x0, y0, x1, y1) or None), as fractions of the input frame's side
PROMPTS: tuple[tuple[tuple[tuple[float, float, int], ...], tuple[float, float, float, float] | None], ...] = (
    (((0.5, 0.3, 1),), None), (((0.3, 0.3, 1),), None), (((0.7, 0.3, 1),), None), (((0.3, 0.5, 1),), None),
    (((0.7, 0.5, 1),), None), (((0.5, 0.4, 1), (0.1, 0.1, 0)), None),
    ((), (0.2, 0.15, 0.8, 0.55)), ((), (0.05, 0.05, 0.45, 0.45)),
)


def mask_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of boolean masks (..., H, W) -> (...); 1 where both are empty."""
    inter = np.logical_and(a, b).sum(axis=(-2, -1))
    union = np.logical_or(a, b).sum(axis=(-2, -1))
    return np.where(union == 0, 1.0, inter / np.maximum(union, 1))


class PromptedMasks:
    """The decoder graph run on image embeddings with the fixed prompts."""

    def __init__(self, decoder_onnx: Path | str, image_size: int, mask_size: int) -> None:
        from ..backends.ort_session import create_session
        from ..model.heads.sam_decoder import prompts_to_inputs

        if not Path(decoder_onnx).is_file():
            raise VitexportError(f"{decoder_onnx} is missing: SAM's masks need the decoder graph the export wrote "
                                 f"beside the encoder; re-export the model.")
        self.session = create_session(decoder_onnx, threads=None)
        self.mask_size = mask_size
        self.groups: dict[int, list[tuple[int, np.ndarray, np.ndarray]]] = {}  # rows -> [(prompt, coords, labels)]
        for i, (points, box) in enumerate(PROMPTS):
            pts = [(x * image_size, y * image_size, label) for x, y, label in points]
            bx = None if box is None else tuple(v * image_size for v in box)
            coords, labels = prompts_to_inputs(pts, bx, (1.0, 1.0))  # type: ignore[arg-type]
            self.groups.setdefault(len(labels), []).append((i, coords, labels))

    def __call__(self, emb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Embeddings (B, C, E, E) -> every prompt's masks (B, P, M, S, S) as logits > 0 and scores (B, P, M)."""
        B = emb.shape[0]
        emb = np.ascontiguousarray(emb, dtype=np.float32)
        masks: list = [None] * len(PROMPTS)
        scores: list = [None] * len(PROMPTS)
        for rows, prompts in self.groups.items():
            k = len(prompts)
            coords = np.stack([c for _, c, _ in prompts])  # (k, rows, 2)
            labels = np.stack([lb for _, _, lb in prompts])  # (k, rows)
            feeds = {"image_embeddings": np.repeat(emb, k, axis=0),  # (B*k, C, E, E): image-major
                     "point_coords": np.tile(coords, (B, 1, 1)), "point_labels": np.tile(labels, (B, 1)),
                     "mask_input": np.zeros((B * k, 1, self.mask_size, self.mask_size), np.float32),
                     "has_mask_input": np.zeros(B * k, np.float32)}
            m, s = self.session.run(["masks", "iou_predictions"], feeds)  # (B*k, M, S, S), (B*k, M)
            m = (m > 0).reshape(B, k, *m.shape[1:])
            s = s.reshape(B, k, -1)
            for j, (i, _, _) in enumerate(prompts):
                masks[i], scores[i] = m[:, j], s[:, j]
        return np.stack(masks, axis=1), np.stack(scores, axis=1)

    def rows(self, prompt: int) -> int:
        """The graph rows of prompt `prompt` (its points and the padding or box rows): SAM's count for select_mask."""
        return next(len(lb) for group in self.groups.values() for i, _, lb in group if i == prompt)


def compare_masks(decode: PromptedMasks, ref: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The IoU of the candidate's mask with the reference's for every image and prompt (B, P), the mask chosen from
    the reference's scores."""
    from ..model.heads.sam_decoder import select_mask

    ref_masks, ref_scores = decode(ref)
    out_masks, _ = decode(out)
    B, P = ref_scores.shape[:2]
    iou = np.zeros((B, P))
    for p in range(P):
        rows = decode.rows(p)
        for b in range(B):
            k = select_mask(ref_scores[b, p], rows)
            iou[b, p] = mask_iou(ref_masks[b, p, k], out_masks[b, p, k])
    return iou
