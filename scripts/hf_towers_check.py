"""transformers' towers at their published sizes: each built by transformers from the config (and image processor
settings) its hub repository holds, with random weights moved off their init, saved with save_pretrained, exported
by `vitexport onnx -c FOLDER` (no -m) in a process of its own under /usr/bin/time -v, and the written ONNX file run
by ONNX Runtime against transformers' own output on two random images; the manifest's preprocessing against the
image processor (its PIL implementation) on a photo. timm's ViT-B/16 by name is the memory baseline.

    python scripts/hf_towers_check.py [--out docs/TRANSFORMERS.md] [--only dinov2-base]

Writes the Markdown table (the file is generated: do not edit it by hand). No network: the configs are written
here as the repositories hold them.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
PHOTO = ROOT / "calibration" / "photos" / "calib" / "chelsea.jpg"
IMAGENET = dict(image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
CLIP = dict(image_mean=[0.48145466, 0.4578275, 0.40821073], image_std=[0.26862954, 0.26130258, 0.27577711])
DINO_PP = dict(size={"shortest_edge": 256}, crop_size={"height": 224, "width": 224}, do_center_crop=True,
               resample=3, **IMAGENET)
# repository: (config class, config kwargs, model class, output, processor class, processor kwargs)
MODELS = {
    "google/vit-base-patch16-224": (
        "ViTConfig", dict(num_labels=1000), "ViTForImageClassification", "logits", "ViTImageProcessorPil",
        dict(size=224, resample=2, image_mean=[0.5] * 3, image_std=[0.5] * 3)),
    "facebook/deit-base-distilled-patch16-224": (
        "DeiTConfig", dict(num_labels=1000), "DeiTForImageClassificationWithTeacher", "logits",
        "DeiTImageProcessorPil", dict(size=256, crop_size=224, do_center_crop=True, resample=3, **IMAGENET)),
    "facebook/dinov2-base": ("Dinov2Config", dict(image_size=518, patch_size=14), "Dinov2Model", "pooler_output",
                             "BitImageProcessorPil", DINO_PP),
    "facebook/dinov2-with-registers-base": (
        "Dinov2WithRegistersConfig", dict(image_size=518, patch_size=14, num_register_tokens=4),
        "Dinov2WithRegistersModel", "pooler_output", "BitImageProcessorPil", DINO_PP),
    "openai/clip-vit-base-patch16": (
        "CLIPConfig", dict(vision_config=dict(patch_size=16), projection_dim=512), "CLIPModel", "image_features",
        "CLIPImageProcessorPil", dict(size=224, crop_size=224, do_center_crop=True, resample=3, **CLIP)),
    "google/siglip-base-patch16-224": (
        "SiglipConfig", dict(), "SiglipModel", "image_features", "SiglipImageProcessorPil",
        dict(size={"height": 224, "width": 224}, resample=3, image_mean=[0.5] * 3, image_std=[0.5] * 3)),
    "facebook/dinov3-vits16-pretrain-lvd1689m": (
        "DINOv3ViTConfig", dict(hidden_size=384, intermediate_size=1536, num_hidden_layers=12, num_attention_heads=6,
                                patch_size=16, image_size=224, num_register_tokens=4, layerscale_value=1.0,
                                rope_theta=100.0, query_bias=True, key_bias=False, value_bias=True,
                                layer_norm_eps=1e-5, use_gated_mlp=False),
        "DINOv3ViTModel", "pooler_output", "DINOv3ViTImageProcessor",
        dict(size={"height": 224, "width": 224}, resample=2, **IMAGENET)),
    "facebook/ijepa_vith14_1k": (
        "IJepaConfig", dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=16,
                            patch_size=14, image_size=224, layer_norm_eps=1e-6),
        "IJepaModel", "last_hidden_state", "ViTImageProcessorPil",
        dict(size={"height": 224, "width": 224}, resample=3, **IMAGENET)),
    "apple/aimv2-large-patch14-224": (
        "Aimv2VisionConfig", dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=24,
                                  num_attention_heads=8, patch_size=14, image_size=224, rms_norm_eps=1e-5,
                                  qkv_bias=False, mlp_bias=False, use_head=True),
        "Aimv2VisionModel", "pooler_output", "CLIPImageProcessorPil",
        dict(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224}, do_center_crop=True, resample=3,
             **CLIP)),
    "google/siglip2-base-patch16-naflex": (
        "Siglip2VisionConfig", dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                    num_attention_heads=12, patch_size=16, num_patches=256),
        "Siglip2VisionModel", "pooler_output", "Siglip2ImageProcessor",
        dict(patch_size=16, max_num_patches=256, resample=2, image_mean=[0.5] * 3, image_std=[0.5] * 3)),
    "microsoft/beit-base-patch16-224": (
        "BeitConfig", dict(use_relative_position_bias=True, use_absolute_position_embeddings=False,
                           use_mean_pooling=True, layer_scale_init_value=0.1, num_labels=1000),
        "BeitForImageClassification", "logits", "BeitImageProcessorPil",
        dict(size={"height": 224, "width": 224}, do_center_crop=False, resample=2, image_mean=[0.5] * 3,
             image_std=[0.5] * 3)),
}


class Refused(Exception):
    """vitexport refused the model with its one sentence (exit 2)."""


def timed(cmd: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MB, output) of a command under /usr/bin/time -v; Refused on exit 2."""
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode == 2 and (said := re.search(r"^Error: (.*)$", p.stdout + p.stderr, flags=re.M)):
        raise Refused(said.group(1))
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1)) / 1024
    return wall, rss, p.stdout + p.stderr


def patches_of(x: torch.Tensor, patch: int) -> dict:
    """SigLIP2 NaFlex's inputs for images x (B, 3, H, W), as its processor lays out a square image: the patches
    ((row, column, channel) flattened), all valid, and the grid."""
    b, c, h, w = x.shape
    px = x.reshape(b, c, h // patch, patch, w // patch, patch).permute(0, 2, 4, 3, 5, 1)
    n = (h // patch) * (w // patch)
    return {"pixel_values": px.reshape(b, n, patch * patch * c),
            "pixel_attention_mask": torch.ones(b, n, dtype=torch.long), "spatial_shapes": torch.tensor([[h // patch, w // patch]] * b)}


def output_of(model, output: str, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        if output == "image_features":  # a whole two-tower model: its image features
            return model.get_image_features(pixel_values=x).pooler_output.numpy()
        if model.config.model_type == "siglip2_vision_model":
            return getattr(model(**patches_of(x, model.config.patch_size)), output).numpy()
        return getattr(model(pixel_values=x), output).numpy()


def check(repo: str, tmp: Path) -> dict:
    import onnxruntime as ort
    import transformers
    from PIL import Image

    from vitexport.data.images import preprocess_image
    from vitexport.data.preprocess import Preprocess

    cfg_cls, cfg_kw, model_cls, output, proc_cls, proc_kw = MODELS[repo]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**cfg_kw)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    processor = getattr(transformers, proc_cls)(**proc_kw) if proc_cls else None
    saved, out = tmp / repo.split("/")[1], tmp / "export"
    model.save_pretrained(saved)
    if processor is not None:
        processor.save_pretrained(saved)
    try:
        wall, rss, _ = timed([sys.executable, "-m", "vitexport", "onnx", "-c", str(saved), "-o", str(out), "-q"])
    except Refused as e:
        return {"repo": repo, "class": model_cls, "refused": str(e).replace(str(saved), repo.split("/")[1])}
    manifest = json.loads((out / "manifest.json").read_text())
    h, w = manifest["img_size"]
    x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(1))
    want = output_of(model, output, x)
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    with Image.open(PHOTO) as img:
        naflex = model.config.model_type == "siglip2_vision_model"
        if naflex:  # its processor keeps the aspect ratio; the export takes a square image: a square photo
            img = img.crop((0, 0, min(img.size), min(img.size)))
        ref_px = processor(images=img.convert("RGB"), return_tensors="np")["pixel_values"][0]
        our_px = preprocess_image(img, Preprocess.from_dict(manifest["preprocess"]))
        if naflex:  # compared as the processor's patches
            our_px = patches_of(torch.from_numpy(our_px)[None], model.config.patch_size)["pixel_values"][0].numpy()
            ref_px = ref_px[: len(our_px)]
    return {"repo": repo, "class": model_cls, "output": output, "size": f"{h}x{w}",
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
            "rel_err": float(np.abs(got - want).max() / max(1.0, np.abs(want).max())),
            "pixels": float(np.abs(our_px - ref_px).max()) if our_px.shape == ref_px.shape else float("inf"),
            "wall_s": wall, "rss_mb": rss}


def write(rows: list[dict], baseline: tuple[float, float], path: Path) -> None:
    import os

    import transformers

    from vitexport.environment import cpu_model

    lines = ["# transformers' vision towers at their published sizes", "",
             "Made by `scripts/hf_towers_check.py` (do not edit by hand). Each model was built by transformers from "
             "the config its hub repository holds (random weights moved off their init), saved with `save_pretrained` "
             "with its image processor, and exported by `vitexport onnx -c FOLDER` (no `-m`) in a process of its "
             "own; the written ONNX file was run by ONNX Runtime (CPU) against transformers' output on two random "
             "images (a tower without a pooler: its tokens, last_hidden_state). *rel. error* is max abs / max(1, "
             "|output|) (the tests' bound is 1e-4); *pixels* is the largest difference between the manifest's "
             "preprocessing and the image processor's on a 451x300 photo, in normalised units (its PIL "
             "implementation where it has one; DINOv3's and SigLIP2's resize with torch and keep the pixels as "
             "floats, so up to one 8-bit level apart; SigLIP2's on a square crop of the photo, as its patches).", "",
             f"transformers {transformers.__version__}, torch {torch.__version__}; {cpu_model()}, "
             f"{os.cpu_count()} cores. Memory baseline: `vitexport onnx -m vit_base_patch16_224` (timm's ViT-B/16 by "
             f"name, random weights) took {baseline[0]:.0f} s at a peak RSS of {baseline[1]:,.0f} MB.", "",
             "| repository (its config) | class | output | input | params (M) | rel. error | pixels | export s | "
             "peak RSS MB |", "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    refused = [r for r in rows if "refused" in r]
    for r in rows:
        if "refused" in r:
            continue
        lines.append(f"| {r['repo']} | {r['class']} | {r['output']} | {r['size']} | {r['params_m']:.1f} | "
                     f"{r['rel_err']:.1e} | {r['pixels']:.1e} | {r['wall_s']:.0f} | {r['rss_mb']:,.0f} |")
    if refused:
        lines += ["", "Refused, with the sentence `vitexport onnx` ends with (exit 2):", ""]
        lines += [f"- {r['repo']} ({r['class']}): {r['refused']}" for r in refused]
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "TRANSFORMERS.md")
    ap.add_argument("--only", action="append", help="a repository name (or its last part); repeatable")
    args = ap.parse_args()
    repos = [r for r in MODELS if not args.only or r in args.only or r.split("/")[1] in args.only]
    with tempfile.TemporaryDirectory() as tmp:
        wall, rss, _ = timed([sys.executable, "-m", "vitexport", "onnx", "-m", "vit_base_patch16_224", "-o",
                              str(Path(tmp) / "timm"), "-q"])
        rows = []
        for repo in repos:
            with tempfile.TemporaryDirectory(dir=tmp) as one:
                rows.append(check(repo, Path(one)))
                print(json.dumps(rows[-1]), flush=True)
    write(rows, (wall, rss), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
