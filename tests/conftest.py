import functools
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from vitexport.environment import usable_cores

ROOT = Path(__file__).resolve().parents[1]


def _pin_worker() -> None:
    """xdist worker N of W runs on the N-th of W equal shares of this process's cores, and so do the threads and
    processes it starts: every runtime sizes its pool to the cores it may use (environment.usable_cores), so two
    workers on 2 cores never run four threads, two of them ONNX Runtime spinners (that cost a quarter of the time)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (hasattr(os, "sched_setaffinity") and worker[2:].isdigit() and count.isdigit() and int(count) > 1):
        return
    cores = sorted(os.sched_getaffinity(0))
    share = len(cores) // int(count)
    if share:
        n = int(worker[2:]) % int(count)
        os.sched_setaffinity(0, set(cores[n * share:(n + 1) * share]))


_pin_worker()
torch.set_num_threads(max(1, min(2, usable_cores())))


# the graphs torch.onnx.export made in this run (the memo below), shared by its xdist workers: named by the
# controller, which starts them with its environment after loading this file, and removes the folder at the end
if not os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["VITEXPORT_TEST_GRAPHS"] = str(Path(tempfile.gettempdir()) / f"vitexport-test-graphs-{os.getpid()}")
GRAPHS_DIR = Path(os.environ["VITEXPORT_TEST_GRAPHS"])


def _memoise_torch_onnx_export() -> None:
    """torch.onnx.export is half of the suite's time (0.5 s a block, with a symbolic batch), and many tests export a
    model another test of the worker exported already, byte for byte. Its result depends only on the module (class,
    every parameter and buffer, every plain attribute of every submodule: config, flags, scales), the shapes and types
    of the example inputs and the arguments, so a second call with the same ones gets a fresh copy of the first
    call's graph; everything vitexport does with the graph (naming, checks, parity, the files) still runs. Graphs
    over 64 MB are not kept. They are kept in a folder of the run (GRAPHS_DIR, removed at the session's end), which
    its xdist workers share, each graph written to a temporary name and renamed; none is held in memory."""
    import hashlib

    real = torch.onnx.export

    def key(model, args, kwargs) -> str:
        h = hashlib.sha256(repr((torch.__version__, type(model).__qualname__, repr(model))).encode())
        for name, module in model.named_modules():
            plain = {k: v for k, v in vars(module).items() if not k.startswith("_")
                     and isinstance(v, (bool, int, float, str, tuple, type(None)))}
            h.update(repr((name, type(module).__qualname__, sorted(plain.items()), getattr(module, "cfg", None),
                           module.training)).encode())
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            t = t.detach().contiguous().cpu()
            h.update(repr((name, t.dtype, tuple(t.shape))).encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")  # 0-d: BN's count
        h.update(repr([(tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args]).encode())
        h.update(repr(sorted(kwargs.items())).encode())
        return h.hexdigest()

    class Program:
        def __init__(self, data: bytes):
            import onnx

            self.model_proto = onnx.load_from_string(data)

    def export(model, args=(), *rest, **kwargs):
        if rest or not isinstance(model, torch.nn.Module) or not kwargs.get("dynamo"):
            return real(model, args, *rest, **kwargs)
        kept = GRAPHS_DIR / key(model, args, kwargs)
        if kept.is_file():
            return Program(kept.read_bytes())
        program = real(model, args, **kwargs)
        proto = program.model_proto
        if proto.ByteSize() >= 64 * 2**20:
            return program
        data = proto.SerializeToString()
        GRAPHS_DIR.mkdir(parents=True, exist_ok=True)
        tmp = GRAPHS_DIR / f".{kept.name}.{os.getpid()}"
        tmp.write_bytes(data)
        os.replace(tmp, kept)
        return Program(data)

    torch.onnx.export = export


_memoise_torch_onnx_export()

GB_PER_WORKER = 4  # the largest tests (ViT-B/16 exports, benches) peak at about 3.6 GB each


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject's addopts): one worker per core this process may use, at most 8, and no more than the
    free memory holds at GB_PER_WORKER each (at least one)."""
    cores = usable_cores()
    try:
        free_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                       if line.startswith("MemAvailable:"))
        by_memory = free_kb // (GB_PER_WORKER * 2**20)
    except (OSError, StopIteration, ValueError):
        by_memory = cores
    return max(1, min(cores, 8, by_memory))


@pytest.fixture(scope="session", autouse=True)
def generated_sets(tmp_path_factory):
    """Data sets vitexport generates into its cache (the digits' default bench set) go to a folder of the session,
    not the user's cache."""
    old = os.environ.get("VITEXPORT_CACHE")
    os.environ["VITEXPORT_CACHE"] = str(tmp_path_factory.mktemp("vitexport-cache"))
    yield Path(os.environ["VITEXPORT_CACHE"])
    if old is None:
        os.environ.pop("VITEXPORT_CACHE", None)
    else:
        os.environ["VITEXPORT_CACHE"] = old


@pytest.fixture
def ctrl_c():
    """Python's own SIGINT handler for the test: a shell that starts jobs in the background (nohup, some CI
    runners) starts Python with SIGINT ignored, and _thread.interrupt_main() then raises nothing."""
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run in an empty folder: artifacts land in tmp_path/models."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def tiny_default(tmp_path_factory):
    """A tiny model exported to its default folder (models/vit_tiny_patch16_224-32x32) under a scratch directory.
    Shared by the session: tests may add files to it (`quantize --fp16`, a bench's FP16/INT8 graphs); a test that
    asserts which files it holds works on a copy (copy_export)."""
    from vitexport.exporter.run import run_export
    from vitexport.model.spec import ModelSpec

    root = tmp_path_factory.mktemp("work")
    old = os.getcwd()
    os.chdir(root)
    try:
        run_export(ModelSpec(variant="vit_tiny_patch16_224", img_size=(32, 32)))
    finally:
        os.chdir(old)
    return root


def fails_cleanly(r, needle):
    """A CLI run that failed with one sentence containing `needle`: no traceback."""
    assert r.exit_code != 0, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)  # no traceback
    assert "Traceback" not in r.output
    assert needle.lower() in r.output.lower(), r.output


@pytest.fixture(scope="session")
def digits_export(tmp_path_factory):
    """The digits model exported once for the session (an export takes seconds); modules copy it (copy_export)."""
    from vitexport.exporter.run import run_export
    from vitexport.model.spec import ModelSpec
    from vitexport.model.variants import DIGITS_VARIANT

    return run_export(ModelSpec(variant=DIGITS_VARIANT), output=tmp_path_factory.mktemp("digits-export") / "model") \
        .folder.path


def copy_export(src: Path, dst: Path) -> Path:
    """A copy of an export folder at dst (its lock and owner files left behind): a folder of its own to change."""
    from vitexport.artifacts.folder import LOCK_NAME, OWNER_NAME

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(LOCK_NAME, OWNER_NAME))
    return Path(dst)


@functools.lru_cache(maxsize=None)
def load_script(name: str):
    """A module of scripts/ (not a package), loaded by path, once: tests use the same helpers the scripts run."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def quick_bench(folder: Path, tmp_path: Path) -> dict:
    """`vitexport bench FOLDER` with one timed iteration: {row name: JSON record} of the rows that ran."""
    import json

    from click.testing import CliRunner

    from vitexport.cli import cli

    report = tmp_path / "bench.json"
    r = CliRunner().invoke(cli, ["bench", str(folder), "--iterations", "1", "--min-time", "0", "--warmup", "0",
                                 "--json", str(report), "-q"])
    assert r.exit_code == 0, r.output
    return {row["name"]: row for row in json.loads(report.read_text())["results"] if row["available"]}


LINT = """
import sys
from polygraphy.tools import main
for model, report in zip(sys.argv[1::2], sys.argv[2::2]):
    sys.argv = ["polygraphy", "check", "lint", model, "-o", report]
    try:
        main()
    except SystemExit:
        pass
"""


def lint(paths, tmp_path):
    """`polygraphy check lint` of each graph (one process): {name: [(failing nodes, message)]}, [] when clean."""
    import json
    import subprocess

    pytest.importorskip("polygraphy")
    reports = [tmp_path / f"{p.name}.lint.json" for p in paths]
    subprocess.run([sys.executable, "-c", LINT, *[str(x) for pair in zip(paths, reports) for x in pair]],
                   capture_output=True, text=True, timeout=600)
    return {p.name: [(e["nodes"], e["message"]) for e in json.loads(r.read_text())["lint_entries"]
                     if e["level"] in ("exception", "error")] for p, r in zip(paths, reports)}


# -- the graph rule: no graph the suite writes holds an op TensorRT's parser refuses ----------------------------------

def graphs_breaking_the_rule(root: Path) -> list[str]:
    """'FILE: NODE (OP), ...' for each ONNX graph under `root` with a node of graph_rules.FORBIDDEN_OPS, and for
    each graph vitexport wrote (its producer: an export, and the graphs made of it) with a node TensorRT's ONNX
    parser refuses ('node NAME (OP): why', graph_rules.parser_refusals: its support matrix op by op; an antialiased
    Resize, which `vitexport trt` refuses itself, excepted) or that fails onnx.checker's full check. A test's
    hand-made graph is held to FORBIDDEN_OPS only.
    Files that are not regular files (the FIFOs and links of the untrusted-folder tests) and files that are no ONNX
    graph (their corrupt-file cases) are not graphs vitexport wrote."""
    import onnx

    from vitexport.tensorrt_engine.graph_rules import parser_refusals, rule_breakers

    found = []
    for path in sorted(root.rglob("*.onnx")):
        if path.is_symlink() or not path.is_file():
            continue
        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception:  # noqa: BLE001 - a deliberately damaged file
            continue
        if breakers := (parser_refusals if model.producer_name == "vitexport" else rule_breakers)(model):
            found.append(f"{path.relative_to(root)}: {', '.join(breakers[:5])}")
        elif model.producer_name == "vitexport" and _own_external_data(path, model) and (invalid := _full_check(path)):
            found.append(f"{path.relative_to(root)}: onnx.checker's full check: {invalid}")
    return found


def _own_external_data(path: Path, model) -> bool:
    """Whether every external tensor of a graph is a regular file beside it, as vitexport writes them; the
    untrusted-folder tests plant graphs whose data leads elsewhere, which is what they test, not a graph to check."""
    folder = path.parent.resolve()
    for t in model.graph.initializer:
        if t.data_location == 1:  # EXTERNAL
            location = next((e.value for e in t.external_data if e.key == "location"), "")
            target = path.parent / location
            if target.is_symlink() or not target.is_file() or not target.resolve().is_relative_to(folder):
                return False
    return True


def _full_check(path: Path) -> str:
    """onnx.checker's full check (with shape inference) of a graph vitexport wrote, by path (its external data
    beside it): '' when it passes, else the checker's first line."""
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as e:  # noqa: BLE001 - ValidationError, InferenceError: the checker's sentence is the finding
        return str(e).splitlines()[0][:200]
    return ""


def pytest_sessionfinish(session, exitstatus):
    """After every test (in the controller: it sees what each worker wrote under the session's temporary folder),
    fail the run when a graph the suite wrote breaks the rule, naming the file and the nodes."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    shutil.rmtree(GRAPHS_DIR, ignore_errors=True)
    if not hasattr(session.config, "_tmp_path_factory"):
        return
    try:
        root = session.config._tmp_path_factory.getbasetemp()
    except OSError:
        return
    broken = graphs_breaking_the_rule(Path(root))
    if broken:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = ["Graphs with ops or attributes TensorRT's parser refuses (its support matrix, tensorrt_engine.onnx_support):", *broken]
        for line in lines:
            (reporter.write_line(line, red=True) if reporter else print(line, file=sys.stderr))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

