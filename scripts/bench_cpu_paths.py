"""The CPU paths side by side in one run: vitexport's graphs (ONNX Runtime FP32, OpenVINO bf16 on model.onnx, OpenVINO
on model.int8.onnx) against PyTorch's own compiled path as vitexport packages it (`vitexport aoti`: Inductor bf16,
PT2E INT8), for the default ViT-B/16 at 224 and DINOv3-S/16 at 512.

    python scripts/bench_cpu_paths.py [--out /tmp/cpu-paths] [--rounds 5] [--runs 5] [--only vit_base]
                                      [--alt-int8 "--smoothquant --min-cos 0.999"]

Each folder is exported (`vitexport onnx -m ARCH`, random weights), its CPU INT8 graph made (`quantize --int8`) and
its packages (`aoti --precision bf16`, `--precision int8`, each timed: the compile time is reported apart). Then
every row is loaded once, warmed up, and timed in interleaved rounds at batch 1 and 8 (the median of --runs calls
a round); the ratio to ONNX Runtime FP32 is taken within a round and its median over rounds printed with its range.
Parity: each row's outputs against ONNX Runtime FP32's, the min and mean cosine on the 7 shipped held-out photos and on
the 13 calibration photos, and on how many of the 20 the row is closer to FP32 than the PT2E package.
--alt-int8 ARGS also makes a second CPU INT8 graph with those `quantize --int8` options (in a copy of the folder: the
default graph stays) and times OpenVINO on it as one more row, in the same rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"vit_base_patch16_224": [], "vit_small_patch16_dinov3": ["--img-size", "512"]}


def vx(*args: str) -> float:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "vitexport", *args, "-q"], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"vitexport {' '.join(args)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return time.perf_counter() - t0


def rows(folder: Path, alt: Path | None = None) -> dict:
    from vitexport.artifacts.folder import ModelFolder
    from vitexport.backends.aoti_backend import AotiRunner
    from vitexport.backends.openvino_backend import OpenVinoRunner
    from vitexport.backends.ort_backend import OrtRunner

    m = ModelFolder(folder).read_manifest()
    io = {"input_name": m.input_name, "output_name": m.output_name}
    return {"onnxruntime cpu fp32": OrtRunner(folder / "model.onnx", "fp32", "cpu", **io),
            "openvino cpu bf16 (model.onnx)": OpenVinoRunner(folder / "model.onnx", "bf16", **io),
            "openvino cpu int8 (model.int8.onnx)": OpenVinoRunner(folder / "model.int8.onnx", "int8", **io),
            "pytorch cpu bf16 (compiled)": AotiRunner(folder / "model.aoti.bf16.pt2", "bf16"),
            "pytorch cpu int8 (pt2e)": AotiRunner(folder / "model.aoti.int8.pt2", "int8"),
            **({} if alt is None else {"openvino cpu int8 (--alt-int8 graph)": OpenVinoRunner(alt, "int8", **io)})}


def measure(folder: Path, rounds: int, runs: int, alt: Path | None = None) -> dict:
    from bench_dense_cpu import interleaved  # this folder's script: the same interleaved rounds

    from vitexport.artifacts.folder import ModelFolder
    from vitexport.data.images import load_folder

    m = ModelFolder(folder).read_manifest()
    sets = {part: load_folder(ROOT / "calibration" / "photos" / part, m.preprocess).x for part in ("holdout", "calib")}
    photos = sets["holdout"]
    runners = rows(folder, alt)
    per_image: dict[str, dict[str, np.ndarray]] = {}  # row -> photo set -> each photo's cosine to ONNX Runtime FP32
    for part, x in sets.items():
        outs = {}
        for name, r in runners.items():
            r.load()
            outs[name] = r.infer_all(x, chunk=8).reshape(len(x), -1).astype(np.float64)
        ref = outs["onnxruntime cpu fp32"]
        for name, o in outs.items():
            per_image.setdefault(name, {})[part] = (o * ref).sum(1) / (np.linalg.norm(o, axis=1) *
                                                                        np.linalg.norm(ref, axis=1))
    pt2e = per_image["pytorch cpu int8 (pt2e)"]
    cos = {name: {"min_cos": round(float(c["holdout"].min()), 5), "mean_cos": round(float(c["holdout"].mean()), 5),
                  "calib_min_cos": round(float(c["calib"].min()), 5),
                  "calib_mean_cos": round(float(c["calib"].mean()), 5),
                  # on how many of the 20 photos this row is closer to FP32 than the PT2E package
                  "closer_than_pt2e": int(sum((c[p] > pt2e[p]).sum() for p in sets))}
           for name, c in per_image.items()}
    result = {}
    for b in (1, 8):
        x = np.ascontiguousarray(np.resize(photos, (b, *photos.shape[1:])))
        # three warm-up calls: a new batch shape's first ones build the runtimes' kernels for it
        for name, ms, ratios in interleaved(runners, x, rounds, runs, warmup=3):
            result.setdefault(name, dict(cos[name]))[f"batch {b}"] = {
                "median_ms": round(ms, 2), "ratio": round(statistics.median(ratios), 2),
                "range": [round(min(ratios), 2), round(max(ratios), 2)]}
    for r in runners.values():
        r.close()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/vitexport-cpu-paths"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", help="one of " + ", ".join(MODELS))
    ap.add_argument("--alt-int8", default=None, metavar="ARGS",
                    help="quantize --int8 options of a second INT8 graph timed beside the default one")
    a = ap.parse_args()
    from vitexport.environment import cpu_flags, cpu_model

    results: dict = {"cpu": cpu_model(), "flags": sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx")))}
    for arch, extra in MODELS.items():
        if a.only and a.only not in arch:
            continue
        folder = a.out / arch
        steps = {}
        if not (folder / "manifest.json").exists():
            steps["onnx_s"] = round(vx("onnx", "-m", arch, *extra, "-o", str(folder)), 1)
        steps["quantize_int8_s"] = round(vx("quantize", str(folder), "--int8"), 1)
        for p in ("bf16", "int8"):
            steps[f"aoti_{p}_s"] = round(vx("aoti", str(folder), "--precision", p), 1)
        alt = None
        if a.alt_int8:
            import shutil

            copy = a.out / f"{arch}-alt-int8"
            shutil.rmtree(copy, ignore_errors=True)
            copy.mkdir(parents=True)
            for f in ("manifest.json", "model.onnx"):
                shutil.copy(folder / f, copy / f)
            shutil.copytree(folder / "calib-cache", copy / "calib-cache")
            steps["quantize_alt_int8_s"] = round(vx("quantize", str(copy), "--int8", *a.alt_int8.split()), 1)
            alt = copy / "model.int8.onnx"
        print(json.dumps({"model": arch, **steps}), flush=True)
        results[arch] = {"steps": steps, "rows": measure(folder, a.rounds, a.runs, alt)}
        print(json.dumps({arch: results[arch]["rows"]}, indent=1), flush=True)
    (a.out / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
