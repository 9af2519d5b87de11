"""ONNX Runtime CPU latency of one model's FP32 vs INT8 vs FP16 ONNX, side by side in one run.

    python scripts/bench_precision_cpu.py [MODEL_DIR] [--iterations N]

Default MODEL_DIR: models/vit_base_patch16_224-224x224 (exported and quantized first if missing).
Prints a table and the ratios against FP32 at each batch size; ratios, not absolute times, are what
transfer between machines.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vitexport.benchmark.run import BenchOptions, run_bench
from vitexport.ensure import ensure_artifact, open_model
from vitexport.precision import CalibOptions, Int8Settings
from vitexport.progress import Log


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", nargs="?", type=Path, default=None)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--min-time", type=float, default=3.0)
    ap.add_argument("--quantize-attention", action="store_true",
                    help="re-quantize with the attention products in INT8 too (replaces model.int8.onnx)")
    args = ap.parse_args()
    log = Log()
    folder = open_model(args.model_dir, log=log)
    ensure_artifact(folder, "fp16", calib=CalibOptions(), log=log)
    # INT8 made again when the one in the folder was made with the other attention setting
    ensure_artifact(folder, "int8", calib=CalibOptions(int8=Int8Settings(quantize_attention=args.quantize_attention)),
                    log=log)
    manifest = folder.read_manifest()
    report = run_bench(folder, BenchOptions(iterations=args.iterations, min_time=args.min_time,
                                            backends=("onnxruntime cpu",)), log)
    by = {(r.precision, lt.batch): lt for r in report.results if r.available and r.backend == "onnxruntime"
          for lt in r.latency}
    att = " (INT8 with attention products quantized)" if args.quantize_attention else ""
    print(f"{manifest.variant} {list(manifest.img_size)}{att}  ONNX Runtime CPU ({report.environment['cpu']}, "
          f"{report.environment['threads']} threads)")
    print(f"{'precision':<10}{'batch':>6}{'mean ms':>10}{'p50 ms':>10}{'vs FP32':>10}")
    for prec in ("fp32", "int8", "fp16"):
        for b in report.options["batches"]:
            lt = by.get((prec, b))
            if lt:
                ratio = by[("fp32", b)].mean_ms / lt.mean_ms
                print(f"{prec:<10}{b:>6}{lt.mean_ms:>10.1f}{lt.p50_ms:>10.1f}{ratio:>9.2f}x")
    for r in report.results:
        if r.available and r.backend == "onnxruntime" and r.parity:
            p = r.parity.stats
            print(f"parity {r.precision}: cos min {p.cos_min:.5f} mean {p.cos_mean:.5f} "
                  f"top-1 agree {p.top1_agree:.1%} ({'pass' if r.parity.passed else 'FAIL'})")


if __name__ == "__main__":
    main()
