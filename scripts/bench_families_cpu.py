"""OpenVINO INT8 against ONNX Runtime FP32 across ViT families, side by side in one run on this CPU.

    python scripts/bench_families_cpu.py [--rounds 5] [--runs 2] [--batch 8] [-m ARCH[@SIZE] ...]
        [--quantize-attention auto|on|off]

Default models (random weights, full size, each at its own input size): vit_base_patch16_224 (the reference),
vit_small_patch14_reg4_dinov2 at 518 (DINOv2-S/14 with registers) and vit_base_patch16_siglip_224 (SigLIP-B/16,
attention-pool head). Each is exported and its CPU INT8 graph calibrated on the shipped photos (models/ folders,
reused when present). Then every model's ONNX Runtime FP32 session and OpenVINO INT8 runner are timed in
interleaved rounds, and each round's ratio (ORT FP32 time / OpenVINO INT8 time, same model, same round) is taken;
the table gives the median ratio over rounds with its spread, and each family's ratio relative to the first
model's. Parity: OpenVINO INT8 against ORT FP32 on the held-out photos.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from bench_openvino_cpu import ort_session

from vitexport.backends.base import infer_in_chunks
from vitexport.backends.openvino_backend import OpenVinoRunner, cpu_capabilities
from vitexport.data.images import load_folder
from vitexport.ensure import ensure_artifact
from vitexport.environment import cpu_flags, cpu_model
from vitexport.model.spec import user_spec
from vitexport.model.variants import parse_img_size
from vitexport.parity.accumulate import compare
from vitexport.paths import default_heldout_dir
from vitexport.precision import CalibOptions
from vitexport.precision.settings import Int8Settings
from vitexport.progress import Log

DEFAULT_MODELS = ["vit_base_patch16_224", "vit_small_patch14_reg4_dinov2", "vit_base_patch16_siglip_224"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", action="append", default=None,
                    help="an architecture, at its own input size or @SIZE (384, 512x384) (repeatable)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=2, help="timed runs per configuration and round")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--quantize-attention", choices=("auto", "on", "off"), default="auto",
                    help="INT8 attention products: quantize's default (auto: long sequences, kept if the held-out "
                         "check passes), or on / off for every model")
    ap.add_argument("--hint", choices=("default", "f32", "bf16"), default="default",
                    help="OpenVINO's inference precision for the float layers of the INT8 graph (default: the "
                         "`openvino cpu int8` row's, bf16 where the CPU has BF16 arithmetic)")
    args = ap.parse_args()
    attention = {"auto": None, "on": True, "off": False}[args.quantize_attention]
    calib = CalibOptions(check=attention is None, int8=Int8Settings(quantize_attention=attention))
    log = Log()
    runs: list[tuple[str, object, object, np.ndarray, str]] = []  # (model, ort run, ov run, input, parity)
    hints: set[str] = set()
    for model in args.model or DEFAULT_MODELS:
        name, _, size = model.partition("@")
        spec = user_spec(name, img_size=parse_img_size(size) if size else None)
        folder = spec.default_folder()
        fp32 = ensure_artifact(None, "fp32", spec=spec, log=log).path  # the default folder, exported when missing
        int8 = ensure_artifact(folder.path, "int8", calib=calib, log=log).path
        manifest = folder.read_manifest()
        attn_int8 = manifest.precisions["int8"].calibration.quantize_attention
        sess = ort_session(fp32, args.threads, "ORT_ENABLE_ALL", {})
        ort_run = (lambda s, m: lambda x: s.run([m.output_name], {m.input_name: x})[0])(sess, manifest)
        ov = OpenVinoRunner(int8, "int8", args.threads, None if args.hint == "default" else args.hint,
                            input_name=manifest.input_name, output_name=manifest.output_name).load()
        hints.add(ov.info["inference_precision"])
        held = load_folder(default_heldout_dir(manifest.variant), manifest.preprocess)
        s = compare(infer_in_chunks(ort_run, held.x), infer_in_chunks(ov.infer, held.x))
        x = np.ascontiguousarray(np.resize(held.x, (args.batch, *held.x.shape[1:])))
        label = f"{name} {manifest.img_size[0]}x{manifest.img_size[1]}" + (" (INT8 attention)" if attn_int8 else "")
        runs.append((label, ort_run, ov.infer, x, f"cos min {s.cos_min:.5f}, top-1 agree {s.top1_agree:.0%}"))
        for f in (ort_run, ov.infer):  # warm-up: the first runs at a shape compile kernels
            f(x), f(x)
    times: dict[str, list[tuple[float, float]]] = {r[0]: [] for r in runs}
    t_all = time.perf_counter()
    for rnd in range(args.rounds):
        for label, ort_run, ov_run, x, _ in runs:
            pair = []
            for f in (ort_run, ov_run):
                t0 = time.perf_counter()
                for _ in range(args.runs):
                    f(x)
                pair.append((time.perf_counter() - t0) / args.runs)
            times[label].append((pair[0], pair[1]))
        log.info(f"round {rnd + 1}/{args.rounds} done")
    what = {"auto": "INT8 as `quantize --int8` makes it by default (attention products in INT8 where marked)",
            "on": "INT8 with attention products", "off": "INT8 (GEMMs with a weight)"}[args.quantize_attention]
    print(f"\n{what}, OpenVINO's float layers in {'/'.join(sorted(hints))}; {cpu_model()}, {args.threads} threads "
          f"(flags: {' '.join(cpu_flags()) or 'n/a'}; OpenVINO reports "
          f"{', '.join(cpu_capabilities())}); batch {args.batch}; {args.rounds} interleaved rounds x {args.runs} "
          f"runs ({time.perf_counter() - t_all:.0f} s of timing)\n")
    print("| model | ORT FP32 median ms | OpenVINO INT8 median ms | OV INT8 / ORT FP32 speed-up (min-max) | "
          "relative to the first model's | parity of OV INT8 |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    base = None
    for label, *_, parity in runs:
        ratios = [o / v for o, v in times[label]]
        med = statistics.median(ratios)
        base = base or med
        print(f"| {label} | {statistics.median(o for o, _ in times[label]) * 1e3:.0f} | "
              f"{statistics.median(v for _, v in times[label]) * 1e3:.0f} | **{med:.2f}x** "
              f"({min(ratios):.2f}-{max(ratios):.2f}) | {med / base:.2f} | {parity} |")


if __name__ == "__main__":
    main()
