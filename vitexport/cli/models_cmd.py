"""`vitexport models [PATTERN]`: the architectures vitexport builds by name (timm's VisionTransformer family and the
shipped digits model) and their pretrained tags, as `timm.list_models` lists them. Reads the table only: no torch."""

from __future__ import annotations

import fnmatch
import json

import click


def _rows(pattern: str, pretrained: bool) -> list[dict]:
    from ..model.archs import arch_names
    from ..model.variants import DIGITS_VARIANT, get_variant

    rows = []
    for name in arch_names() + [DIGITS_VARIANT]:
        arch = get_variant(name)
        shape = arch.describe()
        tags = list(arch.tags.values()) if name != DIGITS_VARIANT else []
        entries = [(f"{name}.{t.name}", t) for t in tags] if pretrained else [(name, arch.default_tag)]
        for full, tag in entries:
            if not (fnmatch.fnmatchcase(full, pattern) or fnmatch.fnmatchcase(name, pattern)):
                continue
            size = tag.input_size if tag is not None else arch.img_size
            rows.append({"name": full, "embed_dim": shape["embed_dim"], "depth": shape["depth"],
                         "num_heads": shape["num_heads"], "patch": shape["patch"], "input_size": list(size),
                         "params": tag.params if tag is not None and tag.params else None,
                         "num_classes": tag.num_classes if tag is not None else arch.num_classes,
                         "tags": len(tags) if not pretrained else None})
    return rows


@click.command("models")
@click.argument("pattern", required=False, default="*")
@click.option("--pretrained", is_flag=True, help="List each pretrained tag (ARCH.TAG), as timm.list_pretrained does.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def models_command(pattern: str, pretrained: bool, as_json: bool) -> None:
    """List the architectures vitexport builds by name (-m), optionally matching a shell PATTERN
    ('*dinov2*', 'vit_base_*'), with width, depth, heads, patch, input size and parameter count."""
    from ..model.archs import table

    rows = _rows(pattern if any(c in pattern for c in "*?[") else f"*{pattern}*", pretrained)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    if not rows:
        raise click.ClickException(f"No architecture matches {pattern!r}; `vitexport models` lists them all.")
    width = max(len(r["name"]) for r in rows)
    click.echo(f"{'name':<{width}}  {'width':>5} {'depth':>5} {'heads':>5} {'patch':>5}  {'input':>9}  "
               f"{'params':>8}  {'classes':>7}" + ("" if pretrained else "  tags"))
    for r in rows:
        params = f"{r['params'] / 1e6:7.1f}M" if r["params"] else "       -"
        size = f"{r['input_size'][0]}x{r['input_size'][1]}"
        click.echo(f"{r['name']:<{width}}  {r['embed_dim']:>5} {r['depth']:>5} {r['num_heads']:>5} {r['patch']:>5}  "
                   f"{size:>9}  {params:>8}  {r['num_classes']:>7}" + ("" if pretrained else f"  {r['tags']:>4}"))
    click.echo(f"{len(rows)} {'tags' if pretrained else 'architectures'} (timm {table()['timm_version']}'s "
               f"VisionTransformer family; -m ARCH for random weights, -m ARCH.TAG for the tag's weights)")
