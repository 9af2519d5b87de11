"""transformers' vision towers of sizes no table names, from `save_pretrained` folders (no -m): the export matches
transformers' own model with the same weights on the output each family's users take, and the manifest's
preprocessing does what the family's image processor does to a real photo.

Every model is random (every tensor perturbed, so none is left at an initial value that would hide a wrong
mapping), at a width, depth, MLP width and image size no architecture table has.
"""

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from conftest import ROOT, fails_cleanly
from PIL import Image

from vitexport.cli import cli
from vitexport.data.images import preprocess_image
from vitexport.data.preprocess import Preprocess

transformers = pytest.importorskip("transformers")

SIZES = dict(hidden_size=72, num_hidden_layers=2, num_attention_heads=3, image_size=40, patch_size=8)
VIT = dict(SIZES, intermediate_size=200)
DINO = dict(SIZES, mlp_ratio=3)
PHOTO = ROOT / "calibration" / "photos" / "calib" / "chelsea.jpg"  # 451 x 300: the two sides resize differently

# id: (config class, config kwargs, model class, output taken, processor class, processor kwargs)
CASES = {
    "vit-model": ("ViTConfig", VIT, "ViTModel", "pooler_output", "ViTImageProcessorPil",
                  dict(size={"height": 40, "width": 40})),
    "vit-classifier": ("ViTConfig", dict(VIT, num_labels=5), "ViTForImageClassification", "logits",
                       "ViTImageProcessorPil", dict(size={"height": 40, "width": 40}, resample=3)),
    "deit-model": ("DeiTConfig", VIT, "DeiTModel", "pooler_output", "DeiTImageProcessorPil",
                   dict(size={"height": 48, "width": 48}, crop_size={"height": 40, "width": 40})),
    "deit-classifier": ("DeiTConfig", dict(VIT, num_labels=5), "DeiTForImageClassification", "logits",
                        "DeiTImageProcessorPil", dict(size={"height": 48, "width": 48},
                                                      crop_size={"height": 40, "width": 40})),
    "deit-teacher": ("DeiTConfig", dict(VIT, num_labels=5), "DeiTForImageClassificationWithTeacher", "logits",
                     "DeiTImageProcessorPil", dict(size={"height": 48, "width": 48},
                                                   crop_size={"height": 40, "width": 40})),
    # a position embedding trained at 64 px, used at 40: transformers resamples it in every forward pass
    "dinov2-model": ("Dinov2Config", dict(DINO, image_size=64), "Dinov2Model", "pooler_output",
                     "BitImageProcessorPil", dict(size={"shortest_edge": 46}, crop_size={"height": 40, "width": 40},
                                                  image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])),
    "dinov2-classifier": ("Dinov2Config", dict(DINO, num_labels=4), "Dinov2ForImageClassification", "logits",
                          "BitImageProcessorPil", dict(size={"shortest_edge": 40},
                                                       crop_size={"height": 40, "width": 40})),
    "dinov2-swiglu": ("Dinov2Config", dict(DINO, use_swiglu_ffn=True, layerscale_value=0.1), "Dinov2Model",
                      "pooler_output", "BitImageProcessorPil", dict(size={"shortest_edge": 40},
                                                                    crop_size={"height": 40, "width": 40})),
    "dinov2-registers": ("Dinov2WithRegistersConfig", dict(DINO, image_size=64, num_register_tokens=3),
                         "Dinov2WithRegistersModel", "pooler_output", "BitImageProcessorPil",
                         dict(size={"shortest_edge": 46}, crop_size={"height": 40, "width": 40})),
    "dinov2-registers-classifier": ("Dinov2WithRegistersConfig", dict(DINO, num_register_tokens=2, num_labels=4),
                                    "Dinov2WithRegistersForImageClassification", "logits", "BitImageProcessorPil",
                                    dict(size={"shortest_edge": 40}, crop_size={"height": 40, "width": 40})),
    "clip-model": ("CLIPVisionConfig", VIT, "CLIPVisionModel", "pooler_output", "CLIPImageProcessorPil",
                   dict(size={"shortest_edge": 40}, crop_size={"height": 40, "width": 40})),
    "clip-projection": ("CLIPVisionConfig", dict(VIT, projection_dim=24), "CLIPVisionModelWithProjection",
                        "image_embeds", "CLIPImageProcessorPil",
                        dict(size={"shortest_edge": 40}, crop_size={"height": 40, "width": 40})),
    "siglip": ("SiglipVisionConfig", VIT, "SiglipVisionModel", "pooler_output", "SiglipImageProcessorPil",
               dict(size={"height": 40, "width": 40})),
    "metaclip2-projection": ("MetaClip2VisionConfig", dict(VIT, projection_dim=24),
                             "MetaClip2VisionModelWithProjection", "image_embeds", "CLIPImageProcessorPil",
                             dict(size={"shortest_edge": 40}, crop_size={"height": 40, "width": 40})),
    # towers without a pooler: the export gives the tokens, as last_hidden_state
    "vit-msn": ("ViTMSNConfig", VIT, "ViTMSNModel", "last_hidden_state", "ViTImageProcessorPil",
                dict(size={"height": 40, "width": 40})),
    "vit-msn-classifier": ("ViTMSNConfig", dict(VIT, num_labels=5), "ViTMSNForImageClassification", "logits",
                           "ViTImageProcessorPil", dict(size={"height": 40, "width": 40})),
    "vit-mae": ("ViTMAEConfig", dict(VIT, mask_ratio=0.0), "ViTMAEModel", "last_hidden_state",
                "ViTImageProcessorPil", dict(size={"height": 40, "width": 40})),
    "ijepa": ("IJepaConfig", VIT, "IJepaModel", "last_hidden_state", "ViTImageProcessorPil",
              dict(size={"height": 40, "width": 40})),
    "ijepa-classifier": ("IJepaConfig", dict(VIT, num_labels=4), "IJepaForImageClassification", "logits",
                         "ViTImageProcessorPil", dict(size={"height": 40, "width": 40})),
    # BEiT: a relative position bias per layer, or one shared; LayerScale; mean pooling or the class token
    "beit-model": ("BeitConfig", dict(VIT, use_relative_position_bias=True), "BeitModel", "pooler_output",
                   "BeitImageProcessorPil", dict(size={"height": 48, "width": 48},
                                                 crop_size={"height": 40, "width": 40}, do_center_crop=True)),
    # used at 48 px (a 6 x 6 window) with tables trained at 5 x 5: resampled as transformers does in its forward
    "beit-another-window": ("BeitConfig", dict(VIT, use_relative_position_bias=True), "BeitModel", "pooler_output",
                            "BeitImageProcessorPil", dict(size={"height": 48, "width": 48})),
    "beit-classifier": ("BeitConfig", dict(VIT, use_absolute_position_embeddings=True, use_mean_pooling=False,
                                           layer_scale_init_value=0.0, num_labels=3),
                        "BeitForImageClassification", "logits", "BeitImageProcessorPil",
                        dict(size={"height": 40, "width": 40}, do_center_crop=False)),
    "data2vec-vision": ("Data2VecVisionConfig", dict(VIT, use_shared_relative_position_bias=True),
                        "Data2VecVisionModel", "last_hidden_state", "BeitImageProcessorPil",
                        dict(size={"height": 40, "width": 40}, do_center_crop=False)),
    "data2vec-vision-classifier": ("Data2VecVisionConfig", dict(VIT, use_relative_position_bias=True, num_labels=4),
                                   "Data2VecVisionForImageClassification", "logits", "BeitImageProcessorPil",
                                   dict(size={"height": 40, "width": 40}, do_center_crop=False)),
    # DINOv3: RoPE, registers, LayerScale, no key bias; the gated MLP of the larger ones with every bias set
    "dinov3": ("DINOv3ViTConfig", dict(VIT, num_register_tokens=3), "DINOv3ViTModel", "pooler_output",
               "DINOv3ViTImageProcessor", dict(size={"height": 40, "width": 40})),
    "dinov3-gated": ("DINOv3ViTConfig", dict(VIT, num_register_tokens=2, use_gated_mlp=True, hidden_act="silu",
                                             key_bias=True, layerscale_value=0.1),
                     "DINOv3ViTModel", "pooler_output", "DINOv3ViTImageProcessor", dict(size={"height": 40, "width": 40})),
    # AIMv2: RMSNorm, SwiGLU, no class token, an attention-pooling head without query projection or MLP
    "aimv2": ("Aimv2VisionConfig", dict(VIT, patch_size=8), "Aimv2VisionModel", "pooler_output",
              "CLIPImageProcessorPil", dict(size={"shortest_edge": 40}, crop_size={"height": 40, "width": 40})),
    "aimv2-no-head": ("Aimv2VisionConfig", dict(VIT, patch_size=8, use_head=False, qkv_bias=True, mlp_bias=True),
                      "Aimv2VisionModel", "last_hidden_state", "CLIPImageProcessorPil",
                      dict(size={"shortest_edge": 40}, crop_size={"height": 40, "width": 40})),
    # SigLIP2 NaFlex: patches in; a square image of the processor's max_num_patches (36: 6 x 6 patches of 8 px,
    # 48 px) against a position embedding trained at 4 x 4 (num_patches 16), resampled as transformers does
    "siglip2-naflex": ("Siglip2VisionConfig", dict(VIT, patch_size=8, num_patches=16), "Siglip2VisionModel",
                       "pooler_output", "Siglip2ImageProcessor", dict(patch_size=8, max_num_patches=36)),
}
NAFLEX = {"siglip2-naflex"}


def naflex_inputs(x, patch):
    """What Siglip2's processor hands its model for images x (B, 3, H, W): the patches, each (row, column,
    channel) flattened, all of them valid, and the grid."""
    b, c, h, w = x.shape
    patches = x.reshape(b, c, h // patch, patch, w // patch, patch).permute(0, 2, 4, 3, 5, 1)
    return {"pixel_values": patches.reshape(b, (h // patch) * (w // patch), patch * patch * c),
            "pixel_attention_mask": torch.ones(b, (h // patch) * (w // patch), dtype=torch.long),
            "spatial_shapes": torch.tensor([[h // patch, w // patch]] * b)}


def forward_inputs(case, x):
    """The keyword arguments transformers' model takes for the images x: the pixels, ViT-MAE's shuffle noise in
    token order (nothing reordered, nothing masked), SigLIP2's patches."""
    if case in NAFLEX:
        return naflex_inputs(x, CASES[case][1]["patch_size"])
    if case == "vit-mae":
        return {"pixel_values": x, "noise": torch.arange(25.0).expand(x.shape[0], 25)}
    return {"pixel_values": x}


def perturb(model, seed=0):
    """Every tensor random (LayerNorm, LayerScale, tokens and position embedding included)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


def save_tower(case, folder, seed=0, shard=None):
    """A perturbed transformers model and its image processor, saved with save_pretrained (in shards of at most
    `shard`, e.g. "60KB", with their index, when given); returns both."""
    cfg_cls, cfg_kw, model_cls, _, proc_cls, proc_kw = CASES[case]
    torch.manual_seed(seed)
    model = perturb(getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**cfg_kw)), seed)
    processor = getattr(transformers, proc_cls)(**proc_kw)
    model.save_pretrained(folder, **({} if shard is None else {"max_shard_size": shard}))
    processor.save_pretrained(folder)
    return model, processor


def run_onnx(path, x):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


# the plainer form of a class another case covers with more options (its model without the head, a classifier
# without the teacher or registers, a family's default options): run with the e2e tests, for the suite's length
PLAINER = {"vit-model", "deit-model", "deit-classifier", "dinov2-model", "dinov2-classifier", "dinov2-registers",
           "clip-model", "vit-msn", "ijepa-classifier", "beit-model", "data2vec-vision-classifier", "dinov3"}


@pytest.fixture(scope="module", params=[pytest.param(c, marks=pytest.mark.e2e) if c in PLAINER else c for c in CASES])
def exported(request, tmp_path_factory):
    """(case, transformers model, processor, export folder): `vitexport onnx -c FOLDER` with no -m."""
    assert PLAINER <= set(CASES)
    case = request.param
    tmp = tmp_path_factory.mktemp(case)
    model, processor = save_tower(case, tmp / "saved")
    out = tmp / "export"
    r = CliRunner().invoke(cli, ["onnx", "-c", str(tmp / "saved"), "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    return case, model, processor, out


def test_the_export_gives_transformers_output(exported):
    case, model, _, out = exported
    manifest = json.loads((out / "manifest.json").read_text())
    h, w = manifest["img_size"]
    x = torch.randn(3, 3, h, w, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = getattr(model(**forward_inputs(case, x)), CASES[case][3]).numpy()
    got = run_onnx(out / "model.onnx", x.numpy())
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max())), case


def test_the_manifest_preprocesses_as_the_processor_does(exported):
    """The processor (its PIL implementation) and the manifest's preprocessing on the same photo."""
    case, _, processor, out = exported
    pp = Preprocess.from_dict(json.loads((out / "manifest.json").read_text())["preprocess"])
    with Image.open(PHOTO) as img:
        if case in NAFLEX:  # its processor keeps the aspect ratio; vitexport's export takes a square image
            img = img.crop((0, 0, min(img.size), min(img.size)))
        want = processor(images=img.convert("RGB"), return_tensors="np")["pixel_values"][0]
        got = preprocess_image(img, pp)
    if case in NAFLEX:  # the same pixels as the processor's patches
        got = naflex_inputs(torch.from_numpy(got)[None], CASES[case][1]["patch_size"])["pixel_values"][0].numpy()
        want = want[: len(got)]
    assert got.shape == want.shape, case
    # a processor of PIL's resizes as vitexport does; one of torch's (DINOv3's has no PIL form) keeps the resized
    # pixels as floats where PIL rounds them to 8 bits: up to one 8-bit level apart, never more
    tol = 1e-4 if CASES[case][4].endswith("Pil") else 1.0 / 255 / min(pp.std)
    assert np.abs(got - want).max() < tol, case


def test_a_folder_without_a_processor_says_which_preprocessing_it_assumed(tmp_path):
    model = perturb(transformers.Dinov2Model(transformers.Dinov2Config(**DINO)))
    model.save_pretrained(tmp_path / "saved")
    r = CliRunner().invoke(cli, ["onnx", "-c", str(tmp_path / "saved"), "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert "no preprocessor_config.json" in r.output and "DINOv2" in r.output
    pp = json.loads((tmp_path / "out" / "manifest.json").read_text())["preprocess"]
    assert pp["input_size"] == [40, 40] and pp["mean"] == pytest.approx([0.485, 0.456, 0.406])


def test_another_model_type_is_one_sentence(tmp_path):
    cfg = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1])
    transformers.ResNetModel(cfg).save_pretrained(tmp_path / "resnet")
    r = CliRunner().invoke(cli, ["onnx", "-c", str(tmp_path / "resnet"), "-o", str(tmp_path / "out")])
    fails_cleanly(r, "'resnet'")
    assert "vitexport builds" in r.output and not (tmp_path / "out").exists()


def test_a_name_of_the_folder_s_shape_exports_the_folder_s_model(tmp_path):
    """-m with a transformers folder, as timm users type it: the folder's config gives the model, -m names it."""
    cfg = transformers.ViTConfig(hidden_size=64, num_hidden_layers=6, num_attention_heads=2, intermediate_size=192,
                                 image_size=160, patch_size=16, num_labels=3)
    model = perturb(transformers.ViTForImageClassification(cfg))
    model.save_pretrained(tmp_path / "saved")
    transformers.ViTImageProcessorPil(size={"height": 160, "width": 160}).save_pretrained(tmp_path / "saved")
    for extra in ([], ["--img-size", "64"]):
        out = tmp_path / f"out{len(extra)}"
        r = CliRunner().invoke(cli, ["onnx", "-m", "test_vit", "-c", str(tmp_path / "saved"), "-o", str(out), "-q",
                                     *extra])
        assert r.exit_code == 0, r.output
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["variant"] == "test_vit" and manifest["num_classes"] == 3
        h, w = manifest["img_size"]
        assert (h, w) == ((64, 64) if extra else (160, 160))
        x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            want = model(pixel_values=x, interpolate_pos_encoding=True).logits.numpy()
        got = run_onnx(out / "model.onnx", x.numpy())
        assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))


@pytest.mark.parametrize("name,differs", [
    ("vit_small_patch16_224", "width 72, depth 2, heads 3, patch 8x8, MLP ratio 2.77778"),
    ("vit_small_patch8_224", "width 72, depth 2, heads 3, MLP ratio 2.77778 ("),  # the patch agrees
])
def test_a_name_of_another_shape_is_one_sentence_saying_how(tmp_path, name, differs):
    save_tower("vit-classifier", tmp_path / "saved")
    r = CliRunner().invoke(cli, ["onnx", "-m", name, "-c", str(tmp_path / "saved"), "-o", str(tmp_path / "out")])
    fails_cleanly(r, f"-m {name} is")
    assert f"holds a transformers ViTForImageClassification of {differs}" in r.output, r.output
    assert "drop -m" in r.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", [["predict", "{ckpt}", str(PHOTO)], ["bench", "{ckpt}"],
                                     ["quantize", "{ckpt}", "--int8"], ["triton", "{ckpt}", "-o", "{tmp}/repo"],
                                     ["openvino", "{ckpt}"], ["info", "{ckpt}"]])
def test_a_checkpoint_given_as_the_model_is_named_with_the_command_that_exports_it(tmp_path, command):
    save_tower("vit-classifier", tmp_path / "saved")
    args = [a.format(ckpt=tmp_path / "saved", tmp=tmp_path) for a in command]
    r = CliRunner().invoke(cli, args)
    fails_cleanly(r, "is a transformers ViTForImageClassification checkpoint, not an exported model")
    assert f"vitexport onnx -c {tmp_path / 'saved'}" in r.output
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == ["config.json", "model.safetensors",
                                                                       "preprocessor_config.json"]


def test_a_timm_checkpoint_folder_or_weights_file_given_as_the_model_is_named_too(tmp_path):
    timm_dir = tmp_path / "timm-ckpt"
    timm_dir.mkdir()
    (timm_dir / "config.json").write_text(json.dumps({"architecture": "test_vit", "num_classes": 3}))
    (timm_dir / "model.safetensors").write_bytes(b"\0" * 16)
    for given, what in ((timm_dir, "a timm test_vit checkpoint"), (timm_dir / "model.safetensors",
                                                                   "a checkpoint file")):
        for command in (["bench", str(given)], ["quantize", str(given), "--fp16"]):
            r = CliRunner().invoke(cli, command)
            fails_cleanly(r, f"is {what}, not an exported model")
    r = CliRunner().invoke(cli, ["predict", str(timm_dir), str(PHOTO)])
    fails_cleanly(r, "is a timm test_vit checkpoint, not an exported model")
