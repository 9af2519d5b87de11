"""Everything about a TensorRT engine that can be decided without TensorRT: plain functions, unit-tested.

- build options and their validation (checked before any ONNX is prepared or any build starts);
- the optimization profile of the batch axis;
- file names: which ONNX feeds which precision, where the plan and its sidecar go;
- the sidecar: a JSON file beside each plan saying what it was built from, with what, on what;
- the verdict on whether a plan can run on this machine, with the exact difference and what to do;
- the TensorRT version floor and the errors for a missing TensorRT or GPU (exit codes 4 and 5).

This module never imports tensorrt.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from .. import __version__
from ..errors import VitexportError
from ..paths import write_text_atomic

PRECISIONS = ("fp32", "fp16", "int8")
MIN_TENSORRT = (10, 1)  # strongly typed networks + explicit quantization, without the deprecated builder flags
OPT_LEVELS = range(0, 6)  # IBuilderConfig.builder_optimization_level: 0 (fastest build) .. 5 (most tactics)
SIDECAR_FORMAT = "vitexport-plan/1"

EXIT_NO_TENSORRT = 4
EXIT_NO_GPU = 5
INSTALL_COMMAND = "pip install 'vitexport[trt]'"

Shape = tuple[int, int, int, int]  # (batch, channels, height, width)


class EngineUnavailable(VitexportError):
    """TensorRT (10.1 or newer) or a CUDA GPU is missing: the engine cannot be built or run on this machine."""

    exit_code = EXIT_NO_TENSORRT

    @classmethod
    def no_tensorrt(cls) -> "EngineUnavailable":
        return cls(f"TensorRT is not installed; install it with `{INSTALL_COMMAND}` on a machine with an NVIDIA GPU.",
                   EXIT_NO_TENSORRT)

    @classmethod
    def old_tensorrt(cls, version: str) -> "EngineUnavailable":
        need = ".".join(map(str, MIN_TENSORRT))
        return cls(f"TensorRT {version} is installed, but vitexport needs TensorRT {need} or newer; "
                   f"upgrade it with `pip install -U 'vitexport[trt]'`.", EXIT_NO_TENSORRT)

    @classmethod
    def no_gpu(cls) -> "EngineUnavailable":
        return cls("No CUDA GPU is visible (torch.cuda.is_available() is False), so TensorRT engines cannot be "
                   "built or run on this machine.", EXIT_NO_GPU)


# -- build options --------------------------------------------------------------------------------------------

@dataclass
class BuildOptions:
    """What `vitexport trt` builds: one precision, one batch profile, and the builder's knobs."""

    precision: str = "fp16"  # 'fp32' (TF32 off: the reference engine) | 'fp16' | 'int8' (Q/DQ ONNX)
    min_batch: int = 1  # smallest batch the engine accepts
    opt_batch: int = 8  # batch TensorRT tunes its kernels for
    max_batch: int = 32  # largest batch the engine accepts
    workspace_gib: float | None = None  # builder scratch memory limit; None = TensorRT's default (the GPU's memory)
    timing_cache: Path | None = None  # loaded when present, saved after the build; None = no cache file
    opt_level: int | None = None  # builder optimization level 0-5; None = TensorRT's default (3)

    def validate(self) -> "BuildOptions":
        """Raise VitexportError (one sentence) on the first invalid option; returns self for chaining."""
        if self.precision not in PRECISIONS:
            raise VitexportError(f"Unknown precision {self.precision!r}; choose one of: {', '.join(PRECISIONS)}.")
        for flag, value in (("--min-batch", self.min_batch), ("--opt-batch", self.opt_batch),
                            ("--max-batch", self.max_batch)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise VitexportError(f"{flag} must be a whole number, got {value!r}.")
            if value < 1:
                raise VitexportError(f"{flag} must be at least 1, got {value}.")
        if not self.min_batch <= self.opt_batch <= self.max_batch:
            raise VitexportError(
                f"The batch profile needs --min-batch <= --opt-batch <= --max-batch, got "
                f"{self.min_batch} / {self.opt_batch} / {self.max_batch}.")
        if self.workspace_gib is not None:
            w = self.workspace_gib
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
                raise VitexportError(f"--workspace must be a positive number of GiB, got {w!r}.")
        if self.opt_level is not None and (isinstance(self.opt_level, bool) or not isinstance(self.opt_level, int)
                                           or self.opt_level not in OPT_LEVELS):
            raise VitexportError(f"--opt-level must be one of 0-5, got {self.opt_level!r}.")
        if self.timing_cache is not None:
            tc = Path(self.timing_cache)
            if tc.exists() and not tc.is_file():
                raise VitexportError(f"--timing-cache {tc} exists and is not a file.")
        return self

    @property
    def workspace_bytes(self) -> int | None:
        return None if self.workspace_gib is None else int(self.workspace_gib * (1 << 30))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["timing_cache"] = None if self.timing_cache is None else str(self.timing_cache)
        return d


def profile_shapes(opts: BuildOptions, chw: Sequence[int]) -> tuple[Shape, Shape, Shape]:
    """(min, opt, max) input shapes of the optimization profile: only the batch axis varies."""
    c, h, w = check_chw(chw)
    return ((opts.min_batch, c, h, w), (opts.opt_batch, c, h, w), (opts.max_batch, c, h, w))


def check_chw(chw: Sequence[int]) -> tuple[int, int, int]:
    dims = tuple(int(d) for d in chw)
    if len(dims) != 3 or any(d < 1 for d in dims):
        raise VitexportError(f"The image shape must be three positive sizes (channels, height, width), got {dims}.")
    return dims  # type: ignore[return-value]


def input_chw(shape: Sequence[int], name: str, opts: BuildOptions) -> tuple[int, int, int]:
    """(C, H, W) of the ONNX input as TensorRT sees it (-1 = symbolic); only the batch axis may be symbolic."""
    dims = [int(d) for d in shape]
    if len(dims) != 4:
        raise VitexportError(f"The ONNX input {name!r} has shape {dims}; a ViT takes (batch, channels, height, width).")
    if any(d < 1 for d in dims[1:]):
        raise VitexportError(f"The ONNX input {name!r} has a symbolic image size {dims[1:]}; re-export it with a fixed "
                             f"image size (the engine's profile only varies the batch).")
    batch = dims[0]
    if batch >= 1 and not (opts.min_batch == opts.opt_batch == opts.max_batch == batch):
        raise VitexportError(f"The ONNX input {name!r} has a fixed batch of {batch}, so the batch profile "
                             f"{opts.min_batch}/{opts.opt_batch}/{opts.max_batch} cannot apply; re-export it with "
                             f"`vitexport onnx` (symbolic batch).")
    return dims[1], dims[2], dims[3]


def check_batch(batch: int, lo: int, hi: int, plan_name: str) -> None:
    """A runner's batch must lie inside the profile the engine was built for."""
    if not lo <= batch <= hi:
        raise VitexportError(f"Batch {batch} is outside the range {lo}-{hi} that {plan_name} was built for; "
                             f"rebuild it with --min-batch/--max-batch covering {batch}.")


# -- file names -----------------------------------------------------------------------------------------------

_ONNX_FOR = {"fp32": "model.onnx", "fp16": "model.fp16.onnx", "int8": "model.int8.onnx"}


def onnx_digest(onnx_path: Path) -> str:
    """sha256 of an ONNX file, folding in its external data file when it has one (model.onnx.data)."""
    import hashlib

    from ..checkpoints import sha256_file

    digest = sha256_file(onnx_path)
    data = onnx_path.with_name(onnx_path.name + ".data")
    if data.is_file():
        digest = hashlib.sha256(f"{digest}:{sha256_file(data)}".encode()).hexdigest()
    return digest


def onnx_for_precision(folder: Path, precision: str) -> Path:
    """The ONNX that carries a precision: FP32 as exported, FP16 converted, INT8 with Q/DQ nodes."""
    if precision not in _ONNX_FOR:
        raise VitexportError(f"Unknown precision {precision!r}; choose one of: {', '.join(PRECISIONS)}.")
    return Path(folder) / _ONNX_FOR[precision]


def plan_paths(folder: Path, precision: str) -> tuple[Path, Path]:
    """(plan, sidecar): model.<precision>.plan and model.<precision>.plan.json in the model folder."""
    if precision not in PRECISIONS:
        raise VitexportError(f"Unknown precision {precision!r}; choose one of: {', '.join(PRECISIONS)}.")
    plan = Path(folder) / f"model.{precision}.plan"
    return plan, sidecar_for(plan)


def sidecar_for(plan_path: Path) -> Path:
    plan_path = Path(plan_path)
    return plan_path.with_name(plan_path.name + ".json")


def precision_from_plan_name(plan_path: Path) -> str | None:
    """'fp16' from 'model.fp16.plan'; None when the name does not say."""
    m = re.search(r"\.(fp32|fp16|int8)\.(plan|engine)$", Path(plan_path).name)
    return m.group(1) if m else None


def rebuild_command(precision: str, folder: Path | str | None = None) -> str:
    """The command that rebuilds a plan, for error messages: `vitexport trt [MODEL_DIR] --<precision>`."""
    where = f" {folder}" if folder is not None else ""
    return f"vitexport trt{where} --{precision}"


# -- sidecar --------------------------------------------------------------------------------------------------

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


def write_sidecar(path: Path, data: dict[str, Any]) -> Path:
    write_text_atomic(Path(path), json.dumps(data, indent=2) + "\n")
    return Path(path)


_REQUIRED = ("tensorrt", "gpu", "precision", "profile", "plan_sha256")


def read_sidecar(path: Path) -> dict[str, Any]:
    path = Path(path)
    plan = path.name[:-len(".json")] if path.name.endswith(".json") else path.name
    if not path.is_file():
        raise VitexportError(f"{path} is missing, so nothing says where {plan} was built; rebuild the engine with "
                             f"`vitexport trt` on this machine.")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VitexportError(f"{path} is not valid JSON ({e.__class__.__name__}: {e}); rebuild the engine with "
                             f"`vitexport trt` on this machine.") from None
    if not isinstance(data, dict):
        raise VitexportError(f"{path} holds a JSON {type(data).__name__}, not an object; rebuild the engine with "
                             f"`vitexport trt` on this machine.")
    missing = [k for k in _REQUIRED if k not in data]
    gpu = data.get("gpu")
    if not missing and (not isinstance(gpu, dict) or "name" not in gpu or "compute_capability" not in gpu):
        missing.append("gpu.name/gpu.compute_capability")
    if missing:
        raise VitexportError(f"{path} lacks {', '.join(missing)}; rebuild the engine with `vitexport trt` on this "
                             f"machine.")
    return data


# -- may this plan run here? ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    ok: bool  # TensorRT will deserialize and run the plan here
    kind: str  # 'same' | 'other_tensorrt' | 'other_compute_capability' | 'other_gpu'
    message: str  # '' when same; otherwise one sentence: what differs and what to do
    differences: tuple[str, ...] = ()


def check_compatibility(sidecar: dict[str, Any], current: dict[str, Any], folder: Path | str | None = None) -> Verdict:
    """Compare where a plan was built (its sidecar) with this machine (`current`: {'tensorrt', 'gpu'}).

    A plan only deserializes on the TensorRT version that built it, and only on GPUs of the same compute
    capability (engines are built without hardware compatibility). Another GPU model of the same compute
    capability runs it, with kernels tuned for the other model: that is ok, with a message.
    """
    plan = sidecar.get("plan") or f"model.{sidecar.get('precision', '?')}.plan"
    rebuild = f"rebuild with `{rebuild_command(str(sidecar.get('precision', 'fp16')), folder)}` on this machine"
    built_gpu, here_gpu = sidecar.get("gpu") or {}, current.get("gpu") or {}
    diffs: list[str] = []
    kinds: list[str] = []
    if str(sidecar.get("tensorrt")) != str(current.get("tensorrt")):
        diffs.append(f"TensorRT {sidecar.get('tensorrt')} (plan) vs {current.get('tensorrt')} (here)")
        kinds.append("other_tensorrt")
    if str(built_gpu.get("compute_capability")) != str(here_gpu.get("compute_capability")):
        diffs.append(f"compute capability {built_gpu.get('compute_capability')} on {built_gpu.get('name')} (plan) vs "
                     f"{here_gpu.get('compute_capability')} on {here_gpu.get('name')} (here)")
        kinds.append("other_compute_capability")
    if diffs:
        return Verdict(False, kinds[0], f"{plan} cannot run here: it was built for {'; '.join(diffs)}; {rebuild}.",
                       tuple(kinds))
    if str(built_gpu.get("name")) != str(here_gpu.get("name")):
        return Verdict(True, "other_gpu",
                       f"{plan} was built on {built_gpu.get('name')}, not on this {here_gpu.get('name')} (same compute "
                       f"capability {here_gpu.get('compute_capability')}): it runs, with kernels tuned for the other "
                       f"GPU; {rebuild} for full speed.", ("other_gpu",))
    return Verdict(True, "same", "", ())


# -- TensorRT version -----------------------------------------------------------------------------------------

def check_trt_version(version: str) -> tuple[int, int]:
    """(major, minor) of an installed TensorRT; EngineUnavailable (exit 4) below 10.1 or when unreadable."""
    m = re.match(r"^\s*(\d+)\.(\d+)", str(version))
    if not m:
        need = ".".join(map(str, MIN_TENSORRT))
        raise EngineUnavailable(f"TensorRT reports the version {version!r}, which vitexport cannot read; it needs "
                                f"TensorRT {need} or newer (`{INSTALL_COMMAND}`).", EXIT_NO_TENSORRT)
    major_minor = (int(m.group(1)), int(m.group(2)))
    if major_minor < MIN_TENSORRT:
        raise EngineUnavailable.old_tensorrt(str(version).strip())
    return major_minor


# -- messages -------------------------------------------------------------------------------------------------

def parse_failure_message(onnx_path: Path, errors: Sequence[str]) -> str:
    """Every ONNX parser error, numbered: the first is often a symptom of a later one."""
    name = Path(onnx_path).name
    if not errors:
        return f"TensorRT could not parse {name} and gave no reason; run with TensorRT's verbose log to see why."
    lines = [f"TensorRT could not parse {name} ({len(errors)} error{'s' if len(errors) != 1 else ''}):"]
    lines += [f"  {i}. {e.strip()}" for i, e in enumerate(errors, 1)]
    return "\n".join(lines)


def build_failure_message(onnx_path: Path, errors: Sequence[str]) -> str:
    name = Path(onnx_path).name
    if not errors:
        return f"TensorRT could not build an engine from {name} and logged no error."
    lines = [f"TensorRT could not build an engine from {name}:"] + [f"  {e.strip()}" for e in errors]
    return "\n".join(lines)
