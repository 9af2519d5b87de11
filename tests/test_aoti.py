"""`vitexport aoti`: PyTorch's compiled CPU path as a package of the folder. The digits model's PT2E INT8 package is
built, checked against the FP32 ONNX on the held-out digits and recorded; it loads in a fresh process and answers as
the bench's row does; one compiled without Inductor's freezing (its linears dequantized to FP32 matmuls) is caught
by the check and kept aside; without torchao the command and the row say why."""

import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import ROOT, copy_export, fails_cleanly

from vitexport.cli import cli

pytest.importorskip("torchao")
HELDOUT = ROOT / "calibration" / "digits" / "heldout"


@pytest.fixture(scope="module")
def packaged(digits_export, tmp_path_factory):
    folder = copy_export(digits_export, tmp_path_factory.mktemp("aoti") / "digits")
    r = CliRunner().invoke(cli, ["aoti", str(folder), "--precision", "int8", "-q"])
    assert r.exit_code == 0, r.output
    return folder


def test_the_int8_package_is_fused_checked_and_recorded(packaged):
    import torch

    from vitexport.aoti.package import package_facts
    from vitexport.artifacts.folder import ModelFolder
    from vitexport.exporter.torch_model import model_from_manifest

    record = json.loads((packaged / "manifest.json").read_text())["precisions"]["aoti-int8"]
    manifest = ModelFolder(packaged).read_manifest()
    # every nn.Linear of the digits model runs in its forward: each a fused INT8 kernel
    linears = sum(isinstance(m, torch.nn.Linear) for m in model_from_manifest(manifest).modules())
    facts = package_facts(packaged / "model.aoti.int8.pt2")
    assert facts.qlinear >= linears == record["aoti"]["linears"] > 0
    assert record["aoti"]["facts"]["qlinear"] == facts.qlinear
    assert record["check"]["passed"] and record["check"]["n"] == 360
    assert record["source_sha256"] == manifest.onnx_sha256
    # the package is INT8: its answers differ from FP32's by more than float rounding, within INT8's bounds
    assert 1e-4 < record["check"]["max_abs"] and record["check"]["cos_min"] > 0.99
    assert record["aoti"]["float_parts"] in ("bf16", "fp32")


def test_the_package_loads_in_a_fresh_process_and_answers_as_the_bench_row(packaged, tmp_path):
    from vitexport.backends.aoti_backend import AotiRunner
    from vitexport.data.images import load_folder
    from vitexport.artifacts.folder import ModelFolder

    pp = ModelFolder(packaged).read_manifest().preprocess
    x = load_folder(HELDOUT, pp, limit=16).x[:16]
    np.save(tmp_path / "x.npy", x)
    code = ("import sys, numpy as np, torch; f = torch._inductor.aoti_load_package(sys.argv[1]); "
            "np.save(sys.argv[3], f(torch.from_numpy(np.load(sys.argv[2]))).numpy())")
    p = subprocess.run([sys.executable, "-c", code, str(packaged / "model.aoti.int8.pt2"), str(tmp_path / "x.npy"),
                        str(tmp_path / "y.npy")], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    with AotiRunner(packaged / "model.aoti.int8.pt2", "int8") as runner:
        here = runner.infer_all(x, chunk=16)
    assert np.allclose(np.load(tmp_path / "y.npy"), here, atol=1e-5)
    r = CliRunner().invoke(cli, ["bench", str(packaged), "--no-prepare", "--backend", "pt2e", "--data", str(HELDOUT),
                                 "--batch", "1", "--iterations", "2", "--json", str(tmp_path / "b.json")])
    assert r.exit_code == 0, r.output
    row = next(x for x in json.loads((tmp_path / "b.json").read_text())["results"]
               if x["name"] == "pytorch cpu int8 (pt2e)")
    assert row["available"] and row["parity"]["n"] == 360 and row["parity"]["top1_agree"] > 0.97


def test_a_package_compiled_without_freezing_is_caught(packaged, tmp_path):
    from vitexport.aoti.make import make_package
    from vitexport.artifacts.folder import ModelFolder
    from vitexport.errors import ParityError

    folder = ModelFolder(copy_export(packaged, tmp_path / "digits"))
    before = (folder.path / "model.aoti.int8.pt2").read_bytes()
    with pytest.raises(ParityError, match="none of the model.s [0-9]+ linear layers runs as a fused INT8 kernel"):
        make_package(folder, "aoti-int8", freezing=False)
    assert (folder.path / "model.aoti.int8.rejected.pt2").is_file()
    assert (folder.path / "model.aoti.int8.pt2").read_bytes() == before  # the previous package stays


def test_without_torchao_the_command_and_the_row_say_why(digits_export, tmp_path, monkeypatch):
    folder = copy_export(digits_export, tmp_path / "digits")
    monkeypatch.setitem(sys.modules, "torchao", None)  # import torchao raises ImportError
    fails_cleanly(CliRunner().invoke(cli, ["aoti", str(folder), "--precision", "int8"]), "needs torchao")
    assert not list(folder.glob("*.pt2"))
    from vitexport.backends.aoti_backend import AotiRunner
    from vitexport.errors import BackendUnavailable

    with pytest.raises(BackendUnavailable, match="torchao"):
        AotiRunner(folder / "model.aoti.int8.pt2", "int8").load()


def test_a_bf16_package_counts_the_linears_autocast_wraps(packaged, tmp_path):
    folder = copy_export(packaged, tmp_path / "digits")
    r = CliRunner().invoke(cli, ["aoti", str(folder), "--precision", "bf16", "-q"])
    assert r.exit_code == 0, r.output
    int8, bf16 = (json.loads((folder / "manifest.json").read_text())["precisions"][f"aoti-{p}"]["aoti"]
                  for p in ("int8", "bf16"))
    assert bf16["linears"] == int8["linears"] > 0 and bf16["facts"]["linear"] >= bf16["linears"]


def test_predict_runs_the_package(packaged):
    r = CliRunner().invoke(cli, ["predict", str(packaged), str(HELDOUT / "3"), "--backend", "aoti", "--precision",
                                 "int8", "--top-k", "1", "--json", "-q"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    top = [row["top"][0]["label"] for row in rows]
    assert len(top) == len(list((HELDOUT / "3").iterdir())) and top.count("3") >= 0.9 * len(top)
    fails_cleanly(CliRunner().invoke(cli, ["predict", str(packaged), str(HELDOUT / "3"), "--precision", "bf16"]),
                  "bf16 runs on --backend pytorch (autocast) or --backend aoti")


@pytest.mark.e2e
def test_bench_aoti_makes_both_packages_and_shows_their_rows(digits_export, tmp_path):
    folder = copy_export(digits_export, tmp_path / "digits")
    r = CliRunner().invoke(cli, ["bench", str(folder), "--aoti", "--backend", "pytorch", "--data", str(HELDOUT),
                                 "--batch", "1", "--iterations", "2", "--json", str(tmp_path / "b.json")])
    assert r.exit_code == 0, r.output
    rows = {x["name"]: x for x in json.loads((tmp_path / "b.json").read_text())["results"]}
    from vitexport.environment import cpu_has_bf16

    if cpu_has_bf16() is False:  # a bf16 package is not timed where bf16 would be emulated: the row says so
        bf16 = rows.pop("pytorch cpu bf16 (compiled)")
        assert not bf16["available"] and "no BF16 arithmetic" in bf16["reason"]
    for name in [n for n in ("pytorch cpu bf16 (compiled)", "pytorch cpu int8 (pt2e)") if n in rows]:
        assert rows[name]["available"] and rows[name]["parity"]["n"] == 360, name
        assert rows[name]["parity"]["top1_agree"] > 0.97 and rows[name]["latency"], name
    assert not rows["pytorch cpu fp32 (aoti)"]["available"]  # not made by --aoti: one flag per use
