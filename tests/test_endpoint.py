"""`bench --endpoint`: a real Triton server (the tritonserver binary of nvidia-pytriton, its python backend running
ONNX Runtime on the model.onnx `vitexport triton` wrote) benched like any backend: the same answers as the
reference on the held-out digits over HTTP and gRPC, another model under the name caught, faults one sentence
within --timeout, and the load figures checked against the server's own statistics."""

import json
import os
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from conftest import ROOT, copy_export, fails_cleanly, load_script
from onnx import numpy_helper

from vitexport.cli import cli
from vitexport.deploy.triton import TritonOptions, write_triton
from vitexport.model.variants import DIGITS_VARIANT

NAME = f"{DIGITS_VARIANT}-fp32"  # the name `vitexport triton` gives, which --endpoint-model defaults to
HELDOUT = ROOT / "calibration" / "digits" / "heldout"
QUICK = ["--no-prepare", "--iterations", "1", "--min-time", "0.05", "--warmup", "0", "--concurrency", "1", "-q"]


def _server_script():
    ts = load_script("triton_server")
    if why := ts.runnable_here():
        pytest.skip(why)
    try:
        venv = ts.prepare(quiet=True)  # .ci/run makes it first; made here once otherwise
    except Exception as e:  # noqa: BLE001 - no registry, no disk: said, not hidden
        pytest.skip(f"Triton's venv could not be made ({e}); run `python scripts/triton_server.py prepare`")
    return ts, venv


def _impostor(src, dst):
    """The digits model with its head's rows rolled by one: the same interface, another model's answers."""
    model = onnx.load(str(src))
    head = next(t for t in model.graph.initializer if list(t.dims)[:1] == [10] and len(t.dims) == 2)
    head.CopyFrom(numpy_helper.from_array(np.roll(numpy_helper.to_array(head), 1, axis=0), head.name))
    onnx.save(model, str(dst))


@pytest.fixture(scope="module")
def served(digits_export, tmp_path_factory):
    """One server on free ports of 127.0.0.1, for the module: the digits model under its default name, as uint8
    pixels, an impostor, a model of another input shape, and one that answers after 3 s."""
    from vitexport.artifacts.folder import ModelFolder

    ts, venv = _server_script()
    root = tmp_path_factory.mktemp("served")
    repo = root / "repo"
    folder = ModelFolder(copy_export(digits_export, root / "digits"))  # the bench makes files in it
    write_triton(folder, repo, TritonOptions())
    write_triton(folder, repo, TritonOptions(name="digits-uint8", uint8_input=True))
    write_triton(folder, repo, TritonOptions(name="impostor"))
    _impostor(folder.onnx("fp32"), repo / "impostor" / "1" / "model.onnx")
    write_triton(folder, repo, TritonOptions(name="digits-48"))  # says it takes 48x48 images: another model
    config = repo / "digits-48" / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [ 3, 32, 32 ]", "dims: [ 3, 48, 48 ]"))
    write_triton(folder, repo, TritonOptions(name="slow"))
    for entry in repo.iterdir():
        ts.python_backend(entry)
    model_py = repo / "slow" / "1" / "model.py"
    model_py.write_text(model_py.read_text().replace("    def execute(self, requests):\n",
                                                     "    def execute(self, requests):\n        import time\n"
                                                     "        time.sleep(3)\n"))
    server = ts.start(repo, venv)
    yield server, folder
    server.stop()
    assert server.process.poll() is not None and not ts._group_alive(server.process.pid)  # stubs and all


def bench(folder, tmp_path, *args):
    """The bench on the 360 held-out digits (not the digits' larger default set: these tests are about serving)."""
    report = tmp_path / "bench.json"
    data = () if "--data" in args else ("--data", str(HELDOUT))
    r = CliRunner().invoke(cli, ["bench", str(folder.path), "--backend", "endpoint", "--json", str(report),
                                 *QUICK, *data, *args])
    return r, (json.loads(report.read_text()) if report.is_file() else None)


def _served_rows(report):
    return [row for row in report["results"] if row["backend"] == "endpoint"]


def test_a_uint8_input_model_is_sent_the_pixels(served, tmp_path):
    server, folder = served
    r, report = bench(folder, tmp_path, "--endpoint", server.http, "--endpoint-model", "digits-uint8",
                      "--endpoint", server.http, "--strict", "--max-images", "120", "--shared-memory", "system")
    assert r.exit_code == 0, r.output
    assert not list(Path("/dev/shm").glob(f"vitexport_{os.getpid()}_*"))  # every region this run made, unlinked
    ref = next(row for row in report["results"] if row["name"] == report["reference"])
    (row,) = _served_rows(report)  # the same URL once
    assert row["info"]["input_dtype"] == "UINT8"  # pixels, normalised by the server
    st = row["parity"]
    assert st["n"] == 120 and st["top1_agree"] == 1.0 and st["acc"] == ref["parity"]["acc_ref"]
    assert st["max_abs"] < 1e-4 and row["parity"]["status"] == "pass"


def test_the_served_model_gives_the_references_answers_over_http_and_grpc(served, tmp_path):
    """The default name, float inputs, the 360 held-out digits: the reference's top-1 accuracy (checked here against
    the labels), the same as ONNX Runtime on the same file, and --strict passes."""
    server, folder = served
    r, report = bench(folder, tmp_path, "--endpoint", server.http, "--endpoint", server.grpc, "--strict",
                      "--backend", "onnxruntime cpu fp32")
    assert r.exit_code == 0, r.output
    by_name = {row["name"]: row for row in report["results"] if row["available"]}
    local = by_name["onnxruntime cpu fp32"]["parity"]
    labels = np.array([int(p.parent.name) for p in sorted(HELDOUT.rglob("*.png"))])
    assert report["data"]["n_parity"] == len(labels) == 360
    rows = _served_rows(report)
    assert [row["info"]["protocol"] for row in rows] == ["http", "grpc"]
    for row in rows:
        assert row["info"]["model"] == NAME and row["info"]["input_dtype"] == "FP32"
        assert row["parity"]["n"] == 360 and row["parity"]["top1_agree"] == 1.0
        assert row["parity"]["acc"] == local["acc"] == row["parity"]["acc_ref"]
        assert row["parity"]["max_abs"] <= local["max_abs"] + 1e-5 and row["parity"]["status"] == "pass"


def test_another_model_under_the_name_fails_strict(served, tmp_path):
    server, folder = served
    r, report = bench(folder, tmp_path, "--endpoint", server.http, "--endpoint-model", "impostor", "--strict",
                      "--max-images", "60")
    assert r.exit_code == 1, r.output
    row = _served_rows(report)[0]
    assert row["parity"]["status"] == "fail" and row["parity"]["top1_agree"] < 0.2
    assert "parity missed by endpoint" in r.output


@pytest.mark.parametrize("args, needle", [
    (["--endpoint-model", "digits-48"], "of shape [-1, 3, 48, 48]"),
    (["--endpoint-model", "nobody"], "has no model 'nobody' ready"),
])
def test_a_server_serving_something_else_is_one_sentence_before_any_work(served, tmp_path, args, needle):
    server, folder = served
    t0 = time.monotonic()
    r, report = bench(folder, tmp_path, "--endpoint", server.grpc, "--timeout", "5", *args)
    fails_cleanly(r, needle)
    assert r.exit_code == 2 and report is None and time.monotonic() - t0 < 5 + 3


def test_an_unreachable_port_is_one_sentence_within_the_timeout(served, tmp_path):
    ts = load_script("triton_server")
    _, folder = served
    for url in (f"http://127.0.0.1:{ts.free_port()}", f"grpc://127.0.0.1:{ts.free_port()}"):
        t0 = time.monotonic()
        r, _ = bench(folder, tmp_path, "--endpoint", url, "--timeout", "2")
        fails_cleanly(r, url)
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
        assert time.monotonic() - t0 < 2 + 3


def test_a_server_that_does_not_answer_in_time_fails_the_row(served, tmp_path):
    server, folder = served
    t0 = time.monotonic()
    r, report = bench(folder, tmp_path, "--endpoint", server.http, "--endpoint-model", "slow", "--timeout", "1")
    assert r.exit_code == 2, r.output  # without --strict too: the user asked for that server
    assert time.monotonic() - t0 < 30
    row = _served_rows(report)[0]
    assert not row["available"] and "did not answer a request within 1 s" in row["error"]
    assert "after 0 of 360 images answered" in row["error"] and "Traceback" not in r.output


def test_a_concurrency_sweep_is_counted_by_the_server_too(served, tmp_path):
    server, folder = served
    r, report = bench(folder, tmp_path, "--endpoint", server.grpc, "--batch", "2", "--concurrency", "1",
                      "--concurrency", "4", "--concurrency", "8", "--min-time", "0.2", "--max-images", "16",
                      "--shared-memory", "system", "--html", str(tmp_path / "page.html"))
    assert r.exit_code == 0, r.output
    assert _served_rows(report)[0]["info"]["shared_memory"] == "system"
    assert _served_rows(report)[0]["parity"]["top1_agree"] == 1.0  # each request in flight read its own answer
    lats = _served_rows(report)[0]["latency"]
    assert [(lat["batch"], lat["concurrency"]) for lat in lats] == [(2, 1), (2, 4), (2, 8)]
    for lat in lats:
        assert lat["server_requests"] == lat["requests"] and lat["server_inferences"] == 2 * lat["requests"]
        assert lat["p50_ms"] <= lat["p90_ms"] <= lat["p99_ms"] and lat["throughput"] > 0
        assert lat["windows"] >= 3 and lat["server_compute_ms"] > 0 and lat["server_queue_ms"] >= 0
    # with 8 in flight and one model instance, requests wait in the server's queue for the ones ahead of them
    assert lats[2]["server_queue_ms"] > lats[0]["server_queue_ms"]
    # the page draws it: client p50 and p95, server queue and compute, a point per concurrency each
    from browser import open_page

    with open_page(tmp_path / "page.html", tmp_path / "page.png") as page:
        assert page.messages == [] and page.requests == []
        assert page.count("svg.served") == 1 and page.count("svg.served polyline") == 4
        assert page.count("svg.served circle") == 4 * len(lats)
        assert page.texts("#rows tbody tr td:nth-child(4)")[-3:] == ["1", "4", "8"]  # the in-flight column


def test_a_server_that_dies_mid_run_ends_the_row_with_what_it_measured(digits_export, tmp_path):
    """A model that kills its server on its fourth batch: the row says how far it got, the bench exits non-zero."""
    from vitexport.artifacts.folder import ModelFolder

    ts, venv = _server_script()
    folder = ModelFolder(copy_export(digits_export, tmp_path / "digits"))
    repo = tmp_path / "repo"
    write_triton(folder, repo, TritonOptions())
    ts.python_backend(repo / NAME)
    model_py = repo / NAME / "1" / "model.py"
    model_py.write_text(model_py.read_text().replace(
        "    def execute(self, requests):\n",
        "    def execute(self, requests):\n        self.calls = getattr(self, 'calls', 0) + 1\n"
        "        if self.calls == 4:\n            import os, signal\n"
        "            os.kill(os.getppid(), signal.SIGKILL)\n"))
    server = ts.start(repo, venv)
    try:
        t0 = time.monotonic()
        r, report = bench(folder, tmp_path, "--endpoint", server.http, "--timeout", "5", "--max-images", "64")
    finally:
        server.stop()
    assert not ts._group_alive(server.process.pid)  # the stub the dead server left is stopped too
    assert r.exit_code == 2 and time.monotonic() - t0 < 60, r.output
    row = _served_rows(report)[0]
    assert "failed" in row["error"] and "after 24 of 64 images answered" in row["error"]
    assert f"FAIL endpoint {server.http}" in r.output


def test_the_server_is_stopped_by_its_process_id(served):
    server, _ = served
    assert server.ready() and os.path.exists(f"/proc/{server.process.pid}")


def test_the_python_backend_entries_are_valid_triton_configs(served):
    """What the server loaded parses against Triton's own ModelConfig schema, as `vitexport triton` writes it."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    server, _ = served
    repo = Path(server.log).parent / "repo"
    for config in sorted(repo.glob("*/config.pbtxt")):
        cfg = text_format.Parse(config.read_text(), model_config_pb2.ModelConfig())
        assert cfg.backend == "python" and not cfg.platform and cfg.name == config.parent.name
