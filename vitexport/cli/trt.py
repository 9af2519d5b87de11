"""`vitexport trt`."""

from __future__ import annotations

import click


@click.command("trt")
def trt_command():
    """(not yet available)"""
    raise click.ClickException("not yet available")
