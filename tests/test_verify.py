"""verify.py's verdict on each file of a model folder, one rule at a time, on tiny hand-made files and records.

Each case changes one thing against records that otherwise match, and checks the status and the sentence a user
reads (what is wrong, what to run).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_folder import _manifest_json
from test_tensorrt_engine import _sidecar

from vitexport.artifacts import verify
from vitexport.artifacts.folder import ARTIFACTS, CPU_INT8_WEIGHT_MAX, PLAN_PRECISIONS, ModelFolder, onnx_digest
from vitexport.artifacts.manifest import IrRecord, PrecisionRecord
from vitexport.artifacts.sidecar import write_sidecar
from vitexport.artifacts.verify import (
    BROKEN,
    MISSING,
    OK,
    STALE,
    UNRECORDED,
    FileCheck,
    check_folder,
    check_onnx,
    check_plan,
    require,
)
from vitexport.errors import VitexportError


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_onnx(path: Path, value: float = 1.0, external: str | None = None) -> bytes:
    """A one-node ONNX (y = x + w); with `external`, w's bytes live in that file (a location relative to it)."""
    w = numpy_helper.from_array(np.full((4,), value, np.float32), "w")
    if external is not None:
        w.data_location = TensorProto.EXTERNAL
        w.ClearField("raw_data")
        entry = w.external_data.add()
        entry.key, entry.value = "location", external
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [w])
    path.write_bytes(helper.make_model(graph).SerializeToString())
    return path.read_bytes()


@pytest.fixture
def folder(tmp_path):
    """A folder whose FP32, FP16, INT8 and OpenVINO-FP32 files all match `manifest` (returned with it)."""
    mf = ModelFolder(tmp_path)
    fp32 = _write_onnx(mf.onnx("fp32"))
    fp16 = _write_onnx(mf.onnx("fp16"), 2.0)
    int8 = _write_onnx(mf.onnx("int8"), 3.0)
    mf.onnx("openvino-fp32").write_text("<net/>")
    mf.ir_weights("openvino-fp32").write_bytes(b"weights")
    ir = IrRecord("model.openvino.fp32.bin", _sha(b"weights"), 7, "fp32", _sha(fp32), False, "2026.4")
    manifest = SimpleNamespace(onnx="model.onnx", onnx_sha256=_sha(fp32), precisions={
        "fp16": PrecisionRecord("model.fp16.onnx", _sha(fp32), _sha(fp16)),
        "int8": PrecisionRecord("model.int8.onnx", _sha(fp32), _sha(int8), qdq={"weight_max": CPU_INT8_WEIGHT_MAX}),
        "openvino-fp32": PrecisionRecord("model.openvino.fp32.xml", _sha(fp32), _sha(b"<net/>"), openvino=ir),
    })
    verify._digests.clear()
    return mf, manifest


REMEDY = {"fp32": "re-export it with `vitexport onnx` (the same options), or restore the original file",
          **{k: f"make it again with `{a.made_by}`" for k, a in ARTIFACTS.items() if k != "fp32"}}


def _check(mf, manifest, kind):
    """(status, reason) of a file that is present, once the whole FileCheck is what that verdict says."""
    c = check_onnx(mf, kind, manifest)
    path = mf.onnx(kind)
    sha = _sha(path.read_bytes())
    want = FileCheck(kind, path, c.status, c.reason, sha, "" if c.status == OK else REMEDY[kind])
    assert c == want, (c, want)
    return c.status, c.reason


def test_files_that_match_their_records_are_ok(folder):
    mf, manifest = folder
    for kind in ("fp32", "fp16", "int8", "openvino-fp32"):
        c = check_onnx(mf, kind, manifest)
        assert (c.status, c.reason, c.ok, c.problem) == (OK, "", True, False), kind
        assert c.sha256 == _sha(mf.onnx(kind).read_bytes()) and c.path == mf.onnx(kind) and c.kind == kind


def test_a_missing_file(folder):
    mf, manifest = folder
    mf.onnx("fp32").unlink()
    c = check_onnx(mf, "fp32", manifest)
    assert (c.status, c.ok, c.problem, c.sha256) == (MISSING, False, False, None)
    assert c.sentence() == (f"{mf.onnx('fp32')} is missing; re-export it with `vitexport onnx` (the same options), "
                            f"or restore the original file.")
    mf.onnx("fp16").unlink()
    assert check_onnx(mf, "fp16", manifest).sentence() == (f"{mf.onnx('fp16')} is missing; make it again with "
                                                           f"`vitexport quantize --fp16`.")


def test_the_export_against_the_manifests_digest(folder):
    mf, manifest = folder
    manifest.onnx_sha256 = None
    assert _check(mf, manifest, "fp32") == (UNRECORDED, "has no digest in manifest.json")
    manifest.onnx_sha256 = "0" * 64
    status, reason = _check(mf, manifest, "fp32")
    assert status == BROKEN and reason == ("does not match manifest.json (its sha256 differs: it was replaced or "
                                           "damaged after the export)")


def test_external_data_outside_the_folder_is_refused_before_anything_reads_it(folder, tmp_path):
    mf, manifest = folder
    data = _write_onnx(mf.onnx("fp32"), external="../elsewhere.bin")
    manifest.onnx_sha256 = _sha(data)  # its record matches: the location alone makes it broken
    c = check_onnx(mf, "fp32", manifest)
    assert c == FileCheck("fp32", mf.onnx("fp32"), BROKEN, "names external data '../elsewhere.bin' outside its "
                          "folder (vitexport reads only inside a model folder)", _sha(data), REMEDY["fp32"])
    _write_onnx(mf.onnx("fp16"), external="../elsewhere.bin")
    assert check_onnx(mf, "fp16", manifest).reason == c.reason


def test_a_converted_file_against_its_record(folder):
    mf, manifest = folder
    del manifest.precisions["fp16"]
    assert _check(mf, manifest, "fp16") == (UNRECORDED, "is not described by manifest.json (not made by vitexport "
                                                        "for this export, or its run was interrupted)")
    _write_onnx(mf.onnx("int8"), 4.0)  # replaced
    assert _check(mf, manifest, "int8") == (BROKEN, "does not match its record in manifest.json (its sha256 "
                                                    "differs: it was replaced or damaged after it was made)")


def test_a_converted_file_of_an_earlier_export_is_stale(folder):
    mf, manifest = folder
    manifest.onnx_sha256 = _sha(_write_onnx(mf.onnx("fp32"), 9.0))  # exported again since
    for kind in ("fp16", "int8", "openvino-fp32"):
        c = check_onnx(mf, kind, manifest)
        assert (c.status, c.reason, c.problem) == (STALE, "was made from an earlier model.onnx", True), kind
        assert (c.kind, c.path, c.sha256) == (kind, mf.onnx(kind), _sha(mf.onnx(kind).read_bytes())), kind
        assert c.sentence().endswith(f"; make it again with `{ARTIFACTS[kind].made_by}`.")


@pytest.mark.parametrize("qdq", [None, {}, {"weight_max": 126}, {"weight_max": CPU_INT8_WEIGHT_MAX + 1}])
def test_an_int8_file_without_a_known_weight_range_is_stale(folder, qdq):
    mf, manifest = folder
    manifest.precisions["int8"].qdq = qdq
    assert _check(mf, manifest, "int8") == (STALE, "has 8-bit weights (made by an earlier vitexport), which "
                                                   "saturate on CPUs without VNNI")
    manifest.precisions["fp16"].qdq = qdq  # the rule is INT8's alone
    assert _check(mf, manifest, "fp16") == (OK, "")


@pytest.mark.parametrize("exact", [True, False])
def test_an_int8_file_with_8_bit_weights_is_current_only_where_the_cpu_sums_them_exactly(folder, monkeypatch, exact):
    from vitexport import environment

    mf, manifest = folder
    monkeypatch.setattr(environment, "cpu_sums_int8_exactly", lambda: exact)
    manifest.precisions["int8"].qdq = {"weight_max": 127}
    want = (OK, "") if exact else (STALE, "has 8-bit weights, which this CPU (no VNNI or AMX) sums with saturation")
    assert _check(mf, manifest, "int8") == want
    manifest.precisions["int8"].qdq = {"weight_max": CPU_INT8_WEIGHT_MAX}  # 7 bits: right on every CPU
    assert _check(mf, manifest, "int8") == (OK, "")


def test_an_openvino_ir_against_its_weights_and_its_source(folder):
    mf, manifest = folder
    ir = manifest.precisions["openvino-fp32"].openvino
    weights = mf.ir_weights("openvino-fp32")
    weights.write_bytes(b"other weights")
    assert _check(mf, manifest, "openvino-fp32") == (BROKEN, "comes with a model.openvino.fp32.bin that does not "
                                                             "match its record in manifest.json (its sha256 differs)")
    weights.unlink()
    assert _check(mf, manifest, "openvino-fp32") == (BROKEN, "has lost its weights file model.openvino.fp32.bin")
    weights.write_bytes(b"weights")
    ir.source = "int8"  # converted from another ONNX than the one now recorded for that kind
    assert _check(mf, manifest, "openvino-fp32") == (STALE, "was made from an earlier model.int8.onnx")
    ir.source = "int8-trt"  # whose file is not there
    assert _check(mf, manifest, "openvino-fp32") == (STALE, "was made from an earlier model.int8.trt.onnx")


def test_an_ir_source_is_digested_with_its_external_data(folder):
    mf, manifest = folder
    fp32 = mf.onnx("fp32")
    body = _write_onnx(fp32, external="model.onnx.data")
    (fp32.parent / "model.onnx.data").write_bytes(np.full((4,), 1.0, np.float32).tobytes())
    manifest.onnx_sha256 = _sha(body)
    manifest.precisions["openvino-fp32"].source_sha256 = _sha(body)
    ir = manifest.precisions["openvino-fp32"].openvino
    ir.source_sha256 = _sha(body)  # the bare file's digest: the weights beside it are not in it
    assert _check(mf, manifest, "openvino-fp32") == (STALE, "was made from an earlier model.onnx")
    ir.source_sha256 = onnx_digest(fp32)
    assert _check(mf, manifest, "openvino-fp32") == (OK, "")


def _plan_check(mf, precision, status, reason):
    """The whole FileCheck of a present plan, as its verdict says it must be."""
    path = mf.plan(precision)
    remedy = "" if status == OK else f"rebuild it with `vitexport trt {mf.path} --{precision}`"
    return FileCheck(f"plan:{precision}", path, status, reason, _sha(path.read_bytes()), remedy)


def _plan(mf, precision="fp16", plan=b"PLAN", source=b"graph", **changes):
    mf.plan(precision).write_bytes(plan)
    mf.plan_source(precision).write_bytes(source)
    sidecar = _sidecar(mf.path, precision=precision, plan=plan)
    sidecar["source_onnx_sha256"] = _sha(source)
    sidecar.update(changes)
    sidecar = {k: v for k, v in sidecar.items() if v is not None}
    write_sidecar(mf.sidecar(precision), sidecar)


def test_a_plan_against_its_sidecar_and_its_source(tmp_path):
    mf = ModelFolder(tmp_path)
    remedy = f"rebuild it with `vitexport trt {tmp_path} --fp16`"
    c = check_plan(mf, "fp16")
    assert (c.kind, c.status, c.sentence()) == ("plan:fp16", MISSING, f"{mf.plan('fp16')} is missing; {remedy}.")
    _plan(mf)
    assert check_plan(mf, "fp16") == _plan_check(mf, "fp16", OK, "")
    mf.sidecar("fp16").write_text("{")
    assert check_plan(mf, "fp16") == _plan_check(mf, "fp16", BROKEN, "has no readable sidecar model.fp16.plan.json")
    _plan(mf, plan_sha256="0" * 64)
    c = check_plan(mf, "fp16")
    assert c == _plan_check(mf, "fp16", BROKEN, "is not the plan model.fp16.plan.json describes (its sha256 differs)")
    assert c.sentence() == f"{mf.plan('fp16')} {c.reason}; {remedy}."
    _plan(mf)
    mf.plan_source("fp16").write_bytes(b"a newer graph")
    assert check_plan(mf, "fp16") == _plan_check(mf, "fp16", STALE, "was built from an earlier model.fp16.trt.onnx")
    mf.plan_source("fp16").unlink()
    assert check_plan(mf, "fp16").status == STALE
    _plan(mf, source_onnx_sha256=None)  # nothing recorded about the source: only the plan's own bytes are checked
    mf.plan_source("fp16").write_bytes(b"anything")
    assert check_plan(mf, "fp16").status == OK


def test_a_plan_checks_the_source_its_sidecar_names_else_the_folders_source_for_its_precision(tmp_path):
    mf = ModelFolder(tmp_path)
    (tmp_path / "custom.onnx").write_bytes(b"custom")
    _plan(mf, "fp32", source=b"graph", source_onnx="custom.onnx", source_onnx_sha256=_sha(b"custom"))
    assert check_plan(mf, "fp32").status == OK  # model.onnx differs from the record: not the one named
    _plan(mf, "int8", source=b"trt graph", source_onnx=None)
    mf.onnx("int8").write_bytes(b"the CPU graph")  # not what an INT8 plan is built from
    assert check_plan(mf, "int8").status == OK
    mf.plan_source("int8").write_bytes(b"a newer trt graph")
    assert check_plan(mf, "int8").reason == "was built from an earlier model.int8.trt.onnx"
    _plan(mf, "fp32", source_onnx="../custom.onnx")  # a name out of the folder: the sidecar is not used at all
    assert check_plan(mf, "fp32").reason == "has no readable sidecar model.fp32.plan.json"


def test_a_plans_source_digest_includes_its_external_data(tmp_path):
    mf = ModelFolder(tmp_path)
    _plan(mf, "fp32")
    source = mf.plan_source("fp32")
    body = _write_onnx(source, external="model.onnx.data")
    (tmp_path / "model.onnx.data").write_bytes(b"\0" * 16)
    _plan(mf, "fp32", source=body)  # the sidecar records the bare file's digest
    assert check_plan(mf, "fp32").status == STALE  # its weights are part of what the plan was built from


def test_check_folder_lists_every_kind_and_plan_in_order(folder):
    mf, manifest = folder
    checks = check_folder(mf, manifest)
    assert [c.kind for c in checks] == list(ARTIFACTS) + [f"plan:{p}" for p in PLAN_PRECISIONS]
    assert {c.kind: c.status for c in checks} == {
        "fp32": OK, "fp16": OK, "fp16-trt": MISSING, "int8": OK, "int8-trt": MISSING, "fp8": MISSING,
        "openvino-fp32": OK, "openvino-fp16": MISSING, "openvino-int8": MISSING,
        "aoti-fp32": MISSING, "aoti-bf16": MISSING, "aoti-int8": MISSING, "plan:fp32": MISSING, "plan:fp16": MISSING, "plan:int8": MISSING, "plan:fp8": MISSING}


def test_require_gives_the_path_or_the_sentence(folder):
    mf, manifest = folder
    assert require(mf, "fp16", manifest) == mf.onnx("fp16")
    _plan(mf, "int8")
    assert require(mf, "plan:int8") == mf.plan("int8")
    manifest.onnx_sha256 = "0" * 64
    with pytest.raises(VitexportError) as e:
        require(mf, "fp32", manifest)
    assert str(e.value) == check_onnx(mf, "fp32", manifest).sentence()
    with pytest.raises(VitexportError) as e:
        require(mf, "plan:fp16")
    assert str(e.value) == f"{mf.plan('fp16')} is missing; rebuild it with `vitexport trt {mf.path} --fp16`."
    with pytest.raises(VitexportError) as e:
        require(mf, "plan:fp16:x")  # everything after the first colon is the precision
    assert str(e.value) == "Unknown precision 'fp16:x'; choose one of: fp32, fp16, int8, fp8."


def test_without_a_manifest_given_the_folders_own_is_read(folder):
    mf, manifest = folder
    record = _manifest_json()
    record["onnx_sha256"] = manifest.onnx_sha256
    record["precisions"] = {k: r.to_dict() for k, r in manifest.precisions.items()}
    mf.manifest_path.write_text(json.dumps(record))
    assert check_onnx(mf, "fp16").ok and check_onnx(mf, "openvino-fp32").ok
    assert [c.kind for c in check_folder(mf) if c.ok] == ["fp32", "fp16", "int8", "openvino-fp32"]
    record["onnx_sha256"] = "0" * 64
    mf.manifest_path.write_text(json.dumps(record))
    assert check_onnx(mf, "fp32").status == BROKEN and check_folder(mf)[0].status == BROKEN


def test_a_digest_is_not_taken_for_another_files_with_the_same_inode(tmp_path):
    first, second = tmp_path / "a.bin", tmp_path / "b.bin"
    first.write_bytes(b"first")
    st = os.stat(first)
    assert verify.digest(first) == _sha(b"first")
    first.unlink()
    second.write_bytes(b"other")  # the file system may give it the freed inode; same size and times
    os.utime(second, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert verify.digest(second) == _sha(b"other")


@pytest.mark.parametrize("status,ok,problem", [(OK, True, False), (MISSING, False, False), (BROKEN, False, True),
                                               (STALE, False, True), (UNRECORDED, False, True)])
def test_what_each_status_means(status, ok, problem):
    c = FileCheck("fp16", Path("m.onnx"), status, "is odd", remedy="fix it")
    assert (c.ok, c.problem, c.sentence()) == (ok, problem, "m.onnx is odd; fix it.")


def test_a_digest_is_remembered_only_while_the_file_is_unchanged(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"first")
    assert verify.digest(path) == _sha(b"first")
    path.write_bytes(b"other")  # same size
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert verify.digest(path) == _sha(b"other")
    onnx_path = tmp_path / "m.onnx"
    _write_onnx(onnx_path)
    (tmp_path / "m.onnx.data").write_bytes(b"weights")
    folded = verify.digest(onnx_path, fold_external_data=True)
    assert verify.digest(onnx_path) == _sha(onnx_path.read_bytes()) != folded
    assert folded == hashlib.sha256(f"{_sha(onnx_path.read_bytes())}:{_sha(b'weights')}".encode()).hexdigest()
    onnx.checker.check_model(onnx.load(str(onnx_path), load_external_data=False), full_check=True)


def test_a_prefetched_digest_is_computed_once_and_waited_for(tmp_path, monkeypatch):
    import threading

    data = os.urandom(1 << 20)
    path = tmp_path / "model.onnx"
    path.write_bytes(data)
    started, release, calls = threading.Event(), threading.Event(), []
    real = verify.sha256_file

    def slow(p):
        calls.append(Path(p).name)
        started.set()
        assert release.wait(10)
        return real(p)

    monkeypatch.setattr(verify, "sha256_file", slow)
    monkeypatch.setattr(verify, "_digests", {})
    verify.prefetch_digest(path)
    assert started.wait(10)  # hashing on its own thread
    threading.Timer(0.2, release.set).start()
    assert verify.digest(path) == hashlib.sha256(data).hexdigest()  # waited for, not computed again
    assert calls == ["model.onnx"]


def test_a_prefetch_never_raises_nor_reads_what_is_not_a_regular_file(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(verify, "sha256_file", lambda p: calls.append(p) or "x")
    monkeypatch.setattr(verify, "_digests", {})
    verify.prefetch_digest(tmp_path / "absent.onnx")
    fifo = tmp_path / "fifo.onnx"
    os.mkfifo(fifo)
    verify.prefetch_digest(fifo)  # a read of it would wait for a writer forever
    verify.prefetch_digest(tmp_path)
    assert calls == []


def test_a_digest_that_failed_is_read_again(tmp_path, monkeypatch):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"onnx")
    fail = [True]

    def flaky(p):
        if fail.pop() if fail else False:
            raise OSError("read error")
        return hashlib.sha256(Path(p).read_bytes()).hexdigest()

    monkeypatch.setattr(verify, "sha256_file", flaky)
    monkeypatch.setattr(verify, "_digests", {})
    with pytest.raises(OSError):
        verify.digest(path)
    assert verify.digest(path) == hashlib.sha256(b"onnx").hexdigest()
