"""What a dynamic-size export costs: the same ViT exported with a fixed size and with --dynamic-img-size, timed
side by side on ONNX Runtime's CPU provider at the fixed export's size.

    python scripts/bench_dynamic_size.py [--variant vit_base_patch16_224] [--batches 1 8] [--rounds 15]

Both exports use the same deterministic random weights. The two sessions run interleaved (fixed, dynamic, fixed,
...), each round timing `--iters` runs, so drift of the machine (clock, other load) hits both alike; the figures are
medians over rounds and the ratio is dynamic / fixed (1.00: no cost). Also prints each graph's node count and the
dynamic graph's extra ops (the in-graph position-embedding resampling).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", default="vit_base_patch16_224")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--iters", type=int, default=3)
    args = ap.parse_args()

    import onnx
    import onnxruntime as ort

    from vitexport.environment import cpu_model
    from vitexport.exporter.run import run_export
    from vitexport.model.spec import ModelSpec

    with tempfile.TemporaryDirectory(prefix="vitexport-dynamic-bench-") as tmp:
        paths = {}
        for name, dynamic in (("fixed", False), ("dynamic", True)):
            t0 = time.perf_counter()
            res = run_export(ModelSpec(args.variant, dynamic_img_size=dynamic), Path(tmp) / name)
            paths[name] = res.onnx_path
            print(f"exported {name}: {time.perf_counter() - t0:.0f} s", flush=True)
        size = res.manifest.img_size
        ops = {n: Counter(node.op_type for node in onnx.load(str(p)).graph.node) for n, p in paths.items()}
        extra = ops["dynamic"] - ops["fixed"]
        print(f"nodes: fixed {sum(ops['fixed'].values())}, dynamic {sum(ops['dynamic'].values())} "
              f"(extra: {dict(extra)})")
        so = ort.SessionOptions()
        so.intra_op_num_threads = os.cpu_count() or 1
        sessions = {n: ort.InferenceSession(str(p), so, providers=["CPUExecutionProvider"]) for n, p in paths.items()}
        print(f"ONNX Runtime {ort.__version__}, {os.cpu_count()} threads, {cpu_model()}, {args.variant} at "
              f"{size[0]}x{size[1]}")
        print("| batch | fixed ms (median) | dynamic ms (median) | dynamic / fixed |")
        print("| ---: | ---: | ---: | ---: |")
        rng = np.random.default_rng(0)
        for b in args.batches:
            x = rng.standard_normal((b, 3, *size)).astype(np.float32)
            outs = {n: s.run(None, {"pixel_values": x})[0] for n, s in sessions.items()}  # warm-up, and the same answer
            assert np.abs(outs["fixed"] - outs["dynamic"]).max() < 1e-3
            times: dict[str, list[float]] = {n: [] for n in sessions}
            for _ in range(args.rounds):
                for n, s in sessions.items():
                    t0 = time.perf_counter()
                    for _ in range(args.iters):
                        s.run(None, {"pixel_values": x})
                    times[n].append((time.perf_counter() - t0) / args.iters * 1000)
            fixed, dynamic = statistics.median(times["fixed"]), statistics.median(times["dynamic"])
            print(f"| {b} | {fixed:.1f} | {dynamic:.1f} | {dynamic / fixed:.3f} |", flush=True)


if __name__ == "__main__":
    main()
