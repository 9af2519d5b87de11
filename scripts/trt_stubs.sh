#!/usr/bin/env bash
# Type stubs of the TensorRT Python API for mypy, without TensorRT itself (REFERENCE.md §1).
#
# tensorrt-stubs puts .pyi files into site-packages/tensorrt and site-packages/tensorrt_bindings with no
# py.typed marker, so mypy ignores them where they are installed: this script installs the package with
# --no-deps (its dependencies are the TensorRT wheels, which only NVIDIA's index serves) into a scratch
# folder, copies both stub folders to "$TRT_STUBS_DIR/stubs" (point MYPYPATH there) and fixes the two
# generated signatures that are not valid Python. Idempotent; prints nothing but errors.
#
#   TRT_STUBS_DIR      scratch folder (default: ~/.cache/vitexport/trt-stubs)
#   TRT_STUBS_SPEC     what pip installs (default: tensorrt-stubs==10.13.*)
set -euo pipefail

dir="${TRT_STUBS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vitexport/trt-stubs}"
spec="${TRT_STUBS_SPEC:-tensorrt-stubs==10.13.*}"
python="${PYTHON:-python}"
stamp="$dir/stubs/.ready"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$spec" ]]; then
    exit 0
fi

mkdir -p "$dir"
work="$(mktemp -d "$dir/.work.XXXXXX")"
trap 'rm -rf "$work"' EXIT

if ! "$python" -m pip install --quiet --no-deps --disable-pip-version-check --no-warn-script-location \
        --target "$work/site" "$spec" >"$work/pip.log" 2>&1; then
    cat "$work/pip.log" >&2
    echo "trt_stubs.sh: pip could not install $spec (see above)." >&2
    exit 1
fi
for pkg in tensorrt tensorrt_bindings; do
    if [[ ! -d "$work/site/$pkg" ]]; then
        echo "trt_stubs.sh: $spec has no $pkg/ stub folder; the stubs layout changed." >&2
        exit 1
    fi
done

mkdir -p "$work/stubs"
cp -R "$work/site/tensorrt" "$work/site/tensorrt_bindings" "$work/stubs/"
find "$work/stubs" -name '__pycache__' -prune -exec rm -rf {} +

# 1. a parameter named `in` (a keyword) in the plugin interfaces: rename it
# 2. add_scale_nd has a required parameter after defaulted ones: give it a stub default
sed -i.bak -e 's/\([(,] \)in: /\1in_: /g' \
    -e 's/power: Weights = None, channel_axis: int)/power: Weights = None, channel_axis: int = ...)/' \
    "$work/stubs/tensorrt_bindings/tensorrt.pyi"
rm -f "$work/stubs/tensorrt_bindings/tensorrt.pyi.bak"

# the fixed stubs must at least parse
if ! "$python" - "$work/stubs" <<'PY' >&2
import ast, pathlib, sys
for p in sorted(pathlib.Path(sys.argv[1]).rglob("*.pyi")):
    ast.parse(p.read_text(), filename=str(p))
PY
then
    echo "trt_stubs.sh: the stubs still do not parse after the fixes (see above)." >&2
    exit 1
fi

echo "$spec" >"$work/stubs/.ready"
rm -rf "$dir/stubs.old"
[[ -d "$dir/stubs" ]] && mv "$dir/stubs" "$dir/stubs.old"
mv "$work/stubs" "$dir/stubs"
rm -rf "$dir/stubs.old"
