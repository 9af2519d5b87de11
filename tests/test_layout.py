"""Rules about the code's shape that keep it easy to read: short functions and modules, and every artifact file
name spelled in one module (vitexport/folder.py)."""

import ast
import re
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "vitexport"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 400
# file names of the model folder: the manifest, ONNX files, plans and sidecars, calibration cache, rejected files
ARTIFACT_NAME = re.compile(r"manifest\.json|model\.(onnx|fp32|fp16|int8|openvino)|\.plan\b|calib-cache|\.rejected\.")


def _modules():
    return sorted(PACKAGE.rglob("*.py"))


def _functions(tree):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_no_function_over_80_lines():
    long = [f"{p.relative_to(ROOT)}:{fn.lineno} {fn.name} ({fn.end_lineno - fn.lineno + 1} lines)"
            for p in _modules() for fn in _functions(ast.parse(p.read_text()))
            if fn.end_lineno - fn.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, long


def test_no_module_over_400_lines():
    long = [f"{p.relative_to(ROOT)} ({n} lines)" for p in _modules()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, long


def _docstrings(tree) -> set[int]:
    """ids of the docstring nodes of a module, its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _spelled_names(path: Path) -> list[str]:
    """String literals (f-string text included, docstrings not) that spell an artifact file name: 'line: text'."""
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    return [f"{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
            and ARTIFACT_NAME.search(node.value)]


def test_artifact_file_names_are_spelled_only_in_the_folder_module():
    spelled = {p.relative_to(PACKAGE).as_posix(): _spelled_names(p) for p in _modules()}
    assert spelled["folder.py"], "the rule's pattern no longer matches the names folder.py defines"
    # the CLI's help texts may name files for people; no other module may
    others = [f"vitexport/{name}:{hit}" for name, hits in spelled.items()
              if name != "folder.py" and not name.startswith("cli/") for hit in hits]
    assert not others, others


def test_the_check_finds_a_spelled_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('"""Docstrings may say model.fp16.onnx."""\n\nPATH = f"{1}/model.fp16.onnx"\n')
    hits = _spelled_names(bad)
    assert len(hits) == 1 and hits[0].startswith("3: ") and "model.fp16.onnx" in hits[0]
