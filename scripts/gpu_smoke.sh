#!/usr/bin/env bash
# The GPU check, unattended, sized to finish within 10 minutes on one H200. Runs from a checkout (no install of
# vitexport needed: the checkout goes on PYTHONPATH); needs torch with CUDA, and TensorRT >= 10.12 for all but step 1.
#
#   1. PyTorch CUDA rows: each model exported and benched on PyTorch CUDA against PyTorch CPU FP32. Without
#      TensorRT the script stops here with one sentence (exit 4).
#   2. TensorRT, per model: `trt --fp16`, `trt --int8` and, on compute capability 8.9 or newer, `trt --fp8`
#      (profile opt batch 32, max 64), then `bench --strict` of
#      the PyTorch CUDA and TensorRT rows. It fails when a command fails, a row misses parity (or cannot decide
#      it), an engine does not load, or an engine does not run as its graph asks (an FP32 GEMM, a quantized GEMM
#      that fell back to FP16, an attention left unfused: the runner's engine_problems).
#   3. Speed (scripts/trt_speed.py): the plans timed side by side in interleaved rounds at the opt batch; medians
#      and round-by-round ratios to FP16. For the models in SPEED_GATE, INT8 or FP8 below GATE x FP16 fails.
#   4. INT8 again with ModelOpt's Q/DQ placement (`--placement modelopt`) in a copy of the folder, benched and timed
#      against the same FP16 plan (reported, not gated: which placement is the default is this measurement's).
#   5. One table of every model's plans (throughput, x FP16, accuracy), then the GPU tests.
#
#   bash scripts/gpu_smoke.sh                   # artifacts under ./smoke-models (VITEXPORT_MODELS)
#   MODELS="vit_digits_patch4_32:32x32" bash scripts/gpu_smoke.sh
#   SPEED_GATE="" bash scripts/gpu_smoke.sh     # report the speed ratios without failing on them
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
out="${VITEXPORT_MODELS:-smoke-models}"
models="${MODELS:-vit_digits_patch4_32:32x32 vit_base_patch16_224:224x224}"
speed_gate="${SPEED_GATE-vit_base_patch16_224}"
gate="${GATE:-1.1}"
opt_batch="${OPT_BATCH:-32}"
max_batch="${MAX_BATCH:-64}"
vitexport="python -m vitexport"
export VITEXPORT_MODELS="$out"
mkdir -p "$out"

step() { printf '\n== [%3ds] %s\n' "$SECONDS" "$*" >&2; }
fail() { printf 'gpu_smoke: FAILED: %s\n' "$*" >&2; exit 1; }
dir_of() { local variant="${1%%:*}" size="${1#*:}"; [[ "$size" == "$1" ]] && size=""; echo "$out/$variant${size:+-$size}"; }

step "environment"
python - <<'PY' || fail "a CUDA GPU is required for this script"
import sys
from vitexport.environment import cuda_gpu, tensorrt_version
gpu = cuda_gpu()
if gpu is None:
    sys.exit("no CUDA GPU is visible to torch")
print(f"{gpu['name']} (compute capability {gpu['compute_capability']}, driver {gpu['driver']}, CUDA runtime "
      f"{gpu['cuda_runtime']}); TensorRT {tensorrt_version() or 'not installed'}", file=sys.stderr)
PY

data_for() {  # the bench data of a model: 10,000 digits decide FP16's 0.5-point accuracy bound, 360 cannot
    if [[ "$1" == vit_digits_patch4_32 ]]; then
        [[ -d "$out/digits-10k" ]] || python scripts/make_digits_set.py --out "$out/digits-10k" --count 10000 >&2 \
            || fail "scripts/make_digits_set.py"
        echo "--data $out/digits-10k"
    fi
}

for entry in $models; do
    variant="${entry%%:*}"
    dir=$(dir_of "$entry")
    step "$variant: export to $dir, then the PyTorch CUDA rows"
    $vitexport onnx --model "$variant" --output "$dir" -q || fail "$variant: vitexport onnx"
    # shellcheck disable=SC2046
    $vitexport bench "$dir" --model "$variant" --no-prepare --backend "pytorch cuda" --batch 1 --batch "$opt_batch" \
        --json "$dir/bench-pytorch.json" $(data_for "$variant") || fail "$variant: the PyTorch CUDA bench"
done

step "TensorRT"
python - <<'PY' || { printf 'gpu_smoke: stopped after the PyTorch CUDA rows: %s\n' \
    "TensorRT (>= 10.12) is not installed, so no engine can be built (pip install -e '.[trt]')" >&2; exit 4; }
import sys
from vitexport.errors import VitexportError
from vitexport.tensorrt_engine.probe import require_trt_and_gpu
try:
    version, gpu = require_trt_and_gpu()
except VitexportError as e:
    sys.exit(str(e))
print(f"TensorRT {version} on {gpu['name']}", file=sys.stderr)
PY
precisions=$(python - <<'PY'
from vitexport.environment import cuda_gpu
from vitexport.tensorrt_engine.options import FP8_MIN_CAPABILITY
cc = tuple(int(p) for p in cuda_gpu()["compute_capability"].split("."))
print("fp16 int8" + (" fp8" if cc >= FP8_MIN_CAPABILITY else ""))
PY
) || fail "the GPU's compute capability"
printf 'plans to build: %s\n' "$precisions" >&2

speed_files=()
for entry in $models; do
    variant="${entry%%:*}"
    dir=$(dir_of "$entry")
    for prec in $precisions; do
        step "$variant: TensorRT $prec engine"
        $vitexport trt "$dir" --model "$variant" --"$prec" --opt-batch "$opt_batch" --max-batch "$max_batch" \
            --timing-cache "$out/timing.cache" -q || fail "$variant: vitexport trt --$prec"
    done

    step "$variant: bench --strict (PyTorch CUDA and TensorRT rows)"
    # shellcheck disable=SC2046
    $vitexport bench "$dir" --model "$variant" --no-prepare --strict --backend "pytorch cuda" --backend tensorrt \
        --batch 1 --batch "$opt_batch" --json "$dir/bench.json" $(data_for "$variant") \
        || fail "$variant: vitexport bench --strict (parity miss, undecided bound or error)"
    python - "$dir/bench.json" $precisions <<'PY' || fail "$variant: a TensorRT engine did not run, or not as its graph asks"
import json, sys
report = json.load(open(sys.argv[1]))
ok = True
for prec in sys.argv[2:]:
    rows = [r for r in report["results"] if r["backend"] == "tensorrt" and r["precision"] == prec]
    if not rows or not rows[0]["available"]:
        print(f"tensorrt {prec}: not run ({rows[0]['reason'] if rows else 'no result'})", file=sys.stderr)
        ok = False
        continue
    for problem in rows[0]["info"].get("engine_problems", ["the runner did not check the engine"]):
        print(f"tensorrt {prec}: {problem}", file=sys.stderr)
        ok = False
sys.exit(0 if ok else 1)
PY

    step "$variant: TensorRT speed at batch $opt_batch, interleaved rounds"
    gate_args=()
    [[ " $speed_gate " == *" $variant "* ]] && gate_args=(--gate "$gate")
    python scripts/trt_speed.py "$dir" --bench "$dir/bench.json" --json "$dir/speed.json" "${gate_args[@]}" >&2 \
        || fail "$variant: TensorRT speed (see above)"
    speed_files+=("$dir/speed.json")

    step "$variant: INT8 with ModelOpt's placement (a copy of the folder: the same FP16 plan beside it)"
    alt="$dir-modelopt"
    rm -rf "$alt" && cp -r "$dir" "$alt" || fail "$variant: copying $dir"  # its INT8 graph and plan are remade
    $vitexport trt "$alt" --model "$variant" --int8 --placement modelopt --opt-batch "$opt_batch" \
        --max-batch "$max_batch" --timing-cache "$out/timing.cache" -q || fail "$variant: trt --int8 --placement modelopt"
    # shellcheck disable=SC2046
    $vitexport bench "$alt" --model "$variant" --no-prepare --strict --backend tensorrt --batch 1 \
        --batch "$opt_batch" --json "$alt/bench.json" $(data_for "$variant") \
        || fail "$variant: bench --strict of the ModelOpt-placed INT8 engine"
    python scripts/trt_speed.py "$alt" --bench "$alt/bench.json" --json "$alt/speed.json" >&2 \
        || fail "$variant: TensorRT speed with ModelOpt's placement"
    speed_files+=("$alt/speed.json")
done

step "every model's TensorRT plans"
python scripts/trt_speed.py --table "${speed_files[@]}"

step "GPU tests"
python -m pytest -q -m "tensorrt or gpu" tests/test_tensorrt_gpu.py || fail "tests/test_tensorrt_gpu.py"

printf '\ngpu_smoke: all passed in %d s\n' "$SECONDS" >&2
