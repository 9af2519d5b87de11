"""transformers' vision towers from a minimal config.json, as older transformers versions saved them: every key equal
to its default left out (a nested vision_config's too). vitexport's reader (`model.readers.hf_configs`) then falls
back on its own defaults, and must pick transformers' config class's, or it builds another model silently.

Each case writes config.json by hand with only model_type and the sizes that keep the model tiny (the patch size
left at its default, the image size a multiple of it), builds transformers' model from that file, perturbs every
tensor and saves the weights alone beside it (config.json stays minimal), exports the folder and compares.

The embedding's tensors are scaled down so that the tokens entering the first norm vary by about 1e-3: there a
LayerNorm's (or RMSNorm's) eps is a large part of the variance, so an eps other than transformers' default changes
the output well beyond the tolerance, where at unit scale it would hide below it.
"""

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file
from test_transformers_towers import naflex_inputs, perturb, run_onnx

from vitexport.cli import cli

transformers = pytest.importorskip("transformers")

TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2)
MLP = dict(TINY, intermediate_size=64)
TEXT = dict(MLP)  # a two-tower model's text tower: built, never compared
EMBED_SCALE = 3e-4  # the embedding's tensors after perturbing: tokens of about 1e-3 into the first norm

# model_type: (the minimal config, the model class, the output compared, transformers' defaults the case exercises:
# each absent from the file, each what transformers' config class fills in)
CASES = {
    "vit": ({**MLP, "image_size": 48}, "ViTModel", "pooler_output",
            dict(patch_size=16, layer_norm_eps=1e-12, hidden_act="gelu", qkv_bias=True)),
    "deit": ({**MLP, "image_size": 48}, "DeiTModel", "pooler_output",
             dict(patch_size=16, layer_norm_eps=1e-12, hidden_act="gelu", qkv_bias=True)),
    "dinov2": ({**TINY, "image_size": 42}, "Dinov2Model", "pooler_output",
               dict(patch_size=14, layer_norm_eps=1e-6, mlp_ratio=4, layerscale_value=1.0, use_swiglu_ffn=False,
                    qkv_bias=True, hidden_act="gelu")),
    "dinov2_with_registers": ({**TINY, "image_size": 48}, "Dinov2WithRegistersModel", "pooler_output",
                              dict(patch_size=16, num_register_tokens=4, layer_norm_eps=1e-6, mlp_ratio=4,
                                   layerscale_value=1.0, hidden_act="gelu")),
    "clip_vision_model": ({**MLP, "image_size": 64}, "CLIPVisionModel", "pooler_output",
                          dict(patch_size=32, hidden_act="quick_gelu", layer_norm_eps=1e-5)),
    "clip": ({"vision_config": {**MLP, "image_size": 64}, "text_config": TEXT}, "CLIPModel", "image_features",
             dict(patch_size=32, hidden_act="quick_gelu", layer_norm_eps=1e-5)),
    "siglip_vision_model": ({**MLP, "image_size": 48}, "SiglipVisionModel", "pooler_output",
                            dict(patch_size=16, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6,
                                 vision_use_head=True)),
    "siglip": ({"vision_config": {**MLP, "image_size": 48}, "text_config": TEXT}, "SiglipModel", "image_features",
               dict(patch_size=16, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, vision_use_head=True)),
    "metaclip_2_vision_model": ({**MLP, "image_size": 64}, "MetaClip2VisionModel", "pooler_output",
                                dict(patch_size=32, hidden_act="quick_gelu", layer_norm_eps=1e-5)),
    "metaclip_2": ({"vision_config": {**MLP, "image_size": 64}, "text_config": TEXT}, "MetaClip2Model",
                   "image_features", dict(patch_size=32, hidden_act="quick_gelu", layer_norm_eps=1e-5)),
    "vit_msn": ({**MLP, "image_size": 48}, "ViTMSNModel", "last_hidden_state",
                dict(patch_size=16, layer_norm_eps=1e-6, hidden_act="gelu", qkv_bias=True)),
    "vit_mae": ({**MLP, "image_size": 48}, "ViTMAEModel", "last_hidden_state",
                dict(patch_size=16, layer_norm_eps=1e-12, hidden_act="gelu", qkv_bias=True, mask_ratio=0.75)),
    "ijepa": ({**MLP, "image_size": 48}, "IJepaModel", "last_hidden_state",
              dict(patch_size=16, layer_norm_eps=1e-12, hidden_act="gelu", qkv_bias=True)),
    "beit": ({**MLP, "image_size": 48}, "BeitModel", "pooler_output",
             dict(patch_size=16, layer_norm_eps=1e-12, hidden_act="gelu", use_mean_pooling=True,
                  layer_scale_init_value=0.1, use_absolute_position_embeddings=False,
                  use_relative_position_bias=False, use_shared_relative_position_bias=False)),
    "data2vec-vision": ({**MLP, "image_size": 48}, "Data2VecVisionModel", "last_hidden_state",
                        dict(patch_size=16, layer_norm_eps=1e-12, hidden_act="gelu", use_mean_pooling=True,
                             layer_scale_init_value=0.1, use_absolute_position_embeddings=False,
                             use_relative_position_bias=False, use_shared_relative_position_bias=False)),
    "dinov3_vit": ({**MLP, "image_size": 48}, "DINOv3ViTModel", "pooler_output",
                   dict(patch_size=16, rope_theta=100.0, layer_norm_eps=1e-5, hidden_act="gelu", query_bias=True,
                        key_bias=False, value_bias=True, proj_bias=True, mlp_bias=True, layerscale_value=1.0,
                        num_register_tokens=0, use_gated_mlp=False)),
    # NaFlex: no image_size; the default num_patches (256, a 16 x 16 grid) at the default patch makes it 256 px
    "siglip2_vision_model": (dict(MLP), "Siglip2VisionModel", "pooler_output",
                             dict(patch_size=16, num_patches=256, hidden_act="gelu_pytorch_tanh",
                                  layer_norm_eps=1e-6, vision_use_head=True)),
    "siglip2": ({"vision_config": dict(MLP), "text_config": TEXT}, "Siglip2Model", "image_features",
                dict(patch_size=16, num_patches=256, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6,
                     vision_use_head=True)),
    "aimv2_vision_model": ({**MLP, "image_size": 42}, "Aimv2VisionModel", "pooler_output",
                           dict(patch_size=14, rms_norm_eps=1e-5, hidden_act="silu", qkv_bias=False, mlp_bias=False,
                                use_head=True, is_native=False)),
}
NAFLEX = {"siglip2_vision_model", "siglip2"}


def patch_kernel(model) -> tuple[int, ...]:
    """The patch embedding's spatial kernel (a Conv2d's), or for NaFlex's Linear over patches its pixel count."""
    for name, p in model.named_parameters():
        if "patch" in name and "embed" in name and name.endswith("weight"):
            return tuple(p.shape[2:]) if p.ndim == 4 else (p.shape[1] // 3,)
    raise AssertionError("no patch embedding")


def shrink_embeddings(model):
    """The patch, class, register and position embeddings (not the norms among them) scaled down."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ("embed" in name or "token" in name) and "norm" not in name \
                    and not name.startswith(("text_model.", "head.")):  # not AIMv2's pooling query
                p.mul_(EMBED_SCALE)
    return model


@pytest.fixture(scope="module", ids=list(CASES), params=list(CASES))
def exported(request, tmp_path_factory):
    """(model_type, transformers' config, its model, the export folder): a folder of the minimal config.json and
    the perturbed model's weights, exported with `vitexport onnx -c FOLDER`."""
    model_type = request.param
    keys, model_cls, _, _ = CASES[model_type]
    tmp = tmp_path_factory.mktemp(model_type)
    saved = tmp / "saved"
    saved.mkdir()
    written = {"model_type": model_type, **keys}
    (saved / "config.json").write_text(json.dumps(written))
    config = transformers.AutoConfig.from_pretrained(saved)
    torch.manual_seed(0)
    model = shrink_embeddings(perturb(getattr(transformers, model_cls)(config)))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(saved / "model.safetensors"))
    assert json.loads((saved / "config.json").read_text()) == written  # nothing filled in the defaults
    out = tmp / "export"
    # its own check against its PyTorch model at one batch size (for the suite's length): the test's is transformers'
    r = CliRunner().invoke(cli, ["onnx", "-c", str(saved), "-o", str(out), "-q", "--check-batch", "2"])
    assert r.exit_code == 0, r.output
    return model_type, config, model, out


def transformers_output(model_type, config, model, x):
    """The output the family's users take, for the images x."""
    output = CASES[model_type][2]
    if model_type in NAFLEX:
        inputs = naflex_inputs(x, CASES[model_type][3]["patch_size"])
    elif model_type == "vit_mae":
        # its default mask_ratio (0.75) drops three tokens in four; a feature extractor sets it to 0 at run time,
        # and the noise in token order keeps them in order (vitexport's export gives every token)
        config.mask_ratio = 0.0
        tokens = (x.shape[2] // config.patch_size) * (x.shape[3] // config.patch_size)
        inputs = {"pixel_values": x, "noise": torch.arange(float(tokens)).expand(len(x), -1)}
    else:
        inputs = {"pixel_values": x}
    with torch.no_grad():
        if output == "image_features":
            return model.get_image_features(**inputs).pooler_output.numpy()
        return getattr(model(**inputs), output).numpy()


def test_the_minimal_config_exports_transformers_model(exported):
    model_type, config, model, out = exported
    keys, _, _, defaults = CASES[model_type]
    vision = config.vision_config if "vision_config" in keys else config
    written = keys.get("vision_config", keys)
    # the defaults this case exercises: absent from the file, filled in by transformers' config class
    for key, value in defaults.items():
        assert key not in written, key
        assert getattr(vision, key) == value, (key, getattr(vision, key))
    # the model ran at the default patch size, on the image size the export takes
    patch = defaults["patch_size"]
    assert patch_kernel(model) in ((patch, patch), (patch * patch,))
    manifest = json.loads((out / "manifest.json").read_text())
    h, w = manifest["img_size"]
    side = int(np.sqrt(defaults["num_patches"])) * patch if model_type in NAFLEX else written["image_size"]
    assert (h, w) == (side, side)
    x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(1))
    want = transformers_output(model_type, config, model, x)
    if CASES[model_type][2] == "last_hidden_state":  # every token: one per default-sized patch, and the extra ones
        extra = 0 if model_type == "ijepa" else 1
        assert want.shape[1] == (h // patch) * (w // patch) + extra
    got = run_onnx(out / "model.onnx", x.numpy())
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max())), model_type
