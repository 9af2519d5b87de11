"""The TensorRT code type-checks against tensorrt-stubs, and the check really catches a misspelt API call."""

import os
import re
import subprocess
import sys

from conftest import ROOT

SCRIPT = ROOT / "scripts" / "typecheck_trt.sh"
ENV = {**os.environ, "PYTHON": sys.executable}  # the interpreter running the tests, whatever PATH says


def test_tensorrt_module_typechecks():
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, cwd=ROOT, timeout=600, env=ENV)
    assert r.returncode == 0, r.stdout + r.stderr


def test_typecheck_catches_a_wrong_call(tmp_path):
    src = (ROOT / "vitexport" / "backends" / "tensorrt.py").read_text()
    assert "execute_async_v3" in src
    bad = tmp_path / "wrong_call.py"
    src = re.sub(r"from \.(\w)", r"from vitexport.backends.\1", src.replace("from ..", "from vitexport."))
    bad.write_text(src.replace("execute_async_v3", "execute_async_v4"))
    r = subprocess.run(["bash", str(SCRIPT), str(bad)], capture_output=True, text=True, cwd=ROOT, timeout=600, env=ENV)
    assert r.returncode != 0 and "execute_async_v4" in r.stdout
