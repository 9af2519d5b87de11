"""A full disk while vitexport writes an artifact: an export (with and without external data), the INT8 graph, its
calibration cache, an OpenVINO IR, a Triton repository entry. Each case runs the command through the command line
on a real small file system (a tmpfs mounted for the test, filled with a filler file until less room is left than
the artifact needs) and asserts: exit 2, one sentence naming the file and the file system with what it has left,
no traceback, every file on that file system as it was (the previous good artifact byte for byte, nothing partial,
nothing left beside or outside the folder), and that the same command succeeds once the filler is gone.

Mounting needs root. Where the mount cannot be made the cases are skipped, saying so; the write layer's other
limit (ulimit -f, EFBIG through the same code) is tested without privileges in
test_faults.py::test_a_file_size_limit_names_the_real_file_and_keeps_the_previous_one.
docs/GUARANTEES.md points here.
"""

import errno
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import copy_export
from test_faults import _clean, _one_sentence, _run, _state

from vitexport.artifacts.folder import LOCK_NAME, ModelFolder
from vitexport.artifacts.verify import check_onnx
from vitexport.ensure import ensure_artifact
from vitexport.model.variants import DIGITS_VARIANT
from vitexport.paths import mount_point, write_reason
from vitexport.precision import CalibOptions

DIGITS = ["-m", DIGITS_VARIANT]
INT8 = ["quantize", "--int8", "--calib-samples", "16", "--no-check"]  # the prepared folder's calibration
FULL = "no space is left on the device"


class Disk:
    """A mounted tmpfs: the folders a test writes in, and a filler file that takes all but `leave` bytes."""

    def __init__(self, root: Path):
        self.root = root
        self.filler = root / "filler"

    def put(self, folder: Path, name: str = "m") -> Path:
        shutil.copytree(folder, self.root / name, ignore=shutil.ignore_patterns(LOCK_NAME))
        return self.root / name

    def fill(self, leave: int) -> int:
        """Leave `leave` bytes free (tmpfs counts whole pages: at most that); returns what is free."""
        free = shutil.disk_usage(self.root).free
        with open(self.filler, "wb") as f:
            if free > leave:
                os.posix_fallocate(f.fileno(), 0, free - leave)
        free = shutil.disk_usage(self.root).free
        assert free <= leave, free
        return free

    def empty(self) -> None:
        self.filler.unlink()

    def tree(self) -> dict[str, str]:
        """Every entry on the file system, files with their digests (the folders' locks aside)."""
        folders = {p.relative_to(self.root).as_posix(): "folder" for p in self.root.rglob("*") if p.is_dir()}
        return {**folders, **_state(self.root)}

    def says_full(self, r, final: Path) -> str:
        """Exit 2 and one sentence: the file, the reason, the file system's mount point and what it has left."""
        last = _one_sentence(r, 2, f"Could not write {final}", f": {FULL} (the file system mounted at "
                                                              f"{self.root.resolve()} holds ")
        assert last.endswith(" free)."), last
        assert ".vx" not in last and "staging" not in last, last  # never a hidden temporary's name
        return last


@pytest.fixture
def disk(tmp_path):
    """A 4 MB tmpfs, unmounted after the test (lazily if a library still holds a file open on it)."""
    root = tmp_path / "fs"
    root.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root; a full disk is not tested here (ulimit -f is, in "
                    "test_faults.py)")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(root)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}); a full disk is not tested here "
                    f"(ulimit -f is, in test_faults.py)")
    try:
        yield Disk(root)
    finally:
        if subprocess.run(["umount", str(root)]).returncode != 0:
            subprocess.run(["umount", "-l", str(root)], check=True)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, digits_export):
    """The digits model exported, with its INT8 graph (and calibration cache) and its FP32 OpenVINO IR."""
    root = tmp_path_factory.mktemp("full-disk")
    folder = copy_export(digits_export, root / "model")
    calib = CalibOptions(samples=16, check=False)
    for kind in ("int8", "openvino-fp32"):
        ensure_artifact(folder, kind, calib=calib)
    return root / "model"


def _fails_then_works(disk, args, leave, final):
    """Fill the disk, run `args` (fails naming `final`, every file as it was), empty it, run again (works)."""
    disk.fill(leave)
    before = disk.tree()
    disk.says_full(_run(*args), final)
    assert disk.tree() == before
    disk.empty()
    again = _run(*args)
    assert again.exit_code == 0, again.output


# -- mount_point and the sentence, without a mount ------------------------------------------------------------

def test_the_mount_point_is_the_highest_folder_on_the_same_device(tmp_path):
    assert mount_point("/") == Path("/")
    top = mount_point(tmp_path)
    assert top.stat().st_dev == tmp_path.stat().st_dev and tmp_path.resolve().is_relative_to(top)
    assert top == Path("/") or top.parent.stat().st_dev != top.stat().st_dev
    assert mount_point(tmp_path / "not" / "yet" / "made.onnx") == top  # from the nearest folder that exists


def test_a_full_disk_or_quota_says_which_file_system_and_what_it_holds(tmp_path):
    for code in (errno.ENOSPC, errno.EDQUOT):
        why = write_reason(OSError(code, os.strerror(code)), tmp_path)
        assert f"(the file system mounted at {mount_point(tmp_path)} holds " in why and why.endswith(" free)"), why
    assert write_reason(OSError(errno.ENOSPC, "x")) == FULL  # no file: no file system to name
    assert "mounted" not in write_reason(OSError(errno.EFBIG, "x"), tmp_path)


def test_the_mount_point_of_a_mounted_file_system(disk):
    (disk.root / "a" / "b").mkdir(parents=True)
    assert mount_point(disk.root / "a" / "b" / "model.onnx") == disk.root.resolve()
    assert mount_point(disk.root.parent) != disk.root.resolve()


# -- each artifact on a full disk -----------------------------------------------------------------------------

def test_a_full_disk_during_an_export_keeps_the_previous_one(disk, prepared):
    folder = disk.put(prepared)
    _fails_then_works(disk, ["onnx", *DIGITS, "-o", folder, "-q"], 100_000, folder / "model.onnx")  # ~600 KB
    assert check_onnx(ModelFolder(folder), "fp32").ok and check_onnx(ModelFolder(folder), "int8").ok
    _clean(folder)


def test_a_full_disk_during_an_export_with_external_data_keeps_the_previous_one(disk, prepared, monkeypatch):
    """The weights of a model over protobuf's cap go to model.onnx.data, written before the graph: here the digits
    model's ~570 KB of weights, with the cap made tiny, onto a disk with 100 KB left."""
    import vitexport.exporter.to_onnx as to_onnx

    monkeypatch.setattr(to_onnx, "PROTOBUF_LIMIT", 1000)
    folder = disk.put(prepared)
    args = ["onnx", *DIGITS, "-o", folder, "-q"]
    first = _run(*args)  # the previous good export: a graph and its external data
    assert first.exit_code == 0 and (folder / "model.onnx.data").is_file(), first.output
    _fails_then_works(disk, args, 100_000, folder / "model.onnx.data")
    assert (folder / "model.onnx.data").is_file() and check_onnx(ModelFolder(folder), "fp32").ok
    _clean(folder)


def test_a_full_disk_during_int8_keeps_the_previous_graph(disk, prepared):
    """The calibration cache is reused (nothing else is written before the graph): the ~210 KB graph does not fit
    in the 50 KB left."""
    folder = disk.put(prepared)
    _fails_then_works(disk, [*INT8, folder], 50_000, folder / "model.int8.onnx")
    assert check_onnx(ModelFolder(folder), "int8").ok
    _clean(folder)


def test_a_full_disk_while_writing_the_calibration_cache_keeps_the_previous_int8_and_cache(disk, prepared):
    """Other calibration settings (8 inputs instead of the 16 cached) need a fresh calibration, whose ranges are
    cached as soon as they are computed, before the graph is written; a disk with less than a page left (the cache
    takes one) fails there. The previous graph and cache stay as they were, no new cache is left, and once there
    is room the same command calibrates, caches and writes the graph."""
    folder = disk.put(prepared)
    old_caches = sorted((folder / "calib-cache").iterdir())
    args = ["quantize", "--int8", folder, "--calib-samples", "8", "--no-check"]
    disk.fill(0)
    before = disk.tree()
    r = _run(*args)
    assert "Calibrating" in r.output
    last = disk.says_full(r, folder / "calib-cache")  # ... /calib-cache/<key>.json: no space ...
    assert re.search(r"calib-cache/[0-9a-f]{32}\.json: no space", last), last
    assert disk.tree() == before and sorted((folder / "calib-cache").iterdir()) == old_caches
    disk.empty()
    again = _run(*args)
    assert again.exit_code == 0 and "Reusing calibration cache" not in again.output, again.output
    assert len(list((folder / "calib-cache").iterdir())) == len(old_caches) + 1
    assert check_onnx(ModelFolder(folder), "int8").ok
    _clean(folder)


def test_a_full_disk_during_an_openvino_ir_keeps_the_previous_ir(disk, prepared):
    """OpenVINO writes the IR itself and says only 'iostream error' when its stream fails; the file system is full
    then, and the sentence says so."""
    folder = disk.put(prepared)
    _fails_then_works(disk, ["openvino", folder, "--no-check", "-q"], 100_000, folder / "model.openvino.fp32.xml")
    assert check_onnx(ModelFolder(folder), "openvino-fp32").ok
    _clean(folder)


def test_a_full_disk_during_a_triton_repository_keeps_the_previous_entry(disk, prepared):
    """The entry is staged in a hidden folder of the repository: copying the ~600 KB model into it fails, the
    staging folder goes, the previous entry and the model folder stay as they were."""
    folder = disk.put(prepared)
    repo = disk.root / "repo"
    args = ["triton", folder, "-o", repo, "-q"]
    first = _run(*args)
    assert first.exit_code == 0, first.output
    entry = repo / f"{DIGITS_VARIANT}-fp32"
    _fails_then_works(disk, args, 100_000, entry / "1" / "model.onnx")  # not the model folder's model.onnx
    assert sorted(p.name for p in repo.iterdir()) == [entry.name]
    assert (entry / "1" / "model.onnx").read_bytes() == (folder / "model.onnx").read_bytes()
    _clean(folder)


def test_an_ir_write_that_fails_with_room_left_names_the_ir_and_what_openvino_said(prepared, tmp_path, monkeypatch):
    """Without a full disk, OpenVINO's failure to write is not said to be one; the IR is still named, not its
    temporary, and nothing half-written stays."""
    import openvino

    folder = tmp_path / "m"
    shutil.copytree(prepared, folder, ignore=shutil.ignore_patterns(LOCK_NAME))

    def fails(model, path, compress_to_fp16=True):
        Path(path).write_text("<net")
        raise RuntimeError("Exception from src/core/src/pass/serialize.cpp:1:\nbasic_ios::clear: iostream error")

    monkeypatch.setattr(openvino, "save_model", fails)
    before = _state(folder)
    last = _one_sentence(_run("openvino", folder, "--no-check", "-q"), 2,
                         f"OpenVINO could not write {folder / 'model.openvino.fp32.xml'} (basic_ios::clear: iostream "
                         f"error); is {folder} writable")
    assert FULL not in last and ".vx" not in last
    assert _state(folder) == before
    _clean(folder)
