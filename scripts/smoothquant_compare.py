"""vitexport's SmoothQuant against ONNX Runtime's, on the same model, calibration and held-out images.

    python scripts/smoothquant_compare.py [--model-dir DIR] [--alpha 0.5]

Without --model-dir it builds the test's outlier model (vit_tiny at 64x64, random weights, three LayerNorm channels
x50 in blocks 1 and 6; tests/test_sensitivity.py). It then writes, each from the shipped calibration photos:

- vitexport's CPU INT8 graph, plain and with `--smoothquant ALPHA`;
- ONNX Runtime's `quantize_static` (QDQ, symmetric INT8, per-channel weights, MatMul only, min-max ranges),
  plain and with `extra_options={"SmoothQuant": True, "SmoothQuantAlpha": ALPHA}`, which needs Intel's
  neural-compressor 2.x (`pip install "neural-compressor<3"`; its `adaptor.ox_utils.smooth_quant`);

and prints each one's cosine to FP32 on the held-out photos (ONNX Runtime CPU). The two toolchains place and
calibrate differently, so compare each one's gain from smoothing, not the two plain rows. ONNX Runtime's SmoothQuant
folds its factors into the LayerNorm's initializers as they are named; the exporter shares one initializer among
equal tensors (the scale of ones of every LayerNorm a random model has), so its two rows are repeated on a copy
whose LayerNorms own their parameters.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def outlier_model(where: Path) -> Path:
    import torch

    from vitexport.exporter.run import run_export
    from vitexport.exporter.torch_model import build
    from vitexport.model.spec import ModelSpec

    spec = ModelSpec(variant="vit_tiny_patch16_224", img_size=(64, 64))
    sd = {k: v.clone() for k, v in build(spec).model.state_dict().items()}
    for b in (1, 6):
        for norm in ("norm1", "norm2"):
            sd[f"blocks.{b}.{norm}.weight"][[5, 77, 150]] *= 50
    torch.save(sd, where / "outliers.pth")
    spec.checkpoint = str(where / "outliers.pth")
    return run_export(spec, output=where / "model").folder.path


def logits(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def cosines(ref: np.ndarray, out: np.ndarray) -> np.ndarray:
    ref, out = ref.astype(np.float64), out.astype(np.float64)
    return (ref * out).sum(1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(out, axis=1))


def unshared(src: Path, dst: Path) -> Path:
    """A copy of the ONNX at src whose LayerNorms each own their scale and bias initializers."""
    import onnx

    model = onnx.load(str(src))
    inits = {i.name: i for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "LayerNormalization":
            for k in (1, 2):
                if k < len(n.input) and n.input[k] in inits:
                    copy = onnx.TensorProto()
                    copy.CopyFrom(inits[n.input[k]])
                    copy.name = f"{n.input[k]}.{n.name}"
                    model.graph.initializer.append(copy)
                    n.input[k] = copy.name
    onnx.save_model(model, str(dst))
    return dst


def ort_int8(fp32: Path, dst: Path, calib: np.ndarray, input_name: str, alpha: float | None) -> str | None:
    """ONNX Runtime's static QDQ INT8 of fp32 at dst; None, or why it could not be made."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.rows = iter([{input_name: calib[i:i + 1]} for i in range(len(calib))])

        def get_next(self):
            return next(self.rows, None)

    extra = {"ActivationSymmetric": True, "WeightSymmetric": True}
    if alpha is not None:
        extra.update({"SmoothQuant": True, "SmoothQuantAlpha": alpha})
    try:
        quantize_static(str(fp32), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                        extra_options=extra)
    except ImportError as e:
        return f"not run: {e}"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, help="an exported model folder (default: the outlier test model)")
    ap.add_argument("--alpha", type=float, default=0.5)
    args = ap.parse_args()

    from vitexport.artifacts.folder import ModelFolder
    from vitexport.data.images import load_folder
    from vitexport.paths import default_calib_dir, default_heldout_dir
    from vitexport.precision.prepare import run_quantize
    from vitexport.precision.settings import CalibOptions, Int8Settings

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = args.model_dir or outlier_model(tmp)
        manifest = ModelFolder(src).read_manifest()
        x = load_folder(default_heldout_dir(manifest.variant), manifest.preprocess).x
        calib = load_folder(default_calib_dir(manifest.variant), manifest.preprocess).x
        ref = logits(src / "model.onnx", x)
        rows = []
        for alpha in (None, args.alpha):
            work = tmp / f"vx-{alpha}"
            shutil.copytree(src, work, ignore=shutil.ignore_patterns("*.lock", "calib-cache", "model.*.onnx"))
            run_quantize(work, "int8", CalibOptions(int8=Int8Settings(smoothquant=alpha), check=False))
            rows.append((f"vitexport --int8{'' if alpha is None else f' --smoothquant {alpha:g}'}",
                         cosines(ref, logits(work / "model.int8.onnx", x)), None))
        own = unshared(src / "model.onnx", tmp / "unshared.onnx")
        for fp32, what in ((src / "model.onnx", ""), (own, ", LayerNorm parameters unshared")):
            for alpha in (None, args.alpha):
                dst = tmp / f"ort-{alpha}-{len(what)}.onnx"
                why = ort_int8(fp32, dst, calib, manifest.input_name, alpha)
                name = f"onnxruntime quantize_static{'' if alpha is None else f' SmoothQuant {alpha:g}'}{what}"
                rows.append((name, None if why else cosines(ref, logits(dst, x)), why))
    print(f"{len(x)} held-out images, {len(calib)} calibration images; cosine to FP32 (ONNX Runtime CPU)")
    print(f"{'graph':<76} {'cos min':>8} {'cos mean':>9}")
    for name, cos, why in rows:
        print(f"{name:<76} " + (why if cos is None else f"{cos.min():8.5f} {cos.mean():9.5f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
