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
