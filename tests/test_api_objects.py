"""`vitexport.export(obj)`: a timm or transformers model held in memory, exported with its own head, size and
weights, judged against the object's own forward by ONNX Runtime running the written file."""

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch

import vitexport

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")


def _moved(model, seed=0):
    """Weights off their init (zero biases, unit norms and tiny LayerScales would hide a misplaced tensor)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    return model


def _ort(path, x):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]


def _close(got, want):
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))


@pytest.mark.parametrize("arch,kw", [
    ("vit_small_patch16_224", dict(depth=2, num_classes=7, img_size=80, global_pool="avg")),  # head, size, pooling
    ("vit_small_patch16_224", dict(depth=2, num_classes=0, img_size=64)),  # a feature extractor
    ("eva02_tiny_patch14_224", dict(depth=2, num_classes=3, img_size=84)),  # RoPE at another grid
    ("vit_small_patch16_dinov3", dict(depth=2, num_classes=4, img_size=96)),
    ("beitv2_base_patch16_224", dict(depth=2, embed_dim=96, num_heads=3, num_classes=5, img_size=64)),  # width too
])
def test_a_timm_object_exports_with_its_own_head_size_and_weights(arch, kw, tmp_path):
    model = _moved(timm.create_model(arch, pretrained=False, **kw)).train()  # as a training loop leaves it
    result = vitexport.export(model, output=tmp_path / "m")
    assert model.training  # the user's object is left as it was
    assert result.passed and result.object_checks and all(c.passed for c in result.object_checks)
    size = kw["img_size"]
    x = torch.randn(3, 3, size, size, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = model.eval()(x).numpy()
    _close(_ort(result.onnx, x), want)
    manifest = json.loads(result.manifest.read_text())
    assert manifest["variant"] == arch and manifest["num_classes"] == kw["num_classes"]
    assert tuple(manifest["preprocess"]["input_size"]) == (size, size)


@pytest.mark.parametrize("make,field", [
    (lambda T, c: T.Dinov2Model(T.Dinov2Config(**c)), "pooler_output"),
    (lambda T, c: T.ViTForImageClassification(T.ViTConfig(**c, num_labels=6)), "logits"),
    (lambda T, c: T.CLIPVisionModelWithProjection(T.CLIPVisionConfig(**c, projection_dim=24)), "image_embeds"),
])
def test_a_transformers_object_exports_with_its_config_and_weights(make, field, tmp_path):
    cfg = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=96, image_size=48,
               patch_size=8)
    model = _moved(make(transformers, cfg)).eval()
    result = vitexport.export(model, output=tmp_path / "m")
    assert result.passed and result.object_checks
    x = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = getattr(model(pixel_values=x), field).numpy()
    _close(_ort(result.onnx, x), want)


def test_later_steps_rebuild_the_object_from_the_folder(tmp_path, monkeypatch):
    """The bench's PyTorch reference and predict read the weights the folder keeps, not the object."""
    monkeypatch.chdir(tmp_path)
    model = _moved(timm.create_model("vit_small_patch16_224", pretrained=False, depth=2, num_classes=4, img_size=64))
    result = vitexport.export(model.eval())
    assert result.folder.name == "vit_small_patch16_224-64x64"
    del model
    report = vitexport.bench(result.folder, backends=("pytorch", "onnxruntime cpu fp32"), batches=(1,),
                             iterations=1, max_images=4, prepare=False)
    fp32 = next(r for r in report.rows if r.name == "onnxruntime cpu fp32")
    assert fp32.verdict == "pass" and fp32.parity.max_abs < 1e-4


def test_an_object_that_disagrees_with_its_export_is_a_parity_error(tmp_path):
    """A change the config cannot carry (here LayerScale removed from the blocks) is caught by the object's
    forward, and nothing is left in the folder."""
    model = _moved(timm.create_model("vit_small_patch16_224", pretrained=False, depth=2, num_classes=3, img_size=64))
    model.blocks[1].mlp.act = torch.nn.ReLU()  # what no config says
    with pytest.raises(vitexport.ParityError) as e:
        vitexport.export(model.eval(), output=tmp_path / "m")
    assert "the VisionTransformer object" in str(e.value)
    assert not (tmp_path / "m" / "model.onnx").exists() and not (tmp_path / "m" / "source").exists()


def test_another_object_never_replaces_an_export_silently(tmp_path):
    first = _moved(timm.create_model("vit_small_patch16_224", pretrained=False, depth=2, num_classes=3, img_size=64))
    second = _moved(timm.create_model("vit_small_patch16_224", pretrained=False, depth=2, num_classes=3, img_size=64),
                    seed=1)
    out = tmp_path / "m"
    vitexport.export(first.eval(), output=out)
    kept = sorted((out / "source").iterdir())
    with pytest.raises(vitexport.VitexportError, match="already holds an export of another model"):
        vitexport.export(second.eval(), output=out)
    assert sorted((out / "source").iterdir()) == kept  # the first model's weights are untouched
    vitexport.export(second.eval(), output=out, force=True)
    now = sorted((out / "source").iterdir())
    assert len(now) == 1 and now != kept  # replaced, and the old weights went with the old model
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        _close(_ort(out / "model.onnx", x), second(x).numpy())


@pytest.mark.parametrize("obj,needle", [
    (lambda: torch.nn.Linear(2, 2), "torch.nn.modules.linear.Linear is neither a timm model"),
    (lambda: _with_cfg(torch.nn.Linear(2, 2), "resnet18"), "is timm's resnet18, which vitexport does not build"),
    (lambda: transformers.ResNetModel(transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16],
                                                                depths=[1, 1])),
     "the ResNetModel object is a transformers 'resnet' model"),
])
def test_an_object_vitexport_cannot_build_is_one_sentence(obj, needle, tmp_path):
    with pytest.raises(vitexport.VitexportError) as e:
        vitexport.export(obj(), output=tmp_path / "m")
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "m" / "source").exists()


def _with_cfg(module, arch):
    module.pretrained_cfg = {"architecture": arch}
    return module
