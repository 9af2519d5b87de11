"""The command line: `vitexport --help` and every command's --help load none of the heavy libraries."""

import json
import subprocess
import sys

HEAVY = ("torch", "onnxruntime", "onnx", "tensorrt")

_CODE = """
import json, sys
from click.testing import CliRunner
from vitexport.cli import cli
runner = CliRunner()
results = {}
for args in [["--help"]] + [[name, "--help"] for name in sorted(cli.commands)]:
    r = runner.invoke(cli, args)
    results[" ".join(args)] = [r.exit_code, r.output]
print(json.dumps({"results": results, "loaded": [m for m in %r if m in sys.modules]}))
""" % (HEAVY,)


def test_help_imports_no_heavy_library():
    out = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert set(data["results"]) >= {"--help", "onnx --help", "quantize --help", "trt --help", "bench --help",
                                    "predict --help", "triton --help", "info --help"}
    for args, (code, text) in data["results"].items():
        assert code == 0 and "Usage:" in text, (args, text)
    assert data["loaded"] == [], f"--help imported {data['loaded']}"


def test_the_check_sees_a_heavy_import():
    code = _CODE.replace("from vitexport.cli import cli", "from vitexport.cli import cli\nimport onnx")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert json.loads(out.stdout)["loaded"] == ["onnx"]

