"""preflight.py's checks before work, each rule on its own: the memory estimate's terms, the refusal sentence and
its boundary, the largest batch that fits, where the model's shape comes from, opsets and op types.

The estimate's weights are checked against timm's parameter count in test_faults.py; here the activation terms the
module's docstring lists are counted by hand for small shapes."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_folder import _manifest_json

from vitexport import preflight
from vitexport.errors import VitexportError
from vitexport.model.spec import DEFAULT_OPSET, ModelSpec
from vitexport.progress import Log

TINY = {"img_size": (32, 32), "patch_size": (16, 16), "embed_dim": 8, "depth": 1, "num_heads": 2}


def _by_hand(h, w, p, d, depth, heads, ratio=4.0, chans=3, classes=0, cls_token=True):
    """Bytes of the weights and of one image's activations, term by term (the docstring's list), and tokens."""
    n, hidden = (h // p) * (w // p) + cls_token, int(d * ratio)
    block = (2 * d + 2 * d  # two LayerNorms
             + 3 * d * d + 3 * d + d * d + d  # qkv and the projection
             + d * hidden + hidden + hidden * d + d)  # the MLP
    params = chans * p * p * d + d + d + n * d + depth * block + 2 * d + d * classes + classes
    acts = (chans * h * w  # the input
            + 2 * n * d  # the residual stream
            + 6 * n * d  # Q, K, V and their head-split copies
            + 2 * heads * n * n  # the attention matrices before and after the softmax
            + 2 * n * d  # attention output and projection
            + 2 * n * hidden)  # the MLP's hidden layer, before and after GELU
    return 4 * params, 4 * acts, n


@pytest.mark.parametrize("config,expected", [
    (TINY, _by_hand(32, 32, 16, 8, 1, 2)),
    ({**TINY, "img_size": 32, "patch_size": 16}, _by_hand(32, 32, 16, 8, 1, 2)),  # an int is a square
    ({**TINY, "img_size": (48, 32), "depth": 3, "num_heads": 4, "mlp_ratio": 2.0, "in_chans": 1, "num_classes": 7},
     _by_hand(48, 32, 16, 8, 3, 4, ratio=2.0, chans=1, classes=7)),
    ({**TINY, "class_token": False, "num_classes": None}, _by_hand(32, 32, 16, 8, 1, 2, cls_token=False)),
])
def test_the_estimate_term_by_term(config, expected):
    assert preflight.vit_memory(config) == expected


@pytest.mark.parametrize("n,text", [(0, "0 B"), (999, "999 B"), (1000, "1.0 KB"), (1_500_000, "1.5 MB"),
                                    (16 * 10**9, "16.0 GB"), (2.5e12, "2.5 TB"), (3e15, "3.0 PB"),
                                    (4e18, "4000.0 PB"), (-2000, "-2.0 KB")])
def test_human_sizes(n, text):
    assert preflight.human(n) == text


@pytest.mark.parametrize("text,expected", [
    ("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   16384 kB\n", 16384 * 1024),
    ("MemTotal:       24000000 kB\n", None),  # an old kernel: no estimate
    ("MemAvailable:   lots kB\n", None),
    ("MemAvailable:\n", None),
])
def test_available_memory_is_read_from_meminfo(tmp_path, monkeypatch, text, expected):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(text)
    monkeypatch.setattr(preflight, "Path", lambda p: meminfo if p == "/proc/meminfo" else None)
    assert preflight.mem_available() == expected
    monkeypatch.setattr(preflight, "Path", lambda p: tmp_path / "absent")
    assert preflight.mem_available() is None


def test_the_refusal_and_its_boundary():
    weights, per_image, tokens = preflight.vit_memory(TINY)
    needed = preflight.WEIGHT_COPIES * weights + 3 * per_image
    preflight.require_memory(TINY, 3, "--batch 3", "tiny", "fix", available=needed)  # exactly fits
    with pytest.raises(VitexportError) as e:
        preflight.require_memory(TINY, 3, "--batch 3", "tiny at 32x32", "use --batch 1 or less", available=needed - 1)
    assert str(e.value) == (f"--batch 3 needs about {preflight.human(needed)} of memory for tiny at 32x32 ({tokens:,} "
                            f"tokens, {preflight.human(per_image)} of activations per image at batch 3, "
                            f"{preflight.human(weights)} of weights), but {preflight.human(needed - 1)} is "
                            f"available; use --batch 1 or less.")


def test_where_memory_is_unknown_nothing_is_refused(monkeypatch):
    monkeypatch.setattr(preflight, "mem_available", lambda: None)
    preflight.require_memory(TINY, 10**12, "--batch", "tiny", "fix")
    assert preflight.max_batch(TINY) is None
    preflight.check_batches(TINY, (10**12,), "tiny")


def test_the_largest_batch_that_fits():
    weights, per_image, _ = preflight.vit_memory(TINY)
    base = preflight.WEIGHT_COPIES * weights
    assert preflight.max_batch(TINY, available=base + 5 * per_image) == 5
    assert preflight.max_batch(TINY, available=base + 5 * per_image - 1) == 4
    assert preflight.max_batch(TINY, available=base // 2) == 0  # not even the weights


def test_a_bench_batch_refusal_says_which_batch_would_fit(monkeypatch):
    weights, per_image, _ = preflight.vit_memory(TINY)
    monkeypatch.setattr(preflight, "mem_available", lambda: preflight.WEIGHT_COPIES * weights + 6 * per_image)
    preflight.check_batches(TINY, (2, 6), "tiny")
    with pytest.raises(VitexportError) as e:
        preflight.check_batches(TINY, (7, 2), "tiny")
    assert str(e.value).startswith("--batch 7 needs about") and str(e.value).endswith("; use --batch 6 or less.")
    monkeypatch.setattr(preflight, "mem_available", lambda: weights)
    with pytest.raises(VitexportError) as e:
        preflight.check_batches(TINY, (1,), "tiny")
    assert str(e.value).endswith("is available; free some memory.")


def test_an_export_is_checked_at_its_largest_batch_and_at_least_two(monkeypatch):
    spec = ModelSpec("vit_tiny_patch16_224", img_size=(64, 48))
    config = preflight.spec_config(spec)
    weights, per_image, _ = preflight.vit_memory(config)
    assert preflight.vit_memory(config)[2] == 4 * 3 + 1
    base = preflight.EXPORT_WEIGHT_COPIES * weights
    monkeypatch.setattr(preflight, "mem_available", lambda: base + 2 * per_image)
    preflight.check_export(spec, (1,))  # traced at batch 2: fits exactly
    with pytest.raises(VitexportError) as e:
        preflight.check_export(spec, (1, 3))
    assert str(e.value).startswith("--img-size 64x48 needs about")
    assert "for vit_tiny_patch16_224 at 64x48 (13 tokens" in str(e.value)
    assert str(e.value).endswith("; use a smaller --img-size.")
    monkeypatch.setattr(preflight, "mem_available", lambda: base + per_image)
    with pytest.raises(VitexportError) as e:
        preflight.check_export(ModelSpec("vit_tiny_patch16_224"), (1,))
    assert str(e.value).startswith("Exporting vit_tiny_patch16_224 needs about")
    assert "for vit_tiny_patch16_224 at 224x224 (197 tokens" in str(e.value)
    assert str(e.value).endswith("; free some memory.")


def test_the_shape_of_a_spec(monkeypatch):
    config = preflight.spec_config(ModelSpec("vit_small_patch16_384", num_classes=0))
    shape = {"img_size": (384, 384), "patch_size": (16, 16), "embed_dim": 384, "depth": 12, "num_heads": 6,
             "mlp_ratio": 4.0, "in_chans": 3, "num_classes": 0, "reg_tokens": 0, "class_token": True}
    assert {k: config[k] for k in shape} == shape
    assert preflight.spec_config(ModelSpec("vit_small_patch16_384"))["num_classes"] == 1000
    overridden = preflight.spec_config(ModelSpec("vit_small_patch16_384", overrides={"embed_dim": 576, "depth": 3}))
    assert (overridden["embed_dim"], overridden["depth"], overridden["num_heads"]) == (576, 3, 6)  # a hub config's


def test_bench_takes_the_shape_from_the_folders_manifest_else_from_the_spec(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(preflight, "mem_available", lambda: 10**9)  # the 64-wide digits model fits, a ViT-B not
    preflight.check_bench(None, ModelSpec("vit_base_patch16_224"), None)  # no --batch: nothing to check
    preflight.check_bench(tmp_path / "nothing here", None, (4,))  # no manifest: opening it will say so
    folder = tmp_path / "digits"
    folder.mkdir()
    record = _manifest_json()
    record["img_size"] = record["config"]["img_size"] = [32, 48]
    (folder / "manifest.json").write_text(json.dumps(record))
    preflight.check_bench(folder, ModelSpec("vit_base_patch16_224"), (64,))
    with pytest.raises(VitexportError, match=r"^--batch 100000 needs about .* for vit_digits_patch4_32 at 32x48 "):
        preflight.check_bench(folder / "model.onnx", None, (100000,))
    with pytest.raises(VitexportError, match=r"^--batch 64 needs about .* for vit_base_patch16_224 at 224x224 "):
        preflight.check_bench(None, ModelSpec("vit_base_patch16_224"), (64,))  # no export yet: the size table
    default = ModelSpec("vit_base_patch16_224", img_size=(32, 32)).default_folder().path
    default.mkdir(parents=True)
    (default / "manifest.json").write_text(json.dumps(_manifest_json()))  # its export is the small model
    preflight.check_bench(None, ModelSpec("vit_base_patch16_224", img_size=(32, 32)), (64,))


def test_an_opset_onnx_does_not_know(monkeypatch):
    top = onnx.defs.onnx_opset_version()
    preflight.check_opset(top)
    with pytest.raises(VitexportError) as e:
        preflight.check_opset(top + 1)
    assert str(e.value) == (f"--opset {top + 1} is newer than onnx {onnx.__version__} knows (opset {top} at most); "
                            f"use --opset {DEFAULT_OPSET} (the default) or another between 17 and {top}.")


class _Warnings(Log):
    def __init__(self):
        super().__init__()
        self.warnings = []

    def warn(self, text):
        self.warnings.append(text)


def test_op_types_a_user_names(tmp_path):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Softmax", ["h"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph), str(path))
    log = _Warnings()
    preflight.check_op_types(("Softmax",), path, log=log)
    assert log.warnings == []
    preflight.check_op_types(("LayerNormalization",), path, "--fp32-ops", log)
    assert log.warnings == ["--fp32-ops LayerNormalization: the graph has no LayerNormalization node, so it changes "
                            "nothing."]
    with pytest.raises(VitexportError) as e:
        preflight.check_op_types(("Softmaxx",), path)
    msg = str(e.value)  # the closest names first (difflib), from the graph's op types and ONNX's
    assert msg.startswith("--keep-fp32 Softmaxx: no ONNX operator has that type (did you mean Softmax, ")
    assert msg.endswith("?); this graph uses Relu, Softmax.")
    with pytest.raises(VitexportError) as e:
        preflight.check_op_types(("Reduce",), path)  # many operators are close: the three closest are named
    assert str(e.value).split("(did you mean ")[1].split("?)")[0].count(", ") == 2
    with pytest.raises(VitexportError) as e:
        preflight.check_op_types(("Qwertyuiop",), path)
    assert str(e.value) == "--keep-fp32 Qwertyuiop: no ONNX operator has that type; this graph uses Relu, Softmax."


def test_op_types_are_read_without_the_graphs_external_data(tmp_path):
    from onnx import numpy_helper

    w = numpy_helper.from_array(np.ones((2,), np.float32), "w")
    w.data_location = TensorProto.EXTERNAL
    w.ClearField("raw_data")
    entry = w.external_data.add()
    entry.key, entry.value = "location", "model.onnx.data"  # not there: reading it would fail
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [w])
    path = tmp_path / "model.onnx"
    path.write_bytes(helper.make_model(graph).SerializeToString())
    log = _Warnings()
    preflight.check_op_types(("Add", "Softmax"), path, log=log)
    assert log.warnings == ["--keep-fp32 Softmax: the graph has no Softmax node, so it changes nothing."]



def test_a_dynamic_size_export_is_checked_at_the_largest_size_of_its_range(monkeypatch):
    spec = ModelSpec("vit_tiny_patch16_224", img_size=(64, 48), dynamic_img_size=True,
                     img_size_range=((32, 32), (96, 128)))
    config = {**preflight.spec_config(spec), "img_size": (96, 128)}
    weights, per_image, tokens = preflight.vit_memory(config)
    assert tokens == 6 * 8 + 1
    base = preflight.EXPORT_WEIGHT_COPIES * weights
    monkeypatch.setattr(preflight, "mem_available", lambda: base + 3 * per_image)
    preflight.check_export(spec, (3,))  # fits exactly at the largest size
    with pytest.raises(VitexportError) as e:
        preflight.check_export(spec, (4,))
    assert str(e.value).startswith("--img-size-range up to 96x128 needs about")
    assert "for vit_tiny_patch16_224 at 96x128 (49 tokens" in str(e.value)
    default = ModelSpec("vit_tiny_patch16_224", dynamic_img_size=True)  # its range: 112x112 to 448x448
    weights, per_image, _ = preflight.vit_memory({**preflight.spec_config(default), "img_size": (448, 448)})
    monkeypatch.setattr(preflight, "mem_available", lambda: preflight.EXPORT_WEIGHT_COPIES * weights + 2 * per_image - 1)
    with pytest.raises(VitexportError, match=r"^--img-size-range up to 448x448 needs about .* \(785 tokens"):
        preflight.check_export(default, (1,))


def test_sams_decomposed_attention_counts_its_bias_sums(monkeypatch):
    """SAM ViT-B at 1024: ONNX Runtime's unfused attention holds the product, two broadcast bias sums and the softmax
    (measured: 11.9 GB at the export's check); an export where 10 GB is free is refused, not killed."""
    spec = ModelSpec("samvit_base_patch16")
    config = preflight.spec_config(spec)
    weights, per_image, tokens = preflight.vit_memory(config)
    assert tokens == 64 * 64 and config["rel_pos_bias"] == "decomposed"
    assert per_image > 4 * 12 * tokens ** 2 * 4  # four score tensors an image
    monkeypatch.setattr(preflight, "mem_available", lambda: 10 * 1024 ** 3)
    with pytest.raises(VitexportError, match="^Exporting samvit_base_patch16 needs about 1[12].* GB"):
        preflight.check_export(spec, (1, 3))
    monkeypatch.setattr(preflight, "mem_available", lambda: 13 * 1024 ** 3)
    preflight.check_export(spec, (1, 3))
