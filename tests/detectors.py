"""Small detectors the tests make with transformers (random weights, `save_pretrained` folders), and the wrong graphs
that a tensor tolerance could miss but a detector's task must not."""

import json
import shutil
from pathlib import Path

import numpy as np
import onnx

from vitexport.paths import sha256_file

# RF-DETR at a tiny size: a 4-block DINOv2 of width 32 in 2 x 2 windows, taps after blocks 1, 2 and 4 (so blocks 0
# and 3 are windowed, 1 and 2 global), a 2-layer decoder with 20 queries over 7 labels
TINY_BACKBONE = dict(model_type="rf_detr_dinov2", hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                     image_size=48, patch_size=8, out_indices=[1, 2, 4], num_windows=2, num_register_tokens=0)
TINY = dict(d_model=32, decoder_layers=2, decoder_self_attention_heads=2, decoder_cross_attention_heads=4,
            decoder_n_points=2, num_queries=20, num_labels=7, decoder_ffn_dim=64, c2f_num_blocks=1, group_detr=2)


def rf_detr(transformers, torch, backbone=None, seed=0, **options):
    """A random RfDetrForObjectDetection whose class logits spread wide enough that some detections score above 0.5
    (a random head scores every query near 0.5)."""
    torch.manual_seed(seed)
    cfg = transformers.RfDetrConfig(backbone_config=dict(TINY_BACKBONE, **(backbone or {})), **{**TINY, **options})
    model = transformers.RfDetrForObjectDetection(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
        model.class_embed.weight.mul_(12)
        model.class_embed.bias.fill_(-1.0)
    return model


def save_rf_detr(transformers, torch, folder, size=64, **kw):
    model = rf_detr(transformers, torch, **kw)
    model.save_pretrained(folder)
    transformers.RfDetrImageProcessor(size={"height": size, "width": size}).save_pretrained(folder)
    return model


def _rewire(model, output: str, nodes: list, inits: dict) -> None:
    """Route the graph output `output` through `nodes` (which read '<output>_orig')."""
    for n in model.graph.node:
        n.output[:] = [f"{output}_orig" if o == output else o for o in n.output]
    for name, value in inits.items():
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(value), name))
    model.graph.node.extend(nodes)


def wrong_graph(path, how: str, num_labels: int) -> None:
    """Rewrite the judged output (query_outputs: labels logits then cx, cy, w, h) of the graph at `path`:
    'xyxy' its boxes read as corners (cx, cy, w, h -> cx - w, cy - h, cx + w, cy + h: wrong sizes, as a consumer that
    took the boxes for corners gets); 'classes' the class logits shifted by one (every label one off); 'images' the
    batch rolled (each image given another's detections)."""
    import onnx.helper as h

    m = onnx.load(str(path))
    src = "query_outputs_orig"
    C = num_labels
    if how == "classes":
        nodes = [h.make_node("Split", [src, "w_split"], ["w_logits", "w_boxes"], axis=2),
                 h.make_node("Split", ["w_logits", "w_split1"], ["w_first", "w_rest"], axis=2),
                 h.make_node("Concat", ["w_rest", "w_first", "w_boxes"], ["query_outputs"], axis=2)]
        inits = {"w_split": np.array([C, 4], np.int64), "w_split1": np.array([1, C - 1], np.int64)}
    elif how == "xyxy":
        nodes = [h.make_node("Split", [src, "w_split"], ["w_logits", "w_c", "w_s"], axis=2),
                 h.make_node("Sub", ["w_c", "w_s"], ["w_lo"]), h.make_node("Add", ["w_c", "w_s"], ["w_hi"]),
                 h.make_node("Concat", ["w_logits", "w_lo", "w_hi"], ["query_outputs"], axis=2)]
        inits = {"w_split": np.array([C, 2, 2], np.int64)}
    elif how == "images":  # the batch rolled by one: image i gets image i + 1's outputs
        nodes = [h.make_node("Shape", [src], ["w_shape"], start=0, end=1),
                 h.make_node("Sub", ["w_shape", "w_one"], ["w_n1"]),
                 h.make_node("Concat", ["w_one", "w_n1"], ["w_sizes"], axis=0),
                 h.make_node("Split", [src, "w_sizes"], ["w_first", "w_rest"], axis=0),
                 h.make_node("Concat", ["w_rest", "w_first"], ["query_outputs"], axis=0)]
        inits = {"w_one": np.array([1], np.int64)}
    else:
        raise ValueError(how)
    _rewire(m, "query_outputs", nodes, inits)
    onnx.save(m, str(path))


def with_wrong_export(folder, dst, how: str, num_labels: int):
    """A copy of an export folder whose model.onnx is `wrong_graph`'s, its record updated so the folder is
    consistent (the bench runs it; the PyTorch reference is rebuilt from the checkpoint and is right)."""
    shutil.copytree(folder, dst)
    path = dst / "model.onnx"
    wrong_graph(path, how, num_labels)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["onnx_sha256"], manifest["onnx_bytes"] = sha256_file(path), path.stat().st_size
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


# -- a detector that finds something: RF-DETR at the tiny size trained on coloured squares ---------------------------
SQUARES_MODEL = Path(__file__).resolve().parent / "fixtures" / "rf-detr-squares"  # scripts/train_tiny_detector.py
SQUARE_COLOURS = np.array([[230, 40, 40], [40, 200, 60], [50, 80, 230]], np.float32)  # labels 1, 2, 3
SQUARE_NAMES = ("red square", "green square", "blue square")


def squares(n: int, rng, size: int = 64):
    """n images (n, size, size, 3) uint8 of noise with 1 to 3 squares of a colour each (10 to 27 pixels a side),
    their boxes ((k, 4) cx, cy, w, h normalised) and labels ((k,), 1..3)."""
    images, boxes, labels = [], [], []
    for _ in range(n):
        img = rng.normal(120, 30, (size, size, 3)).clip(0, 255).astype(np.float32)
        b, lab = [], []
        for _ in range(int(rng.integers(1, 4))):
            s = int(rng.integers(10, 28))
            x, y = (int(v) for v in rng.integers(0, size - s, 2))
            c = int(rng.integers(0, 3))
            img[y:y + s, x:x + s] = SQUARE_COLOURS[c] + rng.normal(0, 10, 3)
            b.append([(x + s / 2) / size, (y + s / 2) / size, s / size, s / size])
            lab.append(c + 1)
        images.append(img.clip(0, 255).round().astype(np.uint8))
        boxes.append(np.array(b, np.float64))
        labels.append(np.array(lab, np.int64))
    return np.stack(images), boxes, labels


def squares_set(folder: Path, n: int, seed: int = 1, size: int = 64) -> Path:
    """A labelled detection set of `squares`: folder/images/NNN.png, COCO's instances.json (category ids the
    model's labels, named as its id2label names them) and YOLO labels (folder/labels/NNN.txt, class = the label;
    classes.txt names class 0 'none', the unused label 0)."""
    from PIL import Image

    images, boxes, labels = squares(n, np.random.default_rng(seed), size)
    (folder / "images").mkdir(parents=True)
    (folder / "labels").mkdir()
    recs, anns = [], []
    for i, (img, b, lab) in enumerate(zip(images, boxes, labels)):
        name = f"{i:03d}.png"
        Image.fromarray(img).save(folder / "images" / name)
        recs.append({"id": i + 1, "file_name": name, "width": size, "height": size})
        px = b * size
        for (cx, cy, w, h), c in zip(px, lab):
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": int(c), "iscrowd": 0,
                         "bbox": [cx - w / 2, cy - h / 2, w, h], "area": w * h})
        (folder / "labels" / f"{i:03d}.txt").write_text(
            "".join(f"{c} {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}\n" for (cx, cy, w, h), c in zip(b, lab)))
    cats = [{"id": c + 1, "name": name} for c, name in enumerate(SQUARE_NAMES)]
    (folder / "instances.json").write_text(json.dumps({"images": recs, "annotations": anns, "categories": cats}))
    (folder / "classes.txt").write_text("\n".join(("none", *SQUARE_NAMES)) + "\n")
    return folder
