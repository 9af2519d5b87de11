"""Small detectors the tests make with transformers (random weights, `save_pretrained` folders), and the wrong graphs
that a tensor tolerance could miss but a detector's task must not."""

import json
import shutil

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
