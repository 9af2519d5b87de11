"""Odd images and odd data folders: each image works or is one sentence naming it; calibration and bench leave
out what cannot be used and say how many and why, never silently; nothing in a data folder makes vitexport read
outside it; a model name typed where a model folder belongs is told where it goes. docs/GUARANTEES.md points here.

Oracles are the images' own pixels, made here with known colours (a CMYK cyan is RGB (0, 255, 255), a transparent
pixel is composited on white, an animated file's first frame is its first colour), and the digits model's
held-out images for the command-line cases.
"""

import io
import json
import os
import shutil
import stat

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import ROOT, copy_export, fails_cleanly
from PIL import Image, features

from vitexport.artifacts.folder import LOCK_NAME, OWNER_NAME, ModelFolder
from vitexport.cli import cli
from vitexport.data.images import LINK_OUT, ImageError, Skipped, decode_crop, list_images
from vitexport.data.preprocess import Preprocess
from vitexport.data.stream import InputCache, open_images

PP = Preprocess(input_size=(16, 16), crop_pct=1.0, interpolation="nearest", mean=(0.0, 0.0, 0.0),
                std=(1.0, 1.0, 1.0))
FAST_BENCH = ["--batch", "1", "--iterations", "1", "--min-time", "0", "--warmup", "0", "--backend", "onnxruntime cpu"]
HELDOUT = ROOT / "calibration" / "digits" / "heldout"


def _flat(img):
    """The crop's pixels, as a set of RGB tuples."""
    return {tuple(int(v) for v in px) for px in img.reshape(-1, 3)}


# -- each odd image decodes to what it shows ------------------------------------------------------------------

def test_a_cmyk_jpeg_is_converted_to_rgb(tmp_path):
    Image.new("CMYK", (32, 32), (255, 0, 0, 0)).save(tmp_path / "c.jpg", quality=100)
    (r, g, b), = {tuple(int(round(v / 16)) * 16 for v in px) for px in decode_crop(tmp_path / "c.jpg", PP).reshape(-1, 3)}
    assert r < 16 and g >= 240 and b >= 240  # cyan


def test_a_palette_png_with_transparency_is_composited_on_white(tmp_path):
    img = Image.new("P", (32, 32), 0)
    img.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    img.paste(1, (0, 0, 32, 16))  # top half red, bottom half palette index 0, which is transparent
    img.save(tmp_path / "p.png", transparency=0)
    crop = decode_crop(tmp_path / "p.png", PP)
    assert _flat(crop[:8]) == {(255, 0, 0)} and _flat(crop[8:]) == {(255, 255, 255)}


def test_la_and_one_bit_pngs(tmp_path):
    la = Image.new("LA", (32, 32), (0, 255))
    la.paste((0, 0), (0, 16, 32, 32))  # bottom half fully transparent
    la.save(tmp_path / "la.png")
    crop = decode_crop(tmp_path / "la.png", PP)
    assert _flat(crop[:8]) == {(0, 0, 0)} and _flat(crop[8:]) == {(255, 255, 255)}
    bw = Image.new("1", (32, 32), 0)
    bw.paste(1, (16, 0, 32, 32))
    bw.save(tmp_path / "bw.png")
    crop = decode_crop(tmp_path / "bw.png", PP)
    assert _flat(crop[:, :8]) == {(0, 0, 0)} and _flat(crop[:, 8:]) == {(255, 255, 255)}


@pytest.mark.parametrize("suffix", [".gif", ".webp"])
def test_an_animated_image_gives_its_first_frame(tmp_path, suffix):
    if suffix == ".webp" and not features.check("webp"):
        pytest.skip("this Pillow has no WebP")
    frames = [Image.new("RGB", (32, 32), c) for c in ((0, 0, 255), (255, 0, 0), (0, 255, 0))]
    path = tmp_path / f"a{suffix}"
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=50, loop=0, **(
        {"lossless": True} if suffix == ".webp" else {}))
    with Image.open(path) as check:
        assert getattr(check, "n_frames", 1) == 3  # really animated
    assert _flat(decode_crop(path, PP)) == {(0, 0, 255)}


@pytest.mark.parametrize("kind", ["png", "jpeg"])
def test_a_truncated_image_is_one_sentence_naming_it(tmp_path, kind):
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buf, kind)
    path = tmp_path / f"t.{kind}"
    path.write_bytes(buf.getvalue()[:len(buf.getvalue()) // 2])
    with pytest.raises(ImageError) as e:
        decode_crop(path, PP)
    assert e.value.kind == "damaged" and str(path) in str(e.value) and "\n" not in str(e.value)


def test_very_large_dimensions_are_refused_before_decoding(tmp_path, monkeypatch):
    from PIL import ImageFile

    Image.new("L", (16000, 16000)).save(tmp_path / "huge.png")  # 256 Mpx: over Pillow's bomb limit
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: pytest.fail("the pixels were decoded"))
    with pytest.raises(ImageError) as e:
        decode_crop(tmp_path / "huge.png", PP)
    assert e.value.kind == "too large" and "downscale it" in str(e.value)


def test_an_unreadable_image_says_so(tmp_path, monkeypatch):
    path = tmp_path / "locked.png"
    Image.new("RGB", (32, 32)).save(path)
    if os.geteuid() == 0:  # root reads any file: make the open itself fail as a permission error does
        import PIL.Image

        real = PIL.Image.open
        monkeypatch.setattr(PIL.Image, "open", lambda p, *a, **k: (_ for _ in ()).throw(
            PermissionError(13, "Permission denied", str(p))) if str(p) == str(path) else real(p, *a, **k))
    else:
        path.chmod(0)
    with pytest.raises(ImageError) as e:
        decode_crop(path, PP)
    assert e.value.kind == "unreadable" and "permission denied" in str(e.value) and "check its permissions" in str(e.value)


# -- data folders: links, loops, FIFOs, unreadable folders ------------------------------------------------------

def _png(path, colour=(10, 20, 30)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (32, 32), colour).save(path)


def _truncated(path):
    """A real PNG of noise cut in half: it opens, and its pixel data ends early."""
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buf, "png")
    path.write_bytes(buf.getvalue()[:len(buf.getvalue()) // 2])


def test_links_loops_and_special_files_are_listed_as_skipped(tmp_path):
    root, outside = tmp_path / "data", tmp_path / "outside"
    _png(root / "a" / "1.png")
    _png(root / "b" / "2.png")
    _png(outside / "secret.png")
    (root / "a" / "loop").symlink_to(root)  # a loop
    (root / "b" / "same.png").symlink_to(root / "a" / "1.png")  # a link inside: read
    (root / "out.png").symlink_to(outside / "secret.png")  # a link out: never read
    (root / "outdir").symlink_to(outside)  # a folder link out
    (root / "broken.png").symlink_to(root / "nowhere.png")
    os.mkfifo(root / "pipe.png")  # opening it would block forever
    (root / "notes.txt").write_text("not an image")
    skipped = Skipped()
    files = list_images(root, skipped)
    assert [f.relative_to(root).as_posix() for f in files] == ["a/1.png", "b/2.png", "b/same.png"]
    kinds = {os.path.basename(p): k for p, k, _ in skipped.entries}
    assert kinds == {"loop": "link to a folder", "out.png": LINK_OUT, "outdir": LINK_OUT,
                     "broken.png": "not a regular file", "pipe.png": "not a regular file"}
    assert str(outside) not in {str(f.resolve().parent) for f in files}


def test_an_unreadable_folder_is_skipped_and_said(tmp_path, monkeypatch):
    root = tmp_path / "data"
    _png(root / "ok" / "1.png")
    _png(root / "locked" / "2.png")
    if os.geteuid() == 0:
        real = os.scandir
        monkeypatch.setattr(os, "scandir", lambda p: (_ for _ in ()).throw(PermissionError(13, "Permission denied",
                            str(p))) if str(p).endswith("locked") else real(p))
    else:
        (root / "locked").chmod(0)
    skipped = Skipped()
    assert [f.name for f in list_images(root, skipped)] == ["1.png"]
    assert skipped.entries == [(str(root / "locked"), "unreadable folder", "permission denied")]
    (root / "locked").chmod(stat.S_IRWXU)


def test_a_deep_tree_is_listed_without_recursion(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    for i in range(1100):  # deeper than Python's recursion limit
        d = d / "d"
        d.mkdir()
    Image.new("RGB", (8, 8)).save(d / "x.png")
    try:
        assert len(list_images(tmp_path / "data")) == 1
    finally:  # removed bottom up: a recursive removal would hit the same limit
        (d / "x.png").unlink()
        while d != tmp_path:
            d.rmdir()
            d = d.parent


def test_the_cache_leaves_out_what_cannot_be_decoded_and_keeps_labels_in_step(tmp_path):
    root = tmp_path / "data"
    for cls, colour in (("0", (0, 0, 0)), ("1", (255, 255, 255))):
        for i in range(3):
            _png(root / cls / f"{i}.png", colour)
    _truncated(root / "0" / "1.png")
    (root / "1" / "0.png").write_bytes(b"")
    images = open_images(root)
    with InputCache(images, PP, workers=2) as cache:
        assert cache.n == 4 and cache.kept.tolist() == [0, 2, 4, 5]
        x = np.concatenate([b for _, b in cache.batches(3)])
    assert [float(v) for v in x[:, 0, 0, 0]] == [0.0, 0.0, 1.0, 1.0]  # each kept input is its own image
    assert images.labels[cache.kept].tolist() == [0, 0, 1, 1]
    assert sorted(os.path.basename(p) for p, _, _ in images.skipped.entries) == ["0.png", "1.png"]
    assert images.skipped.kinds() == {"damaged": 2}
    assert [w for _, _, w in images.skipped.entries][1] == "the file is empty"


# -- through the command line -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model(tmp_path_factory, digits_export):
    return copy_export(digits_export, tmp_path_factory.mktemp("odd") / "m")


@pytest.fixture
def mixed(tmp_path):
    """Two held-out images per class, labelled, with a damaged file, an empty one, a link out of the folder and a
    link loop among them."""
    root, outside = tmp_path / "mixed", tmp_path / "outside"
    for cls in sorted(HELDOUT.iterdir()):
        (root / cls.name).mkdir(parents=True)
        for f in sorted(cls.iterdir())[:2]:
            shutil.copy(f, root / cls.name / f.name)
    _truncated(root / "3" / "damaged.png")
    (root / "5" / "empty.png").write_bytes(b"")
    _png(outside / "secret.png")
    (root / "7" / "out.png").symlink_to(outside / "secret.png")
    (root / "7" / "loop").symlink_to(root)
    return root


def _run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_bench_says_how_many_files_it_skipped_and_why(model, mixed, tmp_path):
    r = _run("bench", model, "--data", mixed, *FAST_BENCH, "--json", tmp_path / "b.json")
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output
    assert "Skipped 4 files of" in r.output and "every backend is judged on the other 20" in r.output.lower()
    data = json.loads((tmp_path / "b.json").read_text())["data"]
    assert data["n_parity"] == 20 and data["subset"] is False and data["labelled"] is True
    assert data["skipped"]["count"] == 4
    assert {os.path.basename(f["file"]): f["kind"] for f in data["skipped"]["files"]} == {
        "out.png": LINK_OUT, "loop": "link to a folder", "damaged.png": "damaged", "empty.png": "damaged"}
    strict = _run("bench", model, "--data", mixed, *FAST_BENCH, "--strict")
    assert strict.exit_code == 1 and strict.output.strip().splitlines()[-1].startswith("Error: 4 file(s) of")


def test_calibration_says_how_many_files_it_skipped_and_records_it(model, mixed):
    r = _run("quantize", "--int8", model, "--calib-data", mixed, "--no-check")
    assert r.exit_code == 0, r.output
    assert "Skipped 4 files of" in r.output and "Calibrated on the other 20" in r.output
    cal = ModelFolder(model).read_manifest().precisions["int8"].calibration
    assert cal.samples == 20 and cal.skipped == 2  # the two chosen images that could not be decoded
    again = _run("quantize", "--int8", model, "--calib-data", mixed, "--no-check")  # the cached ranges say it too
    assert again.exit_code == 0 and "Reusing calibration cache" in again.output
    assert "left out 4 file(s)" in again.output


def test_a_folder_of_nothing_usable_is_one_sentence_and_changes_nothing(model, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.jpg").write_bytes(os.urandom(300))
    (bad / "y.png").write_bytes(b"")
    def listing():  # the folder's files; the lock is made by the first command that touches the folder (in a
        # subset of the suite, this one), and it holds no model state
        return sorted(p.name for p in model.iterdir() if p.name not in (LOCK_NAME, OWNER_NAME))

    before = listing()
    for args in (["bench", model, "--data", bad, *FAST_BENCH], ["quantize", "--int8", model, "--calib-data", bad,
                                                                 "--no-check"]):
        r = _run(*args)
        assert r.exit_code == 2 and "Traceback" not in r.output, r.output
        last = r.output.strip().splitlines()[-1]
        assert last.startswith("Error: None of the 2") and "x.jpg" in last and "y.png" in last, last
    assert listing() == before


def test_predict_names_the_file_it_cannot_read(model, mixed):
    r = _run("predict", model, mixed / "3" / "damaged.png")
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.output.strip().splitlines()[-1].startswith(f"Error: Cannot read image {mixed / '3' / 'damaged.png'}")
    r = _run("predict", model, mixed / "7")
    assert r.exit_code == 2 and "link out of the folder" in r.output.strip().splitlines()[-1]


def test_every_odd_image_through_bench(model, tmp_path, monkeypatch):
    """The matrix above through the command line: a labelled folder whose class 0 holds one of each odd but valid
    image (each decoded, so in the parity set) and class 1 the ones that cannot be used (each skipped, named,
    with its kind), beside real digits."""
    root = tmp_path / "odd"
    for cls in ("0", "1"):
        for f in sorted((HELDOUT / cls).iterdir())[:2]:
            (root / cls).mkdir(parents=True, exist_ok=True)
            shutil.copy(f, root / cls / f.name)
    good = root / "0"
    Image.new("CMYK", (40, 40), (0, 0, 0, 255)).save(good / "cmyk.jpg")
    pal = Image.new("P", (40, 40), 1)
    pal.putpalette([0, 0, 0, 255, 255, 255] + [0] * 762)
    pal.save(good / "palette.png", transparency=0)
    Image.new("LA", (40, 40), (0, 128)).save(good / "la.png")
    Image.new("1", (40, 40), 1).save(good / "onebit.png")
    Image.new("I;16", (40, 40), 40000).save(good / "sixteen.png")
    frames = [Image.new("RGB", (40, 40), c) for c in ((0, 0, 0), (255, 255, 255))]
    frames[0].save(good / "anim.gif", save_all=True, append_images=frames[1:], duration=50)
    if features.check("webp"):
        frames[0].save(good / "anim.webp", save_all=True, append_images=frames[1:], duration=50, lossless=True)
    bad = root / "1"
    _truncated(bad / "truncated.png")
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(2).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buf, "jpeg")
    (bad / "truncated.jpg").write_bytes(buf.getvalue()[:300])
    Image.new("L", (16000, 16000)).save(bad / "huge.png")
    Image.new("RGB", (40, 40)).save(bad / "locked.png")
    (bad / "text.jpg").write_text("not an image")
    import PIL.Image

    real_open = PIL.Image.open  # root reads any file: the permission error a locked file gives, made here

    def open_(p, *a, **k):
        if str(p).endswith("locked.png"):
            raise PermissionError(13, "Permission denied", str(p))
        return real_open(p, *a, **k)

    monkeypatch.setattr(PIL.Image, "open", open_)
    r = _run("bench", model, "--data", root, *FAST_BENCH, "--json", tmp_path / "b.json")
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    data = json.loads((tmp_path / "b.json").read_text())["data"]
    valid = len(list(good.iterdir())) + 2
    assert data["n_parity"] == valid, data["skipped"]
    kinds = {os.path.basename(f["file"]): f["kind"] for f in data["skipped"]["files"]}
    assert kinds.pop("truncated.jpg") in ("damaged", "not an image")  # 300 bytes: perhaps not even a header
    assert kinds == {"truncated.png": "damaged", "huge.png": "too large", "locked.png": "unreadable",
                     "text.jpg": "not an image"}
    assert f"Skipped 5 files of {root}" in r.output


@pytest.mark.parametrize("args,hint", [
    (["info", "vit_tiny_patch16_224"], "export it with `vitexport onnx -m vit_tiny_patch16_224`"),
    (["quantize", "vit_tiny_patch16_224.augreg_in21k", "--int8"], "give it as -m vit_tiny_patch16_224.augreg_in21k"),
    (["predict", "vit_tiny_patch16_224", "photo.jpg"], "give it as -m vit_tiny_patch16_224"),
    (["bench", "vit_tiny_patch16_224"], "give it as -m vit_tiny_patch16_224"),
])
def test_a_model_name_where_a_folder_belongs_is_told_where_it_goes(args, hint, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, args)
    fails_cleanly(r, f"{args[1]} is a model name")
    assert hint in r.output and not (tmp_path / "models").exists()


def test_a_missing_path_that_names_no_model_just_does_not_exist(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["quantize", "no_such_folder", "--int8"])
    fails_cleanly(r, "no_such_folder does not exist.")
    assert "model name" not in r.output
