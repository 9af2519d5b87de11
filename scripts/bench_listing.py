"""Listing a large data folder: time and memory of data.stream.open_images on an ImageFolder of N files.

    python scripts/bench_listing.py [--files 100000] [--classes 1000]

Makes the folder in a temporary directory (empty `.jpg` files: listing never opens them), then, each in a fresh
process so the memory figure is its own: open_images (list, labels, an even subset), and pathlib's rglob as the
side-by-side baseline (what a plain `sorted(root.rglob("*"))` costs). Prints seconds and the peak RSS each adds
over an interpreter that has imported vitexport.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
import vitexport.data.stream as stream
root, how = Path(sys.argv[1]), sys.argv[2]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
if how == "open_images":
    s = stream.open_images(root)
    n = len(s)
    assert s.labels is not None and len(s.classes) > 1 and not s.skipped
else:
    n = len(sorted(p for p in root.rglob("*") if p.is_file()))
dt = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"how": how, "files": n, "seconds": dt, "added_rss_mb": (peak - base) / 1024}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--classes", type=int, default=1000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="vitexport-listing-") as tmp:
        root = Path(tmp) / "val"
        for i in range(args.files):
            d = root / f"{i % args.classes:04d}"
            if i < args.classes:
                d.mkdir(parents=True)
            (d / f"img_{i:07d}.jpg").touch()
        rows = []
        for how in ("open_images", "rglob", "open_images", "rglob"):  # twice each, alternating: a warm cache for both
            out = subprocess.run([sys.executable, "-c", CHILD, str(root), how], capture_output=True, text=True,
                                 check=True)
            rows.append(json.loads(out.stdout))
    for r in rows[2:]:
        print(f"{r['how']:12s} {r['files']:>8,} files  {r['seconds']:6.2f} s  +{r['added_rss_mb']:6.1f} MB peak RSS")
    ours, plain = rows[2], rows[3]
    print(f"open_images / rglob: time {ours['seconds'] / plain['seconds']:.2f}x, "
          f"added memory {ours['added_rss_mb'] / max(plain['added_rss_mb'], 1e-9):.2f}x")


if __name__ == "__main__":
    main()
