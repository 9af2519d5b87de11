"""The TensorRT code type-checks against tensorrt-stubs, and the check really catches a misspelt API call."""

import os
import re
import subprocess
import sys

from conftest import ROOT

SCRIPT = ROOT / "scripts" / "typecheck_trt.sh"
ENV = {**os.environ, "PYTHON": sys.executable}  # the interpreter running the tests, whatever PATH says


def test_tensorrt_modules_typecheck_and_a_wrong_call_is_caught(tmp_path):
    """One mypy run (it takes seconds) over the TensorRT modules and a copy of the runner with one misspelt call:
    the modules have no error, the copy has exactly that one."""
    src = (ROOT / "vitexport" / "backends" / "tensorrt.py").read_text()
    assert "execute_async_v3" in src
    bad = tmp_path / "wrong_call.py"
    src = re.sub(r"from \.(\w)", r"from vitexport.backends.\1", src.replace("from ..", "from vitexport."))
    bad.write_text(src.replace("execute_async_v3", "execute_async_v4"))
    r = subprocess.run(["bash", str(SCRIPT), str(bad)], capture_output=True, text=True, cwd=ROOT, timeout=600, env=ENV)
    errors = [line for line in r.stdout.splitlines() if ": error:" in line]
    assert r.returncode != 0 and errors, r.stdout + r.stderr
    assert all(line.startswith(str(bad)) for line in errors), errors  # none in the real modules
    assert any("execute_async_v4" in line for line in errors), errors
