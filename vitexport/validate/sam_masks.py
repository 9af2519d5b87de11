"""SAM's decoder graph (`decoder.onnx`, FP32, ONNX Runtime) run with parity.masks' fixed prompts on image
embeddings: what a SAM model's checks judge its embeddings through (parity.masks.compare_masks); and with the
prompts of a ground-truth map's objects (parity.masks.truth_objects), judged against them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..data.preprocess import Preprocess
from ..errors import VitexportError
from ..parity.masks import PROMPTS, postprocess_masks, truth_iou, truth_objects

TRUTH_CHUNK = 8  # objects decoded a call (the embedding is repeated for each)


def decode(session, emb: np.ndarray, coords: np.ndarray, labels: np.ndarray,
           mask_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The decoder graph's session on k embeddings (k, C, E, E) with k prompts (point_coords (k, N, 2), point_labels
    (k, N)), no previous mask: every mask's low-resolution logits (k, M, S, S) and the scores (k, M)."""
    k = len(coords)
    masks, scores = session.run(["masks", "iou_predictions"], {
        "image_embeddings": np.ascontiguousarray(emb, np.float32), "point_coords": coords, "point_labels": labels,
        "mask_input": np.zeros((k, 1, mask_size, mask_size), np.float32), "has_mask_input": np.zeros(k, np.float32)})
    return masks, scores


class PromptedMasks:
    """The decoder graph run on image embeddings with the fixed prompts."""

    def __init__(self, decoder_onnx: Path | str, image_size: int, mask_size: int,
                 pp: Preprocess | None = None) -> None:
        from ..backends.ort_session import create_session
        from ..model.heads.sam_decoder import prompts_to_inputs, select_mask

        if not Path(decoder_onnx).is_file():
            raise VitexportError(f"{decoder_onnx} is missing: SAM's masks need the decoder graph the export wrote "
                                 f"beside the encoder; re-export the model.")
        self.session = create_session(decoder_onnx, threads=None)
        self.mask_size, self.image_size, self.pp = mask_size, image_size, pp  # pp: where an image lies in the frame
        self.prompts_to_inputs = prompts_to_inputs
        self.select = select_mask  # (scores (M,), rows) -> the mask SAM's export script picks
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
            m, s = decode(self.session, np.repeat(emb, k, axis=0),  # (B*k, C, E, E): image-major
                          np.tile(coords, (B, 1, 1)), np.tile(labels, (B, 1)), self.mask_size)
            m = (m > 0).reshape(B, k, *m.shape[1:])
            s = s.reshape(B, k, -1)
            for j, (i, _, _) in enumerate(prompts):
                masks[i], scores[i] = m[:, j], s[:, j]
        return np.stack(masks, axis=1), np.stack(scores, axis=1)

    def rows(self, prompt: int) -> int:
        """The graph rows of prompt `prompt` (its points and the padding or box rows): SAM's count for select_mask."""
        return next(len(lb) for group in self.groups.values() for i, _, lb in group if i == prompt)

    def against_truth(self, emb: np.ndarray, gt: np.ndarray) -> dict[str, float] | None:
        """One image's embedding (C, E, E) against its (H, W) truth map: the mean IoU over its objects of the masks
        their point prompts give ('point_iou') and their boxes give ('box_iou'); None when it has no object."""
        if self.pp is None:
            raise ValueError("against_truth needs the model's preprocessing")
        objects = truth_objects(gt)
        if not objects:
            return None
        H, W = gt.shape
        nw, nh = self.pp.resized_size(W, H)
        scale, resized = (nw / W, nh / H), (min(nh, self.image_size), min(nw, self.image_size))
        out = {}
        for kind in ("point", "box"):
            ious = []
            for at in range(0, len(objects), TRUTH_CHUNK):
                chunk = objects[at:at + TRUTH_CHUNK]
                pairs = [self.prompts_to_inputs([(*pt, 1)], None, scale) if kind == "point" else
                         self.prompts_to_inputs([], box, scale) for _, pt, box in chunk]
                m, s = decode(self.session, np.repeat(emb[None], len(chunk), axis=0),
                              np.stack([c for c, _ in pairs]), np.stack([lb for _, lb in pairs]), self.mask_size)
                for j, (obj, _, _) in enumerate(chunk):
                    pick = self.select(s[j], len(pairs[j][1]))
                    full = postprocess_masks(m[j, pick:pick + 1], self.image_size, resized, (H, W))[0]
                    ious.append(truth_iou(full, obj, gt))
            out[f"{kind}_iou"] = float(np.mean(ious))
        return out
