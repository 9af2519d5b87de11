"""`-c hf-hub:ORG/NAME[@REVISION]` and timm's tagged names, offline, from a Hugging Face cache folder the tests
build themselves (refs/main -> snapshots/<commit>/{config.json, model.safetensors}); timm and transformers are
the oracles for the weights."""

import hashlib
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import ROOT, fails_cleanly
from safetensors.torch import load_file, save_file

from vitexport.artifacts.folder import ModelFolder
from vitexport.cli import cli
from vitexport.errors import VitexportError
from vitexport.model.readers.hub import HubRef, origin, parse_ref
from vitexport.model.labels import class_names
from vitexport.model.spec import user_spec

TINY_REPO = "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k"
DIGITS_WEIGHTS = ROOT / "models" / "digits" / "vit_digits_patch4_32.safetensors"
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def add_repo(cache, repo_id, files, revision="main"):
    """A repository in huggingface_hub's cache layout; returns its commit hash."""
    commit = hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()
    root = cache / f"models--{repo_id.replace('/', '--')}"
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / revision).write_text(commit)
    for name, write in files.items():
        write(snap / name)
    return commit


def json_file(data):
    return lambda path: path.write_text(json.dumps(data))


def safetensors_file(state_dict):
    return lambda path: save_file({k: v.contiguous() for k, v in state_dict.items()}, path)


def timm_config(architecture, num_classes, input_size, **pretrained):
    """config.json as timm's hub repositories hold it."""
    return {"architecture": architecture, "num_classes": num_classes, "global_pool": "token",
            "pretrained_cfg": {"tag": "test", "input_size": [3, *input_size], "interpolation": "bicubic",
                               "crop_pct": 0.9, "crop_mode": "center", "mean": [0.5] * 3, "std": [0.5] * 3,
                               "num_classes": num_classes, "first_conv": "patch_embed.proj", "classifier": "head",
                               **pretrained}}


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.fixture
def timm_tiny():
    import timm

    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False).eval()


def test_onnx_from_a_timm_hub_repo_matches_timm(hub_cache, in_tmp, timm_tiny):
    """The acceptance case: offline, from the cache; the export equals timm's model with the same weights."""
    import onnxruntime as ort

    config = timm_config("vit_tiny_patch16_224", 1000, (224, 224), crop_pct=0.875, interpolation="bilinear",
                         mean=IMAGENET_MEAN, std=IMAGENET_STD)
    commit = add_repo(hub_cache, TINY_REPO, {"config.json": json_file(config),
                                             "model.safetensors": safetensors_file(timm_tiny.state_dict())})
    r = CliRunner().invoke(cli, ["onnx", "-q", "-c", f"hf-hub:{TINY_REPO}", "--check-batch", "2"])
    assert r.exit_code == 0, r.output
    folder = ModelFolder(in_tmp / "models" / "vit_tiny_patch16_224-224x224")
    m = folder.read_manifest()
    weights = hub_cache / f"models--{TINY_REPO.replace('/', '--')}" / "snapshots" / commit / "model.safetensors"
    assert (m.checkpoint.repo, m.checkpoint.revision) == (TINY_REPO, commit)
    assert m.checkpoint.sha256 == hashlib.sha256(weights.read_bytes()).hexdigest()
    # preprocessing from the config, not the variant's defaults (0.5 mean, crop 0.9, bicubic)
    assert (list(m.preprocess.mean), list(m.preprocess.std)) == (IMAGENET_MEAN, IMAGENET_STD)
    assert (m.preprocess.crop_pct, m.preprocess.interpolation) == (0.875, "bilinear")
    assert m.labels.source == "imagenet-1k" and m.num_classes == 1000

    x = torch.randn(3, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = timm_tiny(x).numpy()
    got = ort.InferenceSession(str(folder.onnx()), providers=["CPUExecutionProvider"]).run(None, {m.input_name: x.numpy()})[0]
    assert ref.std() > 0.05  # real logits, not a zero head
    assert np.abs(got - ref).max() < 1e-4


def test_timm_tagged_model_name_fetches_timm_repo(hub_cache, timm_tiny):
    add_repo(hub_cache, TINY_REPO, {"config.json": json_file(timm_config("vit_tiny_patch16_224", 1000, (224, 224))),
                                    "model.safetensors": safetensors_file(timm_tiny.state_dict())})
    spec = user_spec("vit_tiny_patch16_224.augreg_in21k_ft_in1k")
    assert spec.variant == "vit_tiny_patch16_224" and spec.checkpoint == f"hf-hub:{TINY_REPO}"
    assert origin(spec.resolved_checkpoint()) == (TINY_REPO, hashlib.sha1(f"{TINY_REPO}@main".encode()).hexdigest())
    with pytest.raises(VitexportError, match="names pretrained weights already"):
        user_spec("vit_tiny_patch16_224.augreg_in21k_ft_in1k", checkpoint="weights.pth")


def test_revision_picks_that_commit(hub_cache):
    sd = load_file(DIGITS_WEIGHTS)
    cfg = timm_config("vit_digits_patch4_32", 10, (32, 32))
    main = add_repo(hub_cache, "me/digits", {"config.json": json_file(cfg), "model.safetensors": safetensors_file(sd)})
    v2 = add_repo(hub_cache, "me/digits", {"config.json": json_file(cfg),
                                           "model.safetensors": safetensors_file({k: v * 2 for k, v in sd.items()})},
                  revision="v2")
    assert main != v2
    assert origin(user_spec(None, "hf-hub:me/digits").resolved_checkpoint())[1] == main
    assert origin(user_spec(None, "hf-hub:me/digits@v2").resolved_checkpoint())[1] == v2


def test_timm_repo_class_names_reach_the_manifest(hub_cache, in_tmp):
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    cfg = timm_config("vit_digits_patch4_32", 10, (32, 32), crop_pct=1.0, interpolation="bilinear")
    cfg["label_names"] = [f"d{i}" for i in range(10)]
    cfg["label_descriptions"] = {f"d{i}": n for i, n in enumerate(names)}
    add_repo(hub_cache, "me/digits", {"config.json": json_file(cfg),
                                      "model.safetensors": safetensors_file(load_file(DIGITS_WEIGHTS))})
    r = CliRunner().invoke(cli, ["onnx", "-q", "-c", "hf-hub:me/digits"])
    assert r.exit_code == 0, r.output
    m = ModelFolder(in_tmp / "models" / "vit_digits_patch4_32-32x32").read_manifest()
    assert m.labels.source == "checkpoint" and m.labels.names == names and class_names(m) == names
    assert (m.preprocess.crop_pct, m.preprocess.interpolation) == (1.0, "bilinear")


def test_transformers_repo_goes_through_the_huggingface_loader(hub_cache, in_tmp):
    """A transformers ViT of the digits' shape: built from its config (named after the repository), id2label kept,
    and the export equal to transformers' own forward pass."""
    import onnxruntime as ort
    transformers = pytest.importorskip("transformers")

    cfg = transformers.ViTConfig(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=128,
                                 image_size=32, patch_size=4, num_labels=10, hidden_act="gelu",
                                 id2label={i: f"digit {i}" for i in range(10)}, label2id={f"digit {i}": i for i in range(10)})
    torch.manual_seed(0)
    hf = transformers.ViTForImageClassification(cfg).eval()
    hf.save_pretrained(in_tmp / "saved")  # the file layout a transformers repository holds
    add_repo(hub_cache, "someone/vit-digits", {
        "config.json": lambda p: p.write_bytes((in_tmp / "saved" / "config.json").read_bytes()),
        "model.safetensors": lambda p: p.write_bytes((in_tmp / "saved" / "model.safetensors").read_bytes()),
        "preprocessor_config.json": json_file({"image_mean": [0.5] * 3, "image_std": [0.25] * 3, "resample": 2}),
    })
    spec = user_spec(None, "hf-hub:someone/vit-digits")
    assert spec.variant == "vit-digits" and spec.preprocess.std == (0.25, 0.25, 0.25)
    r = CliRunner().invoke(cli, ["onnx", "-q", "-c", "hf-hub:someone/vit-digits"])
    assert r.exit_code == 0, r.output
    folder = ModelFolder(in_tmp / "models" / "vit-digits-32x32")
    m = folder.read_manifest()
    assert m.checkpoint.format == "hf-vit" and m.checkpoint.repo == "someone/vit-digits"
    assert m.labels.names == [f"digit {i}" for i in range(10)]
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = hf(pixel_values=x).logits.numpy()
    got = ort.InferenceSession(str(folder.onnx()), providers=["CPUExecutionProvider"]).run(None, {m.input_name: x.numpy()})[0]
    assert np.abs(got - ref).max() < 1e-4


def test_uncached_repo_offline_is_one_sentence(hub_cache, in_tmp):
    r = CliRunner().invoke(cli, ["onnx", "-c", "hf-hub:nobody/no-such-model"])
    fails_cleanly(r, "not in the Hugging Face cache")
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    assert "HF_HUB_OFFLINE" in r.output and "hf download nobody/no-such-model" in r.output
    assert not (in_tmp / "models").exists()


def test_cached_repo_without_the_revision_or_weights(hub_cache, in_tmp):
    add_repo(hub_cache, "me/configonly", {"config.json": json_file(timm_config("vit_digits_patch4_32", 10, (32, 32)))})
    for args, needle in [(["-c", "hf-hub:me/configonly"], "none of model.safetensors"),
                         (["-c", "hf-hub:me/configonly@v9"], "other files or revisions"),
                         (["-c", "hf-hub:not-a-ref"], "hf-hub:ORG/NAME"),
                         (["-m", "vit_nope.tag"], "is not one of")]:
        r = CliRunner().invoke(cli, ["onnx", *args])
        fails_cleanly(r, needle)


def test_unknown_architecture_and_model_args_are_refused(hub_cache):
    add_repo(hub_cache, "me/eva", {"config.json": json_file(timm_config("eva03_tiny_patch14_224", 1000,
                                                                         (224, 224))),
                                   "model.safetensors": safetensors_file({"x": torch.zeros(1)})})
    with pytest.raises(VitexportError, match="eva03_tiny_patch14_224, which is not one of the architectures vitexport "
                                             "builds .*`vitexport models` lists them"):
        user_spec(None, "hf-hub:me/eva")
    cfg = timm_config("vit_digits_patch4_32", 10, (32, 32))
    cfg["model_args"] = {"rope_type": "axial"}
    add_repo(hub_cache, "me/reg", {"config.json": json_file(cfg),
                                   "model.safetensors": safetensors_file({"x": torch.zeros(1)})})
    with pytest.raises(VitexportError, match="rope_type"):
        user_spec(None, "hf-hub:me/reg")


def test_parse_ref():
    assert parse_ref("hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k@abc") == \
        HubRef("timm/vit_base_patch16_224.augreg2_in21k_ft_in1k", "abc")
    assert parse_ref("weights/model.safetensors") is None
    for bad in ("hf-hub:", "hf-hub:only", "hf-hub:a/b/c", "hf-hub:a b/c"):
        with pytest.raises(VitexportError):
            parse_ref(bad)


@pytest.mark.parametrize("args,needle", [
    ({"embed_dim": -5}, "embed_dim -5"), ({"depth": "12"}, "depth is '12', not a int"),
    ({"img_size": [100000, 100000]}, "100000"), ({"reg_tokens": 10**9}, "reg_tokens"),
    ({"act_layer": "relu6"}, "act_layer='relu6'"), ({"mlp_ratio": float("nan")}, "mlp_ratio"),
    ({"num_heads": 7}, "not divisible into 7 heads"), ({"qkv_bias": "yes"}, "qkv_bias"),
    ({"embed_dim": 65536, "num_heads": 16}, "memory"),  # a shape that fits no machine: refused before any tensor
])
def test_a_hub_config_is_input(hub_cache, args, needle, tmp_path, monkeypatch):
    """Absurd, negative or wrongly typed fields of a timm config.json: one sentence, exit 2, nothing allocated and
    nothing written."""
    import tracemalloc

    monkeypatch.chdir(tmp_path)
    cfg = timm_config("vit_small_patch16_224", 1000, (224, 224))
    cfg["model_args"] = args
    add_repo(hub_cache, "me/odd", {"config.json": json_file(cfg),
                                   "model.safetensors": safetensors_file({"x": torch.zeros(1)})})
    tracemalloc.start()
    try:
        r = CliRunner().invoke(cli, ["onnx", "-c", "hf-hub:me/odd"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and needle.lower() in r.output.lower(), r.output
    assert peak < 200 * 2**20, peak  # no model was allocated
    assert not (tmp_path / "models").exists()
