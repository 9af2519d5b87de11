"""FP16 that cannot overflow: the digits model given "massive activations" (three residual channels pushed to
1.2e5 by blocks 0 and 1, then brought back by blocks 2 and 3, so FP32 is fine and the output still depends on the
image), once through fc2's bias and once through fc2's GEMM itself. Every FP16-bearing graph `quantize` writes for
it must give finite outputs close to FP32's with few FP32 nodes; a model without such activations keeps its
all-FP16 graph; and a graph forced to overflow names the node where Inf first appears.

The oracle is ONNX Runtime on the written files against the FP32 export, on the held-out digits.
"""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from conftest import ROOT, copy_export, lint, load_script

from vitexport.cli import cli
from vitexport.data.images import load_image
from vitexport.data.preprocess import Preprocess
from vitexport.precision.ranges import first_non_finite

HELDOUT = ROOT / "calibration" / "digits" / "heldout"
compare = load_script("autocast_compare")  # the test model (massive) and the FP32 node count, as the comparison has them


@pytest.fixture(scope="module", params=["bias", "gemm"])
def outliers(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"massive-{request.param}")
    ckpt = compare.massive(request.param, tmp / "w.safetensors")
    r = CliRunner().invoke(cli, ["onnx", "-m", "vit_digits_patch4_32", "-c", str(ckpt), "-o", str(tmp / "m"), "-q"])
    assert r.exit_code == 0, r.output
    return tmp / "m"


def heldout_inputs(folder, n=96):
    pp = Preprocess.from_dict(json.loads((folder / "manifest.json").read_text())["preprocess"])
    files = sorted(p for p in HELDOUT.rglob("*.png"))[:: max(1, len(list(HELDOUT.rglob("*.png"))) // n)][:n]
    return np.stack([load_image(f, pp) for f in files])


def run(path, x):
    so = ort.SessionOptions()
    if "fp8" in str(path):  # ONNX Runtime's extended optimizations fuse FP8 Q/DQ into an integer-only kernel
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


@pytest.mark.parametrize("args,kind", [(["--fp16", "--target", "tensorrt"], "fp16-trt"),
                                       (["--int8", "--target", "tensorrt"], "int8-trt"), (["--fp8"], "fp8")])
def test_massive_activations_stay_finite(outliers, args, kind):
    graph = f"model.{kind.replace('-', '.')}.onnx"
    r = CliRunner().invoke(cli, ["quantize", str(outliers), *args])
    assert r.exit_code == 0, r.output
    assert "nodes kept in FP32" in r.output and "1.2e+05" in r.output
    onnx.checker.check_model(str(outliers / graph), full_check=True)
    x = heldout_inputs(outliers)
    want, got = run(outliers / "model.onnx", x), run(outliers / graph, x)
    assert np.isfinite(got).all() and first_non_finite(outliers / graph, [x[:16]], "pixel_values") is None
    cos = (want * got).sum(1) / (np.linalg.norm(want, axis=1) * np.linalg.norm(got, axis=1))
    assert cos.min() >= (0.999 if "fp16" in graph else 0.99), cos.min()
    fp32, compute = compare.fp32_compute_nodes(outliers / graph)
    assert 0 < fp32 <= compute / 4, (fp32, compute)
    kept = json.loads((outliers / "manifest.json").read_text())["precisions"][kind]
    assert kept["fp32_nodes"] and all(k["max"] >= 4094 for k in kept["fp32_nodes"])


def test_the_outliers_are_real(outliers):
    """The test model is what it claims: all-FP16 without the ranges overflows (so the test above can fail) at the
    residual Add after block 1's MLP. Every tensor is stored in its own type there (first_non_finite): ONNX
    Runtime's CPU provider alone computes a chain of FP16 ops in FP32 and would hide it."""
    from vitexport.precision.convert import convert_fp16

    convert_fp16(outliers / "model.onnx", outliers / "plain.onnx", ())
    x = heldout_inputs(outliers, 8)
    assert first_non_finite(outliers / "plain.onnx", [x], "pixel_values")[1] == "blocks.1/Add_1"
    assert first_non_finite(outliers / "model.onnx", [x], "pixel_values") is None


def test_a_model_without_outliers_keeps_its_all_fp16_graph(digits_export, tmp_path):
    folder = copy_export(digits_export, tmp_path / "digits")
    r = CliRunner().invoke(cli, ["quantize", str(folder), "--fp16", "--target", "tensorrt", "-q"])
    assert r.exit_code == 0, r.output
    assert "kept in FP32" not in r.output
    assert compare.fp32_compute_nodes(folder / "model.fp16.trt.onnx")[0] == 0
    assert json.loads((folder / "manifest.json").read_text())["precisions"]["fp16-trt"]["fp32_nodes"] == []


def test_an_overflow_names_the_first_bad_node(outliers, tmp_path, monkeypatch):
    """With the ranges ignored the graph overflows; the error names where Inf first appears: the residual Add after
    block 1's MLP, where the stream reaches 1.2e5."""
    import vitexport.precision.ranges as ranges

    folder = copy_export(outliers, tmp_path / "m")
    monkeypatch.setattr(ranges, "SAFE_MAX", float("inf"))
    r = CliRunner().invoke(cli, ["quantize", str(folder), "--fp16", "--target", "tensorrt", "-q"])
    assert r.exit_code == 1, r.output
    assert "NaN/Inf first appears at" in r.output and "node blocks.1/Add_1" in r.output, r.output
    assert "--exclude-node blocks.1/Add_1" in r.output
    monkeypatch.undo()  # the named node kept in FP32 by hand is not enough alone; the ranges are
    r = CliRunner().invoke(cli, ["quantize", str(folder), "--fp16", "--target", "tensorrt", "-q"])
    assert r.exit_code == 0, r.output


def test_every_graph_quantize_writes_lints_clean_but_fp8(digits_export, tmp_path):
    """NVIDIA Polygraphy's lint loads each graph in ONNX Runtime with every optimization: the FP16 and INT8 graphs
    pass. The FP8 graph cannot: ONNX Runtime's Q/DQ rewrites of the extended level bind an FP8 DequantizeLinear's
    type parameter to uint8 (docs/TENSORRT.md); its only lint errors must be that one."""
    folder = copy_export(digits_export, tmp_path / "digits")
    for args in (["--int8", "--target", "all"], ["--fp16", "--target", "all"], ["--fp8"]):
        r = CliRunner().invoke(cli, ["quantize", str(folder), *args, "--no-check", "-q"])
        assert r.exit_code == 0, r.output
    names = ("model.fp16.onnx", "model.fp16.trt.onnx", "model.int8.onnx", "model.int8.trt.onnx", "model.fp8.onnx")
    errors = lint([folder / n for n in names], tmp_path)
    assert {n: e for n, e in errors.items() if n != "model.fp8.onnx"} == {n: [] for n in names[:4]}
    assert all("float8e4m3fn" in message for _, message in errors["model.fp8.onnx"]), errors


def test_a_cosine_target_returns_the_costliest_regions_to_fp32(digits_export, tmp_path):
    """--fp16 --min-cos: digits in FP16 misses a cosine of 0.9999999 (FP16's rounding alone costs more); regions go
    back to FP32, costliest first, until the written graph meets it, and they are recorded; an impossible target is
    one sentence."""
    folder = copy_export(digits_export, tmp_path / "digits")
    r = CliRunner().invoke(cli, ["quantize", str(folder), "--fp16", "--target", "tensorrt", "-q"])
    assert r.exit_code == 0, r.output
    x = heldout_inputs(folder, 360)
    want = run(folder / "model.onnx", x)

    def cos_min(graph):
        got = run(graph, x)
        return ((want * got).sum(1) / (np.linalg.norm(want, axis=1) * np.linalg.norm(got, axis=1))).min()

    plain = cos_min(folder / "model.fp16.trt.onnx")
    target = 1 - (1 - plain) / 4  # a quarter of all-FP16's worst error
    r = CliRunner().invoke(cli, ["quantize", str(folder), "--fp16", "--target", "tensorrt", "--min-cos",
                                 f"{target:.9f}"])
    assert r.exit_code == 0, r.output
    assert "regions" in r.output
    assert cos_min(folder / "model.fp16.trt.onnx") >= target
    kept = json.loads((folder / "manifest.json").read_text())["precisions"]["fp16-trt"]["fp32_nodes"]
    fp32, compute = compare.fp32_compute_nodes(folder / "model.fp16.trt.onnx")
    assert kept and 0 < fp32 < compute
    r = CliRunner().invoke(cli, ["quantize", str(folder), "--fp16", "--target", "tensorrt", "--min-cos", "1.0",
                                 "--no-check"])
    assert r.exit_code == 2 and "drop --no-check" in r.output


def _unreduced_at_most(folder, monkeypatch, graph_order: bool) -> tuple[int, int]:
    """(the most tensors made but not yet reduced at any point of one run of the range pass's graph, the tensors
    reduced), from ONNX Runtime's own profile of the order it ran the nodes in."""
    from vitexport.backends.ort_session import create_session
    from vitexport.precision.graphs import read_graph
    from vitexport.precision.ranges import reduced_model

    model = read_graph(folder / "model.onnx")
    data, weights, names = reduced_model(model)
    profiled = ort.SessionOptions

    class Profiled(profiled):
        def __init__(self):
            super().__init__()
            self.enable_profiling = True
            self.profile_file_prefix = str(folder / "profile")

    monkeypatch.setattr(ort, "SessionOptions", Profiled)
    sess = create_session(data, weights=weights, graph_order=graph_order)
    sess.run(None, {"pixel_values": np.zeros((1, 3, 32, 32), np.float32)})
    ran = [e["name"][:-len("_kernel_time")] for e in json.loads(open(sess.end_profiling()).read())
           if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    reduced = set(names)
    makes = {n.name: [o for o in n.output if o in reduced] for n in model.graph.node}
    reducer = {f"vx_ReduceMax_{k}": t for k, t in enumerate(names)}
    pending, worst = set(), 0
    for node in ran:
        pending.update(makes.get(node, ()))
        pending.discard(reducer.get(node))
        worst = max(worst, len(pending))
    return worst, len(names)


def test_the_range_pass_reduces_each_tensor_as_soon_as_it_is_made(digits_export, tmp_path, monkeypatch):
    """Its memory is one image's activations only if each tensor is freed once read: in ONNX Runtime's default order
    the reductions ran after the whole forward pass (Sapiens2-B at 3,072 tokens went past 20 GB for 4 images)."""
    folder = copy_export(digits_export, tmp_path / "m")
    worst, count = _unreduced_at_most(folder, monkeypatch, graph_order=True)
    assert count > 100 and worst <= 2, (worst, count)  # measured: 1 of 138
    default_worst, _ = _unreduced_at_most(folder, monkeypatch, graph_order=False)
    assert default_worst > count // 2, (default_worst, count)  # what the order is for: the default held 108 of 138
