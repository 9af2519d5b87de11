"""A process pinned to fewer cores than the machine has (taskset, a container's cpuset, a pinned test worker) runs
as many runtime threads as it has cores, not as the machine has."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")

CHILD = r"""
import os, sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

if sys.argv[1] == "one":
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
else:  # every core of the machine (a pinned test worker's child inherits one)
    try:
        os.sched_setaffinity(0, set(range(os.cpu_count())))
    except OSError:  # a cpuset narrower than the machine: nothing to show here
        print("cpuset"); sys.exit(0)
from vitexport.backends.ort_session import create_session
from vitexport.data.stream import default_workers
from vitexport.environment import usable_cores

w = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])], [w])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
sess = create_session(model.SerializeToString())
sess.run(None, {"x": np.ones((64, 64), np.float32)})
told = create_session(model.SerializeToString(), threads=2)
print(usable_cores(), default_workers(), sess.get_session_options().intra_op_num_threads,
      told.get_session_options().intra_op_num_threads)
"""


def test_a_process_on_one_core_runs_one_onnx_runtime_thread_unless_told_more():
    """ONNX Runtime sizes its pool by the machine's physical cores when left to choose (0); vitexport tells it the
    process's own, and an explicit thread count (--threads) still wins."""
    r = subprocess.run([sys.executable, "-c", CHILD, "one"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    cores, workers, default, told = map(int, r.stdout.split())
    assert (cores, workers) == (1, 2)  # one core; decoding keeps one thread more than the cores
    assert (default, told) == (1, 2)


def test_a_process_free_to_use_every_core_leaves_the_count_to_onnx_runtime():
    """On the whole machine ONNX Runtime keeps its own choice (0: its physical cores, fewer than the logical ones
    where the CPU has SMT); decoding still uses every core."""
    r = subprocess.run([sys.executable, "-c", CHILD, "all"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    if r.stdout.strip() == "cpuset":
        pytest.skip("this process's cpuset is narrower than the machine")
    cores, workers, default, told = map(int, r.stdout.split())
    assert cores == os.cpu_count() and workers == min(8, cores + 1)
    assert (default, told) == (0, 2)
