"""How a TensorRT engine is built, decided without TensorRT: plain functions, unit-tested.

- build options and their validation (checked before any ONNX is prepared or any build starts);
- the optimization profile of the batch axis;
- the TensorRT version floor and the errors for a missing TensorRT or GPU (exit codes 4 and 5);
- where TensorRT's own log goes (`LogOptions`: `vitexport trt --verbose / --verbose-log FILE`);
- the messages of a failed parse or build, which point at that log.

File names (which ONNX feeds which plan) belong to vitexport.artifacts.folder; the sidecar and the verdict on whether a
plan can run here to .sidecar. This module never imports tensorrt.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from ..artifacts.folder import PLAN_PRECISIONS
from ..errors import VitexportError
from ..model.posembed import antialiased_resizes

# Strongly typed networks are complete from TensorRT 10.12 on: NVIDIA's strong-typing migration guidance
# (TensorRT repo, .agents/skills/trt-strong-typing-migration/SKILL.md, 11.1: "strong typing is fully available from
# 10.12 onward"; a build on 10.11 or earlier is told to upgrade). 10.12 is also where the weak-typing builder flags
# that 11.0 removes were deprecated. Rather than list what a strongly typed build lacks below 10.12, we refuse it.
MIN_TENSORRT = (10, 12)
MIN_TENSORRT_WHY = "strongly typed networks are complete from TensorRT 10.12 on"
OPT_LEVELS = range(0, 6)  # IBuilderConfig.builder_optimization_level: 0 (fastest build) .. 5 (most tactics)

EXIT_NO_TENSORRT = 4
EXIT_NO_GPU = 5
INSTALL_COMMAND = "pip install 'vitexport[trt]'"

Shape = tuple[int, int, int, int]  # (batch, channels, height, width)


class EngineUnavailable(VitexportError):
    """TensorRT (10.12 or newer) or a CUDA GPU is missing: the engine cannot be built or run on this machine."""

    exit_code = EXIT_NO_TENSORRT

    @classmethod
    def no_tensorrt(cls) -> "EngineUnavailable":
        return cls(f"TensorRT is not installed; install it with `{INSTALL_COMMAND}` on a machine with an NVIDIA GPU.",
                   EXIT_NO_TENSORRT)

    @classmethod
    def old_tensorrt(cls, version: str) -> "EngineUnavailable":
        need = ".".join(map(str, MIN_TENSORRT))
        return cls(f"TensorRT {version} is installed, but vitexport needs TensorRT {need} or newer "
                   f"({MIN_TENSORRT_WHY}); upgrade it with `pip install -U 'vitexport[trt]'`.", EXIT_NO_TENSORRT)

    @classmethod
    def no_gpu(cls) -> "EngineUnavailable":
        return cls("No CUDA GPU is visible (torch.cuda.is_available() is False), so TensorRT engines cannot be "
                   "built or run on this machine.", EXIT_NO_GPU)


FP8_MIN_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada (8.9), Hopper (9.0) and later


def check_fp8_gpu(precision: str, gpu: dict[str, Any]) -> None:
    """An FP8 engine on a GPU without FP8 tensor cores: one sentence (exit 5) before anything is built."""
    if precision != "fp8":
        return
    cc = str(gpu.get("compute_capability") or "0.0")
    try:
        have = tuple(int(p) for p in cc.split(".")[:2])
    except ValueError:
        have = (0, 0)
    if have < FP8_MIN_CAPABILITY:
        need = ".".join(map(str, FP8_MIN_CAPABILITY))
        raise EngineUnavailable(f"{gpu.get('name', 'This GPU')} has compute capability {cc}, and FP8 engines need "
                                f"{need} or newer (Ada, Hopper); build --int8 or --fp16 on it instead.", EXIT_NO_GPU)


# -- build options --------------------------------------------------------------------------------------------

@dataclass
class BuildOptions:
    """What `vitexport trt` builds: one precision, one batch profile, and the builder's knobs."""

    precision: str = "fp16"  # 'fp32' (TF32 off: the reference engine) | 'fp16' | 'int8' | 'fp8' (Q/DQ ONNX)
    min_batch: int = 1  # smallest batch the engine accepts
    opt_batch: int = 8  # batch TensorRT tunes its kernels for
    max_batch: int = 32  # largest batch the engine accepts
    workspace_gib: float | None = None  # builder scratch memory limit; None = TensorRT's default (the GPU's memory)
    timing_cache: Path | None = None  # loaded when present, saved after the build; None = no cache file
    opt_level: int | None = None  # builder optimization level 0-5; None = TensorRT's default (3)
    # a dynamic-size graph (symbolic height and width): the profile's image sizes, from its manifest
    img_size: tuple[int, int] | None = None  # the size TensorRT tunes for (the export's default size)
    img_size_range: tuple[tuple[int, int], tuple[int, int]] | None = None  # ((min H, min W), (max H, max W))

    def validate(self) -> "BuildOptions":
        """Raise VitexportError (one sentence) on the first invalid option; returns self for chaining."""
        if self.precision not in PLAN_PRECISIONS:
            raise VitexportError(f"Unknown precision {self.precision!r}; choose one of: {', '.join(PLAN_PRECISIONS)}.")
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
        if self.img_size_range is not None:
            (h0, w0), (h1, w1) = self.img_size_range
            h, w = self.img_size or (h0, w0)
            if not (1 <= h0 <= h <= h1 and 1 <= w0 <= w <= w1):
                raise VitexportError(f"The image size profile needs min <= opt <= max on each side, got "
                                     f"{h0}x{w0} / {h}x{w} / {h1}x{w1}.")
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
        d["img_size"] = None if self.img_size is None else list(self.img_size)  # as JSON reads it back
        d["img_size_range"] = None if self.img_size_range is None else [list(s) for s in self.img_size_range]
        return d


def profile_shapes(opts: BuildOptions, chw: Sequence[int]) -> tuple[Shape, Shape, Shape]:
    """(min, opt, max) input shapes of the optimization profile: the batch axis varies, and height and width too
    for a dynamic-size graph (opts.img_size_range; opt: opts.img_size)."""
    c, h, w = check_chw(chw)
    if opts.img_size_range is None:
        return ((opts.min_batch, c, h, w), (opts.opt_batch, c, h, w), (opts.max_batch, c, h, w))
    (h0, w0), (h1, w1) = opts.img_size_range
    return ((opts.min_batch, c, h0, w0), (opts.opt_batch, c, h, w), (opts.max_batch, c, h1, w1))


def check_chw(chw: Sequence[int]) -> tuple[int, int, int]:
    dims = tuple(int(d) for d in chw)
    if len(dims) != 3 or any(d < 1 for d in dims):
        raise VitexportError(f"The image shape must be three positive sizes (channels, height, width), got {dims}.")
    return dims  # type: ignore[return-value]


def input_chw(shape: Sequence[int], name: str, opts: BuildOptions) -> tuple[int, int, int]:
    """(C, H, W) of the ONNX input as TensorRT sees it; only the batch axis may be symbolic, and height and width
    too when opts has an image size range (then H, W are its opt size)."""
    dims = [int(d) for d in shape]
    if len(dims) != 4:
        raise VitexportError(f"The ONNX input {name!r} has shape {dims}; a ViT takes (batch, channels, height, width).")
    if dims[1] < 1:
        raise VitexportError(f"The ONNX input {name!r} has a symbolic channel axis {dims[1:]}; a ViT takes a fixed "
                             f"number of channels.")
    symbolic = [d < 1 for d in dims[2:]]
    if any(symbolic) and opts.img_size_range is None:
        raise VitexportError(f"The ONNX input {name!r} has a symbolic image size {dims[1:]}, but no image size range "
                             f"was given; build it from its model folder (whose manifest records the range of "
                             f"`vitexport onnx --dynamic-img-size`).")
    if not any(symbolic) and opts.img_size_range is not None:
        raise VitexportError(f"The ONNX input {name!r} has a fixed image size {dims[2:]}, so an image size range "
                             f"cannot apply; export it with `vitexport onnx --dynamic-img-size`.")
    if any(symbolic):
        if not all(symbolic):
            raise VitexportError(f"The ONNX input {name!r} has a symbolic image size on one side only {dims[1:]}; "
                                 f"export it again with `vitexport onnx --dynamic-img-size`.")
        h, w = opts.img_size or opts.img_size_range[0]
        dims = [dims[0], dims[1], h, w]
    batch = dims[0]
    if batch >= 1 and not (opts.min_batch == opts.opt_batch == opts.max_batch == batch):
        raise VitexportError(f"The ONNX input {name!r} has a fixed batch of {batch}, so the batch profile "
                             f"{opts.min_batch}/{opts.opt_batch}/{opts.max_batch} cannot apply; re-export it with "
                             f"`vitexport onnx` (symbolic batch).")
    return dims[1], dims[2], dims[3]


def refuse_antialias(onnx_path: Path) -> None:
    """TensorRT's ONNX parser rejects an antialiased Resize (onnx-tensorrt's onnxOpCheckers.cpp: "Antialiasing is
    not supported currently"): a dynamic-size export made with bicubic-antialias is refused in one sentence."""
    nodes = antialiased_resizes(Path(onnx_path))
    if nodes:
        raise VitexportError(f"{Path(onnx_path).name} resamples its position embedding with an antialiased Resize "
                             f"({nodes[0]}), which TensorRT's ONNX parser does not support; export it again with "
                             f"`vitexport onnx --dynamic-img-size --pos-embed-interp bicubic` (or bilinear).")


def check_image_shape(chw: tuple[int, ...], lo: tuple[int, ...], hi: tuple[int, ...], plan_name: str) -> None:
    """A runner's (C, H, W) must be the engine's, or lie inside its image size profile (a dynamic-size engine)."""
    if tuple(lo) == tuple(hi):
        if tuple(chw) != tuple(lo):
            raise VitexportError(f"{plan_name} takes images of shape {tuple(lo)}, got {tuple(chw)}.")
        return
    if len(chw) != 3 or chw[0] != lo[0] or not all(a <= s <= b for a, s, b in zip(lo[1:], chw[1:], hi[1:])):
        raise VitexportError(f"{plan_name} takes images from {lo[1]}x{lo[2]} to {hi[1]}x{hi[2]} with {lo[0]} "
                             f"channels, got {tuple(chw)}; rebuild it from an export with a wider "
                             f"--img-size-range to take it.")


def check_batch(batch: int, lo: int, hi: int, plan_name: str) -> None:
    """A runner's batch must lie inside the profile the engine was built for."""
    if not lo <= batch <= hi:
        raise VitexportError(f"Batch {batch} is outside the range {lo}-{hi} that {plan_name} was built for; "
                             f"rebuild it with --min-batch/--max-batch covering {batch}.")


# -- TensorRT version -----------------------------------------------------------------------------------------

def check_trt_version(version: str) -> tuple[int, int]:
    """(major, minor) of an installed TensorRT; EngineUnavailable (exit 4) below MIN_TENSORRT or when unreadable."""
    m = re.match(r"^\s*(\d+)\.(\d+)", str(version))
    if not m:
        need = ".".join(map(str, MIN_TENSORRT))
        raise EngineUnavailable(f"TensorRT reports the version {version!r}, which vitexport cannot read; it needs "
                                f"TensorRT {need} or newer (`{INSTALL_COMMAND}`).", EXIT_NO_TENSORRT)
    major_minor = (int(m.group(1)), int(m.group(2)))
    if major_minor < MIN_TENSORRT:
        raise EngineUnavailable.old_tensorrt(str(version).strip())
    return major_minor


# -- TensorRT's own log -----------------------------------------------------------------------------------

@dataclass
class LogOptions:
    """Where TensorRT's own messages go besides the failure message: `vitexport trt --verbose / --verbose-log`."""

    verbose: bool = False  # TensorRT's INFO and VERBOSE messages on stderr
    file: Path | None = None  # every message TensorRT logs, all severities, written to this file

    def validate(self) -> "LogOptions":
        if self.file is not None:
            f = Path(self.file)
            if f.is_dir():
                raise VitexportError(f"--verbose-log {f} is a folder; give a file path.")
            if not f.parent.is_dir():
                raise VitexportError(f"--verbose-log {f}: the folder {f.parent} does not exist.")
        return self


def log_hint(verbose: bool = False, files: Sequence[Path] = ()) -> str:
    """Where to read TensorRT's full log, for a failure message: the file or stderr when one is being written."""
    if files:
        return f"TensorRT's full log is in {', '.join(str(f) for f in files)}"
    if verbose:
        return "TensorRT's verbose log above has the details"
    return "run `vitexport trt` again with --verbose (or --verbose-log FILE) to see TensorRT's full log"


# -- messages -------------------------------------------------------------------------------------------------

def parse_failure_message(onnx_path: Path, errors: Sequence[str], hint: str | None = None) -> str:
    """Every ONNX parser error, numbered (the first is often a symptom of a later one), and where the log is."""
    name, hint = Path(onnx_path).name, hint or log_hint()
    if not errors:
        return f"TensorRT could not parse {name} and gave no reason; {hint}."
    lines = [f"TensorRT could not parse {name} ({len(errors)} error{'s' if len(errors) != 1 else ''}):"]
    lines += [f"  {i}. {e.strip()}" for i, e in enumerate(errors, 1)]
    return "\n".join(lines + [f"{hint[0].upper()}{hint[1:]}."])


def build_failure_message(onnx_path: Path, errors: Sequence[str], hint: str | None = None) -> str:
    """The errors TensorRT logged during this build (not before it), and where the full log is."""
    name, hint = Path(onnx_path).name, hint or log_hint()
    if not errors:
        return f"TensorRT could not build an engine from {name} and logged no error; {hint}."
    lines = [f"TensorRT could not build an engine from {name}:"] + [f"  {e.strip()}" for e in errors]
    return "\n".join(lines + [f"{hint[0].upper()}{hint[1:]}."])
