"""The fault matrix of issue 13: every bad input, damaged artifact, conflicting option and interrupted run, through
the command line, with what must come out (exit code, one sentence, no traceback) and what the folder must hold
after (previous good artifacts intact, nothing partial left). docs/GUARANTEES.md points here.

The tiny digits model keeps this fast: one export and its FP16/INT8 files are made once, and each case works on
a copy. kill -9 and concurrent runs use real processes (`python -m vitexport`).
"""

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from conftest import ROOT, copy_export
from filelock import FileLock
from PIL import Image

import vitexport.preflight as preflight
from vitexport.artifacts.folder import LOCK_NAME, ModelFolder, onnx_digest
from vitexport.artifacts.verify import check_onnx
from vitexport.artifacts.workspace import find_debris
from vitexport.cli import cli
from vitexport.ensure import ensure_artifact
from vitexport.model.spec import ModelSpec
from vitexport.model.variants import DIGITS_VARIANT
from vitexport.paths import sha256_file
from vitexport.precision import CalibOptions

DIGITS = ["-m", DIGITS_VARIANT]
CHECKPOINT = ROOT / "models" / "digits" / "vit_digits_patch4_32.safetensors"
FAST_BENCH = ["--batch", "1", "--iterations", "1", "--min-time", "0", "--warmup", "0", "--backend", "onnxruntime cpu"]


# -- fixtures and checks --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def made(tmp_path_factory, digits_export):
    """The digits model exported, with FP16 (both graphs) and INT8 made (without their parity check: not what is
    tested)."""
    root = tmp_path_factory.mktemp("faults")
    folder = copy_export(digits_export, root / "model")
    for kind in ("fp16", "fp16-trt", "int8"):
        ensure_artifact(folder, kind, calib=CalibOptions(samples=24, check=False))
    data = root / "data"  # 2 held-out images per class, unlabelled (flat): bench parity in a second, and no
    data.mkdir()  # accuracy bound that 20 images are too few to decide (the faults are what is tested here)
    for cls in sorted((ROOT / "calibration" / "digits" / "heldout").iterdir())[:10]:
        for f in sorted(cls.iterdir())[:2]:
            shutil.copy(f, data / f"{cls.name}-{f.name}")
    return root


@pytest.fixture
def folder(made, tmp_path):
    shutil.copytree(made / "model", tmp_path / "m", ignore=shutil.ignore_patterns(LOCK_NAME))
    return tmp_path / "m"


@pytest.fixture
def data(made):
    return made / "data"


def _run(*args, env=None):
    return CliRunner().invoke(cli, [str(a) for a in args], env=env)


def _state(folder):
    """The folder's files and their digests (hidden files too, the lock aside)."""
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(Path(folder).rglob("*"))
            if p.is_file() and p.name != LOCK_NAME}


def _one_sentence(r, code, *needles):
    """Exit `code`, no traceback, and the error is one line (the last) holding every needle."""
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("Error: "), r.output
    for needle in needles:
        assert needle.lower() in last.lower(), (needle, last)
    return last


def _never(monkeypatch, module, name):
    """Make module.name fail the test if it is called; returns the (empty) list of its calls."""
    calls = []

    def never(*args, **kwargs):
        calls.append(name)
        pytest.fail(f"{module.__name__}.{name} ran: the run should have been refused before any work")

    monkeypatch.setattr(module, name, never)
    return calls


def _clean(folder):
    """Nothing partial: no leftovers of a run, no hidden file but the lock."""
    assert not find_debris(ModelFolder(folder)), find_debris(ModelFolder(folder))
    assert not [p.name for p in Path(folder).rglob(".*") if p.name != LOCK_NAME]


# -- wrong artifacts never pass ------------------------------------------------------------------------------

def test_bench_fails_a_model_onnx_of_random_bytes(folder, data):
    (folder / "model.onnx").write_bytes(os.urandom(4096))
    r = _run("bench", folder, "--data", data, "--strict", *FAST_BENCH)
    _one_sentence(r, 1, "model.onnx", "does not match manifest.json")
    assert "FAIL" in r.output and "onnxruntime cpu fp32: not run: model.onnx" in r.output


def test_bench_fails_a_model_onnx_of_another_export(folder, data):
    model = onnx.load(str(folder / "model.onnx"))  # a valid graph with other weights: another model
    w = next(i for i in model.graph.initializer if len(i.float_data) or len(i.raw_data) > 64)
    arr = onnx.numpy_helper.to_array(w) + 0.5
    w.CopyFrom(onnx.numpy_helper.from_array(arr.astype(np.float32), w.name))
    onnx.save_model(model, str(folder / "model.onnx"))
    r = _run("bench", folder, "--data", data, "--strict", "--no-prepare", *FAST_BENCH)
    _one_sentence(r, 1, "model.onnx", "sha256 differs")


def test_bench_fails_a_garbage_int8_with_no_prepare(folder, data):
    (folder / "model.int8.onnx").write_bytes(b"\x08\x07garbage" * 100)
    r = _run("bench", folder, "--data", data, "--strict", "--no-prepare", *FAST_BENCH)
    _one_sentence(r, 1, "model.int8.onnx", "does not match its record")
    lenient = _run("bench", folder, "--data", data, "--no-prepare", *FAST_BENCH)
    assert lenient.exit_code == 0 and "--strict makes this exit 1" in lenient.output


def test_bench_passes_with_absent_optional_backends_listed_once(folder, data):
    (folder / "model.fp16.onnx").unlink()  # genuinely absent, like the GPU and TensorRT on this machine
    r = _run("bench", folder, "--data", data, "--strict", "--no-prepare", *FAST_BENCH)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert sum("onnxruntime cpu fp16: unavailable" in line for line in lines) == 1
    unavailable = [line for line in lines if ": unavailable:" in line]
    assert unavailable and len(unavailable) == len(set(unavailable))  # each once, not also as progress


def test_bench_remakes_a_garbage_int8_when_preparing(folder, data):
    (folder / "model.int8.onnx").write_bytes(b"garbage")
    r = _run("bench", folder, "--data", data, "--strict", *FAST_BENCH, "--backend", "int8")
    assert r.exit_code == 0, r.output
    assert check_onnx(ModelFolder(folder), "int8").ok


def test_a_plan_that_is_not_its_sidecars_fails_even_without_a_gpu(folder, data):
    plan = folder / "model.fp16.plan"
    plan.write_bytes(b"a serialized engine")
    source = ModelFolder(folder).plan_source("fp16")
    (folder / "model.fp16.plan.json").write_text(json.dumps({
        "tensorrt": "10.9", "gpu": {"name": "GPU", "compute_capability": "9.0"}, "precision": "fp16", "profile": {},
        "plan_sha256": sha256_file(plan), "source_onnx": source.name, "source_onnx_sha256": onnx_digest(source)}))
    assert re.search(r"ok +model\.fp16\.plan", _run("info", folder).output)
    plan.write_bytes(b"another engine")
    r = _run("bench", folder, "--data", data, "--strict", "--no-prepare", *FAST_BENCH)
    _one_sentence(r, 1, "model.fp16.plan", "is not the plan model.fp16.plan.json describes")


def test_trt_without_tensorrt_exits_4_and_keeps_the_onnx(folder):
    r = _run("trt", "--fp16", folder)
    if r.exit_code == 0:
        pytest.skip("TensorRT and a GPU are here: the engine was built")
    _one_sentence(r, r.exit_code, "TensorRT" if r.exit_code == 4 else "GPU")
    assert r.exit_code in (4, 5) and check_onnx(ModelFolder(folder), "fp16").ok
    _clean(folder)


@pytest.mark.parametrize("command", [["quantize", "--fp16"], ["trt", "--fp32"], ["info"]])
def test_commands_refuse_a_wrong_model_onnx(folder, command):
    (folder / "model.onnx").write_bytes(os.urandom(1000))
    before = _state(folder)
    r = _run(*command, folder)
    if command == ["info"]:
        assert "BROKEN" in r.output and "model.onnx" in r.output
        _one_sentence(r, 1, "1 problem(s) found")
    else:
        _one_sentence(r, 2, "model.onnx", "does not match manifest.json", "vitexport onnx")
    assert _state(folder) == before


def test_a_corrupt_manifest_does_not_bypass_force(folder):
    (folder / "manifest.json").write_text("{ not json")
    before = _state(folder)
    r = _run("onnx", *DIGITS, "-o", folder, "-q")
    _one_sentence(r, 2, "manifest cannot be read", "--force")
    assert _state(folder) == before  # model.onnx and the FP16/INT8 files are still there


@pytest.mark.parametrize("edit, needle", [
    (lambda m: m["config"].pop("embed_dim"), "lacks the field 'config.embed_dim'"),
    (lambda m: m.pop("opset"), "lacks the field 'opset'"),
    (lambda m: m.update(format="vitexport-manifest/9"), "cannot read"),
])
def test_a_manifest_missing_a_field_or_of_another_version_is_one_sentence(folder, edit, needle):
    manifest = json.loads((folder / "manifest.json").read_text())
    edit(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    before = _state(folder)
    for command in (["quantize", "--fp16"], ["bench", "--no-prepare"], ["info"]):
        _one_sentence(_run(*command, folder), 2, needle)
    assert _state(folder) == before


# -- bad input: one sentence, nothing written ----------------------------------------------------------------

def test_a_truncated_safetensors_checkpoint(tmp_path):
    bad = tmp_path / "cut.safetensors"
    bad.write_bytes(CHECKPOINT.read_bytes()[:20000])
    _one_sentence(_run("onnx", *DIGITS, "-c", bad, "-o", tmp_path / "out"), 2, "not a complete .safetensors")
    assert not (tmp_path / "out" / "model.onnx").exists()


def test_a_pickle_with_code_is_never_run_and_the_message_says_how_to_convert(tmp_path):
    import torch

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    torch.save({"w": Evil()}, tmp_path / "evil.pth")
    last = _one_sentence(_run("onnx", *DIGITS, "-c", tmp_path / "evil.pth", "-o", tmp_path / "o"), 2, "safetensors")
    assert not marker.exists() and "weights_only=False" not in last and last.endswith(".")


def test_an_opset_onnx_does_not_know(tmp_path, monkeypatch):
    import vitexport.exporter.run as export_run

    ran = _never(monkeypatch, export_run, "build")  # refused before any model is built
    _one_sentence(_run("onnx", *DIGITS, "--opset", "99", "-o", tmp_path / "o"), 2, "--opset 99", "at most")
    assert not ran and not (tmp_path / "o").exists()


def test_a_decompression_bomb_image(folder, tmp_path):
    (tmp_path / "big").mkdir()
    Image.new("L", (16000, 16000)).save(tmp_path / "big" / "huge.png")
    before = _state(folder)
    _one_sentence(_run("quantize", "--fp16", folder, "--check-data", tmp_path / "big"), 2, "huge.png",
                  "too large to decode safely")
    assert _state(folder) == before
    _clean(folder)


def test_a_damaged_image_ends_with_what_to_do(folder, tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.jpg").write_bytes(os.urandom(300))
    last = _one_sentence(_run("quantize", "--fp16", folder, "--check-data", tmp_path / "bad"), 2, "x.jpg")
    assert "remove it from the folder" in last and not re.search(r"\b[A-Z]\w+Error\.$", last)


def test_a_non_utf8_file_name_in_a_calibration_folder(folder, tmp_path):
    calib = tmp_path / "calib"
    calib.mkdir()
    for i, f in enumerate(sorted((ROOT / "calibration" / "digits" / "calib").rglob("*.png"))[:16]):
        shutil.copy(f, calib / f"{i}.png")
    os.rename(calib / "0.png", os.fsencode(calib) + b"/\xff\xfe.png")
    r = _run("quantize", "--int8", folder, "--calib-data", calib, "--no-check")
    assert r.exit_code == 0, r.output
    assert check_onnx(ModelFolder(folder), "int8").ok
    _clean(folder)


@pytest.mark.parametrize("command", [["quantize", "--fp16", "--check-data"], ["quantize", "--int8", "--no-check",
                                                                              "--calib-data"]])
def test_an_npy_full_of_nan(folder, tmp_path, command):
    np.save(tmp_path / "nan.npy", np.full((4, 3, 32, 32), np.nan, np.float32))
    before = _state(folder)
    _one_sentence(_run(*command[:2], folder, *command[2:], tmp_path / "nan.npy"), 2, "NaN")
    assert _state(folder) == before


def test_a_calibration_cache_of_valid_json_with_wrong_content(folder):
    cache = next((folder / "calib-cache").glob("*.json"))
    cache.write_text(json.dumps({"hello": "world"}))
    r = _run("quantize", "--int8", folder, "--calib-samples", "24", "--no-check")
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    assert "damaged or incomplete" in r.output and "Reusing calibration cache" not in r.output
    assert "hello" not in cache.read_text()  # replaced by a whole cache: the next run reuses it
    again = _run("quantize", "--int8", folder, "--calib-samples", "24", "--no-check")
    assert again.exit_code == 0 and "Reusing calibration cache" in again.output


def test_an_immutable_folder_names_the_real_file(folder):
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)]).returncode != 0:
        pytest.skip("chattr +i is not available here")
    try:
        before = _state(folder)
        last = _one_sentence(_run("quantize", "--fp16", folder, "--no-check"), 2, f"Cannot write in {folder}:",
                             "immutable")  # not even the lock can be made
        subprocess.run(["chattr", "-i", str(folder)])
        (folder / LOCK_NAME).touch()  # a folder written before it was made immutable
        subprocess.run(["chattr", "+i", str(folder)])
        last = _one_sentence(_run("quantize", "--fp16", folder, "--no-check"), 2,
                             f"Could not write {folder / 'model.fp16.onnx'}:", "immutable")
        assert ".vx" not in last
        assert _state(folder) == before
    finally:
        subprocess.run(["chattr", "-i", str(folder)])


def test_a_file_size_limit_names_the_real_file_and_keeps_the_previous_one(folder):
    before = _state(folder)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, hard))  # the FP16 graph is ~300 KB
    try:
        r = _run("quantize", "--fp16", folder, "--no-check")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    last = _one_sentence(r, 2, f"{folder / 'model.fp16.onnx'}", "file-size limit")
    assert ".vx" not in last
    # the tensors' ranges were measured (and cached, whole) before the graph could not be written: only they are new
    after = _state(folder)
    assert {k: v for k, v in after.items() if k in before or not k.startswith("calib-cache/")} == before
    assert all(json.loads((folder / k).read_text())["format"] == "vitexport-ranges/1" for k in after if k not in before)
    _clean(folder)


# -- limits before work ---------------------------------------------------------------------------------------

def _vit(name=None, **kwargs):
    """timm's own model of that name (or its VisionTransformer of these arguments), on the meta device (shapes
    only), and its parameter count."""
    import timm
    import torch
    from timm.models.vision_transformer import VisionTransformer

    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False, **kwargs) if name else VisionTransformer(**kwargs)
    return model, sum(p.numel() for p in model.parameters())


def _needed(last):
    """The bytes a refusal says a run needs ('needs about 38.0 GB')."""
    number, unit = re.search(r"needs about ([\d.]+) (B|KB|MB|GB|TB|PB)\b", last).groups()
    return float(number) * 1000 ** ["B", "KB", "MB", "GB", "TB", "PB"].index(unit)


def test_an_img_size_that_cannot_fit_is_refused_before_any_work(tmp_path, monkeypatch):
    import vitexport.exporter.run as export_run

    assert preflight.mem_available() is not None  # read from /proc/meminfo
    ran = _never(monkeypatch, export_run, "build")
    r = _run("onnx", "-m", "vit_base_patch16_224", "--img-size", "8192", "-o", tmp_path / "o")
    last = _one_sentence(r, 2, "--img-size 8192x8192 needs about", "of memory", "available")
    assert not ran and not (tmp_path / "o").exists()
    ref, _ = _vit("vit_base_patch16_224", img_size=8192)
    tokens = ref.patch_embed.num_patches + ref.num_prefix_tokens
    assert f"({tokens:,} tokens" in last
    # at least one image's attention probabilities of one block, in float32 (timm's shapes)
    assert _needed(last) >= 4 * ref.blocks[0].attn.num_heads * tokens ** 2


def test_a_bench_batch_that_cannot_fit_is_refused_before_any_work(folder, monkeypatch):
    import vitexport.benchmark.run as bench_run

    monkeypatch.setattr(preflight, "mem_available", lambda: 16 * 10**9)  # the same answer on any machine
    ran = _never(monkeypatch, bench_run, "prepare_bench") + _never(monkeypatch, bench_run, "run_bench")
    r = _run("bench", folder, "--batch", "100000")
    last = _one_sentence(r, 2, "--batch 100000 needs about", "16.0 GB is available", "use --batch")
    assert not ran
    cfg = ModelFolder(folder).read_manifest().config
    _, params = _vit(img_size=tuple(cfg["img_size"]), patch_size=tuple(cfg["patch_size"]), in_chans=cfg["in_chans"],
                     embed_dim=cfg["embed_dim"], depth=cfg["depth"], num_heads=cfg["num_heads"],
                     mlp_ratio=cfg["mlp_ratio"], num_classes=cfg["num_classes"])  # the digits model's shape
    assert f"{preflight.human(4 * params)} of weights" in last
    assert _needed(last) > 16 * 10**9 and _needed(last) >= 100000 * 4 * 3 * cfg["img_size"][0] * cfg["img_size"][1]


@pytest.mark.parametrize("name, kwargs", [
    (f"vit_{size}_patch16_{px}", {}) for size in ("tiny", "small", "base", "large") for px in (224, 384)
] + [("vit_base_patch16_224", {"img_size": (384, 512), "num_classes": 10}),
     ("vit_small_patch16_224", {"num_classes": 0})])
def test_the_estimate_counts_the_weights_timm_builds(name, kwargs):
    ref, params = _vit(name, **kwargs)
    spec = ModelSpec(name, img_size=kwargs.get("img_size"), num_classes=kwargs.get("num_classes"))
    weights, per_image, tokens = preflight.vit_memory(preflight.spec_config(spec))
    assert weights == 4 * params, (weights // 4, params)
    assert tokens == ref.patch_embed.num_patches + ref.num_prefix_tokens
    assert per_image >= 4 * ref.blocks[0].attn.num_heads * tokens ** 2  # one block's attention probabilities


def test_the_estimate_lets_ordinary_runs_through():
    for variant, batch in (("vit_base_patch16_224", 32), ("vit_large_patch16_384", 8)):
        preflight.require_memory(preflight.spec_config(ModelSpec(variant)), batch, "--batch", variant, "",
                                 available=16 * 10**9)


# -- options: conflicting or meaningless ----------------------------------------------------------------------

@pytest.mark.parametrize("args, needle", [
    (["quantize", "--fp16", "--int8"], "--fp16 and --int8 exclude each other"),
    (["trt", "--fp16", "--int8"], "--fp16 and --int8 exclude each other"),
    (["bench", "--threshold", "int8.cos_min=nan"], "not a finite number"),
    (["bench", "--threshold", "fp16.cos_min=2"], "in [-1, 1]"),
    (["onnx", "--atol", "-1"], "not in the range"),
    (["onnx", "--atol", "nan"], "not a finite number"),
])
def test_conflicting_or_meaningless_options(args, needle):
    r = _run(*args)
    assert r.exit_code == 2 and "Traceback" not in r.output and needle in r.output, r.output


def test_an_unknown_keep_fp32_op_type(folder):
    before = _state(folder)
    _one_sentence(_run("quantize", "--fp16", folder, "--keep-fp32", "LayerNorm", "--no-check"), 2,
                  "--keep-fp32 LayerNorm", "no ONNX operator", "LayerNormalization")
    assert _state(folder) == before


def test_the_model_names_are_listed_once():
    """`vitexport models` lists them (timm's 179 architectures): no command's help repeats them."""
    assert "vit_huge_patch14_224" in _run("models").output
    assert "vit_small_patch14_reg4_dinov2" in _run("models", "dinov2").output
    for command in ("onnx", "quantize", "trt", "bench"):
        assert "vit_huge_patch14_224" not in _run(command, "--help").output


# -- the error contract ---------------------------------------------------------------------------------------

def test_debug_shows_the_library_traceback(tmp_path):
    bad = tmp_path / "cut.safetensors"
    bad.write_bytes(CHECKPOINT.read_bytes()[:20000])
    for args, env in ((["--debug"], None), ([], {"VITEXPORT_DEBUG": "1"})):
        r = _run(*args, "onnx", *DIGITS, "-c", bad, "-o", tmp_path / "o", env=env)
        assert r.exit_code == 2 and "Traceback" in r.output and "SafetensorError" in r.output
        assert r.output.strip().splitlines()[-1].startswith("Error: Checkpoint")


def test_a_bug_is_one_line_that_says_how_to_report_it(folder, monkeypatch):
    import vitexport.artifacts.status as status

    def broken(_folder):
        raise KeyError("oops")

    monkeypatch.setattr(status, "folder_status", broken)
    _one_sentence(_run("info", folder), 70, "Internal error (KeyError", "--debug")


def test_an_os_error_that_reaches_a_command_names_the_real_file(folder, monkeypatch):
    import errno

    import vitexport.artifacts.status as status

    def full(_folder):
        raise OSError(errno.ENOSPC, "No space left on device", str(folder / ".model.fp16.onnx.vx12-abcd.onnx"))

    monkeypatch.setattr(status, "folder_status", full)
    last = _one_sentence(_run("info", folder), 2, f"{folder / 'model.fp16.onnx'}: no space is left on the device")
    assert ".vx" not in last


def test_ctrl_c_keeps_nothing_partial(folder, monkeypatch):
    import vitexport.precision.convert as convert

    def interrupted(*args, **kwargs):
        Path(args[1]).write_bytes(b"half a graph")
        raise KeyboardInterrupt

    monkeypatch.setattr(convert, "convert_fp16", interrupted)
    before = _state(folder)
    _one_sentence(_run("quantize", "--fp16", folder, "--no-check"), 130, "Interrupted")
    after = _state(folder)  # the ranges measured (and cached, whole) before the interruption may stay; nothing else
    assert {k: v for k, v in after.items() if k in before or not k.startswith("calib-cache/")} == before
    _clean(folder)


# -- crash safety: leftovers, the lock, kill -9 ---------------------------------------------------------------

def test_leftovers_are_reported_by_readers_and_removed_by_writers(folder, data):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (folder / f".model.onnx.vx{dead.pid}-abcd1234.onnx").write_bytes(b"half")
    (folder / f".vx{dead.pid}-tmpabcd").mkdir()
    (folder / ".model.int8.onnx.k3j4h5g6.int8.onnx").write_bytes(b"")  # named by an earlier version
    (folder / ".export-1a2b3c").mkdir()
    info = _run("info", folder)
    assert info.exit_code == 0 and info.output.count("LEFTOVER") == 4, info.output
    bench = _run("bench", folder, "--data", data, "--no-prepare", *FAST_BENCH)
    assert bench.exit_code == 0 and "4 leftover(s)" in bench.output
    r = _run("quantize", "--fp16", folder, "--no-check")
    assert r.exit_code == 0 and "Removed 4 leftover(s)" in r.output, r.output
    _clean(folder)


def test_info_clean_removes_stale_files_and_keeps_the_export(folder):
    f = ModelFolder(folder)
    manifest = f.read_manifest()
    manifest.precisions["fp16"].source_sha256 = "0" * 64  # made from an earlier export
    f.write_manifest(manifest)
    (folder / "model.fp16.plan.json").write_text("{}")  # a sidecar without its plan
    r = _run("info", folder)
    assert "STALE" in r.output and "was made from an earlier model.onnx" in r.output
    _one_sentence(r, 1, "2 problem(s)")
    good = {n: h for n, h in _state(folder).items() if n in ("model.onnx", "model.int8.onnx")}
    cleaned = _run("info", "--clean", folder)
    assert cleaned.exit_code == 0, cleaned.output
    assert not (folder / "model.fp16.onnx").exists() and not (folder / "model.fp16.plan.json").exists()
    assert "fp16" not in f.read_manifest().precisions
    assert {n: h for n, h in _state(folder).items() if n in good} == good
    assert re.search(r"ok +model\.onnx .* sha256 [0-9a-f]{64}", cleaned.output)


def test_a_writer_waits_for_the_lock_and_times_out_in_one_sentence(folder):
    holder = FileLock(str(folder / LOCK_NAME))
    holder.acquire()
    (folder / ".vitexport.owner").write_text(json.dumps({"pid": 4242, "command": "vitexport quantize --int8",
                                                         "since": "12:00:00"}))
    try:
        before = _state(folder)
        r = _run("--lock-timeout", "0.3", "quantize", "--fp16", folder, "--no-check")
        assert "is being written by pid 4242 (vitexport quantize --int8" in r.output
        _one_sentence(r, 2, "still being written by pid 4242", "--lock-timeout")
        assert _state(folder) == before
    finally:
        holder.release()
        (folder / ".vitexport.owner").unlink()


def _vitexport(*args):
    return subprocess.Popen([sys.executable, "-m", "vitexport", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_two_writers_of_one_folder_take_turns(folder):
    holder = FileLock(str(folder / LOCK_NAME))
    holder.acquire()  # both processes must find the folder busy, held by this process as a vitexport run would
    (folder / ".vitexport.owner").write_text(json.dumps({"pid": os.getpid(), "command": "vitexport onnx",
                                                         "since": "12:00:00"}))
    procs = [_vitexport("quantize", "--int8", folder, "--calib-samples", "16", "--no-check") for _ in range(2)]
    waiting = [threading.Event() for _ in procs]
    errs: list[list[str]] = [[], []]

    def read(i):
        for line in procs[i].stderr:
            errs[i].append(line)
            if "is being written by" in line:
                waiting[i].set()

    threads = [threading.Thread(target=read, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        assert all(w.wait(120) for w in waiting), errs
    finally:
        (folder / ".vitexport.owner").unlink()
        holder.release()
    for p, t in zip(procs, threads):
        p.wait(120)
        t.join()
    assert [p.returncode for p in procs] == [0, 0], errs
    assert all(f"pid {os.getpid()}" in "".join(e) for e in errs)
    assert check_onnx(ModelFolder(folder), "int8").ok
    _clean(folder)


def _kill_when(proc, folder, pattern):
    """SIGKILL `proc` once a file matching `pattern` appears in `folder`; the names seen then."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        names = [p.name for p in Path(folder).iterdir()]
        if any(re.match(pattern, n) for n in names):
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return names
        time.sleep(0.005)
    proc.kill()
    pytest.fail(f"{pattern} never appeared: {proc.communicate()}")


@pytest.mark.parametrize("args, staging", [
    (["onnx", *DIGITS, "-o"], r"\.model\.onnx\.vx\d+-"),
    (["quantize", "--int8", "--calib-samples", "16", "--no-check"], r"\.model\.int8\.onnx\.vx\d+-"),
])
def test_kill_9_leaves_the_good_files_and_the_next_run_cleans_up(folder, args, staging):
    before = _state(folder)
    _kill_when(_vitexport(*args, folder), folder, staging)
    assert find_debris(ModelFolder(folder))  # the killed run's temporaries ...
    assert {n: h for n, h in _state(folder).items() if not n.startswith(".")} == \
        {n: h for n, h in before.items() if not n.startswith(".")}  # ... and every good file as it was
    r = _run("quantize", "--int8", folder, "--calib-samples", "16", "--no-check")
    assert r.exit_code == 0 and "leftover(s) of an interrupted run" in r.output, r.output
    assert check_onnx(ModelFolder(folder), "fp32").ok and check_onnx(ModelFolder(folder), "int8").ok
    _clean(folder)
