"""Checkpoint formats against their own reference implementations (transformers, timm's JAX loader)."""

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from timm.models.vision_transformer import VisionTransformer as TimmViT
from timm.models.vision_transformer import _load_weights

from vitexport.errors import VitexportError
from vitexport.model.readers.checkpoints import load_checkpoint, load_into
from vitexport.model.vit import VisionTransformer, ViTConfig

TINY = dict(embed_dim=64, depth=2, num_heads=4, img_size=32, patch_size=8, num_classes=7)


def _randomised_timm(**kw):
    torch.manual_seed(0)
    m = TimmViT(**dict(TINY, **kw)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    return m


def _ours(ckpt_path, **kw):
    ckpt = load_checkpoint(ckpt_path)
    cfg = dict(TINY, **kw)
    cfg.update({k: v for k, v in ckpt.hints.items() if k in ("norm_eps", "qkv_bias")})
    cfg.update(ckpt.fields)  # what the tensors say (a transformers pooler)
    m = VisionTransformer(ViTConfig(**cfg)).eval()
    notes = load_into(m, ckpt, "bicubic-antialias")
    return m, ckpt, notes


FILE_KINDS = [(ext, wrap) for ext in (".pth", ".bin") for wrap in ("plain", "model", "state_dict", "model_ema",
                                                                    "module_prefix")]
FILE_KINDS += [(".safetensors", "plain"), (".safetensors", "module_prefix")]  # safetensors holds flat dicts only


@pytest.mark.parametrize("ext,wrap", FILE_KINDS)
def test_timm_state_dict_variants(tmp_path, wrap, ext):
    ref = _randomised_timm()
    sd = ref.state_dict()
    if wrap == "module_prefix":
        sd = {f"module.{k}": v for k, v in sd.items()}
    path = tmp_path / f"weights{ext}"
    if ext == ".safetensors":
        save_file({k: v.contiguous() for k, v in sd.items()}, path)
    else:
        obj = sd if wrap in ("plain", "module_prefix") else {wrap: sd, "epoch": 3}
        torch.save(obj, path)
    ours, ckpt, _ = _ours(path)
    assert ckpt.format == "timm"
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=0)


def test_format_is_chosen_by_content_not_name(tmp_path):
    ref = _randomised_timm()
    path = tmp_path / "misleading.npz"  # a torch zip under an .npz name
    torch.save(ref.state_dict(), path)
    ours, ckpt, _ = _ours(path)
    assert ckpt.format == "timm"


def _hf_model(cls_name, tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
                                 image_size=32, patch_size=8, num_labels=7, hidden_act="gelu")
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    model.save_pretrained(tmp_path / "hf")
    return model


def test_huggingface_classifier_matches_transformers(tmp_path):
    hf = _hf_model("ViTForImageClassification", tmp_path)
    ours, ckpt, _ = _ours(tmp_path / "hf")  # the directory, with config.json
    assert ckpt.format == "hf-vit" and ckpt.hints["norm_eps"] == pytest.approx(1e-12)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(pixel_values=x).logits, atol=1e-4, rtol=0)
    # the weights file alone loads too
    weights = next((tmp_path / "hf").glob("*.safetensors"))
    ours2, _, _ = _ours(weights)
    with torch.no_grad():
        torch.testing.assert_close(ours2(x), ours(x), atol=0, rtol=0)


def test_huggingface_vitmodel_features(tmp_path):
    hf = _hf_model("ViTModel", tmp_path)
    ours, ckpt, _ = _ours(tmp_path / "hf", num_classes=0)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = hf(pixel_values=x).last_hidden_state
        torch.testing.assert_close(ours.forward_features(x), ref, atol=1e-4, rtol=0)


def _timm_to_jax(model: TimmViT) -> dict:
    """Write a timm ViT in the google-research/vision_transformer .npz layout."""
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    D = model.embed_dim
    H = model.blocks[0].attn.num_heads
    out = {
        "embedding/kernel": sd["patch_embed.proj.weight"].transpose(2, 3, 1, 0),
        "embedding/bias": sd["patch_embed.proj.bias"],
        "cls": sd["cls_token"],
        "Transformer/posembed_input/pos_embedding": sd["pos_embed"],
        "Transformer/encoder_norm/scale": sd["norm.weight"],
        "Transformer/encoder_norm/bias": sd["norm.bias"],
        "head/kernel": sd["head.weight"].T,
        "head/bias": sd["head.bias"],
    }
    for i in range(len(model.blocks)):
        b, mha = f"Transformer/encoderblock_{i}/", f"Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1/"
        out[b + "LayerNorm_0/scale"] = sd[f"blocks.{i}.norm1.weight"]
        out[b + "LayerNorm_0/bias"] = sd[f"blocks.{i}.norm1.bias"]
        out[b + "LayerNorm_2/scale"] = sd[f"blocks.{i}.norm2.weight"]
        out[b + "LayerNorm_2/bias"] = sd[f"blocks.{i}.norm2.bias"]
        qkv_w, qkv_b = sd[f"blocks.{i}.attn.qkv.weight"], sd[f"blocks.{i}.attn.qkv.bias"]
        for j, n in enumerate(("query", "key", "value")):
            out[f"{mha}{n}/kernel"] = qkv_w[j * D:(j + 1) * D].T.reshape(D, H, D // H)
            out[f"{mha}{n}/bias"] = qkv_b[j * D:(j + 1) * D].reshape(H, D // H)
        out[f"{mha}out/kernel"] = sd[f"blocks.{i}.attn.proj.weight"].T.reshape(H, D // H, D)
        out[f"{mha}out/bias"] = sd[f"blocks.{i}.attn.proj.bias"]
        for r in range(2):
            out[f"{b}MlpBlock_3/Dense_{r}/kernel"] = sd[f"blocks.{i}.mlp.fc{r + 1}.weight"].T
            out[f"{b}MlpBlock_3/Dense_{r}/bias"] = sd[f"blocks.{i}.mlp.fc{r + 1}.bias"]
    return out


def test_jax_npz_matches_timm_loader(tmp_path):
    src = _randomised_timm()
    path = tmp_path / "ViT-tiny.npz"
    np.savez(path, **_timm_to_jax(src))
    oracle = TimmViT(**TINY).eval()
    _load_weights(oracle, str(path))  # timm's own JAX loader
    ours, ckpt, _ = _ours(path)
    assert ckpt.format == "jax"
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(oracle(x), src(x), atol=1e-5, rtol=0)  # the fixture itself is right
        torch.testing.assert_close(ours(x), oracle(x), atol=1e-5, rtol=0)


def test_mismatch_names_tensors_in_one_error(tmp_path):
    ref = _randomised_timm(depth=3)
    path = tmp_path / "deeper.pth"
    torch.save(ref.state_dict(), path)
    with pytest.raises(VitexportError) as e:
        _ours(path)  # depth 2 model
    msg = str(e.value)
    assert "unexpected" in msg and "blocks.2." in msg and "depth 3" in msg and "\n" not in msg


def test_mis_shaped_tensors_reported(tmp_path):
    ref = _randomised_timm(embed_dim=32)
    path = tmp_path / "narrow.pth"
    torch.save(ref.state_dict(), path)
    with pytest.raises(VitexportError, match="mis-shaped"):
        _ours(path)


def test_other_class_count_drops_head_with_warning(tmp_path):
    ref = _randomised_timm()
    path = tmp_path / "w.pth"
    torch.save(ref.state_dict(), path)
    ours, _, notes = _ours(path, num_classes=3)
    assert any("dropped" in n for n in notes)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():  # the trunk is still the checkpoint's
        torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all", b"PK\x03\x04 broken zip"])
def test_corrupt_files(tmp_path, content):
    path = tmp_path / "bad.pth"
    path.write_bytes(content)
    with pytest.raises(VitexportError):
        load_checkpoint(path)


def test_truncated_torch_file(tmp_path):
    ref = _randomised_timm()
    path = tmp_path / "trunc.pth"
    torch.save(ref.state_dict(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(VitexportError):
        load_checkpoint(path)
