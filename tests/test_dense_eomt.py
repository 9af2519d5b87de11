"""transformers' EoMT (`EomtForUniversalSegmentation` on a DINOv2-like ViT, `EomtDinov3ForUniversalSegmentation` on a
DINOv3 one) from `save_pretrained` folders: the export gives transformers'
own class_queries_logits and masks_queries_logits with the same weights, whatever its `attn_mask_probs` say (a
new mask in every query block, in some, in none; transformers keeps the previous block's mask where the entry is
0), with a gated MLP, from a config saved without its defaults; the semantic map it adds is the processor's
post-processing before its resizes; the preprocessing is EoMT's processor's (the longer side to the size, black
below and right); what no graph reproduces (a probability strictly between 0 and 1) and another size are one
sentence. Every graph passes onnx.checker's full check and the TensorRT op rule.
"""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from conftest import ROOT, fails_cleanly
from PIL import Image

from vitexport.cli import cli
from vitexport.data.images import preprocess_image
from vitexport.data.preprocess import Preprocess
from vitexport.tensorrt_engine.graph_rules import rule_breakers

transformers = pytest.importorskip("transformers")

TINY = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, image_size=64, patch_size=8, num_queries=6,
            num_blocks=2, num_register_tokens=2, num_labels=3, mlp_ratio=2)
PHOTO = ROOT / "calibration" / "photos" / "calib" / "chelsea.jpg"  # 451 x 300: padded below


DINOV3 = dict(TINY, intermediate_size=64)
DINOV3.pop("mlp_ratio")


def save_eomt(folder, config: dict, probs=None, seed=0, sharp=False, dinov3=False):
    torch.manual_seed(seed)
    cls, cfg = ("EomtDinov3ForUniversalSegmentation", "EomtDinov3Config") if dinov3 else \
        ("EomtForUniversalSegmentation", "EomtConfig")
    model = getattr(transformers, cls)(getattr(transformers, cfg)(**config)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
        if probs is not None:
            model.attn_mask_probs.copy_(torch.tensor(probs, dtype=torch.float32))
        if sharp:  # queries sure of their class and masks of high contrast: a map of several classes
            model.class_predictor.weight.mul_(30)
            model.mask_head.fc3.weight.mul_(3)
    model.save_pretrained(folder)
    return model


def export(saved, out, *extra):
    return CliRunner().invoke(cli, ["onnx", "-c", str(saved), "-o", str(out), "-q", *extra])


def run(path, x):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"pixel_values": x})))


@pytest.mark.parametrize("probs, extra, dinov3", [
    ([1.0, 1.0], {}, False),  # transformers' default: a new mask in each query block
    ([0.0, 1.0], {}, False),  # none in the first, a new one in the second
    ([1.0, 0.0], {}, False),  # the second keeps the first's
    ([0.0, 0.0], {}, False),  # no masking at all
    ([1.0, 1.0], dict(use_swiglu_ffn=True, num_upscale_blocks=1, hidden_act="gelu_pytorch_tanh"), False),
    # EoMT-DINOv3: RoPE on the patches alone (the queries, class and registers unrotated), no key bias
    ([1.0, 1.0], {}, True),
    ([0.0, 1.0], dict(use_gated_mlp=True, key_bias=True, rope_parameters={"rope_theta": 1000.0,
                                                                          "rope_type": "default"}), True),
], ids=["every-block", "second-only", "kept-mask", "unmasked", "swiglu-one-upscale", "dinov3", "dinov3-gated"])
def test_the_export_gives_transformers_outputs(tmp_path, probs, extra, dinov3):
    model = save_eomt(tmp_path / "saved", dict(DINOV3 if dinov3 else TINY, **extra), probs, dinov3=dinov3)
    r = export(tmp_path / "saved", tmp_path / "out")
    assert r.exit_code == 0, r.output
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(pixel_values=x)
    got = run(tmp_path / "out" / "model.onnx", x.numpy())
    for name in ("class_queries_logits", "masks_queries_logits"):
        w = getattr(want, name).numpy()
        assert got[name].shape == w.shape
        assert np.abs(got[name] - w).max() <= 1e-4 * max(1.0, float(np.abs(w).max())), name
    # the semantic map: softmax over the classes without 'no object', sigmoid masks, summed over the queries
    probs_ = torch.softmax(want.class_queries_logits, -1)[..., :-1]
    semantic = torch.einsum("bqc, bqhw -> bchw", probs_, want.masks_queries_logits.sigmoid()).numpy()
    assert np.abs(got["semantic_probs"] - semantic).max() < 1e-4
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["output_name"] == "semantic_probs"
    onnx.checker.check_model(str(tmp_path / "out" / "model.onnx"), full_check=True)
    assert not rule_breakers(onnx.load(str(tmp_path / "out" / "model.onnx")))


@pytest.mark.parametrize("model_type", ["eomt", "eomt_dinov3"])
def test_a_minimal_config_and_the_processors_preprocessing(tmp_path, model_type):
    """A config.json of the non-default values alone (EomtConfig's or EomtDinov3Config's defaults for the rest: 4
    registers, patch 16, DINOv3's RoPE theta 100 and no key bias) and the processor's own settings saved beside
    it: the model transformers builds from the same file, and its pixels on a photo."""
    minimal = {"model_type": model_type, "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2,
               "image_size": 64, "num_queries": 4, "num_blocks": 1, "id2label": {str(i): f"c{i}" for i in range(5)}}
    if model_type == "eomt_dinov3":
        minimal["intermediate_size"] = 64
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "config.json").write_text(json.dumps(minimal))
    torch.manual_seed(0)
    cls = "EomtDinov3ForUniversalSegmentation" if model_type == "eomt_dinov3" else "EomtForUniversalSegmentation"
    model = getattr(transformers, cls)(transformers.AutoConfig.from_pretrained(saved)).eval()
    assert model.config.num_register_tokens == 4 and model.config.num_labels == 5 and model.config.patch_size == 16
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(saved / "model.safetensors"))
    proc = transformers.EomtImageProcessorPil(size={"shortest_edge": 64, "longest_edge": 64}, do_pad=True)
    proc.save_pretrained(saved)
    r = export(saved, tmp_path / "out")
    assert r.exit_code == 0, r.output
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(pixel_values=x).masks_queries_logits.numpy()
    assert np.abs(run(tmp_path / "out" / "model.onnx", x.numpy())["masks_queries_logits"] - want).max() < 1e-4
    pp = Preprocess.from_dict(json.loads((tmp_path / "out" / "manifest.json").read_text())["preprocess"])
    with Image.open(PHOTO) as img:
        ref = proc(images=img.convert("RGB"), return_tensors="np")["pixel_values"][0]
        ours = preprocess_image(img, pp)
    assert ours.shape == ref.shape == (3, 64, 64)
    assert np.abs(ours[:, 43:] - ref[:, 43:]).max() < 1e-5  # the padding below: -mean / std, exactly
    assert np.abs(ours - ref).max() < 0.05  # the photo: the two resizers' pixels


@pytest.mark.parametrize("change, args, needle", [
    (dict(probs=[0.5, 1.0]), [], "between 0 and 1"),
    ({}, ["--img-size", "96"], "image_size alone"),
    ({}, ["--dynamic-img-size"], "image_size alone"),
], ids=["random-masking", "another-size", "dynamic"])
def test_what_no_graph_reproduces_is_one_sentence(tmp_path, change, args, needle):
    save_eomt(tmp_path / "saved", TINY, change.get("probs"))
    r = export(tmp_path / "saved", tmp_path / "out", *args)
    fails_cleanly(r, needle)
    assert not (tmp_path / "out" / "model.onnx").exists()


def test_predict_writes_each_images_class_map(tmp_path):
    """`predict --out-dir`: the palette PNG holds, at the photo's own size, the argmax of the semantic map cut to
    the part the photo fills (it is padded below) and resized bilinearly; the overlay has the photo's size; the
    JSON line's class shares sum to 1 and are the PNG's."""
    save_eomt(tmp_path / "saved", TINY, sharp=True, seed=5)  # three classes over the photo
    r = export(tmp_path / "saved", tmp_path / "out")
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["predict", str(tmp_path / "out"), str(PHOTO), "--out-dir", str(tmp_path / "maps"),
                                 "-q"])
    assert r.exit_code == 0, r.output
    line = json.loads(next(x for x in r.output.splitlines() if x.startswith("{")))
    seg = np.asarray(Image.open(tmp_path / "maps" / "chelsea.seg.png"))
    assert seg.shape == (300, 451)
    pp = Preprocess.from_dict(json.loads((tmp_path / "out" / "manifest.json").read_text())["preprocess"])
    with Image.open(PHOTO) as img:
        x = preprocess_image(img, pp)[None]
    semantic = torch.from_numpy(run(tmp_path / "out" / "model.onnx", x)["semantic_probs"])  # (1, 3, 32, 32)
    filled = semantic[..., :22, :]  # 451 x 300 -> 64 x 43 (+ 21 rows of padding): 21.5 of 32 rows, rounded to even
    want = torch.nn.functional.interpolate(filled, size=(300, 451), mode="bilinear", align_corners=False)[0]
    assert (seg == want.argmax(0).numpy()).mean() == 1.0
    assert len(line["class_shares"]) == 3  # a map of several classes, so a wrong crop would show
    shares = line["class_shares"]
    assert sum(shares.values()) == pytest.approx(1.0)
    for c, share in shares.items():
        assert share == pytest.approx((seg == int(c)).mean())
    assert Image.open(tmp_path / "maps" / "chelsea.overlay.png").size == (451, 300)


@pytest.mark.parametrize("probs, judged_by_cosine", [([1.0, 0.0], True), ([0.0, 0.0], False)],
                         ids=["masked", "unmasked"])
def test_a_masked_export_is_judged_by_cosine(tmp_path, probs, judged_by_cosine):
    """A mask logit within float rounding of 0 may fall on either side in another runtime, which moves that query's
    outputs by more than a max abs bound: with masking on, the export check says it judges by cosine alone."""
    save_eomt(tmp_path / "saved", TINY, probs)
    r = CliRunner().invoke(cli, ["onnx", "-c", str(tmp_path / "saved"), "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert ("judged by its cosine" in " ".join(r.output.split())) == judged_by_cosine
    checks = json.loads((tmp_path / "out" / "manifest.json").read_text())["parity"]
    assert checks["checks"] and all(c["passed"] for c in checks["checks"])
