"""`vitexport bench`."""

from __future__ import annotations

import click


@click.command("bench")
def bench_command():
    """(not yet available)"""
    raise click.ClickException("not yet available")
