"""Rules about the code's shape that keep it easy to read: short functions and modules, and every artifact file
name spelled in one module (vitexport/artifacts/folder.py)."""

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
    assert spelled["artifacts/folder.py"], "the rule's pattern no longer matches the names folder.py defines"
    # the CLI's help texts may name files for people; no other module may
    others = [f"vitexport/{name}:{hit}" for name, hits in spelled.items()
              if name != "artifacts/folder.py" and not name.startswith("cli/") for hit in hits]
    assert not others, others


def test_the_check_finds_a_spelled_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('"""Docstrings may say model.fp16.onnx."""\n\nPATH = f"{1}/model.fp16.onnx"\n')
    hits = _spelled_names(bad)
    assert len(hits) == 1 and hits[0].startswith("3: ") and "model.fp16.onnx" in hits[0]


# -- import direction ---------------------------------------------------------------------------------------------

# The layers of docs/ARCHITECTURE.md, top first. A module may import its own package and any package of a lower
# layer, never one of its own layer or above; "base" is the package's top-level modules below `ensure`.
LAYERS = [
    ("__main__", "__init__"),
    ("cli", "api"),
    ("benchmark", "deploy"),
    ("ensure",),
    ("openvino_ir", "aoti"),
    ("exporter", "precision"),
    ("validate",),
    ("preflight",),
    ("backends",),
    ("tensorrt_engine",),
    ("model",),
    ("artifacts",),
    ("data",),
    ("parity",),
    ("paths", "environment", "progress"),
    ("errors", "version"),
]
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def _unit(module: str) -> str:
    """The layering unit of a dotted module name below `vitexport`: its subpackage, or the top-level module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path, package_root: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import of the package in a file, lazy and type-only ones included."""
    rel = path.relative_to(package_root.parent).with_suffix("")
    here = list(rel.parts) if rel.name == "__init__" else list(rel.parts[:-1])
    here = [p for p in here if p != "__init__"]
    root = package_root.name
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            if module == root:  # `from . import x`: x may be a module of its own
                found += [(node.lineno, f"{root}.{a.name}") for a in node.names]
            elif module.startswith(root + "."):
                found.append((node.lineno, module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith(root + ".")]
    return found


def layering_violations(package_root: Path) -> list[str]:
    """'file:line imports module' for every import that points across or up the layers."""
    bad = []
    for path in sorted(package_root.rglob("*.py")):
        me = _unit(".".join(path.relative_to(package_root.parent).with_suffix("").parts))
        for line, module in _imports(path, package_root):
            other = _unit(module)
            if other == me or other not in RANK:  # its own package; `vitexport.__version__` and the like
                continue
            if me not in RANK:
                bad.append(f"{path.relative_to(package_root.parent)}: {me!r} has no layer")
            elif RANK[other] <= RANK[me]:
                bad.append(f"{path.relative_to(package_root.parent)}:{line} imports {module}")
    return bad


def test_every_package_and_top_level_module_has_a_layer():
    units = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if p.suffix == ".py" or (p / "__init__.py").is_file()}
    assert units == set(RANK), (units - set(RANK), set(RANK) - units)


def test_imports_flow_down_the_layers():
    assert not layering_violations(PACKAGE), layering_violations(PACKAGE)


def test_at_most_8_modules_directly_in_the_package():
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(top) <= 8, top


def _copy_package(tmp_path: Path) -> Path:
    import shutil

    dst = tmp_path / "vitexport"
    shutil.copytree(PACKAGE, dst, ignore=shutil.ignore_patterns("__pycache__", "resources"))
    return dst


def test_the_check_finds_an_import_that_points_up(tmp_path):
    copy = _copy_package(tmp_path)
    assert not layering_violations(copy)
    planted = copy / "model" / "vit.py"
    planted.write_text(planted.read_text() + "\n\ndef _late():\n    from ..benchmark.run import run_bench\n")
    assert layering_violations(copy) == [f"vitexport/model/vit.py:{len(planted.read_text().splitlines())} "
                                         "imports vitexport.benchmark.run"]


def test_the_check_finds_an_import_across_one_layer(tmp_path):
    copy = _copy_package(tmp_path)
    planted = copy / "exporter" / "check.py"
    planted.write_text("from vitexport.precision import settings\n" + planted.read_text())
    assert layering_violations(copy) == ["vitexport/exporter/check.py:1 imports vitexport.precision"]


def test_commands_that_export_nothing_never_load_torch():
    """torch takes 1.4 s to import: `ensure` (behind quantize, openvino, bench's checks) imports the exporter only
    when it exports."""
    import subprocess
    import sys

    code = "import sys, vitexport.ensure, vitexport.cli.quantize_cmd; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr


# -- no circles ---------------------------------------------------------------------------------------------------

def _module_name(path: Path, package_root: Path) -> str:
    parts = list(path.relative_to(package_root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_circles(package_root: Path) -> list[str]:
    """'a -> b -> ... -> a' for each circle of the module import graph (lazy and type-only imports included: a
    circle a function-level import hides is still two modules that each need the other). An import of a name from
    a package counts as an import of the package's __init__, or of its submodule when the name is one."""
    paths = sorted(package_root.rglob("*.py"))
    modules = {_module_name(p, package_root) for p in paths}
    edges: dict[str, set[str]] = {}
    for path in paths:
        me = _module_name(path, package_root)
        targets = {m for _, m in _imports(path, package_root) if m in modules and m != me}
        edges[me] = targets
    # Tarjan's strongly connected components; each component of two or more modules is a circle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(" -> ".join(sorted(component)) + " -> " + min(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return circles


def test_no_module_imports_one_that_imports_it_back():
    assert not import_circles(PACKAGE), import_circles(PACKAGE)


def test_the_check_finds_a_circle_through_a_lazy_import(tmp_path):
    copy = _copy_package(tmp_path)
    planted = copy / "parity" / "stats.py"
    planted.write_text(planted.read_text() + "\n\ndef _late():\n    from .accumulate import compare\n")
    circles = import_circles(copy)
    assert len(circles) == 1 and {"vitexport.parity.accumulate", "vitexport.parity.stats"} <= \
        set(circles[0].split(" -> ")), circles
