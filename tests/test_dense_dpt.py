"""transformers' DPT (`DPTForDepthEstimation` over DPT's own ViT or a DINOv2 backbone, `DPTForSemanticSegmentation`)
from `save_pretrained` folders: the export gives transformers' own `predicted_depth` or `logits` with the same
weights, option by option (readout ignore/add/project, batch norm and biases in the fusion, the head projection,
segmentation with an auxiliary head), at the config's size and, over DINOv2 with --dynamic-img-size, at other
sizes (one non-square); every parameter and batch-norm statistic random, so no wrong mapping hides behind an
initial value; a config saved without its defaults is read as transformers reads it; what vitexport cannot build
is one sentence.
"""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from conftest import fails_cleanly

from vitexport.cli import cli
from vitexport.model.heads.config import DenseConfig
from vitexport.tensorrt_engine.graph_rules import rule_breakers

transformers = pytest.importorskip("transformers")

# DPT's own ViT: 3 blocks, 32 wide, patch 8, at 32 px (a 4 x 4 grid); a small neck
VIT = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=48, image_size=32,
           patch_size=8, backbone_out_indices=[0, 1, 2], reassemble_factors=[4, 2, 1], neck_hidden_sizes=[8, 16, 24],
           fusion_hidden_size=16)
# a DINOv2 backbone of 3 blocks, patch 14, at 56 px (a 4 x 4 grid)
DINOV2 = dict(model_type="dinov2", hidden_size=32, num_hidden_layers=3, num_attention_heads=2, image_size=56,
              patch_size=14, mlp_ratio=2, reshape_hidden_states=False)
NECK = dict(reassemble_factors=[4, 2, 1, 0.5], neck_hidden_sizes=[8, 16, 24, 32], fusion_hidden_size=16)

DEPTH = {
    # DPT-Large's layout at a small size: the projecting readout, 4 taps
    "vit-project": (dict(VIT, backbone_out_indices=[0, 1, 2, 3], num_hidden_layers=4, **NECK), 32),
    # the class token dropped; batch norm in the fusion's residual units, their convs then without bias; an odd
    # grid (5 x 5: the fusion resizes its skip maps)
    "vit-ignore-batchnorm": (dict(VIT, readout_type="ignore", use_batch_norm_in_fusion_residual=True, image_size=40),
                             40),
    # the class token added; batch norm with biases; taps not in order; the head on another fused map; exported
    # at 48 px (--img-size): the position embedding resampled bilinearly, as DPT's ViT does in its forward pass
    "vit-add-batchnorm-bias": (dict(VIT, readout_type="add", use_batch_norm_in_fusion_residual=True,
                                    use_bias_in_fusion_residual=True, backbone_out_indices=[2, 0, 1],
                                    head_in_index=-2), 48),
    # the head's 256-channel projection (add_projection); no biases in the fusion without batch norm; a tanh GELU
    # in the blocks and the projecting readout
    "vit-head-projection": (dict(VIT, add_projection=True, fusion_hidden_size=256, use_bias_in_fusion_residual=False,
                                 hidden_act="gelu_new"), 32),
    # DINOv2 under DPT's neck: spread taps, normed; the class token added
    "dinov2-add": (dict(NECK, readout_type="add", backbone_config=dict(DINOV2, out_indices=[0, 1, 2, 3])), 56),
}
SEGMENTATION = dict(VIT, num_labels=5, use_batch_norm_in_fusion_residual=True)


def perturb(model, seed=0):
    """Every parameter random, norms and biases included (a weight's noise at most 1/sqrt(fan-in), so that 256
    channels deep the maps keep a size float32 compares to 1e-4), and every batch norm's running statistics
    (variances positive), so that no batch norm is the identity."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            std = min(0.1, p[0].numel() ** -0.5) if p.ndim > 1 else 0.1
            p.add_(torch.randn(p.shape, generator=g) * std)
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.5)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) * 1.5 + 0.25)
        if isinstance(model, transformers.DPTForDepthEstimation):  # a positive last bias: a ReLU'd depth map that
            model.head.head[4].bias.abs_().add_(0.1)  # is not all zeros
    return model.eval()


def save_dpt(folder, config: dict, cls=None, seed=0):
    torch.manual_seed(seed)
    cls = cls or transformers.DPTForDepthEstimation
    model = perturb(cls(transformers.DPTConfig(**config)), seed)
    model.save_pretrained(folder)
    return model


def export(saved, out, *args):
    r = CliRunner().invoke(cli, ["onnx", "-c", str(saved), "-o", str(out), "-q", *args])
    assert r.exit_code == 0, r.output
    return json.loads((out / "manifest.json").read_text())


def assert_same(model, onnx_path, h, w, field="predicted_depth", seed=1):
    """ONNX Runtime's output against transformers' on the same images; the output, to check its shape."""
    x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        want = getattr(model(pixel_values=x), field).numpy()
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"pixel_values": x.numpy()})[0]
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max())), (h, w)
    assert np.abs(want).max() > 1e-3  # not a map of zeros (a ReLU head on random weights could give one)
    return want


def checked_graph(path):
    """The graph passes onnx.checker's full check and the TensorRT op rule."""
    onnx.checker.check_model(str(path), full_check=True)
    assert not rule_breakers(onnx.load(str(path))), path


@pytest.mark.parametrize("case", DEPTH)
def test_the_export_gives_transformers_depth(case, tmp_path):
    config, size = DEPTH[case]
    model = save_dpt(tmp_path / "saved", config)
    own = config["backbone_config"]["image_size"] if "backbone_config" in config else config["image_size"]
    manifest = export(tmp_path / "saved", tmp_path / "out", *([] if size == own else ["--img-size", str(size)]))
    want = assert_same(model, tmp_path / "out" / "model.onnx", size, size)
    assert manifest["output_name"] == "predicted_depth" and manifest["output_shape"] == ["batch", *want.shape[1:]]
    assert manifest["checkpoint"]["format"] == ("hf-dpt-dinov2" if "backbone_config" in config else "hf-dpt")
    checked_graph(tmp_path / "out" / "model.onnx")


def test_the_export_gives_transformers_segmentation_logits(tmp_path):
    """DPTForSemanticSegmentation: logits (B, labels, H', W') from its batch-normed head; the auxiliary head, whose
    output transformers discards at inference, is left out with a note."""
    model = save_dpt(tmp_path / "saved", SEGMENTATION, transformers.DPTForSemanticSegmentation)
    assert model.auxiliary_head is not None
    r = CliRunner().invoke(cli, ["onnx", "-c", str(tmp_path / "saved"), "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert "auxiliary head is left out" in r.output
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    want = assert_same(model, tmp_path / "out" / "model.onnx", 32, 32, field="logits")
    assert want.shape == (2, 5, 64, 64)
    assert manifest["output_name"] == "logits" and manifest["output_shape"] == ["batch", 5, 64, 64]
    dense = DenseConfig.from_dict(manifest["config"]["dense"])
    assert dense.num_labels == 5 and dense.output_dims((4, 4), (8, 8)) == [5, 64, 64]
    checked_graph(tmp_path / "out" / "model.onnx")


def test_a_dynamic_size_export_over_dinov2_gives_transformers_depth_at_other_sizes(tmp_path):
    """One graph at the stored grid and at two other sizes, one non-square with an odd grid (the output is 32 x
    ceil(grid / 2) a side, not the input's size; DINOv2 resamples its position embedding bicubically)."""
    model = save_dpt(tmp_path / "saved", dict(NECK, backbone_config=dict(DINOV2, out_indices=[0, 1, 2, 3])))
    out = tmp_path / "out"
    manifest = export(tmp_path / "saved", out, "--dynamic-img-size", "--img-size-range", "28..112")
    assert manifest["output_shape"] == ["batch", "out_height", "out_width"]
    assert manifest["pos_embed_interp"] == "bicubic"
    shapes = [assert_same(model, out / "model.onnx", h, w).shape[1:] for h, w in ((56, 56), (84, 84), (70, 98))]
    assert shapes == [(64, 64), (96, 96), (96, 128)]
    checked_graph(out / "model.onnx")


def test_a_config_saved_without_its_defaults_is_read_as_transformers_reads_it(tmp_path):
    """A config.json of only the values that differ from DPTConfig's defaults (no architectures: depth) builds the
    model transformers builds from the same file."""
    minimal = {"model_type": "dpt", "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 2,
               "intermediate_size": 64, "image_size": 32, "patch_size": 8, "backbone_out_indices": [0, 1, 2, 3],
               "neck_hidden_sizes": [8, 16, 24, 32], "fusion_hidden_size": 16}
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "config.json").write_text(json.dumps(minimal))
    torch.manual_seed(0)
    model = perturb(transformers.DPTForDepthEstimation(transformers.AutoConfig.from_pretrained(saved)))
    assert model.config.readout_type == "project" and model.config.layer_norm_eps == 1e-12
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(saved / "model.safetensors"))
    export(saved, tmp_path / "out")
    assert_same(model, tmp_path / "out" / "model.onnx", 32, 32)


@pytest.mark.parametrize("change, args, needle", [
    (dict(is_hybrid=True), [], "DPT-Hybrid"),
    ({}, ["--dynamic-img-size"], "square inputs of one size"),
    ({}, ["--img-size", "32x48"], "square inputs of one size"),
    (dict(backbone_out_indices=[0, 1, -1]), [], "backbone_out_indices [0, 1, -1]"),
    (dict(architectures=["DPTForSemanticSegmentation"], backbone_config=dict(DINOV2)), [], "backbone_config"),
], ids=["hybrid", "dynamic-vit", "non-square-vit", "negative-tap", "segmentation-backbone"])
def test_what_cannot_be_built_is_one_sentence(tmp_path, change, args, needle):
    saved = tmp_path / "saved"
    save_dpt(saved, VIT)
    cfg = json.loads((saved / "config.json").read_text())
    cfg.update(change)
    (saved / "config.json").write_text(json.dumps(cfg))
    r = CliRunner().invoke(cli, ["onnx", "-c", str(saved), "-o", str(tmp_path / "out"), "-q", *args])
    fails_cleanly(r, needle)
    assert not (tmp_path / "out" / "model.onnx").exists()
