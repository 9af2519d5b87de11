"""`vitexport trt` as a library call: prepare the ONNX for the precision, build, write plan + sidecar atomically.

Order matters: options are validated first (cheap, before any work), then the FP16/INT8 ONNX is prepared
(it is useful on its own, so it is produced even where TensorRT is missing), then TensorRT and the GPU are
required (exit 4 / 5), then the engine is built.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from ..version import __version__
from ..artifacts.folder import PLAN_SOURCE, ModelFolder, artifact_kind, onnx_digest
from ..artifacts.sidecar import SIDECAR_FORMAT, write_sidecar
from ..errors import VitexportError
from ..paths import atomic_path
from ..progress import QUIET, Log
from .options import BuildOptions, check_fp8_gpu, profile_shapes, refuse_antialias
from .probe import require_trt_and_gpu

PrepareOnnx = Callable[[str], Path]  # precision -> the ONNX that carries it (exporting / converting as needed)
BuildFn = Callable[[Path, BuildOptions, Log], tuple[bytes, dict[str, Any]]]


@dataclass
class TrtResult:
    plan_path: Path
    sidecar_path: Path
    sidecar: dict[str, Any]
    onnx_path: Path
    build_seconds: float
    notes: list[str] = field(default_factory=list)


def _default_build(onnx_path: Path, opts: BuildOptions, log: Log) -> tuple[bytes, dict[str, Any]]:
    from .trt_build import build_engine  # imports tensorrt: only once we know it is there

    return build_engine(onnx_path, opts, log)


def run_trt(model_dir: ModelFolder | Path, opts: BuildOptions, log: Log = QUIET,
            prepare_onnx: PrepareOnnx | None = None, build: BuildFn | None = None) -> TrtResult:
    """Build model.<precision>.plan (+ .plan.json) in `model_dir`.

    prepare_onnx(precision) -> Path runs the precision step when needed (ensure.build_plan passes one that
    exports and converts first); without it the ONNX must already be in the folder. `build` replaces the
    TensorRT build (tests).
    """
    opts.validate()
    folder = model_dir if isinstance(model_dir, ModelFolder) else ModelFolder(model_dir)
    opts = with_image_range(folder, opts)
    checked = folder.onnx() if folder.onnx().is_file() else None
    if checked is not None:
        refuse_antialias(checked)  # before minutes of calibration for a graph TensorRT cannot parse
    onnx_path = Path(prepare_onnx(opts.precision)) if prepare_onnx is not None \
        else folder.plan_source(opts.precision)
    if not onnx_path.is_file():
        raise VitexportError(f"{onnx_path} does not exist; make it with {_how_to_make(opts.precision)} first.")
    if onnx_path != checked:  # an FP32 plan's source is that export: not read a second time
        refuse_antialias(onnx_path)
    trt_version, gpu = require_trt_and_gpu()
    check_fp8_gpu(opts.precision, gpu)
    log.info(f"TensorRT {trt_version} on {gpu['name']} (compute capability {gpu['compute_capability']}).")

    onnx_sha = onnx_digest(onnx_path)
    t0 = time.perf_counter()
    plan, info = (build or _default_build)(onnx_path, opts, log)
    seconds = time.perf_counter() - t0
    plan_path, sidecar_path = folder.plan(opts.precision), folder.sidecar(opts.precision)
    sidecar = make_sidecar(
        plan_path=plan_path, plan_sha256=hashlib.sha256(plan).hexdigest(), plan_bytes=len(plan),
        onnx_path=onnx_path, onnx_sha256=onnx_sha, opts=opts, input_name=info["input_name"], chw=info["chw"],
        output_names=info.get("output_names", []), tensorrt_version=info.get("tensorrt_version", trt_version),
        gpu=gpu, build_seconds=seconds, build_info=info)
    # both files go to temporaries first; a failure leaves the previous pair (or nothing) in place. Readers
    # also check plan_sha256, so even a crash between the two renames cannot pass a stale pair off as current.
    with atomic_path(plan_path) as tmp_plan:
        tmp_plan.write_bytes(plan)
        write_sidecar(sidecar_path, sidecar)
    log.info(f"Wrote {plan_path} ({len(plan) / 2**20:.1f} MiB) and {sidecar_path.name} in {seconds:.1f}s.")
    return TrtResult(plan_path, sidecar_path, sidecar, onnx_path, seconds)


def with_image_range(folder: ModelFolder, opts: BuildOptions) -> BuildOptions:
    """A dynamic-size export's default size and range (its manifest) for the profile; opts unchanged otherwise."""
    if opts.img_size_range is not None or not folder.has_manifest():
        return opts
    manifest = folder.read_manifest()
    if manifest.img_size_range is None:
        return opts
    return replace(opts, img_size=tuple(manifest.img_size), img_size_range=manifest.img_size_range).validate()


def _how_to_make(precision: str) -> str:
    """The commands that make the ONNX a plan of this precision is built from, for error messages."""
    kind = artifact_kind(PLAN_SOURCE[precision])
    steps = [artifact_kind("fp32").made_by] + ([] if kind.name == "fp32" else [kind.made_by])
    return " and ".join(f"`{s}`" for s in steps)


def make_sidecar(*, plan_path: Path, plan_sha256: str, plan_bytes: int, onnx_path: Path, onnx_sha256: str,
                 opts: BuildOptions, input_name: str, chw: Sequence[int], output_names: Sequence[str],
                 tensorrt_version: str, gpu: dict[str, Any], build_seconds: float,
                 build_info: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON written beside a plan: what it is, what it was built from, how, and on which machine."""
    mn, op, mx = profile_shapes(opts, chw)
    info = dict(build_info or {})
    return {
        "format": SIDECAR_FORMAT,
        "plan": Path(plan_path).name,
        "plan_sha256": plan_sha256,
        "plan_bytes": int(plan_bytes),
        "precision": opts.precision,
        "source_onnx": Path(onnx_path).name,
        "source_onnx_sha256": onnx_sha256,
        "tensorrt": tensorrt_version,
        "gpu": {
            "name": gpu.get("name"),
            "compute_capability": gpu.get("compute_capability"),
            "cuda_driver": gpu.get("driver"),
            "cuda_runtime": gpu.get("cuda_runtime"),
        },
        "profile": {"input": input_name, "min": list(mn), "opt": list(op), "max": list(mx)},
        "outputs": list(output_names),
        "build_options": {
            **opts.to_dict(),
            "strongly_typed": True,
            "tf32": opts.precision != "fp32",
            **{k: v for k, v in info.items() if k in ("timing_cache_loaded", "timing_cache_saved")},
        },
        "build_seconds": round(float(build_seconds), 3),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "vitexport": __version__,
    }
