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
import gc
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
    # Depth Anything V1 and V2 (convert_depth_anything_to_hf.py): a DINOv2 backbone at 518, its taps, the DPT head;
    # the processor keeps each image's aspect ratio at a multiple of 14
    **{repo: ("DepthAnythingConfig", dict(
        backbone_config=dict(model_type="dinov2", image_size=518, patch_size=14, hidden_size=width,
                             num_hidden_layers=depth, num_attention_heads=heads, out_indices=taps,
                             apply_layernorm=True, reshape_hidden_states=False),
        reassemble_hidden_size=width, patch_size=14, fusion_hidden_size=fusion, neck_hidden_sizes=neck, **extra),
        "DepthAnythingForDepthEstimation", "predicted_depth", "DPTImageProcessorPil",
        dict(size={"height": 518, "width": 518}, keep_aspect_ratio=True, ensure_multiple_of=14, resample=3,
             **IMAGENET))
       for repo, (width, depth, heads, taps, fusion, neck, extra) in {
           "depth-anything/Depth-Anything-V2-Small-hf": (384, 12, 6, [3, 6, 9, 12], 64, [48, 96, 192, 384], {}),
           "depth-anything/Depth-Anything-V2-Base-hf": (768, 12, 12, [3, 6, 9, 12], 128, [96, 192, 384, 768], {}),
           "depth-anything/Depth-Anything-V2-Large-hf": (1024, 24, 16, [5, 12, 18, 24], 256,
                                                         [256, 512, 1024, 1024], {}),
           "LiheYoung/depth-anything-small-hf": (384, 12, 6, [9, 10, 11, 12], 64, [48, 96, 192, 384], {}),
           "depth-anything/Depth-Anything-V2-Metric-Indoor-Small-hf": (
               384, 12, 6, [3, 6, 9, 12], 64, [48, 96, 192, 384],
               dict(depth_estimation_type="metric", max_depth=20)),
       }.items()},
    # DPT-Large (dpt/convert_dpt_to_pytorch.py, get_dpt_config's "large": a ViT-L/16 at DPTConfig's 384, its taps
    # and neck; the rest DPTConfig's defaults); its processor DPTImageProcessor(size=384) (convert_dpt_checkpoint)
    # with the class's defaults: a fixed 384x384, bicubic, mean/std 0.5
    "Intel/dpt-large": (
        "DPTConfig", dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                          backbone_out_indices=[5, 11, 17, 23], neck_hidden_sizes=[256, 512, 1024, 1024]),
        "DPTForDepthEstimation", "predicted_depth", "DPTImageProcessorPil",
        dict(size=384, resample=3, image_mean=[0.5] * 3, image_std=[0.5] * 3)),
    # DPT over DINOv2-S (dpt/convert_dinov2_depth_to_hf.py, get_dpt_config's "small": facebook/dinov2-small's config,
    # hidden_size 384 and 6 heads at 518 / 14 as dinov2/convert_dinov2_to_hf.py's get_dinov2_config makes "vits",
    # with out_indices [3, 6, 9, 12], no layernorm on the taps, not reshaped; the neck and head options); its
    # processor (convert_dpt_checkpoint): no resize, no rescale, the original's 0..255 mean/std, centre-padded to a
    # multiple of 14 (the script's size_divisibility=14: DPTImageProcessor's size_divisor)
    "facebook/dpt-dinov2-small-nyu": (
        "DPTConfig", dict(
            backbone_config=dict(model_type="dinov2", image_size=518, patch_size=14, hidden_size=384,
                                 num_attention_heads=6, out_indices=[3, 6, 9, 12], apply_layernorm=False,
                                 reshape_hidden_states=False),
            neck_hidden_sizes=[48, 96, 192, 384], use_bias_in_fusion_residual=False, add_projection=True),
        "DPTForDepthEstimation", "predicted_depth", "DPTImageProcessorPil",
        dict(do_resize=False, do_rescale=False, do_pad=True, size_divisor=14, do_normalize=True,
             image_mean=[123.675, 116.28, 103.53], image_std=[58.395, 57.12, 57.375])),
    # EoMT-L at 640 on DINOv2 (eomt/convert_eomt_to_hf.py, convert_model: EomtConfig from the original repository's
    # config.json with layerscale_value 1e-5; EomtConfig's defaults are this checkpoint's ViT-L/16 with 4 registers,
    # 200 queries over the last 4 blocks, 2 upscale blocks; 133 COCO panoptic labels: the integration test's class
    # logits (1, 200, 134), tests/models/eomt/test_modeling_eomt.py); a panoptic processor: the longer side to 640,
    # padded (do_pad), no split, EomtImageProcessor's bilinear and ImageNet mean/std. Judged on its mask and class
    # logits by name (its graph leads with vitexport's semantic_probs)
    "tue-mps/coco_panoptic_eomt_large_640": (
        "EomtConfig", dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, image_size=640,
                           patch_size=16, num_register_tokens=4, num_queries=200, num_blocks=4, num_upscale_blocks=2,
                           layerscale_value=1e-5, num_labels=133),
        "EomtForUniversalSegmentation", "masks_queries_logits", "EomtImageProcessorPil",
        dict(size={"shortest_edge": 640, "longest_edge": 640}, do_split_image=False, do_pad=True, resample=2,
             **IMAGENET)),
    # EoMT-S at 640 on DINOv3 ViT-S/16: transformers' conversion (eomt_dinov3/convert_eomt_dinov3_to_hf.py via
    # convert.sh, of tue-mps/coco_panoptic_eomt_small_640_dinov3 on facebook/dinov3-vits16-pretrain-lvd1689m) as
    # the config.json and preprocessor_config.json it wrote beside them hold: the backbone's sizes, eps 1e-5, RoPE
    # theta 100, no key bias; 200 queries over the last 3 blocks, 133 labels; the processor as convert_model makes it
    "tue-mps/eomt-dinov3-coco-panoptic-small-640": (
        "EomtDinov3Config", dict(hidden_size=384, intermediate_size=1536, num_hidden_layers=12, num_attention_heads=6,
                                 image_size=640, patch_size=16, num_register_tokens=4, layer_norm_eps=1e-5,
                                 layerscale_value=1.0, rope_theta=100.0, query_bias=True, key_bias=False,
                                 value_bias=True, use_gated_mlp=False, num_queries=200, num_blocks=3,
                                 num_upscale_blocks=2, num_labels=133),
        "EomtDinov3ForUniversalSegmentation", "masks_queries_logits", "EomtImageProcessorPil",
        dict(size={"shortest_edge": 640, "longest_edge": 640}, do_split_image=False, do_pad=True, resample=2,
             **IMAGENET)),
}
# Segment Anything ViT-B/L/H (sam/convert_sam_to_hf.py: SamVisionConfig's defaults are ViT-B; L and H set the width,
# depth, heads and global blocks), judged on the image embedding (get_image_embeddings); SamImageProcessor: the
# longer side to 1024, bilinear, ImageNet mean/std, padded to 1024 x 1024
SAM_PP = dict(size={"longest_edge": 1024}, pad_size={"height": 1024, "width": 1024}, resample=2, **IMAGENET)
for _name, _vision in (("sam-vit-base", {}),
                       ("sam-vit-large", dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                              global_attn_indexes=[5, 11, 17, 23])),
                       ("sam-vit-huge", dict(hidden_size=1280, num_hidden_layers=32, num_attention_heads=16,
                                             global_attn_indexes=[7, 15, 23, 31]))):
    MODELS[f"facebook/{_name}"] = ("SamConfig", dict(vision_config=_vision), "SamModel", "image_embeddings",
                                   "SamImageProcessorPil", SAM_PP)
# RF-DETR (rf_detr/convert_rf_detr_to_hf.py: OBJECT_DETECTION_CHECKPOINT_DEFAULT_ARGS and
# build_rf_detr_config_from_checkpoint): every published detector is a windowed DINOv2-S (384 wide, 6 heads, 12
# blocks) under a 256-wide decoder with 2 points a head, 300 queries and 91 labels (COCO's 90 classes + 1: the label
# index is COCO's category id); nano/small/medium/large at 384/512/576/704, patch 16, 2 windows a side, taps after
# blocks 3, 6, 9 and 12, 2/3/4/4 decoder layers; base at 560, patch 14, 4 windows, taps after 2, 5, 8 and 11, its
# position embedding trained at 518 (37 x 37), 3 decoder layers. The processor resizes to the resolution, bilinear,
# ImageNet mean/std. Judged on logits and pred_boxes by name (the graph leads with vitexport's query_outputs)
_RF_DETR = dict(d_model=256, decoder_n_points=2, decoder_self_attention_heads=8, decoder_cross_attention_heads=16,
                num_queries=300, group_detr=13, num_labels=91)
for _name, _size, _patch, _windows, _taps, _layers, _pos in (
        ("nano", 384, 16, 2, [3, 6, 9, 12], 2, 384), ("small", 512, 16, 2, [3, 6, 9, 12], 3, 512),
        ("medium", 576, 16, 2, [3, 6, 9, 12], 4, 576), ("base", 560, 14, 4, [2, 5, 8, 11], 3, 518)):
    MODELS[f"Roboflow/rf-detr-{_name}"] = (
        "RfDetrConfig", dict(backbone_config=dict(model_type="rf_detr_dinov2", hidden_size=384, num_hidden_layers=12,
                                                  num_attention_heads=6, image_size=_pos, patch_size=_patch,
                                                  out_indices=_taps, num_windows=_windows, num_register_tokens=0),
                             decoder_layers=_layers, **_RF_DETR),
        "RfDetrForObjectDetection", "logits", "RfDetrImageProcessor",
        dict(size={"height": _size, "width": _size}, **IMAGENET))
# outputs judged beside a row's own (the worse error counts): EoMT's class logits beside its mask logits, a
# detector's boxes beside its logits
ALSO = {"masks_queries_logits": ("class_queries_logits",), "RfDetrForObjectDetection": ("pred_boxes",)}


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


def output_of(model, outputs: tuple[str, ...], x: torch.Tensor) -> list[np.ndarray]:
    """transformers' outputs of those names, from one forward pass."""
    with torch.no_grad():
        if outputs == ("image_features",):  # a whole two-tower model: its image features
            return [model.get_image_features(pixel_values=x).pooler_output.numpy()]
        if outputs == ("image_embeddings",):  # SAM: the vision encoder's embedding
            return [model.get_image_embeddings(x).numpy()]
        if model.config.model_type == "siglip2_vision_model":
            out = model(**patches_of(x, model.config.patch_size))
        else:
            out = model(pixel_values=x)
        return [getattr(out, o).numpy() for o in outputs]


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
        if output == "predicted_depth":  # a depth above zero, as a trained model's (a ReLU of noise is mostly 0):
            # the head's last convolution (Depth Anything's head.conv3, DPT's head.head[4])
            [*_, last] = (m for m in model.head.modules() if isinstance(m, torch.nn.Conv2d))
            last.bias.fill_(1.0)
        if hasattr(model, "attn_mask_probs"):  # EoMT's trained checkpoints hold 0 (masking annealed away in
            model.attn_mask_probs.zero_()  # training); with it on, a mask logit within rounding of 0 flips
    processor = getattr(transformers, proc_cls)(**proc_kw) if proc_cls else None
    saved, out = tmp / repo.split("/")[1], tmp / "export"
    model.save_pretrained(saved)
    if processor is not None:
        processor.save_pretrained(saved)
    big = sum(p.numel() for p in model.parameters()) > 400e6
    if big:  # SAM ViT-H: not held here while the export runs (the machine's memory is the two processes')
        del model
        gc.collect()
    try:
        wall, rss, _ = timed([sys.executable, "-m", "vitexport", "onnx", "-c", str(saved), "-o", str(out), "-q"])
    except Refused as e:
        return {"repo": repo, "class": model_cls, "refused": str(e).replace(str(saved), repo.split("/")[1])}
    if big:  # read back: the same weights, as saved
        model = getattr(transformers, model_cls).from_pretrained(saved).eval()
    manifest = json.loads((out / "manifest.json").read_text())
    h, w = manifest["img_size"]
    x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(1))
    judged = (output, *ALSO.get(output, ALSO.get(model_cls, ())))
    wants = output_of(model, judged, x)
    want = wants[0]
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]  # each judged output by name where the graph has it, else its first
    gots = sess.run([o if o in names else names[0] for o in judged], {sess.get_inputs()[0].name: x.numpy()})
    if output == "predicted_depth" and not (want > 0).mean() > 0.5:
        raise SystemExit(f"{repo}: transformers' depth is mostly zero; the check would be vacuous")
    with Image.open(PHOTO) as img:
        naflex = model.config.model_type == "siglip2_vision_model"
        if naflex:  # its processor keeps the aspect ratio; the export takes a square image: a square photo
            img = img.crop((0, 0, min(img.size), min(img.size)))
        ref_px = processor(images=img.convert("RGB"), return_tensors="np")["pixel_values"][0]
        our_px = preprocess_image(img, Preprocess.from_dict(manifest["preprocess"]))
        if naflex:  # compared as the processor's patches
            our_px = patches_of(torch.from_numpy(our_px)[None], model.config.patch_size)["pixel_values"][0].numpy()
            ref_px = ref_px[: len(our_px)]
    return {"repo": repo, "class": model_cls, "output": ", ".join(judged), "size": f"{h}x{w}",
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
            "rel_err": max(float(np.abs(g - w_).max() / max(1.0, np.abs(w_).max())) for g, w_ in zip(gots, wants)),
            "pixels": float(np.abs(our_px - ref_px).max()) if our_px.shape == ref_px.shape else float("inf"),
            "wall_s": wall, "rss_mb": rss}


def write(rows: list[dict], baseline: tuple[float, float], path: Path) -> None:
    import os

    import transformers

    from vitexport.environment import cpu_model

    lines = ["# transformers' vision towers and dense models at their published sizes", "",
             "Made by `scripts/hf_towers_check.py` (do not edit by hand). Each model was built by transformers from "
             "the config its hub repository holds (random weights moved off their init), saved with `save_pretrained` "
             "with its image processor, and exported by `vitexport onnx -c FOLDER` (no `-m`) in a process of its "
             "own; the written ONNX file was run by ONNX Runtime (CPU) against transformers' output on two random "
             "images (a tower without a pooler: its tokens, last_hidden_state). *rel. error* is max abs / max(1, "
             "|output|) (the tests' bound is 1e-4; EoMT: the worse of its mask and class logits, each the ONNX "
             "output of that name, its graph's first being vitexport's semantic_probs); *pixels* is the largest "
             "difference between the manifest's preprocessing and the image processor's on a 451x300 photo, in "
             "normalised units (its PIL implementation where it has one; DINOv3's and SigLIP2's resize with torch and "
             "keep the pixels as floats, so up to one 8-bit level apart; SigLIP2's on a square crop of the photo, as "
             "its patches; n/a: Depth Anything's processor keeps each photo's aspect ratio, and DPT-DINOv2's does not "
             "resize at all (it pads to a multiple of 14), which a fixed-size export does not: it resizes to its "
             "input size; RF-DETR: judged on logits and pred_boxes by name, its graph leading with vitexport's "
             "query_outputs; its processor resizes the float image with torch's bilinear without antialias, which "
             "PIL's bilinear matches where both sides grow and not where one shrinks: nano's 384 from the photo's "
             "451-pixel width).", "",
             f"transformers {transformers.__version__}, torch {torch.__version__}; {cpu_model()}, "
             f"{os.cpu_count()} cores. Memory baseline: `vitexport onnx -m vit_base_patch16_224` (timm's ViT-B/16 by "
             f"name, random weights) took {baseline[0]:.0f} s at a peak RSS of {baseline[1]:,.0f} MB.", "",
             "| repository (its config) | class | output | input | params (M) | rel. error | pixels | export s | "
             "peak RSS MB |", "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    refused = [r for r in rows if "refused" in r]
    for r in rows:
        if "refused" in r:
            continue
        pixels = f"{r['pixels']:.1e}" if np.isfinite(r["pixels"]) else "n/a"
        lines.append(f"| {r['repo']} | {r['class']} | {r['output']} | {r['size']} | {r['params_m']:.1f} | "
                     f"{r['rel_err']:.1e} | {pixels} | {r['wall_s']:.0f} | {r['rss_mb']:,.0f} |")
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
