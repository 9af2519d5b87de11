"""Every command over every kind of model source and the options that change what is built: a result or one sentence.

The cases are generated, not listed: for each command, the dimensions are the model sources it can be given and
those of its options (read from the click command itself) that change what is built: image size, dynamic size,
classes, outputs, --force, precision and target. Every pair of values of any two dimensions appears in at least one
case (an all-pairs design: every source meets every option value and every option value meets every other). A run
passes when it exits 0, or exits with a documented code (1 a parity miss, 2 bad input, 3/4/5 a missing runtime or
GPU) with one sentence that names an option, value or input of the case: never exit 70 ("this is a bug"), a
traceback, or a message that does not say what was wrong.

Slow (hundreds of CLI runs, exports and benches of a tiny model among them): deselected from the default run and run
by `.ci/run` as `python -m pytest -q -m sweep`.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from click.testing import CliRunner
from conftest import ROOT, copy_export, load_script

from vitexport.cli import cli

pytestmark = pytest.mark.sweep

ARCH = "test_vit"  # timm's own test ViT: width 64, depth 6, heads 2, patch 16, 160 px
TAG = f"{ARCH}.r160_in1k"
OTHER_ARCH = "vit_tiny_patch16_224"  # width 192: disagrees with the transformers folder
PHOTOS = ROOT / "calibration" / "photos" / "holdout"
DOCUMENTED_EXITS = {0, 1, 2, 3, 4, 5}  # success, parity miss, bad input, no OpenVINO, no TensorRT, no (fit) GPU
COMMANDS = ("onnx", "quantize", "openvino", "trt", "bench", "predict", "triton", "info", "models")
SOURCE_KINDS = ["name", "arch.tag in the hub cache", "hf-hub reference", "timm file", "JAX .npz",
                "transformers folder", "transformers folder, -m of its shape", "transformers folder, -m of another",
                "exported model folder", "transformers folder as MODEL_DIR", "a folder of something else"]


# -- an all-pairs design ---------------------------------------------------------------------------------------------

def all_pairs(dims: dict[str, list]) -> list[dict]:
    """Cases (one value per dimension) such that every pair of values of any two dimensions is in at least one case.

    Greedy and deterministic: each new case starts from the first pair not yet covered and gives every other
    dimension the value that covers most uncovered pairs with the values already chosen (ties: the first value)."""
    names = list(dims)
    if len(names) < 2:  # no pairs: each value once
        return [{n: v} for n in names for v in dims[n]]
    uncovered = {((a, i), (b, j)) for x, a in enumerate(names) for b in names[x + 1:]
                 for i in range(len(dims[a])) for j in range(len(dims[b]))}

    def pair(m, u, n, v):
        return ((m, u), (n, v)) if names.index(m) < names.index(n) else ((n, v), (m, u))

    cases = []
    while uncovered:
        (a, i), (b, j) = min(uncovered, key=lambda p: (names.index(p[0][0]), p[0][1], names.index(p[1][0]), p[1][1]))
        case = {a: i, b: j}
        for n in names:
            if n not in case:
                case[n] = max(range(len(dims[n])),
                              key=lambda v: (sum(pair(m, u, n, v) in uncovered for m, u in case.items()), -v))
        uncovered -= {pair(m, case[m], n, case[n]) for x, m in enumerate(names) for n in names[x + 1:]}
        cases.append({n: dims[n][case[n]] for n in names})
    return cases


def test_the_design_covers_every_pair_and_is_smaller_than_the_product():
    dims = {"a": [0, 1, 2], "b": ["x", "y"], "c": [None, 5, 6, 7], "d": [True, False]}
    cases = all_pairs(dims)
    for (m, us), (n, vs) in itertools.combinations(dims.items(), 2):
        for u, v in itertools.product(us, vs):
            assert any(c[m] == u and c[n] == v for c in cases), (m, u, n, v)
    assert len(cases) < 3 * 2 * 4 * 2 and all(set(c) == set(dims) for c in cases)
    assert cases == all_pairs(dims)  # the same cases every run


# -- the model sources ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Every kind of model source a user hands in, made once: {kind: (options, positional model argument)}."""
    import transformers

    root = tmp_path_factory.mktemp("sources")
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_CACHE", str(root / "hf-cache"))
    mp.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    coverage = load_script("timm_coverage")
    model = coverage.perturb(timm.create_model(ARCH, pretrained=False))
    coverage.lay_out_repo(root / "hf-cache", TAG, model)
    torch.save(model.state_dict(), root / "test_vit.pth")
    from test_checkpoints import _timm_to_jax

    np.savez(root / "test_vit.npz", **_timm_to_jax(model))
    cfg = transformers.ViTConfig(hidden_size=64, num_hidden_layers=6, num_attention_heads=2, intermediate_size=192,
                                 image_size=160, patch_size=16, num_labels=5, hidden_act="gelu")
    hf = transformers.ViTForImageClassification(cfg).eval()
    hf.save_pretrained(root / "hf-vit")
    transformers.ViTImageProcessor(size={"height": 160, "width": 160}).save_pretrained(root / "hf-vit")
    exported = root / "exported"
    r = CliRunner().invoke(cli, ["onnx", "-m", ARCH, "--img-size", "48", "-o", str(exported), "-q"])
    assert r.exit_code == 0, r.output
    other = root / "notes"
    other.mkdir()
    (other / "README.txt").write_text("not a model\n")
    yield {
        "name": (["-m", ARCH], None),
        "arch.tag in the hub cache": (["-m", TAG], None),
        "hf-hub reference": (["-c", f"hf-hub:timm/{TAG}"], None),
        "timm file": (["-m", ARCH, "-c", str(root / "test_vit.pth")], None),
        "JAX .npz": (["-m", ARCH, "-c", str(root / "test_vit.npz")], None),
        "transformers folder": (["-c", str(root / "hf-vit")], None),
        "transformers folder, -m of its shape": (["-m", ARCH, "-c", str(root / "hf-vit")], None),
        "transformers folder, -m of another": (["-m", OTHER_ARCH, "-c", str(root / "hf-vit")], None),
        "exported model folder": ([], exported),
        "transformers folder as MODEL_DIR": ([], root / "hf-vit"),
        "a folder of something else": ([], other),
    }
    mp.undo()


# -- the commands and their dimensions ------------------------------------------------------------------------------

def _params(command: str) -> set[str]:
    """The long option names a command takes, read from the click command."""
    return {o for p in cli.commands[command].params for o in p.opts if o.startswith("--")}


def build_dims(command: str) -> dict[str, list]:
    """The options of `command` that change what is built, each with a few values (None: not given)."""
    takes = _params(command)
    candidates = {
        "--img-size": [None, "48", "32x64"],
        "--dynamic-img-size": [None, True],
        "--num-classes": [None, "0", "7"],
        "--outputs": [None, "pooled,tokens", "registers"],
        "--force": [None, True],
    }
    dims = {opt: values for opt, values in candidates.items() if opt in takes}
    if command == "quantize":
        dims["precision"] = [["--fp16"], ["--int8"], ["--fp8"]]
        dims["--target"] = [None, "cpu", "tensorrt", "all"]
    elif command == "trt":
        dims["precision"] = [["--fp16"], ["--int8"], ["--fp8"], ["--fp32"]]
    elif "--precision" in takes:
        dims["--precision"] = [None, "fp32", "fp16", "int8"]
    return dims


FAST = {  # options that keep a case cheap without changing what is built
    "quantize": ["--calib-samples", "8"],
    "openvino": ["--calib-samples", "8"],
    "bench": ["--batch", "1", "--iterations", "1", "--warmup", "0", "--max-images", "4"],
    "predict": ["--top-k", "2"],
}


def argv(command: str, case: dict, sources: dict, tmp: Path) -> tuple[list[str], list[str]]:
    """(the command line, the words that may name what is at fault: options, values, the input's names)."""
    options, model_dir = sources[case["source"]]
    args = [command]
    if command == "models":  # its argument is a pattern: whatever the user typed as the model
        typed = [a for a in options if not a.startswith("-")] or [str(model_dir)]
        return [command, typed[-1]], [typed[-1], Path(typed[-1]).name]
    if model_dir is not None:
        if case["source"] == "exported model folder":  # a copy of its own: the runs change the folder
            model_dir = copy_export(model_dir, tmp / "exported")
        args.append(str(model_dir))
    elif command == "info":  # info takes a folder only: what the user typed as the model
        args.append(next(a for a in reversed(options) if not a.startswith("-")))
    if command != "info":
        args += options
    for opt, value in case.items():
        if opt == "source" or value is None:
            continue
        if opt == "precision":
            args += value
        elif value is True:
            args.append(opt)
        else:
            args += [opt, value]
    args += FAST.get(command, [])
    if command == "predict":
        args.append(str(PHOTOS))
    if command == "triton":
        args += ["-o", str(tmp / "repo")]
    words = [a for a in args[1:] if a not in FAST.get(command, [])]
    names = {w.lstrip("-") for w in words} | {Path(w).name for w in words if "/" in w}
    names |= {w.split(":", 1)[-1] for w in words if w.startswith("hf-hub:")}
    return args, sorted(n for n in names if n)


ENVIRONMENT = re.compile(r"TensorRT|OpenVINO|GPU|CUDA", re.I)  # exits 3-5 name the missing runtime, not an input


def cases() -> list[tuple[str, dict]]:
    return [(command, case) for command in COMMANDS
            for case in all_pairs({"source": list(SOURCE_KINDS), **build_dims(command)})]


CASES = cases()



def _id(command: str, case: dict) -> str:
    given = [f"{k}={v if not isinstance(v, list) else v[0]}" for k, v in case.items() if k != "source" and v]
    return f"{command}[{case['source']}]" + ("" if not given else "[" + ",".join(given) + "]")


@pytest.mark.parametrize("command,case", CASES, ids=[_id(*c) for c in CASES])
def test_every_combination_ends_in_a_result_or_one_sentence(command, case, sources, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # artifacts of -m/-c land in tmp_path/models (the hub cache: sources' environment)
    args, names = argv(command, case, sources, tmp_path)
    r = CliRunner().invoke(cli, args)
    shown = f"vitexport {' '.join(args)}\n-> exit {r.exit_code}\n{r.output}"
    assert r.exit_code != 70 and "this is a bug" not in r.output, shown
    assert r.exception is None or isinstance(r.exception, SystemExit), shown + repr(r.exception)
    assert "Traceback" not in r.output, shown
    assert r.exit_code in DOCUMENTED_EXITS, shown
    if r.exit_code == 0:
        return
    errors = [ln for ln in r.output.splitlines() if ln.startswith("Error:") or ln.startswith("Usage:")]
    assert errors, shown
    message = r.output[r.output.index(errors[-1]):].strip()
    if message.startswith("Usage:"):  # click's own refusal: its last line names the option
        message = message.splitlines()[-1]
    assert "\n" not in message.strip(), shown  # one sentence, not a dump
    named = any(n.lower() in message.lower() for n in names)
    assert named or (r.exit_code in (3, 4, 5) and ENVIRONMENT.search(message)), shown


def test_the_sweep_reaches_every_command_and_source():
    seen = {(c, case["source"]) for c, case in CASES}
    assert seen == set(itertools.product(COMMANDS, SOURCE_KINDS))
