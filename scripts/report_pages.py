"""The `bench --html` pages the docs show, and what a page costs as the set grows, in one run.

    python scripts/report_pages.py [--out /tmp/report-pages] [--sizes 2000 10000] [--no-shots]

1. The digits model's `bench --strict --html` over its default 2,000-image set (every CPU row).
2. The same model with an INT8 graph made to miss (calibrated on noise far narrower than its inputs, so its
   activations clip): `bench --html`; the INT8 rows fail and their flipped images are shown.
3. For each --sizes N: a digits set of N images (vitexport.data.digits), `bench --html` of the INT8 row made to miss
   and the reference on it, under /usr/bin/time -v: the page's size and the run's peak RSS.

Screenshots of 1 and 2 (Debian's chromium through playwright, the tests' driver) go to docs/images/.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def vx(*args: str, timed: bool = False) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "vitexport", *args]
    if timed:
        cmd = ["/usr/bin/time", "-v", *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def peak_rss_mb(text: str) -> float:
    return int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text).group(1)) / 1024


def shots(page_path: Path, name: str) -> None:
    from browser import chromium
    from playwright.sync_api import sync_playwright

    images = ROOT / "docs" / "images"
    images.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = b.new_page(viewport={"width": 1320, "height": 1100})
        page.goto(page_path.resolve().as_uri())
        page.screenshot(path=str(images / f"{name}-top.png"))
        page.locator("#pareto").screenshot(path=str(images / f"{name}-chart.png"))
        missed = page.locator('section.row-examples[data-row="onnxruntime cpu int8"]')
        if missed.count():
            missed.screenshot(path=str(images / f"{name}-flips.png"))
        b.close()
    print(f"screenshots: docs/images/{name}-*.png")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("/tmp/report-pages"))
    ap.add_argument("--sizes", type=int, nargs="*", default=[2000, 10000])
    ap.add_argument("--no-shots", action="store_true")
    ap.add_argument("--shots-only", action="store_true", help="Stop after the screenshots (no scale runs).")
    a = ap.parse_args()
    out = a.out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    digits = out / "digits"
    rc, text = vx("onnx", "-m", "vit_digits_patch4_32", "-o", str(digits), "-q")
    assert rc == 0, text
    rc, text = vx("bench", str(digits), "--strict", "--html", str(out / "digits.html"), "--json",
                  str(out / "digits.json"), "-q")
    print(f"digits bench --strict: exit {rc}, page {(out / 'digits.html').stat().st_size / 1e3:,.0f} kB")
    miss = out / "digits-int8-miss"
    shutil.copytree(digits, miss)
    noise = out / "noise.npy"
    np.save(noise, (np.random.default_rng(0).standard_normal((16, 3, 32, 32)) * 0.5).astype(np.float32))
    rc, text = vx("quantize", str(miss), "--int8", "--target", "all", "--calib-data", str(noise), "--no-check", "-q")
    assert rc == 0, text
    rc, text = vx("bench", str(miss), "--html", str(out / "miss.html"), "--json", str(out / "miss.json"), "-q")
    failed = [r["name"] for r in json.loads((out / "miss.json").read_text())["results"]
              if (r.get("parity") or {}).get("status") == "fail"]
    print(f"INT8 made to miss: exit {rc}, rows failing: {', '.join(failed)}")
    if a.shots_only or not a.no_shots:
        shots(out / "digits.html", "report-digits")
        shots(out / "miss.html", "report-int8-miss")
    if a.shots_only:
        return
    from vitexport.data.digits import write_set

    print("| images | page kB | JSON kB | pictures | peak RSS MB | wall s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in a.sizes:
        data = write_set(ROOT / "calibration" / "digits" / "heldout", out / f"set-{n}", n)
        page, js = out / f"page-{n}.html", out / f"page-{n}.json"
        t0 = time.perf_counter()
        rc, text = vx("bench", str(miss), "--data", str(data), "--no-prepare", "--backend", "onnxruntime cpu int8",
                      "--batch", "8", "--iterations", "3", "--min-time", "0", "--html", str(page), "--json", str(js),
                      "-q", timed=True)
        wall = time.perf_counter() - t0
        d = json.loads(js.read_text())
        print(f"| {d['data']['n_parity']:,} | {page.stat().st_size / 1e3:,.0f} | {js.stat().st_size / 1e3:,.0f} | "
              f"{len(d['pictures'])} | {peak_rss_mb(text):,.0f} | {wall:.0f} |")


if __name__ == "__main__":
    main()
