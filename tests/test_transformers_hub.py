"""transformers' towers through a Hugging Face cache the tests lay out (offline), then every step after the export:
INT8 for every target and FP16, each file valid by onnx.checker's full check and passing its own parity check;
the bench's CPU rows; a Triton repository whose config parses against Triton's schema (those two chains are marked
`e2e`: CI's second job runs them); `predict` on a classifier.

A whole CLIPModel / SiglipModel (text tower included, as openai/clip-* and google/siglip-* repositories hold
them) exports its vision tower, checked against transformers' get_image_features.
"""

import json

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from conftest import ROOT, quick_bench
from test_hub import add_repo
from test_transformers_towers import CASES, forward_inputs, perturb, run_onnx, save_tower

from vitexport.cli import cli

transformers = pytest.importorskip("transformers")
TOWERS = {"dinov2-registers": "someone/dinov2-reg-tiny", "siglip": "someone/siglip-tiny",
          "dinov3": "someone/dinov3-tiny", "beit-model": "someone/beit-tiny", "siglip2-naflex": "someone/siglip2-tiny"}
SHARDED = {"dinov3"}  # saved as large repositories are: an index and shards, read shard by shard
TEXT = dict(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
VISION = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=80, image_size=40,
              patch_size=8)


def publish(cache, repo, saved):
    """Every file of a save_pretrained folder as a repository in the cache."""
    return add_repo(cache, repo, {p.name: (lambda dst, src=p: dst.write_bytes(src.read_bytes()))
                                  for p in saved.iterdir() if p.is_file()})


@pytest.fixture(scope="module", params=list(TOWERS))
def tower(request, tmp_path_factory):
    """(case, transformers model, export folder): `vitexport onnx -c hf-hub:ORG/NAME`, offline, from the cache."""
    case, repo = request.param, TOWERS[request.param]
    tmp = tmp_path_factory.mktemp(case)
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_CACHE", str(tmp / "cache"))
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.chdir(tmp)
    # the weights test_transformers_towers.py gives the case: the same module, whose graph the export memo holds
    model, _ = save_tower(case, tmp / "saved", shard="60KB" if case in SHARDED else None)
    if case in SHARDED:
        assert len(list((tmp / "saved").glob("model-*.safetensors"))) > 1
    publish(tmp / "cache", repo, tmp / "saved")
    r = CliRunner().invoke(cli, ["onnx", "-c", f"hf-hub:{repo}", "-q"])
    assert r.exit_code == 0, r.output
    (folder,) = (tmp / "models").glob(f"{repo.split('/')[1]}-*x*")  # named after the repository
    yield case, model, folder
    mp.undo()


def test_the_hub_export_is_transformers_model(tower):
    case, model, folder = tower
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["checkpoint"]["repo"] in TOWERS.values() and manifest["num_classes"] == 0
    x = torch.randn(2, 3, *manifest["img_size"], generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(**forward_inputs(case, x)).pooler_output.numpy()
    got = run_onnx(folder / "model.onnx", x.numpy())
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))


@pytest.mark.parametrize("case", list(CASES))
def test_every_class_is_the_same_model_through_an_offline_cache(case, tmp_path, monkeypatch):
    """Each class's folder published as a repository (offline): the hub reference describes the model exactly as
    the folder does (same architecture fields, preprocessing and resampling), and fetches the same weights. The
    export from a folder is checked against transformers in test_transformers_towers, and two towers' exports from
    the cache above."""
    from vitexport.model.spec import user_spec

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    save_tower(case, tmp_path / "saved", seed=7)
    publish(tmp_path / "cache", f"org/{case}", tmp_path / "saved")
    hub, local = user_spec(None, f"hf-hub:org/{case}"), user_spec(None, tmp_path / "saved")
    assert hub.arch.args == local.arch.args and hub.preprocess == local.preprocess and hub.img_size == local.img_size
    assert hub.pos_embed_interp == local.pos_embed_interp
    assert hub.resolved_checkpoint().read_bytes() == (tmp_path / "saved" / "model.safetensors").read_bytes()


@pytest.mark.e2e
def test_int8_for_every_target_and_fp16_pass_their_checks(tower):
    _, _, folder = tower
    for args in (["--int8", "--target", "all"], ["--fp16", "--target", "all"]):
        r = CliRunner().invoke(cli, ["quantize", str(folder), *args, "-q"])
        assert r.exit_code == 0, (args, r.output)
    records = json.loads((folder / "manifest.json").read_text())["precisions"]
    for precision in ("int8", "int8-trt", "fp16", "fp16-trt"):
        assert records[precision]["check"]["passed"], (precision, records[precision]["check"])
    for path in sorted(folder.glob("*.onnx")):
        onnx.checker.check_model(str(path), full_check=True)


@pytest.mark.e2e
def test_the_bench_and_triton_take_the_tower(tower, tmp_path):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    _, model, folder = tower
    ran = quick_bench(folder, tmp_path)
    assert {"pytorch cpu fp32", "onnxruntime cpu fp32", "openvino cpu fp32"} <= set(ran)
    assert all(not row["parity"]["failures"] for row in ran.values()), ran
    r = CliRunner().invoke(cli, ["triton", str(folder), "-o", str(tmp_path / "repo"), "-q"])
    assert r.exit_code == 0, r.output
    (config,) = (tmp_path / "repo").glob("*/config.pbtxt")
    cfg = text_format.Parse(config.read_text(), model_config_pb2.ModelConfig())
    # an embedding: its width, no labels
    assert list(cfg.output[0].dims) == [model.config.hidden_size] and not cfg.output[0].label_filename


def test_predict_names_a_transformers_classifier_s_classes(tmp_path):
    labels = {i: f"kind {i}" for i in range(5)}
    cfg = transformers.DeiTConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=80,
                                  image_size=40, patch_size=8, num_labels=5, id2label=labels,
                                  label2id={v: k for k, v in labels.items()})
    model = perturb(transformers.DeiTForImageClassificationWithTeacher(cfg))
    model.save_pretrained(tmp_path / "saved")
    out = tmp_path / "export"
    assert CliRunner().invoke(cli, ["onnx", "-c", str(tmp_path / "saved"), "-o", str(out), "-q"]).exit_code == 0
    photo = ROOT / "calibration" / "photos" / "calib" / "chelsea.jpg"
    r = CliRunner().invoke(cli, ["predict", str(out), str(photo), "--top-k", "1", "--jsonl"])
    assert r.exit_code == 0, r.output
    pp = json.loads((out / "manifest.json").read_text())["preprocess"]
    from vitexport.data.images import load_image
    from vitexport.data.preprocess import Preprocess

    x = torch.from_numpy(load_image(photo, Preprocess.from_dict(pp))[None])
    with torch.no_grad():
        best = int(model(pixel_values=x).logits.argmax())
    assert json.loads(r.stdout.strip().splitlines()[-1])["top"][0]["label"] == f"kind {best}"


@pytest.mark.parametrize("kind", ["CLIP", "Siglip"])
def test_a_whole_two_tower_model_exports_its_vision_tower(kind, tmp_path):
    cfg = getattr(transformers, f"{kind}Config")(text_config=TEXT, vision_config=VISION,
                                                 **({"projection_dim": 20} if kind == "CLIP" else {}))
    model = perturb(getattr(transformers, f"{kind}Model")(cfg))
    model.save_pretrained(tmp_path / "saved")
    out = tmp_path / "export"
    r = CliRunner().invoke(cli, ["onnx", "-c", str(tmp_path / "saved"), "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    x = torch.randn(2, 3, 40, 40, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = model.get_image_features(pixel_values=x).pooler_output.numpy()
    got = run_onnx(out / "model.onnx", x.numpy())
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))
