"""vitexport as people install it: a wheel built from the repository carries the data its defaults need, and an
installed copy run from an empty folder finds it there (not in a checkout, not in the working directory)."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT

# what a wheel is built from: the build's own files, the package and the data setup.py copies into it
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "vitexport", "calibration", "models/digits")


def _run(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, a folder it is installed in): built from a copy of the repository's files, so that the build
    writes nothing into the checkout, and installed without dependencies (those of this environment serve)."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    for rel in SOURCES:
        p = ROOT / rel
        if p.is_dir():
            shutil.copytree(p, src / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, src / rel)
    r = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", ".", "-w",
              str(base / "dist")], src)
    assert r.returncode == 0, r.stderr
    wheel = next((base / "dist").glob("vitexport-*.whl"))
    target = base / "site"
    r = _run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)], base)
    assert r.returncode == 0, r.stderr
    return wheel, target


def test_the_wheel_carries_the_shipped_data(installed):
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    shipped = "vitexport/shipped/"
    for rel in ("calibration/photos/calib", "calibration/photos/holdout", "calibration/digits/calib",
                "calibration/digits/heldout"):
        want = sorted(str(p.relative_to(ROOT)) for p in (ROOT / rel).rglob("*") if p.is_file())
        got = sorted(n[len(shipped):] for n in names if n.startswith(shipped + rel + "/"))
        assert got == want and want, rel
    assert shipped + "models/digits/vit_digits_patch4_32.safetensors" in names
    assert "vitexport/resources/timm_archs.json" in names and "vitexport/py.typed" in names
    assert not [n for n in names if n.startswith(("tests/", "scripts/", "calibration/", "models/"))]


def test_an_installed_copy_runs_its_defaults_from_an_empty_folder(installed, tmp_path):
    """The installed package (first on the path, ahead of this checkout) exports the digits model from its shipped
    checkpoint, calibrates INT8 on its shipped images and checks it on its held-out set, all from an empty folder;
    and the photos the default job uses resolve inside it."""
    _, target = installed
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target), "VITEXPORT_MODELS": str(empty / "models"),
           "HF_HUB_OFFLINE": "1"}
    probe = ("import json, vitexport, vitexport.paths as p; print(json.dumps([vitexport.__file__, "
             "str(p.default_calib_dir('vit_base_patch16_224')), str(p.default_heldout_dir('vit_base_patch16_224')), "
             "str(p.shipped_checkpoint(p.DIGITS_VARIANT))]))")
    r = _run([sys.executable, "-c", probe], empty, env)
    assert r.returncode == 0, r.stderr
    module, calib, heldout, checkpoint = map(Path, json.loads(r.stdout))
    for p in (module, calib, heldout, checkpoint):
        assert p.is_relative_to(target), p
    assert len(list(calib.iterdir())) == len(list((ROOT / "calibration/photos/calib").iterdir()))
    assert len(list(heldout.iterdir())) == len(list((ROOT / "calibration/photos/holdout").iterdir()))
    for args in (["onnx", "-m", "vit_digits_patch4_32"], ["quantize", "-m", "vit_digits_patch4_32", "--int8"]):
        r = _run([sys.executable, "-m", "vitexport", *args], empty, env)
        assert r.returncode == 0, r.stdout + r.stderr
    manifest = json.loads(next((empty / "models").glob("vit_digits_patch4_32-*/manifest.json")).read_text())
    int8 = manifest["precisions"]["int8"]
    assert Path(int8["calibration"]["data"]).is_relative_to(target)  # calibrated on the installed copy's images
    assert Path(manifest["checkpoint"]["path"]).is_relative_to(target)
    assert sorted(p.name for p in empty.iterdir()) == ["models"]  # nothing else written where it ran
