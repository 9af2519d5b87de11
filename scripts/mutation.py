"""Mutation testing of the decision modules with mutmut 3: does the test suite notice a broken line?

    pip install 'vitexport[mutation]'
    python scripts/mutation.py                      # every module below
    python scripts/mutation.py parity/compare.py    # one (a key of MODULES)

For each module, a scratch copy of the checkout (its tracked files) gets a [tool.mutmut] section that mutates
only that module and runs only the tests that cover it (MODULES), with mutmut's fork server (torch and ONNX
Runtime are not fork-safe). Prints, per module, the mutants killed, survived, timed out, and the score
killed / (all - equivalent); the survivors with their diffs; and writes everything to --out (JSON). Mutants
marked equivalent in EQUIVALENT (with why) are listed and left out of the score.

Not part of CI: on 2 cores a module takes minutes to tens of minutes. Results: docs/MUTATION.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# module (under vitexport/) -> the tests that cover it (pytest arguments); fast ones, no export of a model
MODULES: dict[str, list[str]] = {
    "parity/compare.py": ["tests/test_parity_rules.py", "tests/test_intervals.py", "-k", "not bench"],
    "parity/stats.py": ["tests/test_intervals.py", "-k", "not bench"],
    "parity/accumulate.py": ["tests/test_parity_rules.py", "tests/test_intervals.py", "-k", "not bench"],
    "tensorrt_engine/engine_info.py": ["tests/test_engine_info.py"],
    "tensorrt_engine/trt_build.py": ["tests/test_trt_events.py"],
    "backends/tensorrt.py": ["tests/test_gpu_runners_cpu.py", "tests/test_tensorrt_engine.py",
                             "tests/test_trt_events.py"],
    "artifacts/verify.py": ["tests/test_verify.py"],
    "preflight.py": ["tests/test_preflight.py", "tests/test_faults.py", "-k", "estimate or preflight"],
    "precision/calibrate.py": ["tests/test_calibrate.py", "tests/test_sensitivity.py::test_channel_max_and_scales"],
    "precision/qdq.py": ["tests/test_qdq_rules.py", "tests/test_qdq.py", "-k", "rules or weight"],
    "bench/load.py": ["tests/test_endpoint_rules.py"],
    "parity/knn.py": ["tests/test_data_rules.py::test_knn_figures_pair_the_candidate_with_the_reference",
                      "tests/test_data_rules.py::test_knn_excludes_each_image_itself_and_clamps_k",
                      "tests/test_data_rules.py::test_the_temperature_weighs_close_neighbours_more",
                      "tests/test_data_rules.py::test_knn_edges",
                      "tests/test_data_rules.py::test_the_kth_neighbour_counts",
                      "tests/test_embeddings.py::test_blocked_neighbours_equal_all_pairs_at_once",
                      "tests/test_embeddings.py::test_the_knn_drop_is_judged_like_accuracy_and_argmax_agreement_is_not"],
    "data/labelfile.py": ["tests/test_data_rules.py", "-k", "label or real or key"],
    "validate/labels.py": ["tests/test_data_rules.py", "tests/test_dataset_labels.py::test_names_two_classes_share_map_to_neither",
                           "-k", "reading or names or model_labels"],
    "model/outputs.py": ["tests/test_data_rules.py", "-k", "outputs or shapes or output_sentences"],
    "precision/graphs.py": ["tests/test_graphs.py", "-k", "not int8"],  # the int8 test exports (torch in a fork)
    "bench/latency.py": ["tests/test_latency.py", "tests/test_bench.py::test_default_timing_stops_once_the_median_is_stable"],
    "bench/figures.py": ["tests/test_report.py"],
}

# mutant name -> why it cannot change behaviour (left out of the score)
_P, _S, _A = "vitexport.parity.compare.", "vitexport.parity.stats.", "vitexport.parity.accumulate."
_E, _B = "vitexport.tensorrt_engine.engine_info.", "vitexport.tensorrt_engine.trt_build."
_V, _F = "vitexport.artifacts.verify.", "vitexport.preflight."
_K = "vitexport.parity.knn."
_C, _H = "vitexport.precision.calibrate.", "vitexport.precision.calibrate.xǁAbsHistogramǁ"
_RESHAPE = "numpy reads any negative size in reshape as 'the rest'"
_KL = "vitexport.precision.calibrate.x__kl_threshold__mutmut_"
_WHOLE = "the graph read with its external weights too (or None, which onnx takes as False): memory, not outputs"
_R = "vitexport.backends.tensorrt.xǁTensorRTRunnerǁ"
_UNREAD = ("a placeholder until load() (or _bind()) sets it: stage(), run() and engine_layers() refuse an unloaded "
           "runner first")
EQUIVALENT: dict[str, str] = {
    **{f"{_R}__init____mutmut_{i}": _UNREAD for i in (12, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 27, 28)},
    _R + "_check_plan__mutmut_47": "read_sidecar refuses a sidecar without 'precision': the default is never taken",
    _R + "_check_plan__mutmut_49": "read_sidecar refuses a sidecar without 'precision': the default is never taken",
    _R + "_source_onnx__mutmut_9":
        "read_sidecar already refused a source name out of the folder, with the sidecar's name in its sentence",
    _R + "_live_stream__mutmut_1": "load() sets the stream and the context together and close() clears both",
    _V + "x_digest__mutmut_13": "None is as false as False: the caller waits for the other thread's hash",
    _V + "x_digest__mutmut_22": "the key is there: this call put it there, and only the call that put it removes it",
    **{_V + f"x_prefetch_digest__mutmut_{i}": "a thread's name is for a debugger; nothing reads it"
       for i in (4, 7, 9, 10)},
    **{_V + f"x_prefetch_digest__mutmut_{i}": "a daemon or not, the hash runs to its end or its error: it only decides "
       "whether the interpreter waits for it at exit" for i in (5, 8, 11)},
    **{f"vitexport.precision.graphs.x_prefetch__mutmut_{i}": "a thread's name is for a debugger; nothing reads it"
       for i in (11, 14, 16, 17)},
    **{f"vitexport.precision.graphs.x_prefetch__mutmut_{i}": "a daemon or not, the parse runs to its end or its "
       "error: it only decides whether the interpreter waits for it at exit" for i in (12, 15, 18)},
    _V + "x_check_plan__mutmut_62":
        "read_sidecar already refused a source name out of the folder, with the sidecar's name in its sentence",
    _F + "x_vit_memory__mutmut_41": "a missing num_classes gives None or 0: both are 0 classes",
    _F + "x_vit_memory__mutmut_43": "a missing num_classes gives None or 0: both are 0 classes",
    _F + "x_check_op_types__mutmut_6": "onnx.load tests load_external_data for truth: None is False",
    _F + "x_check_op_types__mutmut_18": "3 is difflib.get_close_matches' default n",
    _F + "x_spec_config__mutmut_26": "a ModelSpec always has overrides: the default is never taken",
    _F + "x_spec_config__mutmut_29": "a ModelSpec always has overrides: the default is never taken",
    _H + "__init____mutmut_2": "the width is set by the first non-empty batch before anything reads it",
    _H + "__init____mutmut_3": "the width is set by the first non-empty batch before anything reads it",
    _H + "_grow__mutmut_10": "merging runs of one bin changes nothing",
    _H + "_grow__mutmut_27": _RESHAPE,
    _H + "coarse__mutmut_6": "summing runs of one bin changes nothing",
    _H + "coarse__mutmut_8": "astype(None) is float64",
    _H + "coarse__mutmut_20": "int64 counts padded with float zeros sum to the same float64 values",
    _H + "coarse__mutmut_22": "int64 counts padded with float zeros sum to the same float64 values",
    _H + "coarse__mutmut_24": _RESHAPE,
    _H + "coarse__mutmut_26": "astype(None) is float64",
    _H + "percentile_amax__mutmut_27": "a cumulative sum of int64 counts is exact either way",
    _H + "percentile_amax__mutmut_29": "a cumulative sum of int64 counts is exact either way",
    _H + "percentile_amax__mutmut_24": "the values below the floor may go in any bin up to the floor's (the first is "
    "one): the count stays under the rank below it either way",
    **{_H + f"__init____mutmut_{i}": "`above` is read only once keep_top has set a floor, and set with it"
       for i in (10, 11)},
    _H + "keep_top__mutmut_1": "an assertion of how it is called (once, after the first batch) that the caller keeps",
    **{_H + f"keep_top__mutmut_{i}": "a floor a bin or two lower (or none where it would be the second bin) bins "
       "more values; percentile_amax finds the same bin" for i in (28, 29, 30, 35)},
    _KL + "2": "a histogram of at most 128 bins returns its length before the zero bin is read",
    _KL + "3": "a histogram of at most 128 bins returns its length before the zero bin is read",
    _KL + "8": "at 128 bins the only threshold tried is 128 itself",
    _KL + "36": "the last kept bin always falls in level 127: bincount is 128 long anyway",
    _KL + "43": "the last kept bin always falls in level 127: bincount is 128 long anyway",
    _KL + "44": "astype(None) is float64",
    _KL + "60": "every candidate's reference has the same total: scaling p scales each divergence alike",
    _KL + "66": "histogram counts are whole numbers: a nonzero sum is at least 1",
    _KL + "70": "q == 0 where p > 0 makes the divergence inf through the logarithm as well",
    _KL + "73": "q == 0 where p > 0 makes the divergence inf through the logarithm as well",
    **{_C + f"x__scratch__mutmut_{i}": "buffers made anew for each chunk (or float64 scratch, into which |x| of "
       "float32 is exact) change the speed, not the counts" for i in (1, 6, 7, 11, 13)},
    **{_H + f"update__mutmut_{i}": "activations come from ONNX Runtime as float32 already" for i in (3, 5)},
    _H + "update__mutmut_46": "a chunk whose largest |x| equals the largest seen needs no more bins than it has",
    _H + "update__mutmut_57": "growing to the length the bins have adds none",
    _H + "update__mutmut_61": "a value equal to the floor lies in a bin below the floor's, counted or binned: the "
    "bin found is the same",
    **{_C + f"xǁChannelMaxǁupdate__mutmut_{i}": "activations come from ONNX Runtime as float32 already"
       for i in (4, 6)},
    _C + "xǁChannelMaxǁupdate__mutmut_16": _RESHAPE,
    **{_C + f"x_calibrate__mutmut_{i}": _WHOLE for i in (21, 23, 25)},
    **{_C + f"x_calibration_batch__mutmut_{i}": _WHOLE for i in (6, 8, 10)},
    **{_C + f"x_observed_model_bytes__mutmut_{i}": _WHOLE for i in (3, 5, 7)},
    _C + "x_calibration_batch__mutmut_12": "shape inference gives a graph that has value_info the same value_info",
    _C + "x_calibration_batch__mutmut_24": "a dimension without a value reads dim_value 0, the default taken",
    _C + "x_calibration_batch__mutmut_54": "one image's activations are thousands of bytes: never 1",
    **{_C + f"x_calibrate__mutmut_{i}": "the session's thread count changes its speed, not its outputs"
       for i in (37, 41)},
    **{_C + f"x_calibrate__mutmut_{i}": "one count runs at a time whatever the pool's size or thread names: each "
       "is waited for before the next is submitted" for i in range(68, 75)},
    _C + "x_calibrate__mutmut_104": "every collector's result() is a Python float already",
    "vitexport.benchmark.figures.x_unsettled_line__mutmut_9": "STABLE * 101 is 2.02 where STABLE * 100 is 2: the same "
    "whole percent",
    _E + "x_dtype_of__mutmut_8": "the text is lower-cased before the split: A-Z never occurs in it",
    _E + "x__kind__mutmut_37": "the pattern is matched with re.I: its letters' case does not matter",
    _E + "x__is_scalar__mutmut_26": "a symbolic axis counts as 2 or 3 elements: more than one either way",
    _E + "x_layer_fact__mutmut_103": "'unknown' is not in PRECISION_ORDER: _narrowest drops it anyway",
    _E + "x_layer_fact__mutmut_104": "'unknown' is not in PRECISION_ORDER: _narrowest drops it anyway",
    _B + "x__use_timing_cache__mutmut_9": "pybind11 converts None to False for a bool argument (type_caster<bool>)",
    _B + "x__use_timing_cache__mutmut_17": "pybind11 converts None to False for a bool argument (type_caster<bool>)",
    _B + "x__use_timing_cache__mutmut_22": "an empty timing cache has no entry whose mismatch could be ignored",
    _B + "xǁ_ProgressMonitorǁphase_finish__mutmut_1":
        "BuildMonitor.phase_finish only forgets the phase's last report time; nothing reads it after the phase ends",
    _P + "x__undecided_drop__mutmut_25": "the flip rate only seeds images_to_resolve's search for the exact size",
    _S + "x__log_pmf__mutmut_3": "an integer k is promoted to float64 by k * log(p): the same values",
    _S + "x__log_pmf__mutmut_5": "an integer k is promoted to float64 by k * log(p): the same values",
    _S + "x__tail_ge__mutmut_1": "k = 0 through the general sum gives 1.0 up to rounding, as the shortcut does",
    _S + "x__tail_ge__mutmut_21":
        "a sum of probabilities never exceeds 1 beyond rounding: the clamp at 2 is the clamp at 1",
    _S + "x__bisect__mutmut_2":
        "the functions bisected are flat past p = 1 (the p >= 1 branch): the same root to 1e-17",
    _S + "x__bisect__mutmut_3": "one more halving of an interval already 2**-60 wide",
    _S + "x__bisect__mutmut_10": "differs only where f(mid) is exactly 0, a measure-zero case of the root itself",
    _S + "x_clopper_pearson__mutmut_2": "n = 0 through the general path gives (0.0, 1.0) as the shortcut does",
    _S + "x_paired_drop__mutmut_26": "clopper_pearson(0, 0) is (0.0, 1.0), the value the branch spells out",
    _S + "x_paired_drop__mutmut_48": "at e_hi == 0 both products are 0",
    _S + "x_paired_drop__mutmut_55": "at e_lo == 0 both products are 0",
    _A + "xǁParityAccumulatorǁ__init____mutmut_7": "labels are compared with int64 indices whatever their dtype",
    _A + "xǁParityAccumulatorǁ__init____mutmut_9": "labels are compared with int64 indices whatever their dtype",
    _A + "xǁParityAccumulatorǁ__init____mutmut_17": "np.zeros is float64 by default",
    _A + "xǁParityAccumulatorǁ__init____mutmut_19": "np.zeros is float64 by default",
    _A + "xǁParityAccumulatorǁ__init____mutmut_22": "np.zeros is float64 by default",
    _A + "xǁParityAccumulatorǁ__init____mutmut_24": "np.zeros is float64 by default",
    _A + "xǁParityAccumulatorǁ__init____mutmut_31":
        "top-1 indices compared for equality: float zeros hold them exactly",
    _A + "xǁParityAccumulatorǁ__init____mutmut_33":
        "top-1 indices compared for equality: float zeros hold them exactly",
    _A + "xǁParityAccumulatorǁ__init____mutmut_36":
        "top-1 indices compared for equality: float zeros hold them exactly",
    _A + "xǁParityAccumulatorǁ__init____mutmut_38":
        "top-1 indices compared for equality: float zeros hold them exactly",
    _A + "xǁParityAccumulatorǁ__init____mutmut_41": "a float 0/1 array has the mean of the bool one",
    _A + "xǁParityAccumulatorǁ__init____mutmut_43": "a float 0/1 array has the mean of the bool one",
    _A + "xǁParityAccumulatorǁupdate__mutmut_7":
        "the logits are float already; differences and norms are taken in numpy's float arithmetic",
    _A + "xǁParityAccumulatorǁupdate__mutmut_9":
        "the logits are float already; differences and norms are taken in numpy's float arithmetic",
    _A + "xǁParityAccumulatorǁupdate__mutmut_18":
        "the logits are float already; differences and norms are taken in numpy's float arithmetic",
    _A + "xǁParityAccumulatorǁupdate__mutmut_20":
        "the logits are float already; differences and norms are taken in numpy's float arithmetic",
    _A + "xǁParityAccumulatorǁupdate__mutmut_11": "numpy reads any negative size in reshape as 'the rest'",
    _A + "xǁParityAccumulatorǁupdate__mutmut_22": "numpy reads any negative size in reshape as 'the rest'",
    _A + "xǁParityAccumulatorǁupdate__mutmut_36": "None is falsy where False is tested",
    _A + "xǁParityAccumulatorǁupdate__mutmut_41":
        "once a value is not finite every figure is NaN or 0 whatever replaced it",
    _A + "xǁParityAccumulatorǁupdate__mutmut_42":
        "once a value is not finite every figure is NaN or 0 whatever replaced it",
    _A + "xǁParityAccumulatorǁupdate__mutmut_44":
        "once a value is not finite every figure is NaN or 0 whatever replaced it",
    _A + "xǁParityAccumulatorǁupdate__mutmut_45":
        "once a value is not finite every figure is NaN or 0 whatever replaced it",
    _A + "xǁParityAccumulatorǁupdate__mutmut_46":
        "once a value is not finite every figure is NaN or 0 whatever replaced it",
    _A + "xǁParityAccumulatorǁupdate__mutmut_47":
        "once a value is not finite every figure is NaN or 0 whatever replaced it",
    _A + "xǁParityAccumulatorǁupdate__mutmut_48":
        "once a value is not finite every figure is NaN or 0 whatever replaced it",
    _A + "xǁParityAccumulatorǁupdate__mutmut_49":
        "once a value is not finite every figure is NaN or 0 whatever replaced it",
    _A + "xǁParityAccumulatorǁupdate__mutmut_58":
        "only the maximum over all images is reported: the max of row maxima is the global max",
    _A + "xǁParityAccumulatorǁstats__mutmut_8": "float('NAN') is float('nan')",
    **{f"{_K}x__unit__mutmut_{i}": "float embeddings: numpy's own float type normalises them the same"
       for i in (7, 9)},
    _K + "x__unit__mutmut_11": _RESHAPE,
    "vitexport.data.labelfile.x_read_label_file__mutmut_15": "codec names are read without regard to case",
    "vitexport.validate.labels.x_readers__mutmut_19": "a class maps to none when its index is negative: -2 as -1",
    **{f"vitexport.validate.labels.x_map_classes__mutmut_{i}": "numpy's default integer is int64 on the platforms "
                                                                "vitexport runs on" for i in (12, 14)},
    _K + "x_neighbours__mutmut_38": "an extra class column gets no vote: every vote is positive, so it is never the "
                                    "argmax",
    _K + "x_neighbours__mutmut_44": "query blocks one image apart overlap; each image's row is written again with the "
                                    "same values",
    **{f"{_K}x_neighbours__mutmut_{i}": "NaN instead of -inf for an empty slot or the image itself: argpartition "
                                        "puts NaN after every number, and each image has at least k others"
       for i in (59, 99)},
    **{f"{_K}x_neighbours__mutmut_{i}": "float64 instead of float32 (or numpy's default float): the same order of "
                                        "similarities and the same votes" for i in (60, 63, 162, 164, 174)},
    **{f"{_K}x_neighbours__mutmut_{i}": "argpartition's and take_along_axis' default axis is the last, axis 1 here"
       for i in (129, 140, 147)},
    "vitexport.precision.graphs.x__parse__mutmut_2": "load_external_data=None: onnx.load_model tests it for truth "
                                                     "(`if load_external_data:`), as it does False",
}


def scratch_copy(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in files.decode().split("\0"):
        if name:
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target)


def config(module: str, tests: list[str]) -> str:
    def toml_list(items: list[str]) -> str:
        return "[" + ", ".join(json.dumps(i) for i in items) + "]"

    return f"""
[tool.mutmut]
source_paths = ["vitexport"]
only_mutate = ["vitexport/{module}"]
also_copy = ["docs", "calibration", "models", "scripts", "README.md"]
pytest_add_cli_args_test_selection = {toml_list(tests)}
pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-n", "0"]  # mutmut records which test runs what in its own process
process_isolation = "forkserver"
timeout_multiplier = 5.0
"""


def results(work: Path) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=work,
                         capture_output=True, text=True)
    found = {}
    for line in out.stdout.splitlines():
        m = re.match(r"\s*([\w.ǁ]+__mutmut_\d+): (.+)$", line)
        if m:
            found[m.group(1)] = m.group(2).strip()
    return found


def show(work: Path, name: str) -> str:
    return subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=work, capture_output=True,
                          text=True).stdout


def run_module(module: str, tests: list[str], workers: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="vitexport-mutation-") as tmp:
        work = Path(tmp)
        scratch_copy(work)
        with open(work / "pyproject.toml", "a") as f:
            f.write(config(module, tests))
        t0 = time.perf_counter()
        env = {**os.environ, "PYTHONPATH": str(work)}
        subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(workers)], cwd=work, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        found = results(work)
        survivors = {n: show(work, n) for n, s in found.items() if s == "survived" and n not in EQUIVALENT}
        # a listed mutant's diff beside its reason: a name that now means another mutant shows in the file
        listed = {n: show(work, n) for n, s in found.items() if s == "survived" and n in EQUIVALENT}
    counts: dict[str, int] = {}
    for s in found.values():
        counts[s] = counts.get(s, 0) + 1
    # only a surviving mutant leaves the score as equivalent; a listed one that a test kills is a stale name (the
    # module changed and its numbers moved): it counts as killed and is reported, for the list to be fixed
    equivalent = [n for n, st in found.items() if n in EQUIVALENT and st == "survived"]
    stale = sorted(n for n, st in found.items() if n in EQUIVALENT and st != "survived")
    decided = len(found) - len(equivalent)
    killed = counts.get("killed", 0) + counts.get("timeout", 0)  # a mutant that hangs the tests is caught too
    return {"module": module, "tests": tests, "seconds": round(time.perf_counter() - t0), "mutants": len(found),
            "counts": counts, "equivalent": {n: {"why": EQUIVALENT[n], "diff": listed[n]} for n in equivalent},
            "score": round(killed / decided, 4) if decided else None, "survivors": survivors,
            "no_tests": sorted(n for n, st in found.items() if st == "no tests"), "stale_equivalent": stale,
            "statuses": found}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("modules", nargs="*", help="keys of MODULES (default: all)")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2)))
    ap.add_argument("--out", type=Path, default=Path("mutation.json"))
    ap.add_argument("--quiet-survivors", action="store_true", help="do not print the survivors' diffs")
    args = ap.parse_args()
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        sys.exit(f"unknown module(s) {', '.join(unknown)}; choose from: {', '.join(MODULES)}")
    report = []
    for module in args.modules or list(MODULES):
        r = run_module(module, MODULES[module], args.workers)
        report.append(r)
        score = "n/a" if r["score"] is None else f"{r['score']:.1%}"
        print(f"{module}: {r['mutants']} mutants, {r['counts']}, score {score}, {r['seconds']} s", flush=True)
        if not args.quiet_survivors:
            for name, diff in r["survivors"].items():
                print(f"--- survived: {name}\n{diff}")
            for name in r["no_tests"]:
                print(f"--- no test runs it: {name}")
        for name in r["stale_equivalent"]:
            print(f"--- listed as equivalent but {r['statuses'][name]}: {name} (fix EQUIVALENT)")
        args.out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
