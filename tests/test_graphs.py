"""One parse of the FP32 graph shared by a precision run's steps: readers share it, a taker gets it and nobody sees
it afterwards, and what is written is byte for byte what separate parses write."""

import os

import numpy as np
import onnx
import pytest
from conftest import copy_export
from onnx import TensorProto, helper

from vitexport.precision import CalibOptions, graphs
from vitexport.precision.prepare import run_quantize


def _identity(path, name):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"], name=name)], "g",
                                                  [x], [y])), str(path))
    return path


def test_readers_share_one_parse_and_a_taker_gets_it_for_itself(tmp_path):
    path = _identity(tmp_path / "m.onnx", "first")
    assert graphs.read_graph(path) is not graphs.read_graph(path)  # outside sharing(): a parse each
    with graphs.sharing():
        shared = graphs.read_graph(path)
        assert graphs.read_graph(path) is shared
        with graphs.sharing():  # nested: the same sharing
            assert graphs.read_graph(path) is shared
        taken = graphs.take_graph(path)
        assert taken is shared
        taken.graph.node[0].name = "changed by its taker"
        again = graphs.read_graph(path)
        assert again is not taken and again.graph.node[0].name == "first"
        assert graphs.take_graph(path) is again  # taken once more: the next parse is the taker's alone
        assert graphs.take_graph(path) is not again
        held = graphs.read_graph(path)
        graphs.let_go()
        assert graphs.read_graph(path) is not held
    assert graphs.read_graph(path) is not graphs.read_graph(path)


def test_the_weights_in_external_data_stay_on_disk(tmp_path):
    """Readers fetch external weights one at a time: a parse never loads them (here they are gone)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    w = onnx.numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    model = helper.make_model(helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [w]))
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="m.data", size_threshold=0)
    (tmp_path / "m.data").unlink()
    for read in (graphs.read_graph, graphs.take_graph):
        t = read(path).graph.initializer[0]
        assert t.data_location == TensorProto.EXTERNAL and not t.raw_data


def test_a_file_changed_while_shared_is_read_again(tmp_path):
    path = _identity(tmp_path / "m.onnx", "first")
    with graphs.sharing():
        assert graphs.read_graph(path).graph.node[0].name == "first"
        st = os.stat(path)
        _identity(path, "second, a longer name")
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
        assert graphs.read_graph(path).graph.node[0].name == "second, a longer name"


def test_a_prefetched_parse_is_the_first_readers_and_only_for_the_file_it_read(tmp_path, counted):
    path = _identity(tmp_path / "m.onnx", "first")
    graphs.prefetch(path)
    assert graphs._prefetched[graphs._state(path)].result().graph.node[0].name == "first"  # parsed on its thread
    with graphs.sharing():
        shared = graphs.read_graph(path)
        assert shared.graph.node[0].name == "first" and graphs.read_graph(path) is shared
    assert counted == ["m.onnx"]  # the prefetch's parse was the only one
    graphs.prefetch(path)
    with graphs.sharing():
        assert graphs.take_graph(path).graph.node[0].name == "first"  # a taker gets it too
    assert counted == ["m.onnx"] * 2
    graphs.prefetch(path)
    st = os.stat(path)
    _identity(path, "second, a longer name")  # changed after the prefetch: its parse is not handed out
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    with graphs.sharing():
        assert graphs.read_graph(path).graph.node[0].name == "second, a longer name"
    assert not graphs._prefetched  # the stale parse went with the run


def test_a_prefetch_of_nothing_or_of_a_broken_file_leaves_the_reader_to_say_so(tmp_path):
    before = dict(graphs._prefetched)  # (another test's command may have failed before its run took its parse)
    graphs.prefetch(tmp_path / "absent.onnx")  # no file: nothing starts, nothing raises
    os.mkfifo(tmp_path / "fifo.onnx")
    graphs.prefetch(tmp_path / "fifo.onnx")  # never opened: its read would wait for a writer forever
    assert graphs._prefetched == before
    graphs.prefetch(_identity(tmp_path / "a.onnx", "a"))
    graphs.prefetch(_identity(tmp_path / "b.onnx", "b"))
    assert list(graphs._prefetched) == [graphs._state(tmp_path / "b.onnx")]  # one held at a time
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"\xff" * 64)
    graphs.prefetch(broken)
    with graphs.sharing(), pytest.raises(Exception) as prefetched:
        graphs.read_graph(broken)
    with pytest.raises(Exception) as plain:
        graphs.read_graph(broken)
    assert type(prefetched.value) is type(plain.value)  # the reader's own parse raised, as without a prefetch


@pytest.fixture
def counted(monkeypatch):
    """The paths graphs parses, in order."""
    seen = []
    parse = graphs._parse

    def counting(path):
        seen.append(os.path.basename(path))
        return parse(path)

    monkeypatch.setattr(graphs, "_parse", counting)
    return seen


def test_int8_parses_its_fp32_graph_once_and_writes_what_separate_parses_write(tmp_path, digits_export, counted,
                                                                                 monkeypatch):
    folder = copy_export(digits_export, tmp_path / "m")
    opts = CalibOptions(samples=12, check=False)
    fresh = run_quantize(folder, "int8", opts)  # calibrated now: read by the session, then taken by the writer
    assert counted == ["model.onnx"]
    written = fresh.onnx_path.read_bytes()
    counted.clear()
    cached = run_quantize(folder, "int8", opts)  # the cached ranges: one parse, taken by the writer
    assert cached.cache_reused and not fresh.cache_reused and counted == ["model.onnx"]
    assert cached.onnx_path.read_bytes() == written
    monkeypatch.setattr(graphs, "_shared", None)
    monkeypatch.setattr(graphs, "sharing", lambda: _nothing_shared())
    from vitexport.precision import prepare

    monkeypatch.setattr(prepare, "sharing", lambda: _nothing_shared())
    counted.clear()
    separate = run_quantize(folder, "int8", opts)
    assert len(counted) >= 3 and separate.onnx_path.read_bytes() == written


class _nothing_shared:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
