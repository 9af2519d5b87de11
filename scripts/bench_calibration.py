"""INT8 calibration cost against the number of calibration images: wall time and peak RSS, side by side.

    python scripts/bench_calibration.py [--samples 96 512] [--repeat 3] [--method percentile] [--images DIR]
                                        [--modelopt-python /path/to/venv/bin/python]

Exports ViT-B/16 (random weights) into a temporary folder, then for each N runs
`vitexport quantize --int8 --target T --calib-data DIR --calib-samples N --no-check` in a fresh process with
an empty calibration cache, and reports its wall time and peak RSS. Without --images, N images are made from
the shipped photos (deterministic random crops and flips), so the run needs nothing but this checkout.

Beside each calibration, the yardstick: one ONNX Runtime FP32 pass over the same N images, read through the same
decoding pool (`CalibrationSet.batches`), in a fresh process of its own, the model loaded from the same file;
the table gives calibration / pass. With --repeat K, each pair (calibration, then the pass) runs K times in turn and
the median of the K ratios is the figure: on a 2-core machine one process's wall time moves by 5-10 % from run to
run, more than the difference the ratio is there to show.

With --modelopt-python (an interpreter that has `nvidia-modelopt[onnx]`; its pins conflict with ours, so it
lives in its own environment), NVIDIA ModelOpt's ONNX PTQ runs on the same model and the same preprocessed
images in the same run, so the two are compared on one machine at one time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from vitexport.artifacts.folder import ModelFolder

ROOT = Path(__file__).resolve().parents[1]
MEASURE = ("import json, resource, subprocess, sys, time; t = time.perf_counter(); "
           "rc = subprocess.run(sys.argv[1:]).returncode; "
           "print(json.dumps({'rc': rc, 'wall_s': time.perf_counter() - t, "
           "'peak_rss_gb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20}))")
ORT_PASS = """
import sys
from pathlib import Path
from vitexport.artifacts.folder import ModelFolder
from vitexport.backends.ort_session import create_session
from vitexport.precision.int8 import calibration_set
folder = ModelFolder(sys.argv[1])
m = folder.read_manifest()
data = calibration_set(Path(sys.argv[2]), m.preprocess, int(sys.argv[3]))
sess = create_session(folder.onnx())
n = sum(len(sess.run(None, {m.input_name: x})[0]) for x in data.batches(m.preprocess, 8))
assert n == int(sys.argv[3]), n
"""
MODELOPT = """
import sys, numpy as np
from modelopt.onnx.quantization import quantize
quantize(onnx_path=sys.argv[1], quantize_mode="int8", calibration_data=np.load(sys.argv[2]),
         calibration_method=sys.argv[4], calibration_eps=["cpu"], output_path=sys.argv[3], log_level="WARNING")
"""


def measured(cmd: list[str]) -> dict:
    """Run cmd in a fresh child of a fresh process: its own peak RSS, not this script's."""
    out = subprocess.run([sys.executable, "-c", MEASURE, *cmd], capture_output=True, text=True)
    lines = [ln for ln in out.stdout.strip().splitlines() if ln.startswith("{")]
    if not lines:
        raise SystemExit(f"measurement failed: {out.stderr[-2000:]}")
    result = json.loads(lines[-1])
    if result["rc"] != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {result['rc']}: {out.stderr[-2000:]}")
    return result


def make_images(dst: Path, n: int, seed: int = 0) -> Path:
    """n JPEGs cut from the shipped photos (random crops of 40-100 % and flips), deterministic."""
    import numpy as np
    from PIL import Image

    photos = sorted((ROOT / "calibration" / "photos").rglob("*.jpg"))
    images = [Image.open(p).convert("RGB") for p in photos]
    rng = np.random.default_rng(seed)
    dst.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        im = images[i % len(images)]
        w, h = im.size
        s = rng.uniform(0.4, 1.0)
        cw, ch = int(w * s), int(h * s)
        x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        crop = im.crop((x, y, x + cw, y + ch))
        if rng.random() < 0.5:
            crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        crop.save(dst / f"{i:05d}.jpg", quality=90)
    return dst


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, nargs="+", default=[96, 512])
    ap.add_argument("--repeat", type=int, default=1, help="pairs per number of images, alternated (median ratio)")
    ap.add_argument("--method", default="percentile", choices=["minmax", "percentile", "entropy"])
    ap.add_argument("--target", default="cpu", choices=["cpu", "tensorrt", "all"],
                    help="which INT8 graphs quantize writes (cpu: the calibration and one graph, no FP16 ranges)")
    ap.add_argument("--images", type=Path, default=None, help="calibration images (default: made from the photos)")
    ap.add_argument("--modelopt-python", default=None, help="python with nvidia-modelopt[onnx], to compare")
    ap.add_argument("--modelopt-method", default="entropy", help="ModelOpt's calibration method (its default)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-calib-"))
    try:
        model = work / "vit_base"
        subprocess.run(["vitexport", "onnx", "-o", str(model), "-q"], check=True)
        fp32 = ModelFolder(model).onnx()
        images = args.images or make_images(work / "images", max(args.samples))
        rows = []
        ratios: dict[int, list[float]] = {}
        for n in args.samples:
            for _ in range(args.repeat):
                shutil.rmtree(ModelFolder(model).calib_cache_dir, ignore_errors=True)
                r = measured(["vitexport", "quantize", str(model), "--int8", "--target", args.target,
                              "--calib-data", str(images), "--calib-samples", str(n), "--calib-method", args.method,
                              "--no-check", "-q"])
                rows.append(("vitexport", args.method, n, r))
                p = measured([sys.executable, "-c", ORT_PASS, str(model), str(images), str(n)])
                rows.append(("onnxruntime fp32 pass", "-", n, p))
                ratios.setdefault(n, []).append(r["wall_s"] / p["wall_s"])
                print(f"vitexport {args.method:<10} N={n:<5} {r['wall_s']:7.1f} s  peak RSS "
                      f"{r['peak_rss_gb']:.2f} GB; ORT FP32 pass {p['wall_s']:.1f} s ({p['peak_rss_gb']:.2f} GB): "
                      f"{r['wall_s'] / p['wall_s']:.2f}x", flush=True)
            if args.modelopt_python:
                npy = work / f"calib-{n}.npy"
                _save_inputs(model, images, n, npy)
                r = measured([args.modelopt_python, "-c", MODELOPT, str(fp32), str(npy),
                              str(work / f"modelopt-{n}.onnx"), args.modelopt_method])
                rows.append(("modelopt", args.modelopt_method, n, r))
                print(f"modelopt  {args.modelopt_method:<10} N={n:<5} {r['wall_s']:7.1f} s  peak RSS "
                      f"{r['peak_rss_gb']:.2f} GB", flush=True)
                npy.unlink()
        print(f"\nCPU: {cpu_name()}, {os.cpu_count()} cores; ViT-B/16 224, random weights")
        print("| tool | method | images | wall s | peak RSS GB |\n|---|---|---:|---:|---:|")
        for tool, method, n, r in rows:
            print(f"| {tool} | {method} | {n} | {r['wall_s']:.1f} | {r['peak_rss_gb']:.2f} |")
        for n in args.samples:
            each = ", ".join(f"{x:.2f}x" for x in ratios[n])
            print(f"N={n}: calibration / ORT FP32 pass = {statistics.median(ratios[n]):.2f}x"
                  + (f" (median of {len(ratios[n])}: {each})" if len(ratios[n]) > 1 else ""))
        for tool in ("vitexport", "modelopt"):
            mine = [(n, r) for t, _, n, r in rows if t == tool]
            (n0, r0), (n1, r1) = (mine[0], mine[-1]) if mine else ((0, None), (0, None))
            if n1 != n0:
                print(f"{tool}: {(r1['wall_s'] - r0['wall_s']) / (n1 - n0):.2f} s per extra image, peak RSS "
                      f"{r0['peak_rss_gb']:.2f} -> {r1['peak_rss_gb']:.2f} GB")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _save_inputs(model: Path, images: Path, n: int, dst: Path) -> None:
    """The same n images, preprocessed by vitexport, for ModelOpt (which takes an array)."""
    import numpy as np

    from vitexport.artifacts.folder import ModelFolder
    from vitexport.data.images import list_images, load_image, select

    pp = ModelFolder(model).read_manifest().preprocess
    files = select(list_images(images), n)
    arr = np.lib.format.open_memmap(dst, mode="w+", dtype=np.float32, shape=(len(files), 3, *pp.input_size))
    for i, f in enumerate(files):
        arr[i] = load_image(f, pp)
    arr.flush()
    del arr


if __name__ == "__main__":
    main()
