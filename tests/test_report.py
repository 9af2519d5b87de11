"""The bench report's text, from hand-made results: unavailable rows grouped by cause, untimed rows without a
speed ratio."""

from vitexport.bench.latency import Latency
from vitexport.bench.report import print_table, to_markdown, unavailable_lines
from vitexport.bench.run import BackendResult, BenchReport

GPU = "no CUDA GPU visible, so {} cannot start"
TRT = "TensorRT is not installed; install it with `pip install 'vitexport[trt]'` on a machine with an NVIDIA GPU."


def _off(name, reason):
    backend, device, precision = name.split()
    return BackendResult(name, backend, precision, device, "", False, reason)


def _report(results):
    env = {"cpu": "test CPU", "cores": 2, "threads": 2, "gpu": None, "versions": {}}
    model = {"variant": "vit_digits_patch4_32", "img_size": [32, 32], "random_weights": False,
             "checkpoint": {"path": "x"}}
    return BenchReport("0", "now", env, model, [], {"n_parity": 3, "source": "d", "labelled": False}, "ref", {}, {},
                       results)


def test_rows_that_share_a_cause_are_one_line_and_a_lone_row_keeps_its_reason():
    results = [_off(f"onnxruntime cuda {p}", GPU.format("CUDAExecutionProvider")) for p in ("fp32", "fp16", "int8")]
    results += [_off(f"onnxruntime trt-ep {p}", GPU.format("TensorrtExecutionProvider")) for p in ("fp32", "fp16")]
    results += [_off(f"tensorrt cuda {p}", TRT) for p in ("fp16", "int8")]
    results += [_off("openvino cpu bf16", "this CPU has no BF16 arithmetic")]
    lines = unavailable_lines(_report(results))
    assert lines == [
        "5 rows unavailable: no CUDA GPU visible (onnxruntime cuda fp32, onnxruntime cuda fp16, onnxruntime cuda "
        "int8, onnxruntime trt-ep fp32, onnxruntime trt-ep fp16)",
        f"2 rows unavailable: {TRT} (tensorrt cuda fp16, tensorrt cuda int8)",
        "openvino cpu bf16: unavailable: this CPU has no BF16 arithmetic",
    ]
    md = to_markdown(_report(results))
    assert md.count("rows unavailable") == 2 and md.count("no CUDA GPU visible") == 1


def test_an_untimed_row_prints_no_speed_ratio(capsys):
    from rich.console import Console

    timed = BackendResult("onnxruntime cpu int8", "onnxruntime", "int8", "cpu", "", True,
                          latency=[Latency(8, 20, 10.0, 9.0, 11.0, 12.0, 800.0, relative_to_reference=3.45)])
    untimed = BackendResult("onnxruntime cpu int8-trt", "onnxruntime", "int8-trt", "cpu", "", True,
                            info={"not_timed": "the graph is shaped for another runtime"})
    report = _report([timed, untimed])
    print_table(report, Console(width=200, force_terminal=False))
    table = capsys.readouterr().out
    timed_line = next(line for line in table.splitlines() if "onnxruntime cpu int8 " in line)
    untimed_line = next(line for line in table.splitlines() if "int8-trt" in line and "│" in line)
    assert "3.45x" in timed_line and "x" not in untimed_line.split("│")[7]
    md_row = next(line for line in to_markdown(report).splitlines() if line.startswith("| onnxruntime cpu int8-trt"))
    assert md_row.split("|")[8].strip() == ""


def test_timings_whose_median_had_not_settled_are_named_with_their_runs(capsys):
    from rich.console import Console

    settled = Latency(1, 5, 10.0, 9.0, 11.0, 12.0, 100.0, stable=True)
    cut = Latency(8, 4, 2000.0, 1990.0, 2100.0, 2200.0, 4.0, stable=False)
    asked = Latency(8, 3, 2000.0, 1990.0, 2100.0, 2200.0, 4.0)  # --iterations: not judged
    served = Latency(8, 200, 50.0, 49.0, 60.0, 70.0, 160.0, concurrency=4, stable=False, windows=10, p95_ms=65.0,
                     requests=200)  # said with its windows, not here
    rows = [BackendResult("onnxruntime cpu fp32", "onnxruntime", "fp32", "cpu", "", True, latency=[settled, cut]),
            BackendResult("openvino cpu fp32", "openvino", "fp32", "cpu", "", True, latency=[asked]),
            BackendResult("triton http fp32", "triton", "fp32", "http", "", True, latency=[served])]
    report = _report(rows)
    print_table(report, Console(width=400, force_terminal=False))
    line = next(x for x in capsys.readouterr().out.splitlines() if "settled" in x)
    assert line.strip().startswith("Timing stopped before the median settled")
    assert "onnxruntime cpu fp32 batch 8 (4 runs)" in line and "batch 1" not in line
    assert "openvino" not in line and "triton" not in line
    assert "- Timing stopped before the median settled" in to_markdown(report)
    rows[0].latency = [settled]
    print_table(_report(rows), Console(width=400, force_terminal=False))
    assert "settled" not in capsys.readouterr().out and "settled" not in to_markdown(_report(rows))
