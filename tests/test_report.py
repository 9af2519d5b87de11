"""The bench report's text, from hand-made results: unavailable rows grouped by cause, untimed rows without a
speed ratio."""

from vitexport.benchmark.latency import Latency
from vitexport.benchmark.report import print_table, to_markdown, unavailable_lines
from vitexport.benchmark.run import BackendResult, BenchReport

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
    lines = unavailable_lines(_report(results).to_dict())
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
    assert line.strip().startswith("Timing stopped before the median settled (the last two runs moved it by more "
                                   "than 2 %; 6 s of runs a configuration at most): onnxruntime cpu fp32 batch 8 (4 "
                                   "runs); a busy machine")
    assert "onnxruntime cpu fp32 batch 8 (4 runs)" in line and "batch 1" not in line
    assert "openvino" not in line and "triton" not in line
    assert "- Timing stopped before the median settled" in to_markdown(report)
    from vitexport.benchmark.figures import unsettled_line

    rows[1].latency = [Latency(1, 3, 20.0, 19.0, 21.0, 22.0, 50.0, stable=False)]
    assert ": onnxruntime cpu fp32 batch 8 (4 runs), openvino cpu fp32 batch 1 (3 runs); " in unsettled_line(
        _report(rows))
    rows[0].latency, rows[1].latency = [settled], [asked]
    assert unsettled_line(_report(rows)) == ""
    print_table(_report(rows), Console(width=400, force_terminal=False))
    assert "settled" not in capsys.readouterr().out and "settled" not in to_markdown(_report(rows))


def _row(name, available=True, **figures):
    from vitexport.parity.compare import ParityStats, ParityVerdict, Thresholds

    stats = ParityStats(100, 0.1, 0.01, 0.99, 0.999, 0.98, 1.0, **figures)
    backend, device, precision = name.split()
    return BackendResult(name, backend, precision, device, "", available, parity=ParityVerdict(stats, Thresholds()))


def test_the_figures_beyond_the_table_are_one_line_each_with_their_intervals():
    from vitexport.benchmark.figures import figure_lines

    subset = _row("onnxruntime cpu int8", subset_classes=200, acc_subset=0.8125, acc_subset_ci=[0.78, 0.843],
                  acc_subset_ref=0.82, acc_subset_drop_ci=[-0.5, 2.0])
    knn = _row("openvino cpu fp16", knn_k=20, knn_t=0.07, knn_acc=0.9, knn_acc_ci=[0.851, 0.934], knn_acc_ref=0.905,
               knn_drop_ci=[-1.25, 2.5], neighbour_agree=0.97, neighbour_agree_ci=[0.915, 0.99])
    unlabelled = _row("pytorch cpu fp32", knn_k=5, knn_t=1.0, neighbour_agree=1.0)
    real = _row("onnxruntime cpu fp16", real_n=1234, real_acc=0.875, real_acc_ci=[0.85, 0.9], real_acc_ref=0.88,
                real_acc_drop_ci=[-0.3, 1.3])
    plain = _row("onnxruntime cpu fp32")  # a labelled set of the model's classes: the table says it all
    off = _row("openvino cpu bf16", available=False, real_n=5, real_acc=0.5, real_acc_ref=0.5)
    old = _row("onnxruntime cpu bf16", subset_classes=10, acc_subset=0.5, acc_subset_ref=0.5)  # no intervals kept
    assert figure_lines(_report([off, plain, subset, knn, unlabelled, real, old])) == [
        "onnxruntime cpu int8: top-1 over the 200 classes present 81.25% [78.0%, 84.3%] (reference 82.00%, drop "
        "[-0.50, +2.00] pts)",
        "openvino cpu fp16: k-NN top-1 90.00% [85.1%, 93.4%] (reference 90.50%, drop [-1.25, +2.50] pts), nearest "
        "neighbour the same as the reference's for 97.00% [91.5%, 99.0%] (k=20, T=0.07)",
        "pytorch cpu fp32: nearest neighbour the same as the reference's for 100.00% (k=5, T=1)",
        "onnxruntime cpu fp16: ReaL top-1 87.50% [85.0%, 90.0%] on 1,234 images (reference 88.00%, drop [-0.30, "
        "+1.30] pts)",
        "onnxruntime cpu bf16: top-1 over the 10 classes present 50.00% (reference 50.00%)",
    ]


def test_the_data_and_label_lines_say_where_they_came_from():
    from vitexport.benchmark.figures import labels_line, source_line

    assert source_line({"n": 2000, "source": "/data/x", "generated": "generated once from the photos"}) == \
        "Data: the 2,000 images of /data/x, generated once from the photos."
    assert source_line({"n": 2000, "source": "/data/x"}) == ""
    labels = {"source": "200 class folders", "how": "WordNet synsets", "present": 200, "num_classes": 1000}
    assert labels_line({"labels": labels}) == \
        "Labels: 200 class folders read by WordNet synsets, 200 of the model's 1,000 classes."
    assert labels_line({"labels": {**labels, "present": 0, "real": True}}) == \
        "Labels: 200 class folders read by WordNet synsets, with ImageNet-ReaL labels."
    assert labels_line({"labels": None}) == labels_line({}) == ""


def test_the_fastest_row_named_is_the_fastest_cpu_row_within_its_bounds_at_each_batch():
    from vitexport.benchmark.figures import fastest_line, fastest_rows

    def row(name, device, status, *lats, backend="onnxruntime"):
        return {"name": name, "device": device, "backend": backend, "available": True, "parity": {"status": status},
                "latency": [{"batch": b, "throughput": t, "relative_to_reference": t / 100, "concurrency": c}
                            for b, t, c in lats]}

    d = {"results": [row("pytorch cpu fp32", "cpu", "pass", (1, 100, None), (8, 200, None)),
                     row("onnxruntime cpu int8", "cpu", "fail", (1, 900, None), (8, 990, None)),  # missed: not it
                     row("openvino cpu int8", "cpu", "pass", (1, 300, None), (8, 250, None)),
                     row("onnxruntime cuda fp16", "cuda", "pass", (1, 5000, None)),  # not a CPU row
                     row("endpoint", "cpu", "pass", (1, 700, 4), backend="endpoint"),  # served under load
                     row("openvino cpu bf16", "cpu", "pass", (8, 260, None))]}
    assert [(b, name) for b, name, *_ in fastest_rows(d)] == [(1, "openvino cpu int8"), (8, "openvino cpu bf16")]
    assert fastest_line(d) == ("Fastest CPU row within its bounds: batch 1 openvino cpu int8 (3.00x the reference), "
                               "batch 8 openvino cpu bf16 (2.60x the reference)")
    assert fastest_line({"results": [row("a", "cpu", "fail", (1, 5, None))]}) == ""
