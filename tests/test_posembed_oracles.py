"""Position-embedding resampling (model/posembed.py) against implementations from outside this project, for each
method of INTERPOLATIONS:

- timm: ``resample_abs_pos_embed`` (bicubic and bilinear, with and without antialias), its dynamic_img_size
  VisionTransformer (bicubic with antialias) and NaFlexViT's ``NaFlexEmbeds`` (SigLIP2's antialiased bilinear,
  C-RADIO's align_corners bilinear, and the aspect-ratio preserving square-then-crop);
- transformers: DINOv2's ``interpolate_pos_encoding`` (bicubic), DPT's ``_resize_pos_embed`` (bilinear) and SigLIP2's
  ``resize_positional_embeddings`` (antialiased bilinear, written as weights rather than through F.interpolate);
- align_corners bilinear from its definition, with numpy's ``interp`` (the corners of the grid are kept exactly).

The oracles' settings are written here, never read from INTERPOLATIONS. Each method is checked at fixed sizes
(resample_pos_embed, as when loading a checkpoint at another size) and at dynamic sizes: the model's forward pass
resampling to its input's grid, and ONNX Runtime running a dynamic-size export, against a fixed-size timm model that
holds the oracle's resampled embedding.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers
from timm.layers import resample_abs_pos_embed
from timm.models.naflexvit import NaFlexEmbeds
from timm.models.vision_transformer import VisionTransformer as TimmViT
from transformers.models.dpt.modeling_dpt import DPTViTEmbeddings
from transformers.models.siglip2.modeling_siglip2 import Siglip2VisionEmbeddings

from vitexport.exporter.to_onnx import export_onnx
from vitexport.model.build import build_model
from vitexport.model.config import ViTConfig
from vitexport.model.posembed import INTERPOLATIONS, resample_pos_embed

D, P, OLD = 32, 4, (4, 4)  # width, patch size, the stored grid
GRIDS = [(5, 7), (3, 2), (7, 3)]  # non-square: both sides up, both down, one up and one down
TINY = dict(patch_size=P, embed_dim=D, depth=1, num_heads=2, num_classes=5)


def _pos_embed(seed: int = 0) -> torch.Tensor:
    """(1, 1 + 4*4, D): a class token's entry and the stored grid's."""
    return torch.randn(1, 1 + OLD[0] * OLD[1], D, generator=torch.Generator().manual_seed(seed))


# -- the oracles: (1, 1 + Ho*Wo, D), (Hn, Wn) -> (1, 1 + Hn*Wn, D) ------------------------------------------------

def _timm(mode: str, antialias: bool):
    def resample(pe, new):
        return resample_abs_pos_embed(pe, new_size=list(new), old_size=list(OLD), num_prefix_tokens=1,
                                      interpolation=mode, antialias=antialias)
    return resample


def _dinov2(pe, new):
    """transformers' DINOv2 (bicubic, no antialias): it takes the image's height and width, not the grid's."""
    cfg = transformers.Dinov2Config(hidden_size=D, num_hidden_layers=1, num_attention_heads=2,
                                    image_size=OLD[0] * P, patch_size=P)
    emb = transformers.Dinov2Model(cfg).embeddings
    with torch.no_grad():
        emb.position_embeddings.copy_(pe)
        tokens = torch.zeros(1, 1 + new[0] * new[1], D)  # only its length and width are read
        return emb.interpolate_pos_encoding(tokens, new[0] * P, new[1] * P)  # the class token's entry included


def _dpt(pe, new):
    """transformers' DPT (bilinear, no antialias)."""
    cfg = transformers.DPTConfig(hidden_size=D, num_hidden_layers=1, num_attention_heads=2, image_size=OLD[0] * P,
                                 patch_size=P, is_hybrid=False)
    with torch.no_grad():
        return DPTViTEmbeddings(cfg)._resize_pos_embed(pe, new[0], new[1])


def _siglip2(pe, new):
    """transformers' SigLIP2 (antialiased bilinear), on the grid without the class token's entry."""
    grid = pe[0, 1:].reshape(*OLD, D)
    out = Siglip2VisionEmbeddings.resize_positional_embeddings(grid, torch.tensor([list(new)]), new[0] * new[1])
    return torch.cat([pe[:, :1], out], dim=1)


def _naflex(mode: str, antialias: bool, corners: bool, square: bool):
    """timm NaFlexViT's learned position embedding (stored as (1, H, W, D), no class token entry) added to zeros."""
    def resample(pe, new):
        emb = NaFlexEmbeds(patch_size=P, embed_dim=D, class_token=False, pos_embed_grid_size=OLD,
                           pos_embed_interp_mode=mode, pos_embed_antialias=antialias,
                           pos_embed_align_corners=corners, pos_embed_ar_preserving=square)
        with torch.no_grad():
            emb.pos_embed.copy_(pe[:, 1:].reshape(1, *OLD, D))
            x = torch.zeros(1, new[0] * new[1], D)
            emb._apply_learned_pos_embed(x, list(new))
        return torch.cat([pe[:, :1], x], dim=1)
    return resample


def _corners_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in): align_corners linear interpolation, the ends on the ends and the rest evenly between
    (np.interp of each basis vector at n_out evenly spaced points of [0, n_in - 1])."""
    at = np.linspace(0, n_in - 1, n_out)
    return np.stack([np.interp(at, np.arange(n_in), e) for e in np.eye(n_in)], axis=1)


def _numpy_corners(pe, new):
    grid = pe[0, 1:].double().numpy().reshape(*OLD, D)
    out = np.einsum("ai,bj,ijd->abd", _corners_matrix(OLD[0], new[0]), _corners_matrix(OLD[1], new[1]), grid)
    return torch.cat([pe[:, :1], torch.from_numpy(out).float().reshape(1, -1, D)], dim=1)


# method, square, oracle; the naflexvit entries with square=True are its aspect-ratio preserving resampling
ORACLES = [
    ("bicubic-antialias", False, _timm("bicubic", True), "timm"),
    ("bicubic-antialias", False, _naflex("bicubic", True, False, False), "timm-naflexvit"),
    ("bicubic", False, _timm("bicubic", False), "timm"),
    ("bicubic", False, _dinov2, "transformers-dinov2"),
    ("bilinear", False, _timm("bilinear", False), "timm"),
    ("bilinear", False, _dpt, "transformers-dpt"),
    ("bilinear-antialias", False, _timm("bilinear", True), "timm"),
    ("bilinear-antialias", False, _siglip2, "transformers-siglip2"),
    ("bilinear-antialias", False, _naflex("bilinear", True, False, False), "timm-naflexvit-siglip"),
    ("bilinear-corners", False, _naflex("bilinear", False, True, False), "timm-naflexvit"),
    ("bilinear-corners", False, _numpy_corners, "numpy-definition"),
    ("bicubic-antialias", True, _naflex("bicubic", True, False, True), "timm-naflexvit-square"),
    ("bicubic", True, _naflex("bicubic", False, False, True), "timm-naflexvit-square"),
    ("bilinear", True, _naflex("bilinear", False, False, True), "timm-naflexvit-square"),
    ("bilinear-antialias", True, _naflex("bilinear", True, False, True), "timm-naflexvit-square"),
    ("bilinear-corners", True, _naflex("bilinear", False, True, True), "timm-naflexvit-cradio-square"),
]


def _id(method, square, name):
    return f"{method}{'-square' if square else ''}-vs-{name}"


def test_every_method_has_an_oracle():
    assert {m for m, *_ in ORACLES} == set(INTERPOLATIONS)
    assert {m for m, square, *_ in ORACLES if square} == set(INTERPOLATIONS)


# -- fixed sizes ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method,square,oracle", [pytest.param(m, s, o, id=_id(m, s, n)) for m, s, o, n in ORACLES])
def test_resample_pos_embed_matches_the_oracle(method, square, oracle):
    pe = _pos_embed()
    for new in GRIDS:
        got = resample_pos_embed(pe, new, num_prefix_tokens=1, old_grid=OLD, method=method, square=square)
        assert got.shape == (1, 1 + new[0] * new[1], D)
        torch.testing.assert_close(got, oracle(pe, new), atol=1e-5, rtol=0, msg=lambda m: f"{new}: {m}")
        assert torch.equal(got[:, :1], pe[:, :1])  # the class token's entry as it was


@pytest.mark.parametrize("new", [(3, 2), (2, 3), (7, 3), (2, 2)], ids=lambda g: f"{g[0]}x{g[1]}")
def test_align_corners_keeps_the_grids_corners_exactly(new):
    """Each of these sizes shrinks at least one side, where align_corners=False moves the corners inwards."""
    pe = _pos_embed(1)
    grid = pe[0, 1:].reshape(*OLD, D)
    corners = lambda g: torch.stack([g[0, 0], g[0, -1], g[-1, 0], g[-1, -1]])  # noqa: E731
    got = resample_pos_embed(pe, new, 1, OLD, "bilinear-corners")[0, 1:].reshape(*new, D)
    assert torch.equal(corners(got), corners(grid))
    plain = resample_pos_embed(pe, new, 1, OLD, "bilinear")[0, 1:].reshape(*new, D)
    assert not torch.equal(corners(plain), corners(grid))


def test_align_corners_in_one_dimension_against_numpy():
    """A 1 x 4 grid to 1 x 7 and to 1 x 3: np.interp at evenly spaced points from the first to the last entry."""
    pe = _pos_embed(2)[:, :5]  # the class token's entry and a 1 x 4 grid
    row = pe[0, 1:].double().numpy()  # (4, D)
    for n in (7, 3):
        got = resample_pos_embed(pe, (1, n), 1, (1, 4), "bilinear-corners")[0, 1:].double().numpy()
        want = np.stack([np.interp(np.linspace(0, 3, n), np.arange(4), row[:, d]) for d in range(D)], axis=1)
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
        assert (got[0] == row[0]).all() and (got[-1] == row[-1]).all()


# -- dynamic sizes --------------------------------------------------------------------------------------------------

def _dynamic_model(method: str, square: bool = False):
    """vitexport's model with a dynamic image size, its 4 x 4 grid at 16 x 16, random weights (a position
    embedding of unit scale, so that how it is resampled shows in the logits)."""
    model = build_model(ViTConfig(img_size=OLD[0] * P, **TINY, dynamic_img_size=True, pos_embed_grid=OLD,
                                  pos_embed_interp=method, pos_embed_square=square))
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
        model.pos_embed.copy_(_pos_embed(4))
    return model


def _reference(model, oracle, hw):
    """timm's fixed-size ViT at `hw` with the model's weights and the oracle's resampled position embedding."""
    grid = (hw[0] // P, hw[1] // P)
    ref = TimmViT(img_size=hw, **TINY).eval()
    state = dict(model.state_dict())
    state["pos_embed"] = oracle(model.pos_embed.detach(), grid)
    ref.load_state_dict(state, strict=True)
    return ref


SIZES = [(20, 28), (12, 8), (28, 12)]  # grids 5x7, 3x2 and 7x3 from the stored 4x4
DYNAMIC = [  # one oracle a method, and the square C-RADIO resampling
    ("bicubic-antialias", False, _timm("bicubic", True), "timm"),
    ("bicubic", False, _dinov2, "transformers-dinov2"),
    ("bilinear", False, _dpt, "transformers-dpt"),
    ("bilinear-antialias", False, _siglip2, "transformers-siglip2"),
    ("bilinear-corners", False, _numpy_corners, "numpy-definition"),
    ("bilinear-corners", True, _naflex("bilinear", False, True, True), "timm-naflexvit-cradio-square"),
]
DYNAMIC_PARAMS = [pytest.param(m, s, o, id=_id(m, s, n)) for m, s, o, n in DYNAMIC]


@pytest.mark.parametrize("method,square,oracle", DYNAMIC_PARAMS)
def test_the_dynamic_model_resamples_like_the_oracle(method, square, oracle):
    model = _dynamic_model(method, square)
    for hw in SIZES:
        x = torch.randn(2, 3, *hw, generator=torch.Generator().manual_seed(hw[0] * 100 + hw[1]))
        with torch.no_grad():
            torch.testing.assert_close(model(x), _reference(model, oracle, hw)(x), atol=1e-5, rtol=0,
                                       msg=lambda m: f"{hw}: {m}")


def test_the_dynamic_model_equals_timms_dynamic_model():
    """timm's dynamic_img_size resamples with resample_abs_pos_embed's defaults: bicubic with antialias."""
    model = _dynamic_model("bicubic-antialias")
    ref = TimmViT(img_size=OLD[0] * P, **TINY, dynamic_img_size=True).eval()
    ref.load_state_dict(model.state_dict(), strict=True)
    for hw in SIZES:
        x = torch.randn(2, 3, *hw, generator=torch.Generator().manual_seed(hw[0]))
        with torch.no_grad():
            torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=0, msg=lambda m: f"{hw}: {m}")


@pytest.mark.parametrize("method,square,oracle", DYNAMIC_PARAMS)
def test_a_dynamic_export_resamples_like_the_oracle_in_onnx_runtime(method, square, oracle, tmp_path):
    """The graph's Resize, run by ONNX Runtime at grids other than the stored one (and at the stored one, where it
    must leave the embedding as it is)."""
    model = _dynamic_model(method, square)
    path = export_onnx(model, tmp_path / "model.onnx", img_size_range=((8, 8), (32, 32)))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for hw in [*SIZES, (16, 16)]:
        x = torch.randn(2, 3, *hw, generator=torch.Generator().manual_seed(hw[1]))
        with torch.no_grad():
            want = _reference(model, oracle, hw)(x).numpy()
        got = sess.run(None, {"pixel_values": x.numpy()})[0]
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0, err_msg=str(hw))
