"""Train the tests' tiny detector: transformers' RfDetrForObjectDetection at the tests' tiny size (tests/detectors.py
TINY: a 4-block DINOv2 of width 32 in 2 x 2 windows, a 2-layer decoder with 20 queries) on coloured squares over
noise (tests/detectors.py `squares`: 1 to 3 squares an image, red, green or blue, labels 1 to 3), with its own loss
(Hungarian matching, focal and box losses, 3 query groups), and save it with save_pretrained and its image
processor to tests/fixtures/rf-detr-squares/.

    python scripts/train_tiny_detector.py [--steps 2000] [--out DIR]

A random detector scores every query near 0.5 and its two-stage selection reorders under any perturbation, so its
reduced precisions lose their answers; this one finds its squares (mAP about 0.65, AP50 about 0.9 on fresh
squares), as a trained detector does, so the precision steps have something to keep. About two minutes on 2 CPU
cores; deterministic on one machine (seed 0).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from detectors import SQUARE_NAMES, SQUARES_MODEL, TINY, TINY_BACKBONE, squares  # noqa: E402

MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])


def batch(n: int, rng) -> tuple[torch.Tensor, list[dict]]:
    images, boxes, labels = squares(n, rng)
    x = (images / 255.0 - MEAN) / STD
    targets = [{"class_labels": torch.from_numpy(lab), "boxes": torch.from_numpy(b).float()}
               for b, lab in zip(boxes, labels)]
    return torch.tensor(x.transpose(0, 3, 1, 2), dtype=torch.float32), targets


def main() -> None:
    import transformers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=SQUARES_MODEL)
    args = ap.parse_args()
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    id2label = {0: "none", **{i + 1: n for i, n in enumerate(SQUARE_NAMES)}}
    cfg = transformers.RfDetrConfig(backbone_config=dict(TINY_BACKBONE), **{**TINY, "num_labels": 4, "group_detr": 3},
                                    id2label=id2label, label2id={v: k for k, v in id2label.items()})
    model = transformers.RfDetrForObjectDetection(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    t0 = time.time()
    for step in range(args.steps):
        x, targets = batch(16, rng)
        loss = model(pixel_values=x, labels=targets).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        opt.step()
        if step % 200 == 0:
            print(f"step {step}: loss {loss.item():.3f} ({time.time() - t0:.0f} s)", flush=True)
    model.eval().save_pretrained(args.out)
    transformers.RfDetrImageProcessor(size={"height": 64, "width": 64}).save_pretrained(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
