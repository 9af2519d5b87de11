"""`vitexport quantize`."""

from __future__ import annotations

import click


@click.command("quantize")
def quantize_command():
    """(not yet available)"""
    raise click.ClickException("not yet available")
