"""Runs that meet in one model folder: each waits or reads a consistent state, nothing torn. docs/GUARANTEES.md
points here.

Real processes (`python -m vitexport`). Where a writer must be caught in the middle of its work, this test is
the writer: it holds the folder's lock as a vitexport writer does and leaves the folder torn (a new file without
its record) while the other run waits, then finishes the write and lets go; the other run must see only the
finished state.
"""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, copy_export
from filelock import FileLock

from vitexport.artifacts.folder import LOCK_NAME, ModelFolder
from vitexport.artifacts.verify import check_onnx, check_plan
from vitexport.artifacts.workspace import reading
from vitexport.deploy.predict import predict
from vitexport.ensure import ensure_artifact
from vitexport.exporter.run import run_export
from vitexport.model.spec import ModelSpec
from vitexport.model.variants import DIGITS_VARIANT
from vitexport.paths import sha256_file
from vitexport.precision import CalibOptions

FAST_BENCH = ["--batch", "1", "--iterations", "1", "--min-time", "0", "--warmup", "0"]
TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def made(tmp_path_factory, digits_export):
    root = tmp_path_factory.mktemp("concurrency")
    folder = ModelFolder(copy_export(digits_export, root / "model"))
    ensure_artifact(folder, "int8", calib=CalibOptions(samples=24, check=False))
    other = root / "other"  # the same export with an INT8 graph of other ranges: what a concurrent quantize writes
    shutil.copytree(root / "model", other)
    ensure_artifact(ModelFolder(other), "int8", calib=CalibOptions(samples=8, check=False), fresh=True)
    resized = run_export(ModelSpec(variant=DIGITS_VARIANT, img_size=(48, 48)), output=root / "resized").folder
    data = root / "data"
    data.mkdir()
    for cls in sorted((ROOT / "calibration" / "digits" / "heldout").iterdir()):
        shutil.copy(sorted(cls.iterdir())[0], data / f"{cls.name}.png")
    return {"root": root, "other": other, "resized": resized.path, "data": data}


@pytest.fixture
def folder(made, tmp_path):
    shutil.copytree(made["root"] / "model", tmp_path / "m", ignore=shutil.ignore_patterns(LOCK_NAME))
    return tmp_path / "m"


class Proc:
    """A vitexport process whose stderr is read as it comes, so a test can wait for a line."""

    def __init__(self, *args, launcher: Path | None = None, env: dict | None = None):
        cmd = [sys.executable, str(launcher)] if launcher else [sys.executable, "-m", "vitexport"]
        self.p = subprocess.Popen([*cmd, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, **(env or {})})
        self.err: list[str] = []
        self.out = ""
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self):
        for line in self.p.stderr:
            self.err.append(line)

    def wait_for(self, text: str, timeout: float = 120) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in self.err):
                return True
            if self.p.poll() is not None:
                time.sleep(0.2)
                return any(text in line for line in self.err)
            time.sleep(0.02)
        return False

    def finish(self, timeout: float = 300) -> int:
        self.out = self.p.stdout.read()
        self.p.wait(timeout)
        self._t.join()
        return self.p.returncode

    @property
    def stderr(self) -> str:
        return "".join(self.err)


class Writer:
    """This test as a vitexport writer of `folder`: the lock and the owner file, as a quantize holds them."""

    def __init__(self, folder: Path, command: str = "vitexport quantize --int8"):
        self.folder, self.lock = folder, FileLock(str(folder / LOCK_NAME))
        self.lock.acquire()
        (folder / ".vitexport.owner").write_text(json.dumps({"pid": os.getpid(), "command": command,
                                                             "since": "12:00:00"}))

    def release(self):
        (self.folder / ".vitexport.owner").unlink()
        self.lock.release()


def _replace(src: Path, dst: Path):
    """As a writer puts a finished file into place: a temporary beside it, renamed."""
    tmp = dst.with_name(f".{dst.name}.vx{os.getpid()}-copy")
    shutil.copy(src, tmp)
    os.replace(tmp, dst)


def test_bench_waits_for_a_quantize_and_measures_what_it_wrote(made, folder, tmp_path):
    new_int8 = made["other"] / "model.int8.onnx"
    assert sha256_file(new_int8) != sha256_file(folder / "model.int8.onnx")
    w = Writer(folder)
    try:
        bench = Proc("bench", folder, "--data", made["data"], "--no-prepare", "--strict", "--backend", "int8",
                     *FAST_BENCH, "--json", tmp_path / "b.json")
        assert bench.wait_for(f"is being written by pid {os.getpid()} (vitexport quantize --int8"), bench.stderr
        _replace(new_int8, folder / "model.int8.onnx")  # the new graph is in place, its record not yet: torn
        time.sleep(1.0)
        assert bench.p.poll() is None  # still waiting: it has read nothing of the torn folder
        _replace(made["other"] / "manifest.json", folder / "manifest.json")
    finally:
        w.release()
    assert bench.finish() == 0, bench.stderr + bench.out
    report = json.loads((tmp_path / "b.json").read_text())
    int8 = next(a for a in report["artifacts"] if a["kind"] == "int8")
    assert int8["status"] == "ok" and int8["sha256"] == sha256_file(new_int8)
    assert any(r["available"] and "int8" in r["name"] for r in report["results"])


def test_a_writer_waits_for_a_reader_and_readers_do_not_wait_for_each_other(folder):
    before = sha256_file(folder / "model.int8.onnx")
    with reading(ModelFolder(folder)):  # this test as a bench in the middle of its run
        quantize = Proc("quantize", "--int8", folder, "--calib-samples", "8", "--no-check")
        assert quantize.wait_for("in use by another vitexport run that reads it"), quantize.stderr
        info = Proc("info", folder)  # another reader: not kept waiting
        assert info.finish(120) == 0, info.stderr
        assert "waiting" not in info.stderr
        time.sleep(0.5)
        assert quantize.p.poll() is None and sha256_file(folder / "model.int8.onnx") == before
    assert quantize.finish() == 0, quantize.stderr
    assert check_onnx(ModelFolder(folder), "int8").ok and sha256_file(folder / "model.int8.onnx") != before


def test_predict_during_an_export_gives_the_new_models_answer(made, folder):
    image = made["data"] / "3.png"
    expected = predict(ModelFolder(made["resized"]), [image], top_k=3)[0]  # the oracle: the new export's own answer
    assert expected.top != predict(ModelFolder(folder), [image], top_k=3)[0].top  # the old one answers otherwise
    w = Writer(folder, "vitexport onnx")
    try:
        p = Proc("predict", folder, image, "--json", "--top-k", "3")
        assert p.wait_for(f"is being written by pid {os.getpid()} (vitexport onnx"), p.stderr
        _replace(made["resized"] / "model.onnx", folder / "model.onnx")  # the new graph, the old manifest: torn
        time.sleep(1.0)
        assert p.p.poll() is None
        _replace(made["resized"] / "manifest.json", folder / "manifest.json")
    finally:
        w.release()
    assert p.finish() == 0, p.stderr
    got = json.loads(p.out)[0]["top"]
    assert [c["index"] for c in got] == [c.index for c in expected.top]
    assert [c["prob"] for c in got] == pytest.approx([c.prob for c in expected.top], abs=1e-5)


LAUNCHER = """
import os, sys, time
sys.path[:0] = [{tests!r}, {root!r}]  # the stand-in, and this checkout
from _pytest.monkeypatch import MonkeyPatch
import fake_tensorrt
mp = MonkeyPatch()
fake_tensorrt.install(mp)
fake_tensorrt.PLAN = b"plan of pid %d" % os.getpid()  # each build's own bytes: a torn pair would show
GATE = os.environ["VX_TEST_GATE"]  # the build goes on once the test removes this file: the other run meets it


def hold(step):
    while os.path.exists(GATE):
        time.sleep(0.02)


fake_tensorrt.on_step = hold
from vitexport.tensorrt_engine import compiler
mp.setattr(compiler, "require_trt_and_gpu", lambda: ("10.13.0.35", {{"name": "NVIDIA H200",
           "compute_capability": "9.0", "driver": "13.0", "cuda_runtime": "13.0"}}))
from vitexport.cli import main
sys.argv[0] = "vitexport"
main()
"""


def test_two_trt_builds_of_one_folder_take_turns(folder, tmp_path):
    launcher = tmp_path / "trt_with_stand_in.py"
    launcher.write_text(LAUNCHER.format(tests=str(TESTS), root=str(ROOT)))
    gate = tmp_path / "gate"
    gate.touch()
    env = {"VX_TEST_GATE": str(gate)}
    first = Proc("trt", "--fp16", folder, launcher=launcher, env=env)
    try:
        assert first.wait_for("Building engine"), first.stderr  # the first is in TensorRT's build, held there
        second = Proc("trt", "--fp16", folder, launcher=launcher, env=env)
        assert second.wait_for("is being written by pid"), second.stderr
    finally:
        gate.unlink()
    assert first.finish() == 0, first.stderr
    assert second.finish() == 0, second.stderr
    assert f"pid {first.p.pid}" in second.stderr
    check = check_plan(ModelFolder(folder), "fp16")
    assert check.ok, check.reason  # the plan is the one its sidecar describes
    assert (folder / "model.fp16.plan").read_bytes() in {b"plan of pid %d" % p.p.pid for p in (first, second)}
