"""Segment Anything's ViT encoders: timm's samvit options against timm (windows that do and do not divide the grid,
global blocks, decomposed relative position at the trained size and at another, no absolute position, the
classifier form), transformers' SamModel and SamVisionModel folders through `vitexport onnx` against transformers
(the encoder's embedding, and the decoder graph's masks for 1, 2 and 5 points with and without a box), SAM's
processor, and the masks gate: an encoder run with its windows as global attention, or a decoder fed another
image's embedding, fails it.
"""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import timm
import torch
from click.testing import CliRunner
from conftest import ROOT, fails_cleanly
from PIL import Image

from vitexport.cli import cli
from vitexport.data.images import preprocess_image
from vitexport.model.archs import get_arch
from vitexport.model.build import build_model
from vitexport.model.readers.checkpoints import adapt_state_dict, detect_format
from vitexport.parity.accumulate import ParityAccumulator, Truth
from vitexport.parity.compare import DEFAULT_THRESHOLDS
from vitexport.parity.masks import PROMPTS
from vitexport.validate.sam_masks import PromptedMasks
from vitexport.tensorrt_engine.graph_rules import rule_breakers

transformers = pytest.importorskip("transformers")

VISION = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, image_size=128, patch_size=16,
              output_channels=32, window_size=3, global_attn_indexes=[1], num_pos_feats=16, mlp_dim=64)
PROMPT = dict(hidden_size=32, image_size=128, patch_size=16, mask_input_channels=8)
DECODER = dict(hidden_size=32, mlp_dim=64, num_attention_heads=2, iou_head_hidden_dim=32)
PHOTO = ROOT / "calibration" / "photos" / "calib" / "chelsea.jpg"  # 451 x 300: padded below


def _perturb(model: torch.nn.Module, seed: int = 0, std: float = 0.2) -> None:
    """Every tensor random; a LayerNorm's weight about 1 and its bias about 0, as trained ones are (random norm
    weights about 0 would leave every image with nearly the same embedding, and every mask the same)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.copy_(1 + 0.1 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.05 * torch.randn(m.bias.shape, generator=g))


def save_sam(folder, vision=None, vision_only=False, seed=0):
    """A tiny SamModel (or SamVisionModel) with every tensor random, saved with its processor."""
    torch.manual_seed(seed)
    vis = dict(VISION, **(vision or {}))
    if vision_only:
        model = transformers.SamVisionModel(transformers.SamVisionConfig(**vis)).eval()
    else:
        cfg = transformers.SamConfig(vision_config=vis, prompt_encoder_config=PROMPT, mask_decoder_config=DECODER)
        model = transformers.SamModel(cfg).eval()
    _perturb(model, seed)
    model.save_pretrained(folder)
    side = vis["image_size"]
    transformers.SamImageProcessor(size={"longest_edge": side}, pad_size={"height": side, "width": side},
                                   mask_size={"longest_edge": side // 4},
                                   mask_pad_size={"height": side // 4, "width": side // 4}).save_pretrained(folder)
    return model


def export(saved, out, *extra):
    return CliRunner().invoke(cli, ["onnx", "-c", str(saved), "-o", str(out), "-q", *extra])


def session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


# -- timm -----------------------------------------------------------------------------------------------------------

TIMM_CASES = {  # (timm arguments, the size it is built at, the size vitexport exports)
    "windows-divide": (dict(window_size=3, global_attn_indexes=[1]), 96, 96),  # a 6 x 6 grid in 3 x 3 windows
    "windows-pad": (dict(window_size=4, global_attn_indexes=[2]), 112, 112),  # 7 x 7 padded to 8 x 8
    "all-global": (dict(window_size=0, global_attn_indexes=[]), 64, 64),
    "all-windowed": (dict(window_size=3, global_attn_indexes=[]), 80, 80),
    "other-size-smaller": (dict(window_size=3, global_attn_indexes=[1]), 128, 96),  # tables and position resampled
    "other-size-larger": (dict(window_size=3, global_attn_indexes=[0, 2]), 96, 144),
    "no-abs-pos-classifier": (dict(window_size=3, global_attn_indexes=[1], use_abs_pos=False, neck_chans=0,
                                   num_classes=5), 64, 64),
    "qk-norm-layer-scale": (dict(window_size=3, global_attn_indexes=[1], qk_norm=True, init_values=0.5), 64, 64),
}


@pytest.mark.parametrize("case", list(TIMM_CASES))
def test_each_option_matches_timm(case):
    """timm's model built at one size and run at another resamples its position embedding and global tables in
    every forward pass; vitexport's, built at the other size, resamples them once at load: the same numbers, for
    timm's forward (the pooled or classified map) and its forward_features (the image embedding)."""
    kwargs, built, size = TIMM_CASES[case]
    torch.manual_seed(0)
    ref = timm.create_model("samvit_base_patch16", pretrained=False, img_size=built, embed_dim=32, depth=3,
                            num_heads=2, **kwargs).eval()
    _perturb(ref)
    arch = get_arch("samvit_base_patch16")
    ours_kw = {k: v for k, v in kwargs.items() if k not in ("use_abs_pos",)}
    cfg = arch.config(img_size=size, embed_dim=32, depth=3, num_heads=2, **ours_kw,
                      **({"abs_pos_embed": False} if kwargs.get("use_abs_pos") is False else {}))
    ours = build_model(cfg)
    raw = ref.state_dict()
    sd, _ = adapt_state_dict(detect_format(set(raw)).convert(raw), ours, cfg.pos_embed_interp)
    ours.load_state_dict(sd, strict=True)
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want_map, want = ref.forward_features(x), ref(x)
        ours.set_fused_attn(False)
        got_map, got = ours.forward_features(x), ours(x)
    for w, g in ((want_map, got_map), (want, got)):
        assert g.shape == w.shape
        assert (g - w).abs().max().item() <= 1e-5 * max(1.0, w.abs().max().item())


def test_the_window_layout_matters():
    """The same weights with every window run as global attention (the tables resampled to the grid) give another
    embedding, a hundred times beyond the comparison's bound above: it can fail on the windows."""
    cfg = get_arch("samvit_base_patch16").config(img_size=96, embed_dim=32, depth=3, num_heads=2, window_size=3,
                                                 global_attn_indexes=[1])
    model = build_model(cfg)
    _perturb(model)
    x = torch.randn(1, 3, 96, 96, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        right = model.forward_features(x)
        for blk in model.blocks:
            blk.window_size = 0
        wrong = model.forward_features(x)
    assert (right - wrong).abs().max().item() > 1e-3 * max(1.0, right.abs().max().item())


# -- transformers ---------------------------------------------------------------------------------------------------

def test_a_sam_model_folder_exports_its_encoder_and_decoder_as_transformers_runs_them(tmp_path):
    hf = save_sam(tmp_path / "saved")
    r = export(tmp_path / "saved", tmp_path / "out")
    assert r.exit_code == 0, r.output
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["decoder"]["onnx"] == "decoder.onnx" and manifest["output_name"] == "image_embeddings"
    x = torch.randn(2, 3, 128, 128, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf.get_image_embeddings(x).numpy()
    enc = session(tmp_path / "out" / "model.onnx")
    got = enc.run(None, {"pixel_values": x.numpy()})[0]
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max())

    dec = session(tmp_path / "out" / "decoder.onnx")
    g = torch.Generator().manual_seed(2)
    for points in (1, 2, 5):
        for box in (False, True):
            coords = torch.rand(2, points, 2, generator=g) * 128
            labels = torch.randint(0, 2, (2, points), generator=g)
            boxes = torch.tensor([[[10.0, 20.0, 90.0, 100.0]], [[5.0, 5.0, 60.0, 70.0]]]) if box else None
            with torch.no_grad():
                out = hf(image_embeddings=torch.from_numpy(got), input_points=coords[:, None],
                         input_labels=labels[:, None], input_boxes=boxes, multimask_output=True)
            extra = boxes.reshape(2, 2, 2) if box else torch.zeros(2, 1, 2)
            extra_labels = torch.tensor([[2.0, 3.0]] * 2) if box else torch.full((2, 1), -1.0)
            feeds = {"image_embeddings": got, "point_coords": torch.cat([coords, extra], 1).numpy(),
                     "point_labels": torch.cat([labels.float(), extra_labels], 1).numpy(),
                     "mask_input": np.zeros((2, 1, 32, 32), np.float32), "has_mask_input": np.zeros(2, np.float32)}
            masks, iou = dec.run(None, feeds)
            want_masks, want_iou = out.pred_masks[:, 0].numpy(), out.iou_scores[:, 0].numpy()
            assert np.abs(masks[:, 1:] - want_masks).max() <= 1e-4 * max(1.0, np.abs(want_masks).max()), (points, box)
            assert np.abs(iou[:, 1:] - want_iou).max() <= 1e-4, (points, box)
    for name in ("model.onnx", "decoder.onnx"):
        onnx.checker.check_model(str(tmp_path / "out" / name), full_check=True)
        assert not rule_breakers(onnx.load(str(tmp_path / "out" / name)))


def test_a_vision_model_folder_exports_the_encoder_alone(tmp_path):
    hf = save_sam(tmp_path / "saved", vision=dict(window_size=4, global_attn_indexes=[0]), vision_only=True)
    r = export(tmp_path / "saved", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert not (tmp_path / "out" / "decoder.onnx").exists()
    x = torch.randn(1, 3, 128, 128, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(x).last_hidden_state.numpy()
    got = session(tmp_path / "out" / "model.onnx").run(None, {"pixel_values": x.numpy()})[0]
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


def test_sams_processor_is_followed(tmp_path):
    """The longer side to the size (int(x * s / longest + 0.5)), ImageNet's normalisation, the padding below: the
    image part equals SamImageProcessor's, the padding is its 0 within the 8-bit mean colour's 0.006."""
    save_sam(tmp_path / "saved")
    assert export(tmp_path / "saved", tmp_path / "out").exit_code == 0
    from vitexport.artifacts.folder import ModelFolder

    pp = ModelFolder(tmp_path / "out").read_manifest().preprocess
    proc = transformers.SamImageProcessor.from_pretrained(tmp_path / "saved")
    for size in ((300, 451), (451, 300), (128, 128), (1000, 37)):
        assert pp.resized_size(size[1], size[0]) == proc._get_preprocess_shape(size, 128)[::-1]
    with Image.open(PHOTO) as img:
        img = img.convert("RGB")
        ours = preprocess_image(img, pp)
        want = proc(images=img, return_tensors="np")["pixel_values"][0]
    h = round(300 * 128 / 451)
    assert np.abs(ours[:, h + 1:] - want[:, h + 1:]).max() < 0.01  # the padding
    assert np.abs(ours[:, :h - 1] - want[:, :h - 1]).mean() < 0.02  # the image (PIL's and torchvision's resize)


def test_another_size_and_sam_hq_are_one_sentence(tmp_path):
    save_sam(tmp_path / "saved")
    fails_cleanly(export(tmp_path / "saved", tmp_path / "out", "--img-size", "256"), "image_size alone (128x128)")
    cfg = json.loads((tmp_path / "saved" / "config.json").read_text())
    (tmp_path / "hq").mkdir()
    (tmp_path / "hq" / "config.json").write_text(json.dumps(dict(cfg, model_type="sam_hq")))
    (tmp_path / "hq" / "model.safetensors").write_bytes((tmp_path / "saved" / "model.safetensors").read_bytes())
    fails_cleanly(export(tmp_path / "hq", tmp_path / "out2"), "SAM-HQ")


# -- the masks gate -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("sam")
    save_sam(root / "saved", seed=3)
    assert export(root / "saved", root / "out").exit_code == 0
    from vitexport.artifacts.folder import ModelFolder

    _inputs.pp = ModelFolder(root / "out").read_manifest().preprocess
    return root / "out"


def _embeddings(onnx_path, x):
    return session(onnx_path).run(None, {"pixel_values": x})[0]


def _judge(decode, ref, out, precision="fp32"):
    acc = ParityAccumulator(len(ref), Truth(dense="masks", masks=decode))
    acc.update(0, ref, out)
    return DEFAULT_THRESHOLDS[precision].judge(acc.stats())


def _inputs(n=6):
    """The first n held-out photos as SAM's processor gives them."""
    from vitexport.artifacts.folder import ModelFolder  # noqa: F401

    files = sorted((ROOT / "calibration" / "photos" / "holdout").iterdir())[:n]
    pp = _inputs.pp
    return np.stack([preprocess_image(Image.open(f).convert("RGB"), pp) for f in files]).astype(np.float32)


def test_the_same_graph_passes_and_another_images_embedding_fails(exported):
    decode = PromptedMasks(exported / "decoder.onnx", 128, 32)
    ref = _embeddings(exported / "model.onnx", _inputs())
    same = _judge(decode, ref, ref.copy())
    assert same.passed and same.stats.mask_iou == 1.0 and same.stats.mask_iou_min == 1.0
    shifted = _judge(decode, ref, np.roll(ref, 1, axis=0), "int8")  # each image judged with its neighbour's embedding
    assert shifted.stats.mask_iou < 0.8 and shifted.stats.cos_min < 0.9
    assert shifted.failed, shifted.stats
    assert any("mask IoU" in f for f in shifted.failures)


def test_an_encoder_graph_whose_windows_run_as_global_attention_fails(exported, tmp_path):
    """The wrong graph: the same weights with every block attending over the whole grid, exported and run in ONNX
    Runtime; its masks through the right decoder miss even INT8's bounds."""
    from vitexport.artifacts.folder import ModelFolder
    from vitexport.exporter.to_onnx import export_onnx
    from vitexport.exporter.torch_model import model_from_manifest

    model = model_from_manifest(ModelFolder(exported).read_manifest())
    for blk in model.blocks:
        blk.window_size = 0
    export_onnx(model, tmp_path / "wrong.onnx", outputs=("image_embeddings",))
    x = _inputs()
    ref, wrong = _embeddings(exported / "model.onnx", x), _embeddings(tmp_path / "wrong.onnx", x)
    verdict = _judge(PromptedMasks(exported / "decoder.onnx", 128, 32), ref, wrong, "int8")
    assert verdict.failed, verdict.stats
    assert len(PROMPTS) == 8


def test_the_bench_judges_sam_by_its_masks(exported):
    r = CliRunner().invoke(cli, ["bench", str(exported), "--backend", "onnxruntime cpu fp32", "--batch", "1",
                                 "--max-images", "4", "--strict", "--json", str(exported / "bench.json")])
    assert r.exit_code == 0, r.output
    rows = json.loads((exported / "bench.json").read_text())
    text = json.dumps(rows)
    assert "mask_iou" in text and "mask_iou_min" in text


def test_the_docs_state_the_mask_bounds():
    lines = (ROOT / "docs" / "PARITY.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| precision | mask IoU"))
    seen = set()
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        first, *cells = [c.strip() for c in line.strip("|").split("|")]
        for precision in [p for p in ("fp32", "bf16", "fp16", "int8", "fp8") if p in first.split("(")[0]]:
            th = DEFAULT_THRESHOLDS[precision]
            assert [float(c) for c in cells[:2]] == [th.mask_iou, th.mask_iou_min], precision
            seen.add(precision)
    assert seen == set(DEFAULT_THRESHOLDS)


# -- predict ----------------------------------------------------------------------------------------------------------

def test_predict_writes_the_masks_transformers_post_processes(exported, tmp_path):
    """Points and a box on a photo: the chosen mask and the three alternatives at the image's size are
    transformers' (SamProcessor's prompts and post_process_masks over SamModel) given the same pixels (the tiny
    random encoder turns the 8-bit preprocessing's 0.002 into another embedding; the pixels are held to the
    processor's above), up to the pixels a float's rounding moves at a mask's edge."""
    saved = exported.parent / "saved"
    hf = transformers.SamModel.from_pretrained(saved).eval()
    proc = transformers.SamProcessor(transformers.SamImageProcessor.from_pretrained(saved))
    for points, box in (([(300.0, 150.0, 1)], None), ([(300.0, 150.0, 1), (60.0, 40.0, 0)], None),
                        ([], (80.0, 60.0, 380.0, 260.0))):
        out = tmp_path / f"out{len(points)}{box is not None}"
        args = ["predict", str(exported), str(PHOTO), "--out-dir", str(out), "--jsonl", "-q"]
        args += [a for x, y, label in points for a in ("--point", f"{x},{y},{label}")]
        args += ["--box", ",".join(map(str, box))] if box else []
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 0, r.output
        line = json.loads(r.output.strip().splitlines()[-1])
        with Image.open(PHOTO) as img:
            img = img.convert("RGB")
            kw = {}
            if points:
                kw.update(input_points=[[[[x, y] for x, y, _ in points]]], input_labels=[[[lb for *_, lb in points]]])
            if box:
                kw.update(input_boxes=[[list(box)]])
            inputs = proc(images=img, return_tensors="pt", **kw)
            inputs["pixel_values"] = torch.from_numpy(preprocess_image(img, _inputs.pp)[None])
        with torch.no_grad():
            res = hf(**{k: v for k, v in inputs.items() if k not in ("original_sizes", "reshaped_input_sizes")},
                     multimask_output=True)
        want = proc.post_process_masks(res.pred_masks, inputs["original_sizes"], inputs["reshaped_input_sizes"])[0][0]
        for k in (1, 2, 3):
            with Image.open(line["files"][f"mask{k}"]) as m:
                got = np.asarray(m) > 127
            inter, union = (got & want[k - 1].numpy()).sum(), (got | want[k - 1].numpy()).sum()
            assert union == 0 or inter / union > 0.99, (points, box, k, inter / union)
        assert line["files"]["overlay"].endswith(".mask.overlay.png") and len(line["scores"]) == 4
    fails_cleanly(CliRunner().invoke(cli, ["predict", str(exported), str(PHOTO), "--out-dir", str(tmp_path / "o"),
                                           "--point", "1,2,7"]), "foreground")
    fails_cleanly(CliRunner().invoke(cli, ["predict", str(exported), str(PHOTO), "--out-dir", str(tmp_path / "o")]),
                  "give sam a prompt")


def test_predict_writes_the_image_embeddings(exported, tmp_path):
    r = CliRunner().invoke(cli, ["predict", str(exported), str(PHOTO), "--embeddings", str(tmp_path / "e.npy"), "-q"])
    assert r.exit_code == 0, r.output
    emb = np.load(tmp_path / "e.npy")
    x = preprocess_image(Image.open(PHOTO).convert("RGB"), _inputs.pp)[None]
    assert emb.shape == (1, 32, 8, 8)
    assert np.abs(emb - _embeddings(exported / "model.onnx", x)).max() < 1e-5


def _infer(url, model, feeds):
    """One KServe v2 JSON request: {name: array} in, {name: array} out."""
    import urllib.request

    body = {"inputs": [{"name": n, "shape": list(v.shape), "datatype": "FP32", "data": v.ravel().tolist()}
                       for n, v in feeds.items()]}
    req = urllib.request.Request(f"{url}/v2/models/{model}/infer", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        outs = json.loads(r.read())["outputs"]
    return {o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"]) for o in outs}


def test_triton_serves_the_encoder_and_the_decoder_beside_it(exported, tmp_path):
    """`vitexport triton` writes two entries; a real Triton server runs both: the bench's served row is judged by
    its masks, and a point sent to the served decoder with the served embedding gives ONNX Runtime's masks."""
    from conftest import copy_export, load_script

    from vitexport.artifacts.folder import ModelFolder

    ts = load_script("triton_server")
    if why := ts.runnable_here():
        pytest.skip(why)
    venv = ts.prepare(quiet=True)
    folder = ModelFolder(copy_export(exported, tmp_path / "sam"))
    repo = tmp_path / "repo"
    r = CliRunner().invoke(cli, ["triton", str(folder.path), "-o", str(repo)])
    assert r.exit_code == 0, r.output
    name = folder.read_manifest().variant + "-fp32"
    assert sorted(p.name for p in repo.iterdir()) == [name, f"{name}-decoder"]
    dec_config = (repo / f"{name}-decoder" / "config.pbtxt").read_text()
    assert "max_batch_size: 0" in dec_config and "dims: [ -1, -1, 2 ]" in dec_config  # whole tensors
    assert f'client.infer("{name}-decoder"' in r.output
    for entry in repo.iterdir():
        ts.python_backend(entry)
    server = ts.start(repo, venv)
    try:
        r = CliRunner().invoke(cli, ["bench", str(folder.path), "--backend", "endpoint", "--endpoint", server.http,
                                     "--max-images", "4", "--batch", "1", "--iterations", "1", "--min-time", "0.05",
                                     "--warmup", "0", "--concurrency", "1", "--strict", "-q",
                                     "--json", str(tmp_path / "b.json")])
        assert r.exit_code == 0, r.output
        row = next(x for x in json.loads((tmp_path / "b.json").read_text())["results"] if x["backend"] == "endpoint")
        assert row["parity"]["mask_iou"] > 0.999 and row["parity"]["status"] == "pass"
        from vitexport.model.heads.sam_decoder import prompts_to_inputs

        x = _inputs(1)
        emb = _infer(server.http, name, {"pixel_values": x})["image_embeddings"]
        coords, labels = prompts_to_inputs([(40.0, 60.0, 1), (90.0, 20.0, 0)], (10.0, 10.0, 100.0, 90.0), (1.0, 1.0))
        feeds = {"image_embeddings": emb, "point_coords": coords[None], "point_labels": labels[None],
                 "mask_input": np.zeros((1, 1, 32, 32), np.float32), "has_mask_input": np.zeros(1, np.float32)}
        served = _infer(server.http, f"{name}-decoder", feeds)
    finally:
        server.stop()
    local = session(exported / "decoder.onnx").run(None, {**feeds, "image_embeddings": _embeddings(
        exported / "model.onnx", x)})
    assert np.abs(served["masks"] - local[0]).max() < 1e-3 * max(1.0, np.abs(local[0]).max())
    assert (served["masks"] > 0).mean() not in (0.0, 1.0)  # a mask with an inside and an outside
    assert np.abs(served["iou_predictions"] - local[1]).max() < 1e-4


def test_a_replaced_decoder_graph_is_refused_by_triton_and_predict(exported, tmp_path):
    from conftest import copy_export

    folder = copy_export(exported, tmp_path / "sam")
    with open(folder / "decoder.onnx", "ab") as f:
        f.write(b"\0")
    fails_cleanly(CliRunner().invoke(cli, ["triton", str(folder), "-o", str(tmp_path / "repo")]),
                  "decoder.onnx does not match its record")
    assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").iterdir())  # neither entry written
    fails_cleanly(CliRunner().invoke(cli, ["predict", str(folder), str(PHOTO), "--point", "10,10", "--out-dir",
                                           str(tmp_path / "masks")]), "decoder.onnx does not match its record")


# -- against ground-truth objects -------------------------------------------------------------------------------------

def test_the_interior_point_lies_inside_rings_and_crescents():
    from vitexport.parity.masks import interior_point, truth_objects

    yy, xx = np.mgrid[:120, :160]
    ring = ((yy - 60) ** 2 + (xx - 80) ** 2 < 50 ** 2) & ((yy - 60) ** 2 + (xx - 80) ** 2 > 30 ** 2)
    crescent = ((yy - 60) ** 2 + (xx - 80) ** 2 < 50 ** 2) & ((yy - 60) ** 2 + (xx - 100) ** 2 > 45 ** 2)
    for obj in (ring, crescent):
        x, y = interior_point(obj)
        assert obj[y, x] and obj[max(y - 5, 0):y + 6, max(x - 5, 0):x + 6].all()  # well inside, not on an edge
    square = np.zeros((50, 70), bool)
    square[10:31, 30:51] = True  # side 21, centre (40, 20)
    assert interior_point(square) == (40, 20)
    gt = np.zeros((50, 70), np.int64)
    gt[square], gt[40:45, 2:8], gt[0:3] = 7, 3, 255
    objs = truth_objects(gt)
    assert [int(gt[o[1][1], o[1][0]]) for o in objs] == [7, 3]  # largest first, 255 and 0 no object
    assert objs[0][2] == (30, 10, 50, 30) and objs[1][2] == (2, 40, 7, 44)


def _squares(size, seed):
    """A truth map of an image (w, h): three squares of odd sides apart from one another (an erosion leaves each
    one's centre), numbered 1, 2 and 5, one in each third of the width, and a band of rows below them ignored (255)."""
    w, h = size
    rng = np.random.default_rng(seed)
    gt = np.zeros((h, w), np.uint8)
    squares = []
    third = w // 3
    for i, (v, part) in enumerate(((1, 3), (2, 4), (5, 7))):
        half = min(third, h - 8) // part
        cx = i * third + int(rng.integers(half + 1, third - half - 1))
        cy = int(rng.integers(half + 1, h - 8 - half - 1))
        gt[cy - half:cy + half + 1, cx - half:cx + half + 1] = v
        squares.append((v, (cx, cy), (cx - half, cy - half, cx + half, cy + half)))
    gt[h - 6:] = 255
    return gt, squares


def test_the_bench_judges_sam_against_ground_truth_objects_as_transformers_segments_them(exported, tmp_path):
    """Photos with object maps beside them: each object's point (its centre) and box prompts through transformers'
    SamModel (the same pixels, SamProcessor's prompts and post_process_masks, the mask SAM's ONNX script picks)
    give the reference's IoU against the objects the bench reports; the same graph as a row differs by 0."""
    data = tmp_path / "data"
    data.mkdir()
    files = sorted((ROOT / "calibration" / "photos" / "holdout").iterdir())[:3]
    truths = {}
    for i, f in enumerate(files):
        (data / f.name).write_bytes(f.read_bytes())
        with Image.open(f) as img:
            gt, squares = _squares(img.size, i)
        Image.fromarray(gt).save(data / f"{f.stem}.mask.png")
        truths[f.name] = (gt, squares)
    r = CliRunner().invoke(cli, ["bench", str(exported), "--backend", "onnxruntime cpu fp32", "--batch", "1",
                                 "--data", str(data), "--strict", "--no-prepare", "--json", str(tmp_path / "b.json")])
    assert r.exit_code == 0, r.output
    assert "IoU of an object's point prompt" in " ".join(r.output.split())
    row = next(x for x in json.loads((tmp_path / "b.json").read_text())["results"]
               if x["name"] == "onnxruntime cpu fp32")
    truth = row["parity"]["truth"]
    assert truth["n"] == 3

    saved = exported.parent / "saved"
    hf = transformers.SamModel.from_pretrained(saved).eval()
    proc = transformers.SamProcessor(transformers.SamImageProcessor.from_pretrained(saved))
    want = {"point_iou": [], "box_iou": []}
    for name, (gt, squares) in truths.items():
        keep = gt != 255
        with Image.open(data / name) as img:
            img = img.convert("RGB")
            pixels = torch.from_numpy(preprocess_image(img, _inputs.pp)[None])
            per = {"point_iou": [], "box_iou": []}
            for v, (x, y), box in squares:
                for key, kw in (("point_iou", dict(input_points=[[[[x, y]]]], input_labels=[[[1]]])),
                                ("box_iou", dict(input_boxes=[[list(map(float, box))]]))):
                    inputs = proc(images=img, return_tensors="pt", **kw)
                    inputs["pixel_values"] = pixels
                    with torch.no_grad():
                        res = hf(**{k: t for k, t in inputs.items()
                                    if k not in ("original_sizes", "reshaped_input_sizes")}, multimask_output=True)
                    masks = proc.post_process_masks(res.pred_masks, inputs["original_sizes"],
                                                    inputs["reshaped_input_sizes"])[0][0].numpy()
                    chosen = masks[int(res.iou_scores[0, 0].argmax())]  # one point or a box: the best-scored
                    obj = gt == v
                    inter, union = (chosen & obj & keep).sum(), ((chosen | obj) & keep).sum()
                    per[key].append(inter / union if union else 1.0)
        for key in want:
            want[key].append(np.mean(per[key]))
    for key in want:
        # equal here; 1e-4 leaves a few pixels at a mask edge to another CPU's rounding (a point moved by 3 pixels:
        # 2e-4)
        assert abs(truth[key]["reference"] - np.mean(want[key])) < 1e-4, (key, truth[key], want[key])
        assert abs(truth[key]["diff"]) < 0.01 and truth[key]["diff_ci"][0] <= truth[key]["diff"]
        assert 0.0 < truth[key]["reference"] < 1.0  # random weights: neither every pixel nor none
