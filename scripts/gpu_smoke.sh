#!/usr/bin/env bash
# End-to-end check on a machine with an NVIDIA GPU and TensorRT (>= 10.12):
#   export -> trt --fp16 -> trt --int8 -> bench --strict, for the digits model and ViT-B/16, then the GPU tests.
# Exits non-zero on the first failure: a command that fails, a parity miss (bench --strict), a TensorRT
# engine that the bench could not load or run (it would otherwise show as "unavailable" and pass), or, for the
# models in SPEED_GATE, an INT8 engine slower than the FP16 one at the profile's opt batch (both numbers printed).
# The digits model (32x32, 64-wide) is too small for INT8 to pay off: its numbers are printed, not gated.
#
#   bash scripts/gpu_smoke.sh                  # artifacts under ./smoke-models (VITEXPORT_MODELS)
#   MODELS="vit_digits_patch4_32" bash scripts/gpu_smoke.sh
#   SPEED_GATE="" bash scripts/gpu_smoke.sh    # report INT8 vs FP16 speed without failing on it
set -euo pipefail

out="${VITEXPORT_MODELS:-smoke-models}"
models="${MODELS:-vit_digits_patch4_32:32x32 vit_base_patch16_224:224x224}"
speed_gate="${SPEED_GATE-vit_base_patch16_224}"
vitexport="${VITEXPORT:-python -m vitexport}"
export VITEXPORT_MODELS="$out"

step() { printf '\n== %s\n' "$*" >&2; }
fail() { printf 'gpu_smoke: FAILED: %s\n' "$*" >&2; exit 1; }

step "environment"
python - <<'PY' || fail "TensorRT and a CUDA GPU are required for this script"
import sys
from vitexport.tensorrt_engine.probe import require_trt_and_gpu
from vitexport.errors import VitexportError
try:
    version, gpu = require_trt_and_gpu()
except VitexportError as e:
    print(e, file=sys.stderr)
    sys.exit(e.exit_code)
print(f"TensorRT {version} on {gpu['name']} (compute capability {gpu['compute_capability']}, "
      f"driver {gpu['driver']}, CUDA runtime {gpu['cuda_runtime']})", file=sys.stderr)
PY

for entry in $models; do
    variant="${entry%%:*}"
    size="${entry#*:}"
    [[ "$size" == "$entry" ]] && size=""
    dir="$out/$variant${size:+-$size}"

    step "$variant: export to $dir"
    $vitexport onnx --model "$variant" --output "$dir" || fail "$variant: vitexport onnx"

    for prec in fp16 int8; do
        step "$variant: TensorRT $prec engine"
        $vitexport trt "$dir" --model "$variant" --"$prec" --timing-cache "$out/timing.cache" \
            || fail "$variant: vitexport trt --$prec"
        [[ -s "$dir/model.$prec.plan" && -s "$dir/model.$prec.plan.json" ]] \
            || fail "$variant: model.$prec.plan or its sidecar is missing"
    done

    opt=$(python scripts/int8_vs_fp16.py --opt-batch "$dir") || fail "$variant: the plans' opt batch"
    batches=$(printf '%s\n' 1 "$opt" 32 | sort -nu | sed 's/^/--batch /' | tr '\n' ' ')
    data=""
    if [[ "$variant" == vit_digits_patch4_32 ]]; then
        # 360 shipped digits cannot decide FP16's 0.5-point accuracy bound (inconclusive fails --strict): 10,000 can
        [[ -d "$out/digits-10k" ]] || python scripts/make_digits_set.py --out "$out/digits-10k" --count 10000 \
            || fail "scripts/make_digits_set.py"
        data="--data $out/digits-10k"
    fi
    step "$variant: bench --strict (batches ${batches//--batch /})"
    # shellcheck disable=SC2086
    $vitexport bench "$dir" --model "$variant" --strict --json "$dir/bench.json" $batches $data \
        || fail "$variant: vitexport bench --strict (parity miss or error)"

    python - "$dir/bench.json" <<'PY' || fail "$variant: a TensorRT engine did not run in the bench"
import json, sys
report = json.load(open(sys.argv[1]))
ok = True
for prec in ("fp16", "int8"):
    rows = [r for r in report["results"] if r["backend"] == "tensorrt" and r["precision"] == prec]
    if not rows or not rows[0]["available"]:
        why = rows[0]["reason"] if rows else "no result"
        print(f"tensorrt {prec}: not run ({why})", file=sys.stderr)
        ok = False
    elif not (rows[0]["parity"] or {}).get("passed"):
        print(f"tensorrt {prec}: parity failed: {rows[0]['parity']}", file=sys.stderr)
        ok = False
    else:
        p = rows[0]["parity"]
        print(f"tensorrt {prec}: min cosine {p['cos_min']:.5f}, top-1 agreement {p['top1_agree']:.3f}",
              file=sys.stderr)
sys.exit(0 if ok else 1)
PY

    step "$variant: INT8 vs FP16 throughput at batch $opt"
    gate=""
    [[ " $speed_gate " == *" $variant "* ]] && gate="--gate"
    line=$(python scripts/int8_vs_fp16.py "$dir/bench.json" "$dir" $gate) || fail "$variant: ${line:-see above}"
    printf '%s%s\n' "$line" "${gate:+ (gated)}" >&2
done

step "GPU tests"
python -m pytest -q -m "tensorrt or gpu" tests/test_tensorrt_gpu.py || fail "tests/test_tensorrt_gpu.py"

printf '\ngpu_smoke: all passed\n' >&2
