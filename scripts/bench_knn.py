#!/usr/bin/env python
"""Time and memory of the bench's k-NN (vitexport.parity.knn) on N embeddings of width D, as the bench computes it:
the embeddings read back from a file on disk block by block, never all held, the N x N similarity never held.

    python scripts/bench_knn.py --count 1000 10000 50000 --dim 1024

Each count runs in a fresh process (so each peak RSS is its own); the embeddings are made in chunks, clustered by
class (k-NN accuracy well above chance, as real embeddings are), and written to a temporary file first. Prints one
line per count: seconds, images/s, peak RSS, the file's size.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def write_embeddings(path: Path, n: int, dim: int, classes: int, seed: int = 0) -> np.ndarray:
    """(N, D) float32 embeddings written in chunks of 4,096; returns their labels."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim)).astype(np.float32)
    labels = rng.integers(0, classes, n)
    with open(path, "wb") as f:
        for i in range(0, n, 4096):
            y = labels[i:i + 4096]
            x = centres[y] * 0.35 + rng.normal(size=(len(y), dim)).astype(np.float32)
            f.write(x.astype(np.float32).tobytes())
    return labels


def one(n: int, dim: int, classes: int) -> dict:
    from vitexport.parity.knn import neighbours

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "emb.bin"
        labels = write_embeddings(path, n, dim, classes)

        def read(start: int, count: int) -> np.ndarray:
            out = np.empty((count, dim), np.float32)
            with open(path, "rb", buffering=0) as f:
                f.seek(start * dim * 4)
                f.readinto(memoryview(out.reshape(-1).view(np.uint8)))
            return out

        t0 = time.perf_counter()
        nb = neighbours(read, n, labels)
        seconds = time.perf_counter() - t0
        size = path.stat().st_size
    return {"count": n, "dim": dim, "seconds": round(seconds, 2), "images_per_s": round(n / seconds, 1),
            "knn_acc": round(float((nb.pred == labels).mean()), 4), "file_mb": round(size / 1e6, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one count, JSON out
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.count[0], args.dim, args.classes)))
        return 0
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"k-NN (k=20, leave-one-out) on {threads} cores, D={args.dim}, {args.classes} classes")
    for n in args.count:
        out = subprocess.run([sys.executable, __file__, "--one", "--count", str(n), "--dim", str(args.dim),
                              "--classes", str(args.classes)], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"N={r['count']:>7,}: {r['seconds']:8.1f} s ({r['images_per_s']:,.0f} img/s), peak RSS "
              f"{r['peak_rss_mb']:,.0f} MB, embeddings on disk {r['file_mb']:,.0f} MB, k-NN top-1 {r['knn_acc']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
