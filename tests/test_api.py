"""The Python API: docs/API.md's examples run as written, and what the API promises beyond them (a light import,
the CLI's sentences, no exit from library code)."""

import json
import re
import subprocess
import sys

import pytest
from conftest import ROOT

import vitexport


def _examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "API.md").read_text(), flags=re.S)


def test_the_docs_examples_run_in_an_empty_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("VITEXPORT_MODELS", raising=False)
    blocks = _examples()
    assert len(blocks) >= 4
    scope: dict = {}
    for block in blocks:
        exec(compile(block, "docs/API.md", "exec"), scope)
    folder = scope["exported"].folder
    assert (tmp_path / folder / "manifest.json").is_file() and (tmp_path / folder / "model.int8.onnx").is_file()
    assert json.loads((tmp_path / "bench.json").read_text())["results"] and (tmp_path / "bench.md").is_file()
    assert "Unknown model 'vit_no_such_model'" in capsys.readouterr().out


def test_import_loads_no_numeric_library():
    code = ("import sys, vitexport; vitexport.VitexportError; vitexport.export; "
            "print(sorted(m for m in ('torch', 'onnxruntime', 'openvino', 'numpy') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


@pytest.mark.parametrize("call,needle", [
    (lambda: vitexport.quantize(ROOT / "models" / "no_such_folder", "int8"), "no_such_folder"),
    (lambda: vitexport.quantize(".", "int4"), "Unknown precision 'int4'"),
    (lambda: vitexport.quantize(".", "int8", target="gpu"), "Unknown target 'gpu'"),
    (lambda: vitexport.export("vit_digits_patch4_32", img_size_range=((16, 16), (64, 64))),
     "--img-size-range needs --dynamic-img-size"),
    (lambda: vitexport.export(object()), "got a builtins.object object"),
])
def test_bad_input_is_a_vitexport_error_with_one_sentence(call, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(vitexport.VitexportError) as e:
        call()
    assert needle in str(e.value) and "\n" not in str(e.value).strip()


def test_the_cli_and_the_api_say_the_same_sentence(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from vitexport.cli import cli

    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["onnx", "-m", "vit_digits_patch4_32", "--img-size-range", "16..64"])
    with pytest.raises(vitexport.VitexportError) as e:
        vitexport.export("vit_digits_patch4_32", img_size_range=((16, 16), (64, 64)))
    assert r.exit_code == e.value.exit_code == 2 and r.output.strip() == f"Error: {e.value}"


def test_the_public_surface_is_strictly_typed(tmp_path):
    """mypy --strict with the project's configuration (pyproject.toml: torch, ONNX, ONNX Runtime and OpenVINO read as
    Any) over the public surface and a user's file that misuses it: no error in vitexport, and the user's misuse
    found, so the results' types are seen for what they are (not Any)."""
    user = tmp_path / "user_code.py"
    user.write_text("import vitexport\n\nfolder: int = vitexport.export('vit_digits_patch4_32')\n")
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-incremental",
                        "vitexport/__init__.py", "vitexport/api", str(user)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    errors = [line for line in r.stdout.splitlines() if ": error:" in line]
    assert r.returncode == 1 and len(errors) == 1, r.stdout + r.stderr
    assert errors[0].startswith(str(user)) and '"ExportResult"' in errors[0], errors
