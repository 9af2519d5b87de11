#!/usr/bin/env bash
# Type-check the code that calls TensorRT against tensorrt-stubs, on a machine without TensorRT.
# Exits non-zero on any type error (a misspelt method, a wrong argument, a missing attribute).
#   bash scripts/typecheck_trt.sh [extra files...]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export TRT_STUBS_DIR="${TRT_STUBS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vitexport/trt-stubs}"
python="${PYTHON:-python}"

bash "$root/scripts/trt_stubs.sh"

cd "$root"
# --no-incremental: mypy's cache trusts a file whose size and whole-second mtime are unchanged, so an edit
# and its revert within one second would be judged by the stale result. A full check takes seconds.
MYPYPATH="$TRT_STUBS_DIR/stubs" exec "$python" -m mypy \
    --config-file "$root/scripts/mypy-trt.ini" \
    --no-incremental --cache-dir "$TRT_STUBS_DIR/mypy-cache" \
    vitexport/tensorrt_engine/trt_build.py vitexport/backends/tensorrt.py \
    vitexport/tensorrt_engine/events.py vitexport/tensorrt_engine/engine_info.py vitexport/backends/cuda_stream.py "$@"
