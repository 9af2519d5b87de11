"""`quantize --sensitivity`: the groups' costs as a table (sorted by cost), JSON (`--json`) and a bar plot
(`--plot`)."""

from __future__ import annotations

import json
from pathlib import Path

from ..parity.compare import ParityStats
from ..paths import pyplot, save_png, write_text_atomic
from .sensitivity import Pass, Sensitivity

FORMAT = "vitexport-sensitivity/1"
MEASURED = ("each group alone quantized, every other group in float, against the FP32 model on the held-out data; "
            "cost = 1 - mean cosine to FP32")


def _figures(s: ParityStats) -> dict:
    keys = ("cos_min", "cos_mean", "top1_agree", "top1_agree_ci", "disagree", "acc_ref", "acc", "acc_drop",
            "acc_drop_ci", "flips_down", "flips_up", "dense", "absrel", "absrel_ci", "delta1", "delta1_ci",
            "pixel_agree", "pixel_agree_ci", "miou", "miou_ci")
    d = s.to_dict()
    return {k: d[k] for k in keys if d.get(k) is not None}


def _pass(p: Pass) -> dict:
    return {"cost": p.cost, **_figures(p.stats)}


def to_dict(sens: Sensitivity, model: str) -> dict:
    """One record per group, most costly first, with its ONNX node names, block, kind and figures."""
    rows = [{"rank": r + 1, **sens.groups[i].to_dict(), **_pass(sens.passes[i])} for r, i in enumerate(sens.ranked())]
    return {"format": FORMAT, "kind": sens.kind, "model": model, "data": sens.data, "images": sens.images,
            "labelled": sens.labelled, "measured": MEASURED, "all_quantized": _pass(sens.all_quantized),
            "none_quantized": _pass(sens.none_quantized), "groups": rows}


def _acc(s: ParityStats) -> str:
    if s.acc is None or s.acc_drop is None:
        return ""
    ci = f" ({s.acc_drop_ci[0]:+.2f} to {s.acc_drop_ci[1]:+.2f})" if s.acc_drop_ci else ""
    return f"{s.acc:7.2%} {s.acc_drop:+6.2f}{ci}"


# a dense output's cost and column (parity.dense): its task figure against FP32
DENSE_MEASURED = {"depth": ("cost = AbsRel to the FP32 depth", "delta1", "delta1"),
                  "segmentation": ("cost = 1 - pixel agreement with the FP32 map", "mIoU", "miou")}


def table(sens: Sensitivity) -> str:
    """The groups sorted by cost, then every group quantized and none, for scale."""
    acc = "  top-1 acc, drop points (95%)" if sens.labelled else ""
    dense = sens.all_quantized.stats.dense
    measured, column, field_ = DENSE_MEASURED[dense] if dense else (MEASURED.split("; ")[1], "top-1 agree",
                                                                      "top1_agree")
    lines = [f"{sens.kind.upper()} sensitivity on {sens.images:,} held-out inputs ({sens.data}): "
             f"{MEASURED.split('; ')[0]}; {measured}.",
             f"{'rank':>4}  {'group':<26} {'block':>5}  {'kind':<11} {'cost':>9}  {'cos min':>8}  {'cos mean':>8}  "
             f"{column:>11}{'' if dense else acc}"]

    def line(rank: str, name: str, block, kind: str, p: Pass) -> str:
        s = p.stats
        return (f"{rank:>4}  {name:<26} {'' if block is None else block:>5}  {kind:<11} {p.cost:9.2e}  "
                f"{s.cos_min:8.5f}  {s.cos_mean:8.5f}  {getattr(s, field_):11.1%}  {'' if dense else _acc(s)}"
                ).rstrip()

    for r, i in enumerate(sens.ranked()):
        g = sens.groups[i]
        lines.append(line(str(r + 1), g.name, g.block, g.kind, sens.passes[i]))
    lines.append(line("", f"(all {len(sens.groups)} groups)", None, "", sens.all_quantized))
    lines.append(line("", "(no group)", None, "", sens.none_quantized))
    return "\n".join(lines)


def write_json(sens: Sensitivity, model: str, path: Path) -> None:
    write_text_atomic(Path(path), json.dumps(to_dict(sens, model), indent=1) + "\n")


def plot(sens: Sensitivity, path: Path) -> None:
    """A horizontal bar per group, most costly on top; the cost of every group quantized in the title, for scale."""
    plt = pyplot()
    order = sens.ranked()
    names = [sens.groups[i].name for i in order]
    costs = [sens.passes[i].cost for i in order]
    fig, ax = plt.subplots(figsize=(8, max(3.0, 0.22 * len(names) + 1.2)))
    ax.barh(range(len(names)), costs, color="tab:blue")
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("cost: 1 - mean cosine to FP32, that group alone quantized")
    ax.set_title(f"{sens.kind.upper()} sensitivity, {sens.images:,} held-out inputs (all {len(names)} groups "
                 f"quantized: cost {sens.all_quantized.cost:.2e})", fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    save_png(fig, Path(path))
