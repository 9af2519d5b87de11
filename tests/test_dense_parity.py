"""A dense output judged by its task: depth by AbsRel and delta1 against the reference per image, segmentation by
pixel agreement and mIoU of the class maps, each a mean over the images with a 95 % interval; and the ways a backend
can be wrong that a tensor tolerance misses (a depth map at another scale, flipped left to right, from another
checkpoint; two classes swapped) fail the gate.
"""

import numpy as np
import pytest
import torch

from vitexport.parity.accumulate import ParityAccumulator, Truth
from vitexport.parity.compare import DEFAULT_THRESHOLDS, describe, judge
from vitexport.parity.dense import bootstrap_miou, class_counts, depth_figures, set_miou
from vitexport.parity.stats import mean_interval, t975

transformers = pytest.importorskip("transformers")


def test_depth_figures_by_hand():
    """Reference depths 1, 2, 4 and a pixel without depth (0, left out); the candidate 1, 3, 2: relative errors 0,
    0.5, 0.5 -> AbsRel 1/3; ratios 1, 1.5, 2 -> one pixel of three within 1.25."""
    ref = np.array([[[1.0, 2.0], [4.0, 0.0]]])
    out = np.array([[[1.0, 3.0], [2.0, 5.0]]])
    absrel, delta1 = depth_figures(ref, out)
    assert absrel[0] == pytest.approx(1 / 3) and delta1[0] == pytest.approx(1 / 3)
    # a candidate at 0 where the reference has depth misses delta1 and counts a relative error of 1
    absrel, delta1 = depth_figures(ref, np.array([[[0.0, 2.0], [4.0, 0.0]]]))
    assert absrel[0] == pytest.approx(1 / 3) and delta1[0] == pytest.approx(2 / 3)


def test_miou_by_hand():
    """Maps over 3 classes: class 0 IoU 1/2 (1 shared of 2 in the union), class 1 2/3, class 2 absent from both."""
    a = np.array([[0, 1, 1, 0]])
    b = np.array([[0, 1, 1, 1]])
    assert set_miou(*class_counts(a, b, 3)) == pytest.approx((1 / 2 + 2 / 3) / 2)


def test_t_quantiles_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 5, 10, 29, 30, 31, 50, 200, 5000):
        assert t975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=2e-3), df
    v = np.array([0.1, 0.3, 0.2, 0.25])
    m, lo, hi = mean_interval(v)
    want = stats.t.interval(0.95, len(v) - 1, loc=v.mean(), scale=stats.sem(v))
    assert (lo, hi) == pytest.approx(want, abs=1e-3)


def _depth_model(seed):
    cfg = transformers.DepthAnythingConfig(
        backbone_config=dict(model_type="dinov2", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                             image_size=56, patch_size=14, out_indices=[1, 2], reshape_hidden_states=False),
        reassemble_hidden_size=32, neck_hidden_sizes=[16, 32], reassemble_factors=[2, 1], fusion_hidden_size=16,
        head_hidden_size=8)
    torch.manual_seed(seed)
    model = transformers.DepthAnythingForDepthEstimation(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
        # depth above zero over the whole map and varying ~10 % across it, as a trained model's does
        model.head.conv3.weight.mul_(20)
        model.head.conv3.bias.fill_(3.0)
    return model


@pytest.fixture(scope="module")
def depths():
    """A Depth Anything model's depth on 12 images, and another checkpoint's of the same shape."""
    x = torch.randn(12, 3, 56, 56, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        return _depth_model(0)(pixel_values=x).predicted_depth.numpy(), \
            _depth_model(1)(pixel_values=x).predicted_depth.numpy()


def _judge(ref, out, precision, dense="depth"):
    acc = ParityAccumulator(len(ref), Truth(dense=dense))
    for start in range(0, len(ref), 5):  # in batches, as the bench streams them
        acc.update(start, ref[start:start + 5], out[start:start + 5])
    return judge(acc.stats(), precision)


def test_an_honest_depth_map_passes_and_says_its_figures(depths):
    ref, _ = depths
    noisy = ref * (1 + 0.01 * np.random.default_rng(0).standard_normal(ref.shape))  # 1 % per pixel: INT8-like
    verdict = _judge(ref, noisy.astype(np.float32), "int8")
    assert verdict.passed, verdict.problems()
    st = verdict.stats
    assert st.absrel == pytest.approx(0.008, abs=0.002) and st.delta1 == 1.0
    assert "top1_agree" not in st.to_dict() and "AbsRel" in describe(st)


@pytest.mark.parametrize("wrong", ["twice-the-scale", "flipped", "other-checkpoint"])
def test_a_wrong_depth_map_fails_the_gate(depths, wrong):
    ref, other = depths
    out = {"twice-the-scale": ref * 2, "flipped": ref[..., ::-1], "other-checkpoint": other}[wrong]
    verdict = _judge(ref, np.ascontiguousarray(out), "int8")
    assert verdict.failed, describe(verdict.stats)
    assert any("AbsRel" in f for f in verdict.failures)
    if wrong == "twice-the-scale":  # what a cosine bound alone would let through
        assert verdict.stats.cos_min > 0.9999


def test_two_swapped_classes_fail_the_gate():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((8, 5, 16, 16)).astype(np.float32)
    logits[:, 2] += 2.0  # class 2 dominant, so the swap changes most pixels
    swapped = logits[:, [0, 1, 3, 2, 4]]
    verdict = _judge(logits, swapped, "fp16", "segmentation")
    assert verdict.failed and any("mIoU" in f for f in verdict.failures)
    honest = logits + 1e-4 * rng.standard_normal(logits.shape).astype(np.float32)
    verdict = _judge(logits, honest, "fp16", "segmentation")
    assert verdict.passed, verdict.problems()
    assert verdict.stats.pixel_agree > 0.99 and verdict.stats.miou > 0.99


def test_the_sets_miou_pools_pixels_and_its_interval_holds_it():
    """mIoU over a set pools each class's pixels over its images (a rare class missed in one image does not count
    as an IoU of 0 for that image alone), and the bootstrap interval brackets it; the same resample for two sets
    gives a paired difference interval that excludes 0 when one set is worse on every image."""
    rng = np.random.default_rng(1)
    a = rng.integers(0, 4, (20, 100))
    b = a.copy()
    b[:, :5] = (b[:, :5] + 1) % 4  # 5 % of each image's pixels moved to another class
    inter, union = class_counts(a, b, 4)
    want = np.mean([(inter[:, c].sum() / union[:, c].sum()) for c in range(4)])
    assert set_miou(inter, union) == pytest.approx(want)
    c = a.copy()
    c[:, :20] = (c[:, :20] + 1) % 4  # worse everywhere
    (lo, hi), _, (dlo, dhi) = bootstrap_miou([(inter, union), class_counts(a, c, 4)])
    assert lo <= set_miou(inter, union) <= hi and dhi < 0


def test_a_set_too_small_says_so(depths):
    """Two images whose AbsRel straddles the bound: their interval reaches both sides, the verdict is undecided."""
    ref, _ = depths
    out = ref[:2].copy()
    out[0] *= 1.03
    out[1] *= 1.08
    verdict = _judge(ref[:2], out, "int8")
    assert verdict.status == "inconclusive", describe(verdict.stats)
    assert not DEFAULT_THRESHOLDS["int8"].check(verdict.stats)


def test_segmentation_against_its_truth_by_hand():
    """A 2x2 class map upsampled to 4x4 against a mask with an ignored row: mIoU over the classes either has."""
    from vitexport.parity.dense import segmentation_truth_figures

    logits = np.zeros((3, 2, 2), np.float32)
    logits[0, 0, :] = 5  # top row class 0
    logits[1, 1, :] = 5  # bottom row class 1
    mask = np.array([[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 2, 2], [255, 255, 255, 255]])
    acc, inter, union = segmentation_truth_figures(logits, mask, 255)
    # predicted: rows 0-1 class 0, rows 2-3 class 1; counted pixels rows 0-2: class 0 IoU 1, class 1 IoU 2/4,
    # class 2 IoU 0 -> mIoU 1.5 / 3; accuracy 10 of 12
    assert set_miou(inter[None], union[None]) == pytest.approx(0.5) and acc == pytest.approx(10 / 12)


def test_relative_depth_is_aligned_by_scale_and_shift_in_disparity():
    from vitexport.parity.dense import depth_truth_figures

    rng = np.random.default_rng(0)
    disparity = rng.uniform(0.5, 2.0, (8, 8))
    gt = 1.0 / (3.0 * disparity + 0.25)
    gt[0, 0] = 0  # no value there
    absrel, delta1 = depth_truth_figures(disparity, gt, relative=True)
    assert absrel < 1e-6 and delta1 == 1.0  # float32 arithmetic alone
    absrel, _ = depth_truth_figures(disparity, gt, relative=False)  # as metric depth it is far off
    assert absrel > 0.5
