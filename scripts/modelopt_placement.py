"""Our INT8 and FP8 Q/DQ placement against NVIDIA ModelOpt's, node by node, on the same model and images.

    python scripts/modelopt_placement.py --modelopt-python /path/to/venv/bin/python [--model DIR]
                                         [--placement vitexport|modelopt] [--json OUT]

ModelOpt (`nvidia-modelopt[onnx]`, whose pins conflict with ours, so it lives in its own environment) quantizes the
folder's FP32 export to INT8 and to FP8 with its ONNX PTQ on the CPU (`calibration_eps=["cpu"]`), calibrated on the
same preprocessed images as ours; our model.int8.trt.onnx and model.fp8.onnx are made (or reused) in the folder.
Without --model the digits model is exported into a temporary folder.

Each graph is reduced to its placement: for every input of every node that reads a DequantizeLinear, the element
type (int8 / fp8), the granularity (per tensor, or per channel along an axis) and whether it is a weight. The
script prints, per precision, the inputs both quantize alike, those only one of them quantizes, and those they
quantize differently, with block numbers folded (`blocks.*.attn.qkv/MatMul in0`) so a ViT's twelve blocks read as
one line. Exit 0 whatever the differences: it reports, docs/TENSORRT.md says which differences stay and why.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

MODELOPT = """
import sys, numpy as np
from modelopt.onnx.quantization import quantize
quantize(onnx_path=sys.argv[1], quantize_mode=sys.argv[4], calibration_data=np.load(sys.argv[2]),
         calibration_method="max", calibration_eps=["cpu"], output_path=sys.argv[3], log_level="WARNING")
"""


def placement(model) -> dict[tuple[str, int], tuple[str, str, str]]:
    """(consumer node name, input index) -> (element type, granularity, 'weight' | 'activation') for every input
    that reads a DequantizeLinear."""
    from vitexport.tensorrt_engine.fusion import FP8_TYPES

    inits = {i.name: i for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    dq = {n.output[0]: n for n in model.graph.node if n.op_type == "DequantizeLinear"}
    out = {}
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        for k, name in enumerate(node.input):
            d = dq.get(name)
            if d is None:
                continue
            zp = inits.get(d.input[2]) if len(d.input) > 2 else None
            dtype = "fp8" if zp is not None and zp.data_type in FP8_TYPES else "int8"
            scale = inits.get(d.input[1])
            per_tensor = scale is None or int(_numel(scale.dims)) == 1
            axis = next((a.i for a in d.attribute if a.name == "axis"), 1)
            src = d.input[0]
            q = producer.get(src)
            weight = src in inits or (q is not None and q.op_type == "QuantizeLinear" and q.input[0] in inits)
            out[(node.name, k)] = (dtype, "per-tensor" if per_tensor else f"per-channel axis {axis}",
                                   "weight" if weight else "activation")
    return out


def _numel(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def role(key: tuple[str, int], ops: dict[str, str]) -> str:
    """'blocks.3.attn.qkv/MatMul', 0 -> 'blocks.*.attn.qkv/MatMul in0 (MatMul)': block numbers folded."""
    name, k = key
    folded = re.sub(r"blocks\.\d+", "blocks.*", name)
    return f"{folded} in{k} ({ops.get(name, '?')})"


def compare(ours: dict, theirs: dict, ops: dict[str, str]) -> dict[str, Counter]:
    """Counts per folded role: 'same', 'only ours', 'only modelopt', 'differs' (with both descriptions)."""
    out: dict[str, Counter] = {"same": Counter(), "only ours": Counter(), "only modelopt": Counter(),
                               "differs": Counter()}
    for key in sorted(set(ours) | set(theirs)):
        a, b = ours.get(key), theirs.get(key)
        if a == b:
            out["same"][f"{role(key, ops)}: {', '.join(a)}"] += 1
        elif b is None:
            out["only ours"][f"{role(key, ops)}: {', '.join(a)}"] += 1
        elif a is None:
            out["only modelopt"][f"{role(key, ops)}: {', '.join(b)}"] += 1
        else:
            out["differs"][f"{role(key, ops)}: ours {', '.join(a)}; modelopt {', '.join(b)}"] += 1
    return out


def report(precision: str, diff: dict[str, Counter]) -> str:
    lines = [f"## {precision.upper()}", ""]
    for what, counts in diff.items():
        lines.append(f"{what}: {sum(counts.values())} input(s)")
        lines += [f"  {n:3d} x {line}" for line, n in sorted(counts.items())]
    return "\n".join(lines)


def _ours(folder: Path, placement: str) -> dict[str, Path]:
    """Our TensorRT INT8 graph in `placement` and our FP8 graph, made in the folder (or reused)."""
    from vitexport.precision.prepare import run_quantize
    from vitexport.precision.settings import CalibOptions, Int8Settings

    opts = CalibOptions(check=False, int8=Int8Settings(placement=placement))
    return {kind: run_quantize(folder, kind, opts).onnx_path for kind in ("int8-trt", "fp8")}


def _calibration_npy(folder: Path, dst: Path) -> Path:
    """The inputs our calibration read, preprocessed, as one array for ModelOpt."""
    import numpy as np

    from vitexport.artifacts.folder import ModelFolder
    from vitexport.paths import default_calib_dir
    from vitexport.precision.int8 import calibration_set

    manifest = ModelFolder(folder).read_manifest()
    data = calibration_set(default_calib_dir(manifest.variant), manifest.preprocess, None)
    np.save(dst, np.concatenate(list(data.batches(manifest.preprocess))).astype(np.float32))
    return dst


def main(argv: list[str]) -> int:
    import onnx

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modelopt-python", required=True, type=Path, help="an interpreter with nvidia-modelopt[onnx]")
    ap.add_argument("--model", type=Path, help="an exported model folder (default: the digits model, exported now)")
    ap.add_argument("--placement", choices=("vitexport", "modelopt"), default="vitexport",
                    help="our INT8 placement to compare (default: vitexport's, the default of `quantize`)")
    ap.add_argument("--json", type=Path, help="write the comparison here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model
        if folder is None:
            from vitexport.exporter.run import run_export
            from vitexport.model.spec import ModelSpec
            from vitexport.model.variants import DIGITS_VARIANT

            folder = run_export(ModelSpec(variant=DIGITS_VARIANT), output=Path(tmp) / "digits").folder.path
        ours = _ours(folder, args.placement)
        calib = _calibration_npy(folder, Path(tmp) / "calib.npy")
        from vitexport.artifacts.folder import ModelFolder

        fp32 = ModelFolder(folder).onnx("fp32")
        ops = {n.name: n.op_type for n in onnx.load(str(fp32), load_external_data=False).graph.node}
        result = {}
        for precision, kind in (("int8", "int8-trt"), ("fp8", "fp8")):
            theirs_path = Path(tmp) / f"modelopt.{precision}.onnx"
            run = subprocess.run([str(args.modelopt_python), "-c", MODELOPT, str(fp32), str(calib), str(theirs_path),
                                  precision], capture_output=True, text=True)
            if run.returncode != 0 or not theirs_path.is_file():
                print(f"modelopt_placement: ModelOpt's {precision} quantization failed:\n{run.stderr[-3000:]}",
                      file=sys.stderr)
                return 2
            diff = compare(placement(onnx.load(str(ours[kind]), load_external_data=False)),
                           placement(onnx.load(str(theirs_path), load_external_data=False)), ops)
            print(report(precision, diff) + "\n")
            result[precision] = {k: dict(v) for k, v in diff.items()}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
