"""CPU runtimes side by side in one run: ONNX Runtime (FP32, INT8 with several session options) and OpenVINO
(FP32 with the f32 and bf16 hints, INT8 with the f32 and bf16 hints), all on vitexport's own ONNX files.

    python scripts/bench_openvino_cpu.py [MODEL_DIR] [--rounds 5] [--runs 3] [--threads N] [--batch 1 --batch 8]

Default MODEL_DIR: models/vit_base_patch16_224-224x224 (exported and quantized first if missing).

On a machine shared with other work, absolute times drift; so the configurations are timed in interleaved
rounds (every configuration `--runs` times per round, round after round), and each one's throughput is divided
by ONNX Runtime FP32's *in the same round*. The table gives the median of those per-round ratios, with the
spread (min-max) across rounds. Parity: each configuration against ONNX Runtime FP32 on the held-out images.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from vitexport.backends.base import infer_in_chunks
from vitexport.backends.openvino_backend import OpenVinoRunner, cpu_capabilities, has_bf16
from vitexport.data.images import load_folder
from vitexport.ensure import ensure_artifact, open_model
from vitexport.environment import cpu_flags, cpu_model
from vitexport.parity.accumulate import compare
from vitexport.paths import default_heldout_dir
from vitexport.precision import CalibOptions
from vitexport.progress import Log

# ONNX Runtime session variants tried on the INT8 file: name -> (graph optimization level, config entries)
ORT_VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "default (ORT_ENABLE_ALL)": ("ORT_ENABLE_ALL", {}),
    "ORT_ENABLE_EXTENDED": ("ORT_ENABLE_EXTENDED", {}),
    "no spinning": ("ORT_ENABLE_ALL", {"session.intra_op.allow_spinning": "0"}),
    "denormals as zero": ("ORT_ENABLE_ALL", {"session.set_denormal_as_zero": "1"}),
}


@dataclass
class Config:
    name: str
    run: Callable[[np.ndarray], np.ndarray]  # a batch -> logits
    times: dict[int, list[float]] = field(default_factory=dict)  # batch -> per-round mean seconds


def ort_session(path: Path, threads: int, level: str, entries: dict[str, str]) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    for k, v in entries.items():
        so.add_session_config_entry(k, v)
    return ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", nargs="?", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3, help="timed runs per configuration and round")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--batch", type=int, action="append", default=None)
    ap.add_argument("--only", action="append", default=None, help="configurations whose name contains this")
    ap.add_argument("--int8-file", type=Path, default=None, help="another INT8 ONNX to run instead of the folder's")
    args = ap.parse_args()
    batches = args.batch or [1, 8]
    log = Log()
    folder = open_model(args.model_dir, log=log)
    int8 = args.int8_file or ensure_artifact(folder, "int8", calib=CalibOptions(check=False), log=log).path
    manifest = folder.read_manifest()
    fp32 = folder.onnx("fp32")
    io = {"input_name": manifest.input_name, "output_name": manifest.output_name}

    def ort_run(sess: Any) -> Callable[[np.ndarray], np.ndarray]:
        return lambda x: sess.run([manifest.output_name], {manifest.input_name: x})[0]

    def ov_run(path: Path, precision: str, hint: str) -> Callable[[np.ndarray], np.ndarray]:
        r = OpenVinoRunner(path, precision, args.threads, hint, **io).load()
        return r.infer

    caps = cpu_capabilities()
    makers: list[tuple[str, Callable[[], Callable[[np.ndarray], np.ndarray]]]] = [
        ("ORT FP32, model.onnx", lambda: ort_run(ort_session(fp32, args.threads, "ORT_ENABLE_ALL", {}))),
        ("ORT FP32, model.onnx, no spinning",
         lambda: ort_run(ort_session(fp32, args.threads, "ORT_ENABLE_ALL", ORT_VARIANTS["no spinning"][1]))),
    ]
    for name, (level, entries) in ORT_VARIANTS.items():
        makers.append((f"ORT INT8, {int8.name}, {name}",
                       lambda level=level, entries=entries: ort_run(ort_session(int8, args.threads, level, entries))))
    makers += [
        ("OpenVINO f32, model.onnx", lambda: ov_run(fp32, "fp32", "f32")),
        ("OpenVINO INT8 f32 hint, " + int8.name, lambda: ov_run(int8, "int8", "f32")),
    ]
    if has_bf16(caps):
        makers += [
            ("OpenVINO bf16, model.onnx", lambda: ov_run(fp32, "bf16", "bf16")),
            ("OpenVINO INT8 bf16 hint, " + int8.name, lambda: ov_run(int8, "int8", "bf16")),
        ]
    keep = [m for m in makers if m[0] == makers[0][0] or not args.only or any(s in m[0] for s in args.only)]

    held = load_folder(default_heldout_dir(manifest.variant), manifest.preprocess)
    configs: list[Config] = []
    ref: np.ndarray | None = None
    parity: dict[str, tuple[float, float]] = {}
    for name, make in keep:
        with log.step(f"Loading {name}"):
            run = make()
        out = infer_in_chunks(run, held.x)
        if ref is None:
            ref = out
        s = compare(ref, out)
        parity[name] = (s.cos_min, s.top1_agree)
        configs.append(Config(name, run))

    inputs = {b: np.ascontiguousarray(np.resize(held.x, (b, *held.x.shape[1:]))) for b in batches}
    for c in configs:  # warm-up: first runs at a new shape compile kernels
        for b in batches:
            c.run(inputs[b])
            c.run(inputs[b])
    t_all = time.perf_counter()
    for rnd in range(args.rounds):
        for b in batches:
            for c in configs:
                t0 = time.perf_counter()
                for _ in range(args.runs):
                    c.run(inputs[b])
                c.times.setdefault(b, []).append((time.perf_counter() - t0) / args.runs)
        log.info(f"round {rnd + 1}/{args.rounds} done")

    base = configs[0]
    print(f"\n{manifest.variant} {manifest.img_size[0]}x{manifest.img_size[1]}, {args.threads} threads, "
          f"{cpu_model()} (flags: {' '.join(cpu_flags()) or 'n/a'}; OpenVINO reports {', '.join(caps)})")
    print(f"{args.rounds} interleaved rounds x {args.runs} runs per configuration and batch "
          f"({time.perf_counter() - t_all:.0f} s of timing)\n")
    head = "| configuration | " + " | ".join(f"b{b} median ms | b{b} x ORT FP32 (min-max)" for b in batches)
    print(head + " | min cosine vs ORT FP32 | top-1 agree |")
    print("| --- |" + " ---: | ---: |" * len(batches) + " ---: | ---: |")
    for c in configs:
        cells = []
        for b in batches:
            ratios = [bt / ct for bt, ct in zip(base.times[b], c.times[b])]
            cells.append(f"{statistics.median(c.times[b]) * 1e3:.1f} | **{statistics.median(ratios):.2f}x** "
                         f"({min(ratios):.2f}-{max(ratios):.2f})")
        cos, agree = parity[c.name]
        print(f"| {c.name} | " + " | ".join(cells) + f" | {cos:.5f} | {agree:.0%} |")


if __name__ == "__main__":
    main()
