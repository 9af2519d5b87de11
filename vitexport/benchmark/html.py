"""`bench --html`: the report as one self-contained page, rendered from the report's dict (what the JSON holds):
the run, the rows (sortable, each gate's verdict and reason), the accuracy/throughput chart, each row's latency
distribution, the images that explain a miss (a classifier's flipped top-1s, an embedding's changed neighbours, a
dense model's worst maps), and a served model's latency against load. Styles, script and pictures are inline: it
reads offline and attaches to a pull request."""

from __future__ import annotations

import json
import math
from html import escape

from .chart import latency_svg, pareto_svg, served_svg, y_figure
from .figures import fastest_line
from .report import fmt, unavailable_lines, with_interval

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1280px;
color:#1b1b1b;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}
.verdict{display:inline-block;padding:2px 10px;border-radius:4px;font-weight:600;color:#fff}
.pass{background:#1a7f37}.FAIL,.fail{background:#cf222e}.inconclusive{background:#9a6700}
table{border-collapse:collapse;font-size:13px}
th,td{padding:3px 8px;border-bottom:1px solid #eee;text-align:right;vertical-align:top}
th{background:#f6f8fa;position:sticky;top:0;cursor:pointer;user-select:none;white-space:nowrap}
td.l,th.l{text-align:left}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
table.facts td{text-align:left}table.facts td:first-child{color:#555;white-space:nowrap}
td .tag{padding:1px 6px;border-radius:3px;color:#fff;font-size:12px}
.why{color:#555;text-align:left;min-width:420px;max-width:640px}
.scroll{overflow-x:auto;max-width:100%}td.l{white-space:nowrap}.thumb{width:96px}.ok{color:#1a7f37}
.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{border:1px solid #ddd;border-radius:6px;padding:8px;width:250px;font-size:12px}
.card img{display:block;margin-bottom:4px}.card .file{color:#555;word-break:break-all}
.top{display:grid;grid-template-columns:1fr 1fr;gap:6px;margin-top:4px}.top b{display:block}.changed{color:#cf222e}
.dense{display:flex;gap:10px;align-items:flex-start;margin:6px 0;font-size:12px}.dense figure{margin:0}
.dense figcaption{color:#555}.chart text{font-size:11px;fill:#222}.none,.muted{color:#666}code{font-size:12px}
.mono{font-family:ui-monospace,monospace;font-size:12px;word-break:break-all}
"""

SCRIPT = """
document.querySelectorAll('table.sortable').forEach(function (table) {
  table.querySelectorAll('th').forEach(function (th, col) {
    th.addEventListener('click', function () {
      var up = th.getAttribute('aria-sort') !== 'ascending';
      table.querySelectorAll('th').forEach(function (h) { h.removeAttribute('aria-sort'); });
      th.setAttribute('aria-sort', up ? 'ascending' : 'descending');
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      function key(r) { var c = r.cells[col]; var v = c.getAttribute('data-v'); return v === null ? c.textContent : v; }
      rows.sort(function (a, b) {
        var x = key(a), y = key(b), nx = parseFloat(x), ny = parseFloat(y);
        var cmp = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : String(x).localeCompare(String(y));
        return up ? cmp : -cmp;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""

SHOWN_IMAGES = 16  # a row's examples shown on the page (the report keeps at most parity.examples' caps)


def _cell(v, spec: str = ".2f", text: str | None = None) -> str:
    """A numeric cell that sorts by its value."""
    sort = "" if v is None or (isinstance(v, float) and math.isnan(v)) else f' data-v="{v!r}"'
    return f"<td{sort}>{escape(text if text is not None else fmt(v, spec))}</td>"


def _rate(par: dict, key: str) -> tuple[float | None, str]:
    """(a rate, '98.89 (97.2-99.7)': in percent with its 95 % interval, as the terminal's table writes it)."""
    ci = par.get(f"{key}_ci") or [None, None]
    return par.get(key), with_interval(par.get(key), *ci)


def figure_columns(d: dict) -> list[tuple[str, str]]:
    """(parity field, header) of the figures the rows are judged by, for this kind of model."""
    field_name, _ = y_figure(d)
    cols = {"delta1": [("absrel", "AbsRel (95% CI)"), ("delta1", "delta1 % (95% CI)")],
            "pixel_agree": [("pixel_agree", "pixel agree % (95% CI)"), ("miou", "mIoU % (95% CI)")],
            "mask_iou": [("mask_iou", "mask IoU % (95% CI)"), ("mask_iou_min", "worst prompt %")],
            "map": [("map", "mAP % (95% CI)"), ("map_50", "AP50 % (95% CI)"), ("box_iou", "box IoU % (95% CI)")],
            "knn_acc": [("neighbour_agree", "same neighbour % (95% CI)"), ("knn_acc", "k-NN top-1 % (95% CI)")],
            "neighbour_agree": [("neighbour_agree", "same neighbour % (95% CI)")],
            "acc": [("top1_agree", "top-1 agree % (95% CI)"), ("acc", "top-1 acc % (95% CI)")],
            "top1_agree": [("top1_agree", "top-1 agree % (95% CI)")]}[field_name]
    return cols


def _figure_cell(par: dict, key: str) -> str:
    if key == "absrel":
        v, ci = par.get("absrel"), par.get("absrel_ci")
        return _cell(v, ".4f", "-" if v is None else f"{v:.4f}" + ("" if not ci else f" ({ci[0]:.4f}-{ci[1]:.4f})"))
    if key == "mask_iou_min":
        v = par.get(key)
        return _cell(v, "", "-" if v is None else f"{v * 100:.2f}")
    v, text = _rate(par, key)
    return _cell(v, "", text)


def rows_table(d: dict) -> str:
    cols = figure_columns(d)
    labelled = d["data"].get("labelled") and not d["data"].get("embeddings")
    served = any(lat.get("concurrency") for r in d["results"] for lat in r.get("latency") or [])
    head = ["backend", "precision", "batch"] + (["in flight"] if served else []) + \
        ["mean ms", "p50 ms", "p90 ms", "p99 ms", "img/s", "vs reference", "max abs", "cos min"] + \
        [h for _, h in cols] + (["drop pts [95% CI]", "flips down/up"] if labelled else []) + ["parity", "why"]
    out = ['<table class="sortable" id="rows"><thead><tr>'
           + "".join(f'<th class="{"l" if h in ("backend", "precision", "parity", "why") else ""}">{escape(h)}</th>'
                     for h in head) + "</tr></thead><tbody>"]
    for r in d["results"]:
        if not r.get("available"):
            continue
        par = r.get("parity") or {}
        status = {"pass": "pass", "fail": "FAIL", "inconclusive": "inconclusive"}.get(par.get("status"), "FAIL")
        why = "; ".join(par.get("failures", []) + par.get("inconclusive", [])) or (r.get("error") or "")
        for lat in r.get("latency") or [{}]:
            cells = [f'<td class="l">{escape(r["name"])}</td>', f'<td class="l">{escape(r["precision"])}</td>',
                     _cell(lat.get("batch"), "d")]
            if served:
                cells.append(_cell(lat.get("concurrency"), "d"))
            cells += [_cell(lat.get(k), ".2f") for k in ("mean_ms", "p50_ms", "p90_ms", "p99_ms")]
            cells += [_cell(lat.get("throughput"), ".1f"),
                      _cell(lat.get("relative_to_reference"), ".2f",
                            None if lat.get("relative_to_reference") is None
                            else f"{lat['relative_to_reference']:.2f}x"),
                      _cell(par.get("max_abs"), ".2e"), _cell(par.get("cos_min"), ".5f")]
            cells += [_figure_cell(par, k) for k, _ in cols]
            if labelled:
                dci = par.get("acc_drop_ci")
                cells += [_cell(par.get("acc_drop"), "", "-" if par.get("acc_drop") is None else
                                f"{par['acc_drop']:+.2f} [{dci[0]:+.1f}, {dci[1]:+.1f}]" if dci else
                                f"{par['acc_drop']:+.2f}"),
                          f'<td>{fmt(par.get("flips_down"), "d")}/{fmt(par.get("flips_up"), "d")}</td>']
            cells += [f'<td class="l" data-v="{status}"><span class="tag {status}">{status}</span></td>',
                      f'<td class="why">{escape(why)}</td>']
            out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def run_facts(d: dict) -> str:
    m, env, data = d["model"], d["environment"], d["data"]
    ck = m.get("checkpoint")
    weights = "random (latency is real, accuracy is meaningless)" if m.get("random_weights") or not ck else \
        f'{escape(ck["path"])}<br><span class="mono">sha256 {escape(ck["sha256"])}</span>'
    gpu = env.get("gpu")
    facts = [("model", f'{escape(m["variant"])} at {m["img_size"][0]}x{m["img_size"][1]}, {m.get("num_classes", 0):,} '
                       f'outputs; folder <code>{escape(m["folder"])}</code>'),
             ("weights", weights),
             ("data", f'{data["n_parity"]:,} inputs from <code>{escape(data["source"])}</code>'
                      + (f' ({escape(data["generated"])})' if data.get("generated") else "")
                      + (" (labelled)" if data.get("labelled") else "")),
             ("reference", escape(d["reference"])),
             ("CPU", f'{escape(env["cpu"])}, {env["cores"]} cores, {env["threads"]} threads; features '
                     f'{escape(", ".join(env.get("cpu_flags") or []) or "not read")}'),
             ("GPU", escape(gpu["name"]) if gpu else "none"),
             ("versions", escape(", ".join(f"{k} {v}" for k, v in env["versions"].items() if v))),
             ("command", f'<code>{escape(d.get("command") or "(not recorded)")}</code>'),
             ("made", f'{escape(d["created"])}, vitexport {escape(d["vitexport_version"])}, '
                      f'{d.get("wall_s", 0):.0f} s')]
    facts += [(f"{k} made with", f'<span class="mono">{escape(json.dumps(v, sort_keys=True))}</span>')
              for k, v in (d.get("options", {}).get("records") or {}).items()]
    arts = "".join(f'<tr><td><code>{escape(a["file"])}</code></td><td>{a["bytes"] / 1e6:,.1f} MB</td>'
                   f'<td class="mono">{escape(a.get("sha256") or "")}</td><td>{escape(a.get("status", "ok"))}'
                   f'{"" if a.get("status", "ok") == "ok" else ": " + escape(a.get("reason", ""))}</td></tr>'
                   for a in d["artifacts"])
    return ('<table class="facts">' + "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in facts) + "</table>"
            + ("<h3>Files</h3><table class=\"facts\">" + arts + "</table>" if arts else ""))


def unavailable(d: dict) -> str:
    """The rows that could not run, as the terminal says them (a cause shared by several rows once), folded."""
    items = [f"<li>{escape(line)}</li>" for line in unavailable_lines(d)]
    count = sum(1 for r in d["results"] if not r.get("available") and not r.get("error"))
    return "" if not items else f"<details><summary>{count} rows unavailable on this machine</summary><ul>" \
        + "".join(items) + "</ul></details>"


def _img(pictures: dict, index, side: int = 96) -> str:
    """An input's thumbnail shown `side` pixels wide (a small input enlarged, its pixels kept square)."""
    pic = pictures.get(str(index))
    if pic is None:
        return f'<span class="muted">input {index}</span>'
    return (f'<img class="thumb" src="{pic["thumb"]}" alt="{escape(pic["file"])}" title="{escape(pic["file"])}" '
            f'style="width:{side}px">')


def _top(entries: list, reference_top1: int | None = None) -> str:
    """A top-3 as lines 'name 87.1%'; this row's first line marked when it is not the reference's top-1."""
    lines = []
    for i, (c, p, *name) in enumerate(entries):
        changed = i == 0 and reference_top1 is not None and c != reference_top1
        lines.append(f'<div class="{"changed" if changed else ""}">{escape(str(name[0] if name else c))} '
                     f'{p * 100:.1f}%</div>')
    return "".join(lines)


def examples_section(d: dict) -> str:
    """Per row with examples: its flipped images (classifier), changed neighbours (embedding) or worst maps."""
    pictures, out = d.get("pictures") or {}, []
    embedding = bool(d["data"].get("embeddings"))
    for r in d["results"]:
        ex = (r.get("examples") or [])[:SHOWN_IMAGES]
        if not r.get("available") or not ex:
            continue
        par = r.get("parity") or {}
        out.append(f'<section class="row-examples" data-row="{escape(r["name"])}">')
        if "maps" in ex[0] or par.get("dense"):
            heading = f"{escape(r['name'])}: its {len(ex)} worst images against the reference"
            cards = "".join(_dense_card(e, pictures) for e in ex)
            # a row within its bounds: its worst images folded away, there for a look
            out.append(f"<h3>{heading}</h3>{cards}" if par.get("status") != "pass" else
                       f"<details><summary>{heading} (within its bounds)</summary>{cards}</details>")
        elif embedding:
            if "reference_neighbour" not in ex[0]:
                out.pop()
                continue
            out.append(f"<h3>{escape(r['name'])}: images whose nearest neighbour changed "
                       f"(first {len(ex)})</h3><div class=\"cards\">")
            out += [f'<div class="card">{_img(pictures, e["index"])}<div class="top"><div><b>reference\'s neighbour'
                    f'</b>{_img(pictures, e["reference_neighbour"], side=72)}</div><div><b>this row\'s</b>'
                    f'{_img(pictures, e["output_neighbour"], side=72)}</div></div></div>' for e in ex]
            out.append("</div>")
        else:
            total = par.get("disagree")
            out.append(f"<h3>{escape(r['name'])}: top-1 differs from the reference on "
                       f"{'' if total is None else f'{total:,} images; '}the {len(ex)} worst</h3><div class=\"cards\">")
            out += [_flip_card(e, pictures) for e in ex]
            out.append("</div>")
        out.append("</section>")
    return "".join(out) or '<p class="none">No row differs from the reference on any image it was judged on.</p>'


def _flip_card(e: dict, pictures: dict) -> str:
    pic = pictures.get(str(e["index"]), {})
    label = ""
    if "label" in e:
        right = [("reference", e["reference"][0][0] == e["label"][0]), ("this row", e["output"][0][0] == e["label"][0])]
        label = (f'<div>label: {escape(str(e["label"][1]))}; '
                 + ", ".join(f'<span class="{"ok" if ok else "changed"}">{who} {"right" if ok else "wrong"}</span>'
                             for who, ok in right) + "</div>")
    return (f'<div class="card">{_img(pictures, e["index"])}<div class="file">{escape(pic.get("file", ""))}</div>'
            f'{label}<div class="top"><div><b>reference</b>{_top(e["reference"])}</div><div><b>this row</b>'
            f'{_top(e["output"], e["reference"][0][0])}</div></div></div>')


def _dense_card(e: dict, pictures: dict) -> str:
    shown = ", ".join(f"{k} {e[k]:.4f}" for k in ("absrel", "delta1", "pixel_agree", "mask_iou", "mask_iou_min",
                                                   "box_iou", "score_diff") if k in e)
    pic = pictures.get(str(e["index"]), {})
    maps = e.get("maps")
    figs = "" if not maps else "".join(
        f'<figure><img src="{maps[k]}" alt="{k}" style="max-width:128px"><figcaption>{cap}</figcaption></figure>'
        for k, cap in (("reference", "reference"), ("output", "this row"),
                       ("error", f'{escape(maps["error_what"])}, 0 to {maps["error_max"]:.4g}')))
    return (f'<div class="dense"><figure>{_img(pictures, e["index"], side=128)}<figcaption>'
            f'{escape(pic.get("file", ""))}<br>{escape(shown)}</figcaption></figure>{figs}</div>')


def served_section(d: dict) -> str:
    parts = [(r["name"], served_svg(r)) for r in d["results"] if r.get("available")]
    return "".join(f"<h3>{escape(name)}</h3>{svg}" for name, svg in parts if svg)


def render(d: dict) -> str:
    """The page of a bench report's dict (BenchReport.to_dict(), or a bench JSON file read back)."""
    m = d["model"]
    failures = [r["name"] for r in d["results"] if (r.get("parity") or {}).get("status") == "fail"]
    undecided = [r["name"] for r in d["results"] if (r.get("parity") or {}).get("status") == "inconclusive"]
    status = "FAIL" if failures or not d.get("passed", True) else "inconclusive" if undecided else "pass"
    summary = ("every row within its bounds" if status == "pass" else
               "; ".join(([f"missed: {', '.join(failures)}"] if failures else [])
                         + ([f"undecided: {', '.join(undecided)}"] if undecided else [])) or "a file failed")
    made_by = d.get("options", {}).get("made_by", "bench")
    title = f"vitexport {made_by}: {m['variant']} at {m['img_size'][0]}x{m['img_size'][1]}"
    served, fastest = served_section(d), fastest_line(d)
    timed = any(r.get("latency") for r in d["results"] if r.get("available"))
    return "".join([
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; "
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">",
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
        f'<h1>{escape(title)}</h1><p><span class="verdict {status}" id="verdict">{status}</span> {escape(summary)}; '
        f'{d["data"]["n_parity"]:,} inputs, reference {escape(d["reference"])}.</p>',
        *(['<p class="muted">Random weights: latency is real, accuracy is meaningless.</p>']
          if m.get("random_weights") else []),
        "<h2>Rows</h2><p class=\"muted\">Click a heading to sort. Parity is judged against the reference on every "
        "input, with 95% intervals; the bounds are in docs/PARITY.md.</p>",
        '<div class="scroll">' + rows_table(d) + "</div>",
        *([f'<p id="fastest">{escape(fastest)}.</p>'] if fastest else []), unavailable(d),
        *(["<h2>Accuracy against throughput</h2>", pareto_svg(d), "<h2>Latency per run</h2>", latency_svg(d)]
          if timed else ['<p class="none">Parity only: no row was timed (`quantize --html` judges the graph it '
                         'made; `bench --html` times the rows).</p>']),
        "<h2>Where the rows differ from the reference</h2>", examples_section(d),
        *(["<h2>Served models under load</h2>", served] if served else []),
        "<h2>The run</h2>", run_facts(d),
        f"<script>{SCRIPT}</script></body></html>\n"])
