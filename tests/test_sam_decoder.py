"""SAM's prompt encoder and mask decoder (`model/heads/sam_decoder.py`) against transformers' SamModel on a tiny random
config: every mask token's low-resolution masks and iou predictions for 1, 2 and 5 points with mixed labels, with and
without a box, a box alone, a mask input (per image of the batch), an ignored (-10) point; the graph inputs made by
`prompts_to_inputs`. The ONNX graph (torch.onnx.export, opset 17) answers any batch and any number of points with
one file, as PyTorch does, passes onnx.checker's full check and holds no control flow, scatter or einsum. Another
image's embedding gives other masks (the comparison can fail); `select_mask` is SAM's script's choice; the config
refuses bad values by name.
"""

import copy

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from vitexport.errors import VitexportError
from vitexport.model.heads.sam_decoder import (INPUT_NAMES, OUTPUT_NAMES, SHARED_KEY, TIED_KEY, PromptDecoderConfig,
                                               SamPromptDecoder, decoder_state_dict, prompts_to_inputs, select_mask)

transformers = pytest.importorskip("transformers")

E, IMAGE, HIDDEN = 8, 128, 32  # embedding side (image 128 / patch 16), input frame, prompt and decoder width
MASK = 4 * E
CONFIG = dict(hidden_size=HIDDEN, image_size=IMAGE, embedding_size=E, num_pos_feats=16, mask_input_channels=8,
              decoder_heads=2, decoder_mlp_dim=64, iou_head_hidden_dim=32)
FORBIDDEN = {"If", "Loop", "Scan", "ScatterND", "NonZero", "Einsum"}
# per image of a batch of 2: points (x, y, label) in the 128 x 128 frame, and a box
POINTS = [[(10.0, 20.0, 1), (100.0, 50.0, 0), (64.0, 64.0, 1), (3.5, 120.0, 0), (127.0, 0.0, 1)],
          [(90.0, 30.0, 0), (20.0, 110.0, 1), (55.5, 77.25, 1), (0.0, 0.0, 1), (70.0, 8.0, 0)]]
BOXES = [(5.0, 6.0, 90.0, 100.0), (30.0, 20.0, 60.0, 70.0)]


@pytest.fixture(scope="module")
def models():
    """transformers' tiny SamModel, every tensor random (no zero or one hides a bug), and ours with its weights."""
    torch.manual_seed(0)
    config = transformers.SamConfig(
        vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=IMAGE,
                           patch_size=16, output_channels=HIDDEN, num_pos_feats=16, window_size=4,
                           global_attn_indexes=[1], mlp_dim=64),
        prompt_encoder_config=dict(hidden_size=HIDDEN, image_size=IMAGE, patch_size=16, mask_input_channels=8),
        mask_decoder_config=dict(hidden_size=HIDDEN, mlp_dim=64, num_attention_heads=2, iou_head_hidden_dim=32))
    hf = transformers.SamModel(config).eval()
    with torch.no_grad():
        for p in hf.parameters():  # the tied Fourier features too: one tensor under two names
            p.copy_(torch.randn_like(p) * 0.2)
    ours = SamPromptDecoder(PromptDecoderConfig(**CONFIG)).eval()
    ours.load_state_dict(decoder_state_dict(hf.state_dict()), strict=True)
    return hf, ours


def embeddings(seed: int = 1, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, HIDDEN, E, E, generator=torch.Generator().manual_seed(seed))


def graph_inputs(points, boxes):
    """prompts_to_inputs per image, stacked: coords (B, N, 2), labels (B, N)."""
    rows = [prompts_to_inputs(p, b, (1.0, 1.0)) for p, b in zip(points, boxes)]
    return torch.from_numpy(np.stack([c for c, _ in rows])), torch.from_numpy(np.stack([lab for _, lab in rows]))


def no_mask(batch: int = 2):
    return torch.zeros(batch, 1, MASK, MASK), torch.zeros(batch)


def hf_outputs(hf, emb, points, boxes=None, masks=None, labels=None):
    """transformers' pred_masks and iou_scores with multimask_output True (B, 3, ...) and False (B, 1, ...)."""
    kw = dict(image_embeddings=emb, input_masks=masks)
    if points is not None and len(points[0]):
        kw["input_points"] = torch.tensor([[[p[:2] for p in ps]] for ps in points])  # (B, 1, n, 2)
        kw["input_labels"] = torch.tensor([[[p[2] for p in ps]] for ps in points]) if labels is None else labels
    if boxes is not None:
        kw["input_boxes"] = torch.tensor(boxes)[:, None]  # (B, 1, 4)
    with torch.no_grad():
        multi, single = hf(**kw, multimask_output=True), hf(**kw, multimask_output=False)
    return multi.pred_masks[:, 0], multi.iou_scores[:, 0], single.pred_masks[:, 0], single.iou_scores[:, 0]


def assert_close(got, want):
    got, want = torch.as_tensor(got), torch.as_tensor(want)
    assert got.shape == want.shape
    err, tol = (got - want).abs().max().item(), 1e-5 * max(1.0, want.abs().max().item())
    assert err <= tol, f"max error {err} > {tol}"


def assert_matches(ours_out, hf_out):
    masks, iou = ours_out
    multi_masks, multi_iou, single_masks, single_iou = hf_out
    assert_close(masks[:, 1:], multi_masks)
    assert_close(iou[:, 1:], multi_iou)
    assert_close(masks[:, :1], single_masks)
    assert_close(iou[:, :1], single_iou)


@pytest.mark.parametrize("box", [False, True], ids=["points", "points+box"])
@pytest.mark.parametrize("n", [1, 2, 5])
def test_matches_transformers(models, n, box):
    hf, ours = models
    points = [p[:n] for p in POINTS]
    boxes = BOXES if box else None
    coords, labels = graph_inputs(points, boxes or [None, None])
    assert coords.shape == (2, n + (2 if box else 1), 2)
    emb = embeddings()
    with torch.no_grad():
        out = ours(emb, coords, labels, *no_mask())
    assert out[0].shape == (2, 4, MASK, MASK) and out[1].shape == (2, 4)
    assert_matches(out, hf_outputs(hf, emb, points, boxes))


def test_box_alone(models):
    hf, ours = models
    coords, labels = graph_inputs([[], []], BOXES)
    assert labels.tolist() == [[2, 3], [2, 3]]
    emb = embeddings(2)
    with torch.no_grad():
        out = ours(emb, coords, labels, *no_mask())
    assert_matches(out, hf_outputs(hf, emb, None, BOXES))


def test_mask_input(models):
    """A previous mask's logits embedded where has_mask_input is 1 (image 0), the no-mask embedding where 0."""
    hf, ours = models
    points = [p[:2] for p in POINTS]
    coords, labels = graph_inputs(points, [None, None])
    emb = embeddings(3)
    mask = torch.randn(2, 1, MASK, MASK, generator=torch.Generator().manual_seed(4)) * 3
    with torch.no_grad():
        masks, iou = ours(emb, coords, labels, mask, torch.tensor([1.0, 0.0]))
    with_mask = hf_outputs(hf, emb, points, masks=mask)  # transformers' input_masks: (B, 1, 4E, 4E)
    without = hf_outputs(hf, emb, points)
    assert_matches((masks[:1], iou[:1]), [t[:1] for t in with_mask])
    assert_matches((masks[1:], iou[1:]), [t[1:] for t in without])
    assert (with_mask[0][1] - without[0][1]).abs().max() > 1e-3  # the mask input changes the answer


def test_ignored_point(models):
    """-10 (transformers' pad label): a row of zeros among the tokens, before the padding point."""
    hf, ours = models
    points = [p[:3] for p in POINTS]
    coords, labels = graph_inputs(points, [None, None])
    labels[:, 1] = -10
    emb = embeddings(5)
    with torch.no_grad():
        out = ours(emb, coords, labels, *no_mask())
    hf_labels = torch.tensor([[[p[2] for p in ps]] for ps in points])
    hf_labels[:, :, 1] = -10
    assert_matches(out, hf_outputs(hf, emb, points, labels=hf_labels))


def test_state_dict(models):
    hf, ours = models
    sd = hf.state_dict()
    mapped = decoder_state_dict(sd)
    assert TIED_KEY not in mapped and not any(k.startswith("vision_encoder.") for k in mapped)
    assert set(mapped) == set(ours.state_dict())
    only_tied = {k: v for k, v in sd.items() if k != SHARED_KEY}  # a checkpoint holding the tied name alone
    assert torch.equal(decoder_state_dict(only_tied)[SHARED_KEY], sd[SHARED_KEY])
    with torch.no_grad():
        assert_close(ours.image_positional_embeddings(), hf.get_image_wide_positional_embeddings())


def test_norm_epsilons(models):
    """Every LayerNorm's epsilon is transformers' (its values hide a wrong one: 1e-6 and 1e-5 differ below the
    tolerance), and the final one's 1e-5 shows where its input is small."""
    hf, ours = models
    norms = {name: m.eps for name, m in hf.named_modules()
             if isinstance(m, torch.nn.LayerNorm) and not name.startswith("vision_encoder.")}
    assert len(norms) == 3 + 4 * 2 + 1
    assert {name: ours.get_submodule(name).eps for name in norms} == norms
    assert norms["mask_decoder.transformer.layer_norm_final_attn"] == 1e-5
    assert norms["mask_decoder.upscale_layer_norm"] == 1e-6
    quiet = copy.deepcopy(hf)
    transformer = quiet.mask_decoder.transformer
    with torch.no_grad():  # the final norm's input (the last norm's output + the last attention's) scaled by 1e-3
        for p in (*transformer.layers[-1].layer_norm3.parameters(), *transformer.final_attn_token_to_image.out_proj
                  .parameters()):
            p.mul_(1e-3)
    small = SamPromptDecoder(PromptDecoderConfig(**CONFIG)).eval()
    small.load_state_dict(decoder_state_dict(quiet.state_dict()), strict=True)
    points = [p[:2] for p in POINTS]
    coords, labels = graph_inputs(points, [None, None])
    emb = embeddings(6)
    with torch.no_grad():
        out = small(emb, coords, labels, *no_mask())
    assert_matches(out, hf_outputs(quiet, emb, points))
    small.mask_decoder.transformer.layer_norm_final_attn.eps = 1e-6  # the config's: another answer
    with torch.no_grad(), pytest.raises(AssertionError):
        assert_matches(small(emb, coords, labels, *no_mask()), hf_outputs(quiet, emb, points))


def test_other_embedding_differs(models):
    """Another image's embedding: other masks, far beyond the tolerance (the comparisons above can fail)."""
    hf, ours = models
    points = [p[:2] for p in POINTS]
    coords, labels = graph_inputs(points, [None, None])
    with torch.no_grad():
        masks, _ = ours(embeddings(7), coords, labels, *no_mask())
    want = hf_outputs(hf, embeddings(1), points)[0]
    with pytest.raises(AssertionError):
        assert_close(masks[:, 1:], want)
    a, b = masks[:, 1:] > 0, want > 0
    iou = (a & b).sum().item() / max(1, (a | b).sum().item())
    assert iou < 0.8, iou


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the TorchScript exporter (dynamo=False) says it is old
def test_onnx_any_batch_and_points(models, tmp_path):
    _, ours = models
    path = tmp_path / "sam_decoder.onnx"
    axes = {"image_embeddings": {0: "batch"}, "point_coords": {0: "batch", 1: "num_points"},
            "point_labels": {0: "batch", 1: "num_points"}, "mask_input": {0: "batch"}, "has_mask_input": {0: "batch"},
            "masks": {0: "batch"}, "iou_predictions": {0: "batch"}}
    with torch.no_grad():
        torch.onnx.export(ours, ours.example_inputs(2, 3), str(path), dynamo=False, opset_version=17,
                          input_names=list(INPUT_NAMES), output_names=list(OUTPUT_NAMES), dynamic_axes=axes)
    onnx.checker.check_model(str(path), full_check=True)
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert not ops & FORBIDDEN, ops & FORBIDDEN
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for batch, n in ((1, 1), (3, 5)):
        points = [POINTS[i % 2][:n - 1] for i in range(batch)]  # n - 1 points and the padding point
        coords, labels = graph_inputs(points, [None] * batch)
        mask = torch.randn(batch, 1, MASK, MASK)
        has = torch.tensor([float(i % 2) for i in range(batch)])
        inputs = (embeddings(8, batch), coords, labels, mask, has)
        with torch.no_grad():
            want = ours(*inputs)
        got = session.run(list(OUTPUT_NAMES), {k: v.numpy() for k, v in zip(INPUT_NAMES, inputs)})
        assert got[0].shape == (batch, 4, MASK, MASK) and got[1].shape == (batch, 4)
        for g, w in zip(got, want):
            assert_close(g, w)


def test_prompts_to_inputs():
    coords, labels = prompts_to_inputs([(10, 20, 1), (30, 40, 0)], (1, 2, 3, 4), (0.5, 2.0))
    assert coords.dtype == labels.dtype == np.float32
    assert coords.tolist() == [[5, 40], [15, 80], [0.5, 4], [1.5, 8]]
    assert labels.tolist() == [1, 0, 2, 3]
    coords, labels = prompts_to_inputs([(10, 20, 1)], None, (0.5, 2.0))
    assert coords.tolist() == [[5, 40], [0, 0]] and labels.tolist() == [1, -1]
    with pytest.raises(VitexportError, match="label"):
        prompts_to_inputs([(10, 20, 2)], None, (1.0, 1.0))


def test_select_mask():
    iou = np.array([0.1, 0.5, 0.9, 0.3], dtype=np.float32)
    # 2 graph points (one click and the padding): scores [0.1 - 500, 0.5, 0.9, 0.3] -> the best multimask output
    assert select_mask(iou, 2) == 2
    # 3 (two clicks and the padding, or a box): [0.1 + 500, ...] -> the single-mask output
    assert select_mask(iou, 3) == 0
    # the single mask's own score does not count with one click: [0.99 - 500, 0.2, 0.35, 0.1] -> 2
    assert select_mask(np.array([0.99, 0.2, 0.35, 0.1]), 2) == 2


@pytest.mark.parametrize("field,value", [
    ("hidden_size", 0), ("image_size", -1), ("embedding_size", True), ("decoder_heads", 3),
    ("num_pos_feats", 64), ("prompt_act", "swish"), ("decoder_act", "tanh"), ("prompt_norm_eps", 0.0),
    ("decoder_norm_eps", "1e-6"), ("mask_input_channels", 6), ("num_point_embeddings", 5), ("iou_head_depth", 1.5),
    ("attention_downsample_rate", 3),
])
def test_config_refusals(field, value):
    with pytest.raises(VitexportError, match=field):
        PromptDecoderConfig(**{field: value})


def test_config_dict():
    cfg = PromptDecoderConfig(**CONFIG)
    assert PromptDecoderConfig.from_dict(cfg.to_dict()) == cfg
    assert (cfg.mask_size, cfg.num_mask_tokens) == (MASK, 4)
    default = PromptDecoderConfig()
    assert (default.hidden_size, default.mask_size, default.num_mask_tokens) == (256, 256, 4)
    with pytest.raises(VitexportError, match="future_field"):
        PromptDecoderConfig.from_dict({**cfg.to_dict(), "future_field": 1})
