"""The rules of this release's plain modules, without a model: label files (data.labelfile), reading a set's
classes as the model's (validate.labels), the k-NN figures (parity.knn) and the outputs a model has
(model.outputs). Fast: the mutation runs use them (scripts/mutation.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vitexport.data.labelfile import file_key, match, read_label_file
from vitexport.data.stream import open_images
from vitexport.errors import VitexportError
from vitexport.model.config import ViTConfig
from vitexport.model.labels import imagenet_names, imagenet_synsets
from vitexport.model.outputs import available, default_outputs, parse_outputs, primary, shapes
from vitexport.parity.knn import Neighbours, knn_figures, neighbours
from vitexport.parity.stats import clopper_pearson, paired_drop
from vitexport.validate.labels import map_classes, model_labels, name_table


# -- label files ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,want", [
    ("file,label\na.jpg,3\nb,4\n", {"a": "3", "b": "4"}),  # a header, extensions optional
    ("ImageId,PredictionString\nx,n01440764 1 2 3 4 n01443537 5 6 7 8\n", {"x": "n01440764"}),  # LOC: the first
    ("a.JPEG\t7\n# a comment\n\nsub/b.png\t8\n", {"a": "7", "sub/b": "8"}),  # TSV, blank and comment lines
    ("a.png 1\nb.webp 2\n", {"a": "1", "b": "2"}),  # whitespace-separated
    ("./c.jpg,tench\n", {"c": "tench"}),
    ('"d, e.jpg",5\n', {"d, e": "5"}),  # a quoted name with a comma
    ("name,class\nf.txt,1\n", {"f.txt": "1"}),  # not an image extension: kept as it is
    ("a,3\na.png,3\n", {"a": "3"}),  # the same label twice is one
])
def test_label_file_forms(tmp_path, text, want):
    p = tmp_path / "labels.csv"
    p.write_text(text)
    assert read_label_file(p).labels == want


def test_a_first_line_that_is_data_is_not_a_header(tmp_path):
    p = tmp_path / "l.csv"
    p.write_text("img001,label\nimg002,7\n")  # 'label' in the second column: a header
    assert read_label_file(p).labels == {"img002": "7"}
    p.write_text("img001,3\nimg002,7\n")
    assert read_label_file(p).labels == {"img001": "3", "img002": "7"}


@pytest.mark.parametrize("make,why", [
    (lambda p: None, "does not exist"),
    (lambda p: p.mkdir(), "is not a file"),
    (lambda p: p.write_bytes(b"\xff\xfe\x00a,1"), "not UTF-8"),
    (lambda p: p.write_text("a,1\nb\n"), "Line 2"),
    (lambda p: p.write_text("a, \n"), "Line 1"),
])
def test_what_is_not_a_label_file_is_one_sentence(tmp_path, make, why):
    p = tmp_path / "labels.csv"
    make(p)
    with pytest.raises(VitexportError, match=why):
        read_label_file(p)


def test_real_json_rejects_what_is_not_lists_of_indices(tmp_path):
    p = tmp_path / "real.json"
    for bad in ("[[1, -2]]", "[[true]]", "[1, 2]", "[[1.5]]", "{"):
        p.write_text(bad)
        with pytest.raises(VitexportError):
            read_label_file(p)


def test_file_keys_and_matching(tmp_path):
    assert file_key(" a.JPG ") == "a" and file_key("x/y.png") == "x/y" and file_key("z") == "z"
    assert file_key("./d/e.jpeg") == "d/e" and file_key("d\\e.jpg") == "d/e"
    files = [tmp_path / "a.png", tmp_path / "s" / "b.png", tmp_path / "s" / "c.png"]
    assert match(files, tmp_path, {"a": 1, "b": 2}) == [1, 2, None]  # by name
    assert match(files, tmp_path, {"s/b": 2, "b": 9}) == [None, 2, None]  # keys with folders: by relative path


def test_open_images_with_a_label_file_skips_the_unnamed_and_subsets_the_named(tmp_path):
    from PIL import Image

    for i in range(6):
        Image.new("RGB", (4, 4)).save(tmp_path / f"{i}.png")
    (tmp_path / "l.csv").write_text("0,b\n1,a\n2,b\n3,a\n4,b\n")
    lf = read_label_file(tmp_path / "l.csv")
    s = open_images(tmp_path, label_files=(lf,))
    assert [f.name for f in s.files] == ["0.png", "1.png", "2.png", "3.png", "4.png"] and s.total == 5
    assert s.classes == ["a", "b"] and s.labels.tolist() == [1, 0, 1, 0, 1]
    assert [e[1] for e in s.skipped.entries] == ["not in the label file"] and s.label_source == "l.csv"
    sub = open_images(tmp_path, 3, label_files=(lf,))
    assert [f.name for f in sub.files] == ["0.png", "2.png", "4.png"] and sub.labels.tolist() == [1, 1, 1]
    (tmp_path / "real.json").write_text("[]")
    with pytest.raises(VitexportError, match="labels no image"):
        read_label_file(tmp_path / "real.json")
    (tmp_path / "real.json").write_text("[[1]]")
    with pytest.raises(VitexportError, match="names none of the 6 images"):
        open_images(tmp_path, label_files=(lf, read_label_file(tmp_path / "real.json")))
    with pytest.raises(VitexportError, match="one label file"):
        open_images(tmp_path, label_files=(lf, lf))


def test_real_rows_are_padded_and_aligned_with_the_files(tmp_path):
    from PIL import Image

    for i in (1, 2, 3):
        Image.new("RGB", (4, 4)).save(tmp_path / f"ILSVRC2012_val_{i:08d}.JPEG")
    (tmp_path / "real.json").write_text("[[5, 9, 7], [], [2]]")
    s = open_images(tmp_path, label_files=(read_label_file(tmp_path / "real.json"),))
    assert s.labels is None and s.real.tolist() == [[5, 9, 7], [-1, -1, -1], [2, -1, -1]]


# -- a set's classes as the model's --------------------------------------------------------------------------------

def test_readings_are_tried_in_order_and_the_first_that_maps_every_class_wins():
    names = imagenet_names()
    assert map_classes(["2", "10"], 1000, names).how == "class index"
    m = map_classes(["n01443537", "n01440764"], 1000, names)
    assert m.how == "WordNet synset" and m.index.tolist() == [1, 0]
    m = map_classes(["Goldfish", "great_white_shark"], 1000, names)
    assert m.how == "class name" and m.index.tolist() == [1, 2]
    assert map_classes(["n01443537"], 10, [str(i) for i in range(10)]) is None  # synsets need 1000 classes
    assert map_classes(["10"], 10, []) is None  # outside the head
    assert map_classes(["cat", "dog"], 2, []).how == "folder order"  # as many classes as outputs, no reading
    assert map_classes(["cat", "dog"], 3, []) is None


def test_the_reading_that_maps_the_most_wins_when_none_maps_all():
    m = map_classes(["n01440764", "n01443537", "tench", "wat"], 1000, imagenet_names())
    assert m.how == "WordNet synset" and m.index.tolist() == [0, 1, -1, -1] and m.unmapped == [2, 3]
    m = map_classes(["tench", "goldfish", "n01443537"], 1000, imagenet_names())
    assert m.how == "class name" and m.unmapped == [2]


def test_a_checkpoints_names_and_shared_names():
    table = name_table(["Cat", "dog, hound", "hound"])
    assert table == {"cat": 0, "dog, hound": 1, "dog": 1}  # 'hound' names two classes: neither
    assert len(imagenet_synsets()) == 1000 and imagenet_synsets()[0] == "n01440764"


def test_model_labels_maps_a_sets_labels():
    class S:
        labels, classes = np.array([0, 1, 1, 0]), ["n01443537", "n01440764"]
    got, why = model_labels(S, 1000, imagenet_names())
    assert why is None and got.tolist() == [1, 0, 0, 1]
    assert model_labels(S, 0)[0] is None and "no classification head" in model_labels(S, 0)[1]
    S.classes = ["x", "y"]
    assert model_labels(S, 1000)[0] is None and "WordNet synset" in model_labels(S, 1000)[1]


# -- k-NN figures --------------------------------------------------------------------------------------------------

def test_knn_figures_pair_the_candidate_with_the_reference():
    labels = np.array([0, 0, 1, 1, 1, 0, 1, 0])
    ref = Neighbours(np.array([0, 0, 1, 1, 1, 0, 0, 0]), np.array([1, 0, 3, 2, 3, 0, 4, 5]), 20, 0.07)
    out = Neighbours(np.array([0, 1, 1, 1, 1, 0, 1, 0]), np.array([1, 0, 3, 4, 3, 7, 4, 5]), 20, 0.07)
    d = knn_figures(ref, out, labels)
    # reference right on 7 of 8 (image 6 wrong), candidate right on 7 (image 1 wrong): one flip each way
    assert d["knn_acc_ref"] == 7 / 8 and d["knn_acc"] == 7 / 8 and d["knn_flips_down"] == 1 and d["knn_flips_up"] == 1
    assert d["neighbour_agree"] == 6 / 8 and d["neighbour_agree_ci"] == list(clopper_pearson(6, 8))
    _, lo, hi = paired_drop(1, 1, 8)
    assert d["knn_drop"] == 0.0 and d["knn_drop_ci"] == [lo * 100, hi * 100]
    assert d["knn_acc_ci"] == list(clopper_pearson(7, 8)) and (d["knn_k"], d["knn_t"]) == (20, 0.07)
    assert set(knn_figures(ref, out, None)) == {"knn_k", "knn_t", "neighbour_agree", "neighbour_agree_ci"}


def test_knn_excludes_each_image_itself_and_clamps_k():
    emb = np.array([[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9], [-1, 0]], np.float32)
    labels = np.array([0, 0, 1, 1, 2])
    nb = neighbours(lambda s, c: emb[s:s + c], 5, labels, k=1, query_block=2, key_block=2)
    assert nb.nearest.tolist() == [1, 0, 3, 2, 2] and nb.pred.tolist() == [0, 0, 1, 1, 1]
    wide = neighbours(lambda s, c: emb[s:s + c], 5, labels, k=50)
    assert wide.k == 4  # at most the other images
    with pytest.raises(ValueError):
        neighbours(lambda s, c: emb[s:s + c], 1, None)
    assert neighbours(lambda s, c: emb[s:s + c], 5, None).pred is None


def test_the_temperature_weighs_close_neighbours_more():
    # image 0's neighbours: one very close of class 1, two far of class 0
    emb = np.array([[1, 0], [0.99, 0.14], [0.2, 0.98], [0.2, -0.98]], np.float32)
    labels = np.array([0, 1, 0, 0])
    sharp = neighbours(lambda s, c: emb[s:s + c], 4, labels, k=3, t=0.01)
    flat = neighbours(lambda s, c: emb[s:s + c], 4, labels, k=3, t=100.0)
    assert sharp.pred[0] == 1 and flat.pred[0] == 0


# -- outputs -------------------------------------------------------------------------------------------------------

def test_the_outputs_a_model_has():
    plain = ViTConfig(img_size=(32, 32), patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=5)
    regs = ViTConfig(img_size=(32, 32), patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=0, reg_tokens=4)
    tokens_only = ViTConfig(img_size=(32, 32), patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=0,
                            global_pool="")
    assert available(plain) == ["logits", "pooled", "tokens", "patch"]
    assert available(regs) == ["pooled", "tokens", "registers", "patch"]
    assert available(tokens_only) == ["tokens", "patch"]
    assert default_outputs(plain) == ("logits",) and default_outputs(regs) == ("pooled",)
    assert default_outputs(tokens_only) == ("tokens",)
    assert parse_outputs(" Patch , pooled ", regs) == ("patch", "pooled") and parse_outputs(None, plain) == ("logits",)
    for bad in ("", "logits", "cls", "tokens,tokens"):
        with pytest.raises(VitexportError):
            parse_outputs(bad, regs)
    assert primary(("tokens", "pooled", "logits")) == "logits" and primary(("patch", "pooled")) == "pooled"
    assert primary(("patch", "tokens")) == "patch"
    assert shapes(regs, ("pooled", "tokens", "registers", "patch")) == {
        "pooled": ["batch", 16], "tokens": ["batch", 21, 16], "registers": ["batch", 4, 16], "patch": ["batch", 16, 16]}
    assert shapes(plain, ("logits",)) == {"logits": ["batch", 5]}


def test_recorded_shapes_are_the_models():
    import torch

    from vitexport.model.outputs import WithOutputs
    from vitexport.model.build import build_model

    for kw in (dict(num_classes=5), dict(num_classes=0, reg_tokens=2), dict(num_classes=3, distilled=True),
               dict(num_classes=4, class_token=False, global_pool="avg")):
        cfg = ViTConfig(img_size=(32, 24), patch_size=8, embed_dim=16, depth=1, num_heads=2, **kw)
        names = tuple(available(cfg))
        with torch.no_grad():
            got = WithOutputs(build_model(cfg), names)(torch.zeros(2, 3, 32, 24))
        got = got if isinstance(got, tuple) else (got,)
        want = shapes(cfg, names)
        assert {n: [2, *s[1:]] for n, s in want.items()} == {n: list(t.shape) for n, t in zip(names, got)}, kw


# -- each rule's edge, and the sentences word for word (mutation runs: docs/MUTATION.md) ---------------------------

def test_label_file_edges(tmp_path, monkeypatch):
    import vitexport.data.labelfile as lf_module

    p = tmp_path / "l.txt"
    p.write_text("my photo.png 3\n  # an indented comment\nFILENAME\tX\n")  # whitespace: the label is the last word
    assert read_label_file(p).labels == {"my photo": "3", "FILENAME": "X"}  # a header only on line 1
    p.write_text("FILE,whatever\na,1\n")  # a header by its first column, in any case
    assert read_label_file(p).labels == {"a": "1"} and read_label_file(p).path == p
    p.write_text("x,Labels\na,1\n")  # ... or by its second
    assert read_label_file(p).labels == {"a": "1"}
    p.write_bytes("\ufeffa,1\n".encode("utf-8"))  # a byte-order mark, as spreadsheets write
    assert read_label_file(p).labels == {"a": "1"}
    assert file_key("./z") == "z" and file_key("./y.png") == "y"
    monkeypatch.setattr(lf_module, "MAX_BYTES", 4 << 20)
    p.write_bytes(b"a,1\n" + b"#" * ((4 << 20) - 4))
    assert read_label_file(p).labels == {"a": "1"}  # exactly the limit: read
    p.write_bytes(b"a,1\n" + b"#" * ((4 << 20) - 3))
    with pytest.raises(VitexportError) as e:
        read_label_file(p)
    assert str(e.value) == f"Label file {p} is larger than 4 MB; is it a label file?"


@pytest.mark.parametrize("text,sentence", [
    ("", "Label file {p} is empty."),
    ("a,1\na,2\n", "Label file {p} gives a two labels (1 and 2)."),
    ("file,label\n", "Label file {p} has a header and no labels."),
    ("a,1\n,2\n", "Line 2 of label file {p} is not 'file,label': ',2'."),
])
def test_label_file_sentences(tmp_path, text, sentence):
    p = tmp_path / "l.csv"
    p.write_text(text)
    with pytest.raises(VitexportError) as e:
        read_label_file(p)
    assert str(e.value) == sentence.format(p=p)


def test_real_json_sentences_and_class_zero(tmp_path):
    p = tmp_path / "real.json"
    p.write_text("[[0, 5], [0]]")
    assert read_label_file(p).real == {"ILSVRC2012_val_00000001": [0, 5], "ILSVRC2012_val_00000002": [0]}
    p.write_text("{")
    with pytest.raises(VitexportError, match=r"^Label file .* is not valid JSON \("):
        read_label_file(p)
    p.write_text("[[-1]]")
    with pytest.raises(VitexportError) as e:
        read_label_file(p)
    assert str(e.value) == (f"Label file {p} is not ImageNet-ReaL's real.json: a list with, per validation image, a "
                            "list of class indices.")
    d = tmp_path / "dir.json"
    d.mkdir()
    with pytest.raises(VitexportError, match="is not a file"):
        read_label_file(d)


def test_a_labelled_file_outside_the_folder_is_matched_by_its_name(tmp_path):
    assert match([tmp_path.parent / "x.png"], tmp_path, {"x": 1}) == [1]


def test_label_file_reading_failures_and_forms(tmp_path, monkeypatch):
    p = tmp_path / "l.tsv"
    p.write_text("a,b.png\t3\n")  # a tab splits before a comma does
    assert read_label_file(p).labels == {"a,b": "3"}
    long = "x" * 100
    p.write_text(long + "\n")
    with pytest.raises(VitexportError) as e:
        read_label_file(p)
    assert str(e.value) == f"Line 1 of label file {p} is not 'file,label': {'x' * 80!r}."
    r = tmp_path / "real.json"
    r.write_text("[[1]]")
    assert read_label_file(r).path == r

    def denied(self, *a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(VitexportError) as e:
        read_label_file(p)
    assert str(e.value) == f"Cannot read label file {p}: Permission denied."


def test_class_reading_edges():
    # a tie between readings keeps the earlier one: '3' by index and 'tench' by name each map one class
    assert map_classes(["3", "tench"], 1000, imagenet_names()).how == "class index"
    assert map_classes(["cat", "dog"], 2, []).index.tolist() == [0, 1]

    class S:
        labels, classes = None, ["0"]
    assert model_labels(S, 1, ["0"]) == (None, None)  # no labels: nothing to map, nothing to say
    S.labels = np.array([0, 0])
    got, why = model_labels(S, 1, ["0"])  # a one-class head is a head
    assert why is None and got.tolist() == [0, 0]
    assert model_labels(S, 0) == (None, "the model has no classification head")
    S.classes = ["zebra"]
    assert model_labels(S, 5, ["a", "b", "c", "d", "e"]) == (
        None, "none of its 1 classes is one of the model's 5 by index, WordNet synset or class name")


def test_knn_edges():
    # tiny norms, and a raw dot product that would choose otherwise: cosine, of unit vectors
    emb = np.array([[1e-4, 0], [3e-4, 2e-4], [1e-5, 1e-6]], np.float32)
    n = len(emb)

    def strict(start, count):  # reads past the end fail, as a file's would
        assert 0 <= start and start + count <= n, (start, count)
        return emb[start:start + count]

    nb = neighbours(strict, n, np.array([0, 1, 0]), k=5, t=0.5, query_block=2, key_block=2)
    assert nb.nearest.tolist() == [2, 2, 0] and nb.k == 2 and nb.t == 0.5
    assert nb.pred.dtype.kind == "i" and nb.nearest.dtype.kind == "i"
    pair = neighbours(strict, 2, np.array([1, 0]), k=20)  # two images: each the other's only neighbour
    assert pair.k == 1 and pair.nearest.tolist() == [1, 0] and pair.pred.tolist() == [0, 1]
    with pytest.raises(ValueError, match="^a k-NN needs at least two images$"):
        neighbours(strict, 1, None)
    # one candidate without predictions: neighbours only, whatever the reference has
    ref = Neighbours(np.array([0, 1]), np.array([1, 0]), 20, 0.07)
    assert "knn_acc" not in knn_figures(ref, Neighbours(None, np.array([1, 0]), 20, 0.07), np.array([0, 1]))
    # a drop in points: the reference right on both, the candidate on one
    d = knn_figures(ref, Neighbours(np.array([0, 0]), np.array([1, 0]), 20, 0.07), np.array([0, 1]))
    assert d["knn_drop"] == pytest.approx(50.0)


def test_the_kth_neighbour_counts():
    """k = 2 with flat weights: each query's two class-1 neighbours come in the last key block, after a class-0
    decoy a little further away; a k-th neighbour kept from an earlier block would tie the vote, and a tie goes to
    class 0."""
    rng = np.random.default_rng(5)
    centres = rng.normal(size=(10, 8)) * 10
    queries = centres
    decoys = centres + rng.normal(size=(10, 8)) * 1.0
    near = np.concatenate([centres + rng.normal(size=(10, 8)) * 0.01, centres + rng.normal(size=(10, 8)) * 0.02])
    emb = np.concatenate([queries, decoys, near]).astype(np.float32)
    labels = np.array([0] * 20 + [1] * 20)
    for kb in (16, 40):
        nb = neighbours(lambda s, c: emb[s:s + c], len(emb), labels, k=2, t=1e6, query_block=10, key_block=kb)
        assert (nb.pred[:10] == 1).all(), kb


def test_output_sentences_and_edges():
    one = ViTConfig(img_size=(32, 32), patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=1)
    assert available(one)[0] == "logits" and default_outputs(one) == ("logits",)
    headless = ViTConfig(img_size=(32, 32), patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=0)
    cases = {"": "--outputs is empty; give some of logits, pooled, tokens, registers, patch.",
             "cls": "--outputs 'cls' is not an output vitexport knows; choose from logits, pooled, tokens, registers, "
                    "patch.",
             "logits": "--outputs logits: this model has no logits output: it has no classification head "
                       "(--num-classes 0); it has pooled, tokens, patch.",
             "registers": "--outputs registers: this model has no registers output: it has no register tokens; it "
                          "has pooled, tokens, patch.",
             "pooled,pooled": "--outputs pooled,pooled: an output is named twice."}
    for text, sentence in cases.items():
        with pytest.raises(VitexportError) as e:
            parse_outputs(text, headless)
        assert str(e.value) == sentence
    flat = ViTConfig(img_size=(32, 32), patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3, global_pool="")
    with pytest.raises(VitexportError) as e:
        parse_outputs("pooled", flat)
    assert str(e.value) == ("--outputs pooled: this model has no pooled output: it does not pool its tokens "
                            "(global_pool ''); it has logits, tokens, patch.")
    assert shapes(flat, ("logits",)) == {"logits": ["batch", 17, 3]}
    dyn = ViTConfig(img_size=(32, 32), patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3,
                    dynamic_img_size=True)
    assert shapes(dyn, ("tokens", "patch", "logits")) == {"tokens": ["batch", "tokens", 16],
                                                          "patch": ["batch", "patches", 16], "logits": ["batch", 3]}


def test_with_outputs_answers_one_output_as_a_tensor():
    import torch

    from vitexport.model.outputs import WithOutputs, compute
    from vitexport.model.build import build_model

    model = build_model(ViTConfig(img_size=(16, 16), patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3))
    wrapped = WithOutputs(model, ("logits",))
    assert wrapped.cfg is model.cfg
    wrapped.set_fused_attn(False)  # what the export asks: the model's own attention, explicit
    assert not any(getattr(m, "fused_attn", False) for m in model.modules())
    wrapped.set_fused_attn(True)
    assert any(getattr(m, "fused_attn", False) for m in model.modules())
    with torch.no_grad():
        out = wrapped(torch.zeros(2, 3, 16, 16))
        assert isinstance(out, torch.Tensor) and out.shape == (2, 3)
        both = WithOutputs(model, ("pooled", "logits"))(torch.zeros(2, 3, 16, 16))
        assert isinstance(both, tuple) and [t.shape[1] for t in both] == [16, 3]
    with pytest.raises(ValueError, match="unknown output 'cls'"):
        compute(model, torch.zeros(1, 5, 16), "cls")
