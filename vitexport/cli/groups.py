"""Option groups, each defined once: its flags, and how their values become the object the library takes.

A command lists the groups it uses (`@use(MODEL, CALIB, QUIET)`); each group adds its flags to the command and,
at call time, hands the command one object (`spec=ModelSpec(...)`, `calib=CalibOptions(...)`, `log=Log(...)`)
in place of its raw values. Ranges and choices are click's own types, so a bad value exits 2 with click's
message before any work. Library errors become one sentence and their exit code (`handle_errors`).

This module and the command modules import no numeric library: `vitexport --help` stays fast. Each command
imports the library it calls inside its body.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import click

from ..errors import VitexportError
from ..model.posembed import DEFAULT_INTERPOLATION, INTERPOLATIONS
from ..model.spec import spec_for
from ..model.variants import DEFAULT_VARIANT, get_variant, parse_img_size
from ..precision.settings import (
    CALIB_METHODS,
    DEFAULT_ALPHA,
    DEFAULT_KEEP_FP32,
    DEFAULT_PERCENTILE,
    PLACEMENTS,
    calib_options,
)
from ..progress import Log
from .failures import UserError, to_click  # noqa: F401 - UserError: commands raise it from here


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Any failure -> one sentence on stderr and its exit code (failures.to_click); a traceback only with --debug."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as e:  # noqa: BLE001 - translated, not swallowed
            raise to_click(e) from None
        except KeyboardInterrupt as e:
            raise to_click(e) from None

    return wrapper


def parity_line(verdict) -> str | None:
    """'Parity vs FP32: passed (360 held-out inputs, min cosine 0.99446, top-1 98.89% -> 98.89%)', or None when the
    check was skipped: what the commands that make a checked file say of it."""
    if verdict is None:
        return None
    s = verdict.stats
    return (f"Parity vs FP32: passed ({s.n} held-out inputs, min cosine {s.cos_min:.5f}"
            + (f", top-1 {s.acc_ref:.2%} -> {s.acc:.2%}" if s.acc is not None else "") + ")")


def one_flag(default: str | None = None, **given: bool) -> str | None:
    """The one flag of a choice given (--fp16 | --int8 | ...), refusing two: click would let the last one win."""
    chosen = [name for name, on in given.items() if on]
    if len(chosen) > 1:
        raise click.UsageError(f"{' and '.join('--' + c for c in chosen)} exclude each other; give one of them.")
    return chosen[0] if chosen else default


class FiniteFloat(click.FloatRange):
    """A float in a range, and a number: 'nan' and 'inf' are refused (a NaN bound would switch a check off)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        value = super().convert(value, param, ctx)
        if not math.isfinite(value):
            self.fail(f"{value} is not a finite number.", param, ctx)
        return value


class ImgSize(click.ParamType):
    """N or HxW -> (H, W)."""

    name = "N|HxW"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or isinstance(value, tuple):
            return value
        try:
            return parse_img_size(value)
        except VitexportError as e:
            self.fail(str(e), param, ctx)


class SizeRangeType(click.ParamType):
    """MIN..MAX, each N or HxW -> ((min H, min W), (max H, max W))."""

    name = "MIN..MAX"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or isinstance(value, tuple):
            return value
        lo, sep, hi = str(value).partition("..")
        if not sep or not lo or not hi:
            self.fail(f"{value!r} is not MIN..MAX (for example 160..512 or 160x224..512x640).", param, ctx)
        try:
            return parse_img_size(lo), parse_img_size(hi)
        except VitexportError as e:
            self.fail(str(e), param, ctx)


class ModelName(click.ParamType):
    """An architecture of timm's VisionTransformer family, or timm's tagged name of one
    (vit_base_patch16_224.augreg2_in21k_ft_in1k); unknown names get the closest known ones."""

    name = "ARCH[.TAG]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None:
            return value
        try:
            get_variant(str(value).partition(".")[0])
        except VitexportError as e:
            self.fail(str(e), param, ctx)
        return value


class CheckpointRef(click.ParamType):
    """A checkpoint path, or 'hf-hub:ORG/NAME[@REVISION]' kept as written."""

    name = "PATH|hf-hub:ORG/NAME[@REV]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or isinstance(value, Path) or str(value).startswith("hf-hub:"):
            return value
        return Path(value)


@dataclass
class OptionGroup:
    """Flags that belong together and the one object they make."""

    dest: str  # the keyword the command receives the object under
    params: Callable[[], list[click.Parameter]]  # the flags (made afresh for each command that uses the group)
    make: Callable[..., Any]  # the flags' values, by parameter name -> the object


def use(*groups: OptionGroup) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the groups' flags to a command; call it with one object per group instead of their values.

    Errors of the library (and of making the objects) become one sentence and their exit code.
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        made = [(g, g.params()) for g in groups]

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            for group, params in made:
                values = {p.name: kwargs.pop(p.name) for p in params if p.name in kwargs}
                kwargs[group.dest] = group.make(**values)
            return fn(**kwargs)

        wrapped = handle_errors(command)
        memo = wrapped.__dict__.setdefault("__click_params__", [])
        for _, params in reversed(made):  # click reads the list bottom-up, like stacked decorators
            memo.extend(reversed(params))
        return wrapped

    return decorate


def opt(*decls: str, **attrs: Any) -> click.Option:
    """click.Option, written like click.option."""
    return click.Option(list(decls), **attrs)


# -- the groups ---------------------------------------------------------------------------------------------

TARGET = OptionGroup(
    "target",
    lambda: [click.Argument(["model_path"], required=False, type=click.Path(path_type=Path),
                            metavar="[MODEL_DIR|ONNX]")],
    lambda model_path: model_path,
)

MODEL = OptionGroup(
    "spec",
    lambda: [
        opt("--model", "-m", "variant", default=None, type=ModelName(),
             help=f"Any architecture of timm's VisionTransformer family (`vitexport models` lists them), or timm's "
                  f"tagged name (vit_small_patch14_reg4_dinov2.lvd142m: its weights from timm/<name> on the Hugging "
                  f"Face hub). Default: {DEFAULT_VARIANT}, or the -c hub checkpoint's."),
        opt("--checkpoint", "-c", type=CheckpointRef(), default=None,
             help="timm .pth/.safetensors, Hugging Face file or folder, JAX .npz, or hf-hub:ORG/NAME[@REVISION] "
                  "(a timm or transformers repository, through the Hugging Face cache; HF_HUB_OFFLINE=1 works "
                  "from the cache). Default: random weights (the digits model uses its shipped checkpoint)."),
        opt("--img-size", "img_sizes", type=ImgSize(), multiple=True, metavar="N|HxW",
             help="Input size; the position embedding is resized to the new grid. Default: the variant's. With "
                  "--dynamic-img-size: the default size; `bench` takes it more than once and times each size."),
        opt("--num-classes", type=click.IntRange(min=0), default=None,
             help="Classes of the head (0: features). Default: the checkpoint's, else the variant's."),
        opt("--pos-embed-interp", type=click.Choice(list(INTERPOLATIONS)), default=None,
             help=f"How to resize the position embedding. Default: as a transformers checkpoint's own code does, "
                  f"else {DEFAULT_INTERPOLATION}."),
        opt("--dynamic-img-size", is_flag=True,
             help="Any image size (multiples of the patch size, within --img-size-range): the position embedding "
                  "is resampled in the graph; --img-size is the default size (preprocessing, calibration, checks). "
                  "Folder: models/<variant>-<H>x<W>-dynamic/."),
        opt("--img-size-range", type=SizeRangeType(), default=None, metavar="MIN..MAX",
             help="With --dynamic-img-size: the smallest and largest sizes (N or HxW each). Default: half to twice "
                  "--img-size."),
    ],
    lambda variant, checkpoint, img_sizes, num_classes, pos_embed_interp, dynamic_img_size, img_size_range: _spec(
        variant, checkpoint, img_sizes, num_classes, pos_embed_interp, dynamic_img_size, img_size_range),
)


def _spec(variant, checkpoint, img_sizes, num_classes, pos_embed_interp, dynamic_img_size, img_size_range):
    spec = spec_for(variant, checkpoint, img_sizes[0] if img_sizes else None, num_classes=num_classes,
                    pos_embed_interp=pos_embed_interp, dynamic_img_size=dynamic_img_size,
                    img_size_range=img_size_range)
    ctx = click.get_current_context(silent=True)
    if len(img_sizes) > 1 and (ctx is None or ctx.info_name != "bench"):
        raise UserError("--img-size is given once here; `vitexport bench` takes it more than once, to time a "
                        "dynamic-size export (--dynamic-img-size) at each size.")
    spec.bench_sizes = tuple(img_sizes)
    return spec

CALIB = OptionGroup(
    "calib",
    lambda: [
        opt("--calib-data", type=click.Path(path_type=Path), default=None,
             help="Calibration images (recursive; jpg/png/webp/bmp) or .npy batches (INT8/FP8 ranges; FP16: the "
                  "ranges that keep nodes in FP32). Default: the shipped set for the model."),
        opt("--calib-samples", type=click.IntRange(min=1), default=None,
             help="Use N calibration inputs (chosen evenly)."),
        opt("--calib-method", type=click.Choice(CALIB_METHODS), default="percentile", show_default=True),
        opt("--percentile", type=click.FloatRange(0, 100, min_open=True), default=DEFAULT_PERCENTILE,
             show_default=True, help="Percentile for --calib-method percentile."),
        opt("--quantize-attention/--no-quantize-attention", default=None,
            help="INT8: the attention matrix products (Q.K^T, A.V) in INT8 too, or not. Default: the CPU graph of a "
                 "sequence of 256 tokens or more, where they are 8% or more of the work, tries them in INT8 and keeps "
                 "them if the held-out check passes."),
        opt("--placement", type=click.Choice(PLACEMENTS), default="vitexport", show_default=True,
            help="INT8 for TensorRT: where the Q/DQ go: the weight GEMMs' inputs, or ModelOpt's placement (also "
                 "the attention products, the LayerNorm inputs and the residual Adds)."),
        opt("--smoothquant", type=click.FloatRange(0, 1), is_flag=False, flag_value=DEFAULT_ALPHA, default=None,
            metavar="[ALPHA]", help=f"INT8/FP8: SmoothQuant for the GEMMs a LayerNorm feeds (qkv, fc1): activation "
                                    f"outliers moved into the weights, folded into LayerNorm (alpha: how much of "
                                    f"their range moves; default {DEFAULT_ALPHA:g})."),
        opt("--weight-bits", type=click.IntRange(7, 8), default=None, metavar="7|8",
            help="INT8, the CPU graph (model.int8.onnx): its weights' bits. 8 are exact on CPUs with VNNI or AMX (and "
                 "Arm), whose INT8 kernels sum in int32; other x86 CPUs sum pairs of products in int16, which 8 bits "
                 "saturate and 7 cannot. Default: 8 where this CPU sums exactly, else 7."),
        opt("--min-cos", type=click.FloatRange(-1, 1), default=None, metavar="C",
            help="INT8/FP8: return the costliest GEMM groups to float, fewest first, until the minimum cosine to "
                 "FP32 on the held-out data is at least C; FP16: the costliest regions (blocks, stem, head) to "
                 "FP32."),
        opt("--max-drop", type=click.FloatRange(min=0), default=None, metavar="POINTS",
            help="INT8/FP8: the same, until the top-1 accuracy drop on labelled held-out data is within POINTS."),
        opt("--dense-target", type=click.FloatRange(0, 1), default=None, metavar="X",
            help="INT8/FP8 of a depth or segmentation model: the same, until its task figure against FP32 on the "
                 "held-out data reaches X: a depth's AbsRel at most X, a segmentation's pixel agreement at least X."),
        opt("--exclude-node", multiple=True, help="Keep this node in float (FP16: in FP32) (repeatable)."),
        opt("--exclude-block", type=int, multiple=True, help="Keep transformer block N in float (repeatable)."),
        opt("--keep-fp32", default=",".join(DEFAULT_KEEP_FP32), show_default=True, metavar="OP[,OP]",
             help="FP16: op types kept in FP32 ('' for none)."),
        opt("--check-data", type=click.Path(path_type=Path), default=None,
             help="Held-out images for the parity check. Default: the shipped held-out set."),
        opt("--check-labels", type=click.Path(exists=True, dir_okay=False, path_type=Path), multiple=True,
            metavar="FILE", help="Label file for a flat --check-data folder (repeatable, one of each kind): CSV/TSV of file name (extension optional) and label (class index, WordNet synset or class name), ImageNet's LOC_val_solution.csv, or ImageNet-ReaL's real.json (ReaL accuracy as well)."),
        opt("--no-check", is_flag=True, help="Skip the parity check against FP32."),
    ],
    calib_options,  # the flags' names are its keywords
)

QUIET = OptionGroup(
    "log",
    lambda: [opt("--quiet", "-q", is_flag=True, help="No progress output (warnings still show).")],
    lambda quiet: Log(quiet=quiet),
)


def report_file(ctx: click.Context, param: click.Parameter, path: Path | None) -> Path | None:
    """Checked before minutes of work, not after."""
    if path is not None and (path.is_dir() or not (path.parent.is_dir() or not path.parent.exists())):
        raise click.BadParameter(f"{path} is a folder or lies under a file; give a file path", ctx=ctx, param=param)
    return path


def command_line() -> str:
    """The command as typed: `vitexport ARGS` (a report says what made it)."""
    import shlex
    import sys

    return "vitexport " + " ".join(shlex.quote(a) for a in sys.argv[1:])
