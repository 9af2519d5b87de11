"""transformers' RF-DETR (`RfDetrForObjectDetection`) from `save_pretrained` folders: vitexport's model and its ONNX
export give transformers' own logits and pred_boxes with the same weights, option by option (windows or none, the
taps normed or not, the projector's and decoder's activations and widths), with both forms of the deformable
attention's sampling (GridSample and gathers, equal to each other and to grid_sample however far out a point falls);
the batch axis is symbolic; every graph passes onnx.checker's full check, the TensorRT op rule and its support
matrix. The post-processing is the processor's post_process_object_detection, and vitexport's COCO evaluation is
pycocotools' on the same detections. What RF-DETR cannot run is one sentence.
"""

import contextlib
import io
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from conftest import fails_cleanly
from detectors import save_rf_detr

from vitexport.cli import cli
from vitexport.model.layers.deformable import bilinear_gather
from vitexport.parity.coco import STATS, CocoEval
from vitexport.parity.detections import postprocess, split
from vitexport.tensorrt_engine.graph_rules import rule_breakers
from vitexport.tensorrt_engine.onnx_support import unsupported

transformers = pytest.importorskip("transformers")


def export(saved, out, *extra):
    return CliRunner().invoke(cli, ["onnx", "-c", str(saved), "-o", str(out), "-q", *extra])


def run(path, x):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"pixel_values": x})))


def close(a, b):
    """Within 1e-4 x max(1, |ref|) of the reference."""
    a, b = np.asarray(a), np.asarray(b)
    return float(np.abs(a - b).max()) <= 1e-4 * max(1.0, float(np.abs(b).max()))


@pytest.mark.parametrize("sampling", ["grid_sample", "gather"])
def test_the_export_gives_transformers_logits_and_boxes_at_two_batch_sizes(tmp_path, sampling):
    model = save_rf_detr(transformers, torch, tmp_path / "saved")
    r = export(tmp_path / "saved", tmp_path / "out", "--sampling", sampling)
    assert r.exit_code == 0, r.output
    path = tmp_path / "out" / "model.onnx"
    onnx.checker.check_model(str(path), full_check=True)
    graph = onnx.load(str(path))
    assert not rule_breakers(graph) and not unsupported(graph)
    ops = {n.op_type for n in graph.graph.node}
    assert ("GridSample" in ops) == (sampling == "grid_sample") and "TopK" in ops
    assert [d.dim_param for d in graph.graph.input[0].type.tensor_type.shape.dim][:1] == ["batch"]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["output_name"] == "query_outputs" and manifest["config"]["dense"]["sampling"] == sampling
    g = torch.Generator().manual_seed(1)
    for batch in (1, 3):  # the batch is symbolic: two sizes through one graph
        x = torch.randn(batch, 3, 64, 64, generator=g)
        with torch.no_grad():
            ref = model(pixel_values=x)
        got = run(path, x.numpy())
        assert close(got["logits"], ref.logits) and close(got["pred_boxes"], ref.pred_boxes), batch
        assert np.array_equal(got["query_outputs"], np.concatenate([got["logits"], got["pred_boxes"]], -1))


@pytest.mark.parametrize("backbone,options", [
    ({"num_windows": 1}, {}),  # no windows: every block global
    ({"apply_layernorm": False, "out_indices": [2, 4]}, {"activation_function": "relu"}),
    ({"out_indices": [1, 3]}, {"c2f_num_blocks": 2, "decoder_activation_function": "gelu", "hidden_expansion": 1.0,
                               "decoder_layers": 1, "num_queries": 12}),
    ({"layerscale_value": 0.5, "mlp_ratio": 2}, {"decoder_self_attention_heads": 4, "decoder_n_points": 3}),
])
def test_each_option_matches_transformers(tmp_path, backbone, options):
    from vitexport.model.build import build_model
    from vitexport.model.config import ViTConfig
    from vitexport.model.readers.checkpoints import load_checkpoint, load_into
    from vitexport.model.readers.hf_models import describe_transformers

    model = save_rf_detr(transformers, torch, tmp_path / "saved", backbone=backbone, **options)
    cfg = json.loads((tmp_path / "saved" / "config.json").read_text())
    proc = json.loads((tmp_path / "saved" / "preprocessor_config.json").read_text())
    described = describe_transformers(cfg, proc, "saved")
    ours = build_model(ViTConfig(**described.fields))
    load_into(ours, load_checkpoint(tmp_path / "saved"), "bicubic-antialias")
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref, (_, logits, boxes) = model(pixel_values=x), ours(x)
    assert close(logits, ref.logits) and close(boxes, ref.pred_boxes)


def test_a_minimal_config_reads_as_transformers_reads_it(tmp_path):
    """A config.json without the fields equal to their defaults (as an older transformers saves it, and as the
    published configurations are written): the default backbone RfDetrConfig makes, RfDetrDinov2Config's defaults
    under a given one."""
    from vitexport.model.readers.hf_models import describe_transformers

    for cfg in ({"model_type": "rf_detr"},
                {"model_type": "rf_detr", "backbone_config": {"model_type": "rf_detr_dinov2"}, "num_queries": 100}):
        theirs = transformers.RfDetrConfig(**cfg)
        d = describe_transformers(json.loads(json.dumps(cfg)), None, "cfg").fields
        bb = theirs.backbone_config
        assert (d["embed_dim"], d["depth"], d["num_heads"], d["patch_size"]) == \
            (bb.hidden_size, bb.num_hidden_layers, bb.num_attention_heads, (bb.patch_size,) * 2)
        det = d["dense"]
        assert det.taps == tuple(bb.out_indices) and det.num_windows == bb.num_windows
        assert set(det.window_blocks) == set(bb.window_block_indexes) & set(range(bb.num_hidden_layers))
        assert (det.d_model, det.decoder_layers, det.num_queries, det.n_points, det.ffn_dim) == \
            (theirs.d_model, theirs.decoder_layers, theirs.num_queries, theirs.decoder_n_points,
             theirs.decoder_ffn_dim)
        assert (det.self_attn_heads, det.cross_attn_heads, det.num_labels, det.c2f_blocks) == \
            (theirs.decoder_self_attention_heads, theirs.decoder_cross_attention_heads, theirs.num_labels,
             theirs.c2f_num_blocks)


def test_the_gather_form_equals_grid_sample_far_outside_the_map():
    g = torch.Generator().manual_seed(0)
    v = torch.randn(3, 5, 7, 9, generator=g)
    loc = torch.rand(3, 11, 4, 2, generator=g) * 3 - 1  # from -1 to 2: points beyond every border
    loc[0, 0, 0] = torch.tensor([0.0, 1.0])  # exactly on the edges
    ref = F.grid_sample(v, 2 * loc - 1, mode="bilinear", padding_mode="zeros", align_corners=False)
    assert torch.allclose(bilinear_gather(v, loc), ref, atol=1e-5)


def test_the_post_processing_is_the_processors(tmp_path):
    model = save_rf_detr(transformers, torch, tmp_path / "saved")
    proc = transformers.RfDetrImageProcessor.from_pretrained(tmp_path / "saved")
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = model(pixel_values=x)
    sizes = [(300, 451), (480, 200)]
    for threshold, top_k in ((0.5, None), (0.3, 25), (0.0, 7)):
        theirs = proc.post_process_object_detection(out, threshold=threshold, target_sizes=sizes, top_k=top_k)
        q = np.concatenate([out.logits.numpy(), out.pred_boxes.numpy()], -1)
        ours = postprocess(*split(q, 7), sizes, top_k or 20, threshold)
        assert sum(len(t["scores"]) for t in theirs) > 0
        for t, o in zip(theirs, ours):
            assert np.array_equal(t["labels"].numpy(), o.labels)
            assert np.allclose(t["scores"].numpy(), o.scores, atol=1e-6)
            assert np.allclose(t["boxes"].numpy(), o.boxes, atol=1e-3)


def _pycocotools(images, anns, dets):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = {"images": images, "annotations": anns, "categories": [{"id": c} for c in range(1, 6)]}
        gt.createIndex()
        e = COCOeval(gt, gt.loadRes(dets), "bbox")
        e.evaluate()
        e.accumulate()
        e.summarize()
    return e.stats


@pytest.mark.parametrize("seed", range(4))
def test_the_evaluation_is_pycocotools(seed):
    """Random truths (crowds among them, every size range) and detections (jittered truths, strays, scores rounded
    so that ties occur): the same 12 numbers."""
    pytest.importorskip("pycocotools")
    rng = np.random.default_rng(seed)
    images, anns, dets, ev = [], [], [], CocoEval()
    for i in range(30):
        images.append({"id": i + 1, "width": 640, "height": 480})
        g = int(rng.integers(0, 8))
        xy, wh = rng.uniform(0, 500, (g, 2)), rng.uniform(4, 220, (g, 2))
        gb, lab, crowd = np.concatenate([xy, xy + wh], 1), rng.integers(1, 6, g), rng.random(g) < 0.1
        for b, c, k in zip(gb, lab, crowd):
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": int(c), "iscrowd": int(k),
                         "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]], "area": float(np.prod(b[2:] - b[:2]))})
        nd = int(rng.integers(1, 25))
        if g:
            src = rng.integers(0, g, nd)
            db, dl = gb[src] + rng.normal(0, 12, (nd, 4)), np.where(rng.random(nd) < 0.8, lab[src],
                                                                    rng.integers(1, 6, nd))
        else:
            db, dl = rng.uniform(0, 600, (nd, 4)), rng.integers(1, 6, nd)
        db = np.concatenate([np.minimum(db[:, :2], db[:, 2:]), np.maximum(db[:, :2], db[:, 2:]) + 1], 1)
        ds = np.round(rng.random(nd), 2)
        dets += [{"image_id": i + 1, "category_id": int(c), "score": float(s),
                  "bbox": [float(b[0]), float(b[1]), float(b[2] - b[0]), float(b[3] - b[1])]}
                 for b, c, s in zip(db, dl, ds)]
        ev.add(gb, lab, db, ds, dl, crowd, np.prod(gb[:, 2:] - gb[:, :2], axis=1))
    ours = ev.stats()
    assert np.allclose([ours[k] for k in STATS], _pycocotools(images, anns, dets), atol=1e-12)


def test_what_rf_detr_cannot_run_is_one_sentence(tmp_path):
    save_rf_detr(transformers, torch, tmp_path / "saved")
    fails_cleanly(export(tmp_path / "saved", tmp_path / "a", "--img-size", "72"), "divides into its 2 windows")
    fails_cleanly(export(tmp_path / "saved", tmp_path / "b", "--img-size", "64x96"), "square patch grid")
    fails_cleanly(export(tmp_path / "saved", tmp_path / "c", "--dynamic-img-size"), "one square size")
    for model_type, what in (("lw_detr", "LW-DETR"), ("yolos", "YOLOS"), ("owlv2", "OWLv2")):
        cfg = tmp_path / model_type
        cfg.mkdir()
        (cfg / "config.json").write_text(json.dumps({"model_type": model_type}))
        (cfg / "model.safetensors").write_bytes(b"")
        fails_cleanly(export(cfg, tmp_path / f"o-{model_type}"), what)


def test_a_near_tie_in_the_topk_moves_a_few_queries_and_no_more():
    """The export check of a detector leaves out the few queries of an image that took another proposal (two
    proposals within float rounding swap in the two-stage TopK), and judges a graph whose queries moved wholesale
    as it is."""
    from vitexport.exporter.check import MOVED_MIN, moved_queries

    rng = np.random.default_rng(0)
    ref = rng.normal(size=(3, 300, 11)).astype(np.float32)
    out = ref + rng.normal(scale=1e-7, size=ref.shape).astype(np.float32)
    assert not moved_queries(ref, out, 1e-4).any()
    swapped = out.copy()
    swapped[1, [7, 8]] = swapped[1, [8, 7]]  # two queries' proposals swapped in one image
    moved = moved_queries(ref, swapped, 1e-4)
    assert moved is not None and moved.sum() == 2 and moved[1, 7] and moved[1, 8]
    wrong = out.copy()
    wrong[..., -4:] *= 2  # every box twice its size: every query moved
    assert moved_queries(ref, wrong, 1e-4) is None
    many = out.copy()
    many[0, :max(MOVED_MIN, 6) + 1] += 1.0
    assert moved_queries(ref, many, 1e-4) is None
