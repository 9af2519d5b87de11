"""Our ViT vs timm's VisionTransformer with the same weights (timm is the oracle)."""

import pytest
import timm
import torch
from timm.models.vision_transformer import VisionTransformer as TimmViT
from timm.models.vision_transformer import checkpoint_filter_fn

from vitexport.model.readers.checkpoints import Checkpoint, load_into
from vitexport.model.build import build_model
from vitexport.model.vit import VisionTransformer, ViTConfig

TINY = dict(embed_dim=64, depth=2, num_heads=4)

CONFIGS = {
    "token": dict(img_size=32, patch_size=8),
    "avg_no_cls": dict(img_size=32, patch_size=8, class_token=False, global_pool="avg"),
    "no_embed_class": dict(img_size=32, patch_size=8, no_embed_class=True),
    "layerscale": dict(img_size=32, patch_size=8, init_values=0.1),
    "pre_norm": dict(img_size=32, patch_size=8, pre_norm=True),
    "non_square": dict(img_size=(32, 48), patch_size=8),
    "patch14": dict(img_size=56, patch_size=14),
    "avg_fc_norm_off": dict(img_size=32, patch_size=8, global_pool="avg", fc_norm=False),
    "no_pool_features": dict(img_size=32, patch_size=8, global_pool="", num_classes=0),
    "no_qkv_bias_mlp3": dict(img_size=32, patch_size=8, qkv_bias=False, mlp_ratio=3.0),
}


def _timm(kwargs):
    kw = dict(TINY, **kwargs)
    return TimmViT(**kw).eval()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_matches_timm(name):
    kwargs = CONFIGS[name]
    torch.manual_seed(0)
    ref = _timm(kwargs)
    # randomise every tensor (LayerNorm affine and biases included) so nothing matches by accident
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    ours = VisionTransformer(ViTConfig(**TINY, **kwargs)).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(3, 3, *ours.cfg.img_size)
    with torch.no_grad():
        a, b = ref(x), ours(x)
        ours.set_fused_attn(False)
        c = ours(x)
        fa, fb = ref.forward_features(x), ours.forward_features(x)
        pa, pb = ref.forward_head(fa, pre_logits=True), ours.forward_head(fb, pre_logits=True)
    assert a.shape == b.shape
    torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
    torch.testing.assert_close(c, a, atol=1e-5, rtol=0)
    torch.testing.assert_close(fb, fa, atol=1e-5, rtol=0)
    torch.testing.assert_close(pb, pa, atol=1e-5, rtol=0)


def test_state_dict_names_match_timm_exactly():
    for kwargs in CONFIGS.values():
        ref = _timm(kwargs)
        ours = VisionTransformer(ViTConfig(**TINY, **kwargs))
        assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == \
               {k: tuple(v.shape) for k, v in ref.state_dict().items()}


def test_deterministic_init():
    cfg = ViTConfig(**TINY, img_size=32, patch_size=8)
    a, b, c = build_model(cfg, seed=0), build_model(cfg, seed=0), build_model(cfg, seed=1)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(a(x), b(x))
        assert not torch.allclose(a(x), c(x))


@pytest.mark.parametrize("no_embed_class", [False, True])
def test_224_checkpoint_into_384_matches_timm_filter(no_embed_class):
    """A state dict saved at 224 loaded at 384 == timm create_model(img_size=384) + checkpoint_filter_fn."""
    kw = dict(TINY, patch_size=16, no_embed_class=no_embed_class)
    torch.manual_seed(1)
    src = TimmViT(img_size=224, **kw)
    with torch.no_grad():
        for p in src.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    sd = src.state_dict()
    ref = TimmViT(img_size=384, **kw).eval()
    ref.load_state_dict(checkpoint_filter_fn(sd, ref))
    ours = VisionTransformer(ViTConfig(img_size=384, **kw)).eval()
    notes = load_into(ours, Checkpoint(sd, "timm", None, ""), "bicubic-antialias")  # type: ignore[arg-type]
    assert any("Resized" in n for n in notes)
    x = torch.randn(2, 3, 384, 384)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=0)
    # the seed's method (no antialias) really is a different function
    other = VisionTransformer(ViTConfig(img_size=384, **kw)).eval()
    load_into(other, Checkpoint(sd, "timm", None, ""), "bicubic")  # type: ignore[arg-type]
    assert not torch.allclose(other.pos_embed, ours.pos_embed, atol=1e-3)


def test_named_variant_matches_timm_create_model():
    from vitexport.model.variants import get_variant
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False).eval()
    ours = VisionTransformer(get_variant("vit_tiny_patch16_224").config()).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=0)
