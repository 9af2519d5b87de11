#!/usr/bin/env python
"""Decoding throughput: vitexport's pool of decoding threads against one thread, side by side in one run.

The same folder is decoded (JPEG/PNG -> resized, center-cropped 8-bit crop, what every backend's input is made
from) by `data.stream.decoded_crops` with 1 worker and with N, alternating, several rounds; it prints each
round's images/s and the median ratio. Nothing is written.

    python scripts/make_digits_set.py --out /tmp/jpegs --count 2000 --size 256 --format jpg
    python scripts/bench_decode.py /tmp/jpegs --workers 2 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from vitexport.data.images import list_images  # noqa: E402
from vitexport.data.stream import decoded_crops, default_workers  # noqa: E402
from vitexport.environment import cpu_model  # noqa: E402
from vitexport.model.variants import get_variant  # noqa: E402


def rate(files, pp, workers: int) -> float:
    t0 = time.perf_counter()
    n = sum(len(c) for c in decoded_crops(files, pp, workers))
    return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--workers", type=int, default=default_workers(), help="Default: what vitexport uses.")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variant", default="vit_base_patch16_224", help="Whose preprocessing (default: ViT-B/16 224).")
    args = ap.parse_args(argv)
    files, pp = list_images(args.folder), get_variant(args.variant).preprocess()
    if not files:
        ap.error(f"{args.folder} holds no images")
    print(f"{len(files)} images from {args.folder}, {args.variant} preprocessing {pp.input_size}; CPU: {cpu_model()}, "
          f"{len(os.sched_getaffinity(0))} cores")
    rate(files[:64], pp, args.workers)  # warm-up: page cache, imports
    ratios = []
    for r in range(args.rounds):
        one, many = rate(files, pp, 1), rate(files, pp, args.workers)
        ratios.append(many / one)
        print(f"round {r + 1}: 1 worker {one:8.1f} img/s   {args.workers} workers {many:8.1f} img/s   "
              f"ratio {many / one:.2f}x")
    print(f"median ratio {statistics.median(ratios):.2f}x (min {min(ratios):.2f}, max {max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
