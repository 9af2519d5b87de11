"""Depth-Anything-V2-Small at 518 (or EoMT-DINOv3-S at 640, --eomt, or SAM ViT-B at 1024, --sam) on this CPU: the
backends side by side in one run, and the peak memory of calibration, bench and predict at two numbers of images.

    python scripts/bench_dense_cpu.py [--out /tmp/dense] [--images 8 32] [--rounds 5] [--eomt | --sam]

The model is transformers' DepthAnythingForDepthEstimation at its published configuration (convert_depth_anything_
to_hf.py's V2 small: DINOv2-S/14 at 518, taps 3/6/9/12, fusion 64) with random weights moved off their init, saved
with save_pretrained and exported by `vitexport onnx -c`; its CPU INT8 graph is calibrated on the shipped photos.
Timing: ONNX Runtime FP32, OpenVINO bf16 (f32 where the CPU has no BF16) and OpenVINO INT8 (`model.int8.onnx`),
each compiled once, then timed in interleaved rounds at batch 1 (median of --runs calls a round); ratios are taken
within a round (ORT FP32 time / the row's) and the median over rounds is printed with its spread. Memory: each
command in a process of its own under /usr/bin/time -v, on folders of N and 4N images (photos resized and cropped
into distinct 640 x 480 images), so a peak that grows with the number of images shows.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PHOTOS = sorted((ROOT / "calibration" / "photos").rglob("*.jpg"))


def save_model(folder: Path, eomt: bool, sam: bool = False) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    if sam:  # SAM ViT-B (SamVisionConfig's defaults: 1024 px, 64 x 64 tokens, windows of 14, global blocks 2/5/8/11)
        model = transformers.SamModel(transformers.SamConfig()).eval()
        proc = transformers.SamImageProcessor()
    elif eomt:  # EoMT-DINOv3-S at 640 (the converted coco_panoptic_eomt_small_640_dinov3: 1,600 patches, 200 queries)
        cfg = transformers.EomtDinov3Config(hidden_size=384, intermediate_size=1536, num_hidden_layers=12,
                                            num_attention_heads=6, image_size=640, patch_size=16,
                                            num_register_tokens=4, layer_norm_eps=1e-5, num_queries=200,
                                            num_blocks=3, num_labels=133)
        model = transformers.EomtDinov3ForUniversalSegmentation(cfg).eval()
        proc = transformers.EomtImageProcessorPil(size={"shortest_edge": 640, "longest_edge": 640}, do_pad=True)
    else:
        cfg = transformers.DepthAnythingConfig(
            backbone_config=dict(model_type="dinov2", image_size=518, patch_size=14, hidden_size=384,
                                 num_hidden_layers=12, num_attention_heads=6, out_indices=[3, 6, 9, 12],
                                 apply_layernorm=True, reshape_hidden_states=False),
            reassemble_hidden_size=384, patch_size=14, fusion_hidden_size=64, neck_hidden_sizes=[48, 96, 192, 384])
        model = transformers.DepthAnythingForDepthEstimation(cfg).eval()
        proc = transformers.DPTImageProcessorPil(size={"height": 518, "width": 518}, keep_aspect_ratio=True,
                                                 ensure_multiple_of=14, resample=3,
                                                 image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
        if eomt:
            model.attn_mask_probs.zero_()  # as trained EoMT checkpoints hold it
        elif not sam:
            model.head.conv3.bias.fill_(1.0)
    model.save_pretrained(folder)
    proc.save_pretrained(folder)


def vx(*args: str) -> tuple[float, float, str]:
    """(wall s, peak RSS MB, output) of `vitexport ARGS` under /usr/bin/time -v."""
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-m", "vitexport", *args], capture_output=True,
                       text=True)
    if p.returncode:
        raise SystemExit(f"vitexport {' '.join(args)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1)) / 1024
    return time.perf_counter() - t0, rss, p.stdout + p.stderr


def image_folder(folder: Path, n: int) -> Path:
    """n distinct 640 x 480 images: the photos, each at several crops and scales."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        with Image.open(PHOTOS[i % len(PHOTOS)]) as img:
            img = img.convert("RGB")
            s = 1.0 + 0.15 * (i // len(PHOTOS))
            w, h = img.size
            img = img.resize((int(w * s) + 640, int(h * s) + 480))
            left, top = (i * 37) % (img.width - 640), (i * 53) % (img.height - 480)
            img.crop((left, top, left + 640, top + 480)).save(folder / f"img{i:04d}.jpg", quality=92)
    return folder


def fresh_copy(src: Path, dst: Path) -> Path:
    """The export alone (model.onnx, SAM's decoder.onnx and the manifest without precisions), for a calibration from
    scratch."""
    import shutil

    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    shutil.copy(src / "model.onnx", dst / "model.onnx")
    if (src / "decoder.onnx").is_file():  # SAM's checks judge its masks through the decoder graph
        shutil.copy(src / "decoder.onnx", dst / "decoder.onnx")
    manifest = json.loads((src / "manifest.json").read_text())
    manifest["precisions"] = {}
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def timing(folder: Path, rounds: int, runs: int) -> list[tuple[str, float, list[float]]]:
    """[(row, median ms, [ORT FP32 / row ratio per round])], interleaved rounds at batch 1."""
    from vitexport.artifacts.folder import ModelFolder
    from vitexport.backends.openvino_backend import OpenVinoRunner
    from vitexport.backends.ort_backend import OrtRunner
    from vitexport.data.images import load_folder

    manifest = ModelFolder(folder).read_manifest()
    x = load_folder(ROOT / "calibration" / "photos" / "holdout", manifest.preprocess, limit=1).x[:1]
    io = {"input_name": manifest.input_name, "output_name": manifest.output_name}
    rows = {"onnxruntime cpu fp32": OrtRunner(folder / "model.onnx", "fp32", "cpu", **io),
            "openvino cpu bf16": OpenVinoRunner(folder / "model.onnx", "bf16", **io),
            "openvino cpu int8": OpenVinoRunner(folder / "model.int8.onnx", "int8", **io)}
    for r in rows.values():
        r.load()
    return interleaved(rows, x, rounds, runs)


def interleaved(rows: dict, x: np.ndarray, rounds: int, runs: int,
                warmup: int = 1) -> list[tuple[str, float, list[float]]]:
    """[(row, median ms, [first row's / this row's time, per round])] of loaded runners on the batch x: each warmed
    up, then `rounds` rounds of `runs` calls a row in turn, the median call of each round kept."""
    for r in rows.values():
        for _ in range(warmup):
            r.infer(x)
    times: dict[str, list[float]] = {k: [] for k in rows}
    for _ in range(rounds):
        for name, r in rows.items():
            one = []
            for _ in range(runs):
                t0 = time.perf_counter()
                r.infer(x)
                one.append((time.perf_counter() - t0) * 1000)
            times[name].append(statistics.median(one))
    base = next(iter(times.values()))
    return [(k, statistics.median(v), [b / t for b, t in zip(base, v)]) for k, v in times.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/vitexport-dense"))
    ap.add_argument("--images", type=int, nargs=2, default=[8, 32])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3)
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--eomt", action="store_true", help="EoMT-DINOv3-S at 640 instead of Depth-Anything-V2-S at 518")
    which.add_argument("--sam", action="store_true", help="SAM ViT-B at 1024 (SamModel): the encoder timed; predict "
                                                          "with a point and a box")
    args = ap.parse_args()
    from vitexport.environment import cpu_flags, cpu_model

    out = args.out / ("eomt-dinov3-s-640" if args.eomt else "sam-vit-b-1024" if args.sam else "da-v2-s-518")
    if not (out / "model" / "manifest.json").exists():
        save_model(out / "saved", args.eomt, args.sam)
        wall, rss, _ = vx("onnx", "-c", str(out / "saved"), "-o", str(out / "model"), "-q")
        print(json.dumps({"step": "onnx", "wall_s": round(wall), "rss_mb": round(rss)}), flush=True)
    if not (out / "model" / "model.int8.onnx").exists():  # the timed INT8 graph: calibrated on the shipped photos
        vx("quantize", str(out / "model"), "--int8", "-q")
    results: dict = {"cpu": cpu_model(), "flags": sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx")))}
    for n in args.images:
        data = image_folder(out / f"images-{n}", n)
        fresh = fresh_copy(out / "model", out / f"calibrated-{n}")
        for step, cmd in (("calibrate INT8", ["quantize", str(fresh), "--int8", "--calib-data", str(data)]),
                          ("bench", ["bench", str(out / "model"), "--data", str(data), "--backend", "onnxruntime",
                                     "--batch", "1", "--iterations", "2", "--no-prepare"]),
                          ("predict", ["predict", str(out / "model"), str(data), "--out-dir",
                                       str(out / f"maps-{n}-{time.time_ns()}"),
                                       *(["--point", "320,240", "--box", "200,150,500,400"] if args.sam else [])])):
            wall, rss, _ = vx(*cmd, "-q")
            results[f"{step} @ {n}"] = {"wall_s": round(wall, 1), "rss_mb": round(rss)}
            print(json.dumps({"step": step, "images": n, "wall_s": round(wall, 1), "rss_mb": round(rss)}), flush=True)
    for name, ms, ratios in timing(out / "model", args.rounds, args.runs):
        results[name] = {"median_ms": round(ms, 1), "ratio_median": round(statistics.median(ratios), 2),
                         "ratio_range": [round(min(ratios), 2), round(max(ratios), 2)]}
        print(json.dumps({"row": name, **results[name]}), flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
