"""vitexport's range-aware FP16 for TensorRT against NVIDIA ModelOpt's AutoCast, on the same models and images.

    python scripts/autocast_compare.py --modelopt-python /path/to/venv/bin/python [--json OUT]

Models: the digits model given massive activations (three residual channels at 1.2e5 between blocks 1 and 2,
through fc2's bias, and through fc2's GEMM; `massive`), and ViT-B/16 at 224 with random weights. For each, vitexport
writes model.fp16.trt.onnx (`quantize --fp16 --target tensorrt`) and AutoCast (`convert_to_mixed_precision`, FP16,
its defaults: data_max 512, init_max 65504, calibrated on the same preprocessed calibration images, in its own
environment: nvidia-modelopt[onnx]'s pins conflict with ours) converts the same model.onnx. Both graphs are then
measured alike: compute nodes left in FP32 (by the types ONNX infers), whether any tensor overflows when each is
stored in its own type (precision.ranges.first_non_finite), and the cosine to FP32 on the held-out images on ONNX
Runtime's CPU provider. Exit 0 whatever the figures; docs/PARITY.md records them.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "models" / "digits" / "vit_digits_patch4_32.safetensors"
CHANNELS = [5, 17, 40]
SHAPE_OPS = {"Cast", "Constant", "Shape", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Gather", "Slice",
             "Concat", "Identity", "Expand", "Flatten", "Split", "QuantizeLinear", "DequantizeLinear"}
AUTOCAST = """
import sys, numpy as np, onnx
from modelopt.onnx.autocast import convert_to_mixed_precision
model = convert_to_mixed_precision(onnx_path=sys.argv[1], low_precision_type="fp16", calibration_data=sys.argv[2],
                                   keep_io_types=True)
onnx.save(model, sys.argv[3])
"""


def massive(kind: str, path: Path) -> Path:
    """The digits weights with the residual stream of CHANNELS at +6e4 after block 0, +1.2e5 after block 1, and
    back to normal after blocks 2 and 3: through fc2's bias ('bias'), or through fc2's weights reading one GELU unit
    that fc1's bias holds on ('gemm': a GEMM's output, not a constant). FP32 is fine; FP16 storage overflows."""
    from safetensors.torch import load_file, save_file

    sd = load_file(str(DIGITS))
    for block, sign in ((0, 1), (1, 1), (2, -1), (3, -1)):
        if kind == "bias":
            sd[f"blocks.{block}.mlp.fc2.bias"][CHANNELS] += sign * 6e4
        else:
            sd[f"blocks.{block}.mlp.fc1.bias"][3] += 30.0  # GELU(~30) = ~30 on every token, whatever its input
            sd[f"blocks.{block}.mlp.fc1.weight"][3] *= 1e-4
            sd[f"blocks.{block}.mlp.fc2.weight"][CHANNELS, 3] = sign * 2e3
    save_file(sd, str(path))
    return path


def fp32_compute_nodes(path: Path) -> tuple[int, int]:
    """(compute nodes whose output is FP32, compute nodes) of a graph, by the types ONNX infers."""
    import onnx

    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    types = {v.name: v.type.tensor_type.elem_type for v in (*model.graph.value_info, *model.graph.output)}
    compute = [n for n in model.graph.node if n.op_type not in SHAPE_OPS]
    return sum(types.get(n.output[0]) == onnx.TensorProto.FLOAT for n in compute), len(compute)


def measure(graph: Path, fp32: Path, x: np.ndarray, input_name: str) -> dict:
    import onnxruntime as ort

    from vitexport.precision.ranges import first_non_finite

    def run(p: Path) -> np.ndarray:
        sess = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
        return sess.run(None, {input_name: x})[0]

    want, got = run(fp32), run(graph)
    cos = (want * got).sum(1) / (np.linalg.norm(want, axis=1) * np.linalg.norm(got, axis=1) + 1e-30)
    kept, compute = fp32_compute_nodes(graph)
    hit = first_non_finite(graph, [x[i:i + 8] for i in range(0, len(x), 8)], input_name)
    return {"fp32_nodes": kept, "compute_nodes": compute, "cos_min": float(np.nanmin(cos)) if np.isfinite(cos).all()
            else float("nan"), "cos_mean": float(np.nanmean(cos)), "overflow": None if hit is None else hit[1]}


def compare(name: str, folder: Path, modelopt_python: str, tmp: Path) -> dict:
    from vitexport.artifacts.folder import ModelFolder
    from vitexport.data.images import load_image
    from vitexport.paths import default_calib_dir, default_heldout_dir
    from vitexport.precision.prepare import run_quantize

    manifest = ModelFolder(folder).read_manifest()
    pp, inp = manifest.preprocess, manifest.input_name
    calib = np.stack([load_image(f, pp) for f in sorted(default_calib_dir(manifest.variant).rglob("*"))
                      if f.is_file() and f.suffix.lower() in (".png", ".jpg", ".jpeg")][:64])
    held = sorted(f for f in default_heldout_dir(manifest.variant).rglob("*") if f.suffix.lower() in (".png", ".jpg"))
    x = np.stack([load_image(f, pp) for f in held[:: max(1, len(held) // 64)]])
    run_quantize(folder, "fp16-trt")
    np.savez(tmp / "calib.npz", **{inp: calib})
    out = tmp / (re.sub(r"[^A-Za-z0-9]+", "-", name) + ".autocast.onnx")
    subprocess.run([modelopt_python, "-c", AUTOCAST, str(folder / "model.onnx"), str(tmp / "calib.npz"), str(out)],
                   check=True)
    fp32 = folder / "model.onnx"
    return {"model": name, "held_out": len(x),
            "vitexport": measure(folder / "model.fp16.trt.onnx", fp32, x, inp), "autocast": measure(out, fp32, x, inp)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modelopt-python", required=True, help="python of an environment with nvidia-modelopt[onnx]")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from vitexport.exporter.run import run_export
    from vitexport.model.spec import ModelSpec

    rows = []
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for kind in ("bias", "gemm"):
            folder = run_export(ModelSpec(variant="vit_digits_patch4_32",
                                          checkpoint=massive(kind, tmp / f"{kind}.safetensors")),
                                output=tmp / f"massive-{kind}").folder.path
            rows.append(compare(f"digits, massive activations ({kind})", folder, args.modelopt_python, tmp))
            print(json.dumps(rows[-1]), flush=True)
        folder = run_export(ModelSpec(variant="vit_base_patch16_224"), output=tmp / "vitb").folder.path
        rows.append(compare("ViT-B/16 224, random weights", folder, args.modelopt_python, tmp))
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    sys.exit(0)


if __name__ == "__main__":
    main()
