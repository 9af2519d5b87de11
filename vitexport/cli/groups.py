"""Options shared by several commands, written once, and the error handling every command uses."""

from __future__ import annotations

import functools
from pathlib import Path

import click

from ..errors import VitexportError
from ..posembed import DEFAULT_METHOD, METHODS
from ..progress import Log
from ..variants import DEFAULT_VARIANT, VARIANTS, parse_img_size


class UserError(click.ClickException):
    """Printed as 'Error: <sentence>' with the error's own exit code."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


def handle_errors(fn):
    """VitexportError -> one sentence on stderr and its exit code; never a traceback for user mistakes."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except VitexportError as e:
            raise UserError(str(e), e.exit_code) from None
        except KeyboardInterrupt:
            raise UserError("Interrupted; no partial output was kept.", 130) from None

    return wrapper


def model_options(fn):
    """--model, --checkpoint, --img-size, --num-classes, --pos-embed-interp."""
    for dec in reversed([
        click.option("--model", "-m", "variant", default=DEFAULT_VARIANT, show_default=True,
                     type=click.Choice(list(VARIANTS)), help="Named ViT variant (timm's names)."),
        click.option("--checkpoint", "-c", type=click.Path(path_type=Path), default=None,
                     help="timm .pth/.safetensors, Hugging Face file or folder, or JAX .npz. "
                          "Default: random weights (the digits model uses its shipped checkpoint)."),
        click.option("--img-size", default=None, metavar="N|HxW",
                     help="Input size; the position embedding is resized to the new grid. Default: the variant's."),
        click.option("--num-classes", type=int, default=None,
                     help="Classes of the head (0: features). Default: the checkpoint's, else the variant's."),
        click.option("--pos-embed-interp", type=click.Choice(list(METHODS)), default=DEFAULT_METHOD,
                     show_default=True, help="How to resize the position embedding."),
    ]):
        fn = dec(fn)
    return fn


def spec_from(variant: str, checkpoint: Path | None, img_size: str | None, num_classes: int | None,
              pos_embed_interp: str):
    from ..export import ModelSpec

    return ModelSpec(variant=variant, checkpoint=checkpoint, img_size=parse_img_size(img_size),
                     num_classes=num_classes, pos_embed_interp=pos_embed_interp)


quiet_option = click.option("--quiet", "-q", is_flag=True, help="No progress output (warnings still show).")


def make_log(quiet: bool) -> Log:
    return Log(quiet=quiet)


def target_options(fn):
    """MODEL_DIR argument or --model etc.: which exported model a command works on."""
    fn = model_options(fn)
    return click.argument("model_path", required=False, type=click.Path(path_type=Path), metavar="[MODEL_DIR|ONNX]")(fn)


def calib_options(fn):
    """Options of the precision step, shared by `quantize` and `trt`."""
    from ..precision.convert import METHODS

    for dec in reversed([
        click.option("--calib-data", type=click.Path(path_type=Path), default=None,
                     help="Calibration images (recursive; jpg/png/webp/bmp) or .npy batches. "
                          "Default: the shipped set for the model."),
        click.option("--calib-samples", type=int, default=None, help="Use N calibration inputs (chosen evenly)."),
        click.option("--calib-method", type=click.Choice(METHODS), default="percentile", show_default=True),
        click.option("--percentile", type=float, default=99.999, show_default=True,
                     help="Percentile for --calib-method percentile."),
        click.option("--quantize-attention", is_flag=True,
                     help="Also quantize the attention matrix products (Q.K^T, A.V)."),
        click.option("--exclude-node", multiple=True, help="Keep this node in float (repeatable)."),
        click.option("--exclude-block", type=int, multiple=True, help="Keep transformer block N in float (repeatable)."),
        click.option("--keep-fp32", default="LayerNormalization,Softmax", show_default=True, metavar="OP[,OP]",
                     help="FP16: op types kept in FP32 ('' for none)."),
        click.option("--check-data", type=click.Path(path_type=Path), default=None,
                     help="Held-out images for the parity check. Default: the shipped held-out set."),
        click.option("--no-check", is_flag=True, help="Skip the parity check against FP32."),
    ]):
        fn = dec(fn)
    return fn


def calib_from(calib_data, calib_samples, calib_method, percentile, quantize_attention, exclude_node,
               exclude_block, keep_fp32, check_data, no_check):
    from ..precision import CalibOptions
    from ..precision.convert import Int8Settings

    if not 0 < percentile <= 100:
        raise click.BadParameter("must be in (0, 100]", param_hint="--percentile")
    return CalibOptions(
        data=calib_data, samples=calib_samples,
        int8=Int8Settings(method=calib_method, percentile=percentile, quantize_attention=quantize_attention,
                          exclude_nodes=list(exclude_node), exclude_blocks=list(exclude_block)),
        keep_fp32=tuple(op.strip() for op in keep_fp32.split(",") if op.strip()),
        check=not no_check, check_data=check_data,
    )


CALIB_KEYS = ("calib_data", "calib_samples", "calib_method", "percentile", "quantize_attention", "exclude_node",
              "exclude_block", "keep_fp32", "check_data", "no_check")
MODEL_KEYS = ("variant", "checkpoint", "img_size", "num_classes", "pos_embed_interp")


def pop_keys(kwargs: dict, keys) -> dict:
    return {k: kwargs.pop(k) for k in keys}
