"""Every pretrained tag of timm's VisionTransformer family through vitexport's export, against timm's own model.

For each tag: timm builds the model (random weights, moved off their init so every tensor matters; its own width,
heads, options and input size; depth cut to 2 blocks, full depth for the smallest architecture of each family),
and its repository is laid out in a private Hugging Face cache as timm's are (`config.json` from timm's own
`save_config_for_hf`, `model.safetensors`). vitexport then exports it by name (`-m ARCH.TAG`, offline) with its
own check, and ONNX Runtime's output on the written file is compared with timm's on the same images: a tag passes
when max abs <= 1e-5 x max(1, |timm output|). Anything vitexport refuses is listed with its sentence.

    python scripts/timm_coverage.py                    # writes docs/MODELS.md
    python scripts/timm_coverage.py --only 'deit3_*'    # a subset, printed, no doc written
    python scripts/timm_coverage.py --only 'samvit_*' --merge   # a subset run again, its rows replaced in the doc

Run with `/usr/bin/time -v` for the peak RSS the doc records (it records the process's own too).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "MODELS.md"
TOLERANCE = 1e-5  # x max(1, |timm output|)
FAMILIES = [  # (pattern on ARCH.TAG, family), first match wins
    (r"^deit3_", "DeiT3"), (r"^deit_.*distilled", "DeiT (distilled)"), (r"^deit_", "DeiT"),
    (r"dinov2", "DINOv2"), (r"siglip", "SigLIP / SigLIP2"), (r"_pe_|\.fb$", "Perception Encoder"),
    (r"clip|\.openai|\.laion|\.metaclip|\.dfn|\.datacomp", "CLIP / OpenCLIP"), (r"\.mae$", "MAE"),
    (r"radio", "RADIO"), (r"intern", "InternViT"), (r"aimv2", "AIMv2"),
    (r"\.sbb|reg\d_gap|_gap_|betwixt|mediumd|little|so150m|wee|pwee", "timm sbb / gap / registers"),
    (r"\.dino$|\.dino_", "DINO"), (r"\.sam", "SAM-pretrained"), (r"\.augreg|\.orig_in21k|\.in21k", "AugReg / original"),
    (r"", "other ViTs"),
]
MODULE_GROUPS = [("vision_transformer.py, deit.py", ("vision_transformer", "deit")),
                 ("eva.py, beit.py, naflexvit.py", ("eva", "beit", "naflexvit")),
                 ("vision_transformer_sam.py", ("vision_transformer_sam",))]
# eva.py, beit.py and naflexvit.py: (pattern on ARCH.TAG, family) by timm's module, first match wins
MODULE_FAMILIES = {
    "eva": [(r"dinov3", "DINOv3"), (r"sapiens2", "Sapiens2"), (r"lingbot", "LingBot-Vision"),
            (r"_pe_", "Perception Encoder"), (r"rope_reg\d", "timm sbb RoPE ViTs"), (r"_rope_", "RoPE ViTs (naver)"),
            (r"^eva02_", "EVA02"), (r"^eva_", "EVA"), (r"", "other eva.py models")],
    "beit": [(r"", "BEiT / BEiT v2")],
    "naflexvit": [(r"siglip", "NaFlexViT: SigLIP2"), (r"radio", "NaFlexViT: C-RADIO"), (r"", "NaFlexViT")],
    "vision_transformer_sam": [(r"", "Segment Anything (image encoder)")],
}


def family(tag: str) -> str:
    from vitexport.model.archs import resolve

    table = MODULE_FAMILIES.get(resolve(tag)[0].module, FAMILIES)
    return next(f for pat, f in table if re.search(pat, tag))


def perturb(model, seed: int = 0, scale: float = 0.02):
    """Every tensor moved off its init (norm weights of one, zero biases, LayerScale 1e-5 all matter then)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


def lay_out_repo(cache: Path, tag: str, model, shard_bytes: int | None = None) -> Path:
    """timm/<tag> in huggingface_hub's cache layout, written by timm's own hub helpers (shard_bytes: the weights in
    shards of at most that size with their index, as huggingface_hub saves large models); the snapshot folder."""
    from safetensors.torch import save_file
    from timm.models._hub import save_config_for_hf

    repo = f"timm/{tag}"
    commit = hashlib.sha1(repo.encode()).hexdigest()
    root = cache / f"models--{repo.replace('/', '--')}"
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    save_config_for_hf(model, str(snap / "config.json"))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if shard_bytes is None:
        save_file(state, str(snap / "model.safetensors"))
    else:
        from huggingface_hub import save_torch_state_dict

        save_torch_state_dict(state, str(snap), max_shard_size=shard_bytes)
    return snap


def run_tag(tag: str, depth: int | None, work: Path) -> dict:
    import numpy as np
    import onnxruntime as ort
    import timm
    import torch

    from vitexport.errors import VitexportError
    from vitexport.exporter.run import run_export
    from vitexport.model.archs import resolve
    from vitexport.model.spec import ExportOptions, user_spec

    t0 = time.time()
    cache = work / "hf-cache"
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir()
    torch.manual_seed(0)
    kw = {} if depth is None else {"depth": depth}
    kv = resolve(tag)[0].args.get("num_kv_heads")
    if depth is not None and isinstance(kv, list):  # one entry per block: the first and the middle one's
        kw["num_kv_heads"] = tuple(kv[i * len(kv) // depth] for i in range(depth))
    if depth is not None and resolve(tag)[0].module == "vision_transformer_sam":
        kw["global_attn_indexes"] = (depth - 1,)  # cut, SAM keeps a global block after a windowed one
    model = perturb(timm.create_model(tag, pretrained=False, **kw))
    lay_out_repo(cache, tag, model)
    h, w = model.pretrained_cfg["input_size"][1:]
    x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(1))
    sam = resolve(tag)[0].module == "vision_transformer_sam"
    with torch.no_grad():  # SAM's export writes the image embedding (forward_features), not timm's pooled head
        want = (model.forward_features(x) if sam else model(x)).numpy()
    result = {"tag": tag, "family": family(tag), "module": resolve(tag)[0].module, "depth": len(model.blocks),
              "input": [h, w],
              "params": sum(p.numel() for p in model.parameters())}
    del model
    out = work / "export"
    shutil.rmtree(out, ignore_errors=True)
    try:
        spec = user_spec(model=tag)
        res = run_export(spec, output=out, opts=ExportOptions(check_batches=(2,)))
        sess = ort.InferenceSession(str(res.onnx_path), providers=["CPUExecutionProvider"])
        got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
        scale = max(1.0, float(np.abs(want).max()))
        err = float(np.abs(got - want).max()) if got.shape == want.shape else float("inf")
        result.update(status="ok" if err <= TOLERANCE * scale else "mismatch", max_abs=err, scale=scale)
    except VitexportError as e:
        result.update(status="refused", why=str(e))
    except Exception as e:  # noqa: BLE001 - a bug: recorded, the run goes on
        result.update(status="error", why=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
    shutil.rmtree(out, ignore_errors=True)
    result["seconds"] = round(time.time() - t0, 1)
    return result


def full_depth_tags(tags: list[str]) -> set[str]:
    """The tag of the smallest architecture (by parameters) of each family: run at full depth."""
    from vitexport.model.archs import resolve

    best: dict[str, tuple[int, str]] = {}
    for t in tags:
        params = resolve(t)[1].params or 0
        f = family(t)
        if f not in best or params < best[f][0]:
            best[f] = (params, t)
    return {t for _, t in best.values()}


def write_doc(results: list[dict], wall: float, rss_mb: float, timm_version: str, note: str = "",
              cpu: str | None = None, kept_lines: dict[str, str] | None = None) -> None:
    """kept_lines: the family table's lines to keep as they are (--merge: the families it did not run again, whose
    worst figure the every-tag table holds to two digits only)."""
    import onnxruntime
    import torch

    ok = [r for r in results if r["status"] == "ok"]
    by_family: dict[str, list[dict]] = {}
    for r in results:
        by_family.setdefault(r["family"], []).append(r)
    lines = [
        "# Models: timm's vision transformers, tag by tag",
        "",
        "Made by `scripts/timm_coverage.py` (do not edit by hand). Every pretrained tag of timm's "
        "`vision_transformer.py`, `deit.py`, `eva.py`, `beit.py`, `naflexvit.py` and `vision_transformer_sam.py` was "
        "built by timm with random "
        "weights (moved off their init), laid out as timm's hub repositories are, exported by vitexport **by name** "
        "(`-m ARCH.TAG`, offline) with its own ONNX Runtime check, and the written ONNX file was run by ONNX Runtime "
        "(CPU) against timm's PyTorch output on the same two random images (for SAM, timm's `forward_features`: the "
        "image embedding its export writes). A tag passes when max abs <= "
        f"{TOLERANCE:g} x max(1, |timm output|).",
        "",
        "Depth is cut to 2 blocks (every option is per block; SAM's second block is a global one, the first windowed), "
        "except for the smallest architecture of each family, which runs at full depth (marked *full*). Width, heads, "
        "options and input size are the tag's own.",
        "",
        f"**{len(ok)} of {len(results)} tags pass ({100 * len(ok) / max(1, len(results)):.1f} %).** "
        f"timm {timm_version}, torch {torch.__version__}, onnxruntime {onnxruntime.__version__}; "
        f"wall time {wall / 60:.1f} min, peak RSS {rss_mb:,.0f} MB (this process and its children), "
        f"on {cpu or _cpu()}.{note}",
        "",
        "| timm modules | tags | pass | share |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, modules in MODULE_GROUPS:
        rs = [r for r in results if r.get("module") in modules]
        passed = sum(r["status"] == "ok" for r in rs)
        lines.append(f"| {label} | {len(rs)} | {passed} | {100 * passed / max(1, len(rs)):.1f} % |")
    lines += [
        "",
        "| family | tags | pass | worst max abs / max(1, \\|out\\|) | full-depth tag | s (full depth) |",
        "| --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for f, rs in sorted(by_family.items()):
        passed = [r for r in rs if r["status"] == "ok"]
        worst = max((r["max_abs"] / r["scale"] for r in passed), default=float("nan"))
        full = next((r for r in rs if r.get("full")), None)
        desc = f"{full['tag']} (depth {full['depth']})" if full else "-"
        if f in (kept_lines or {}):
            lines.append((kept_lines or {})[f])
            continue
        lines.append(f"| {f} | {len(rs)} | {len(passed)} | {worst:.2e} | {desc} | "
                     f"{full['seconds'] if full else '-'} |")
    bad = [r for r in results if r["status"] != "ok"]
    lines += ["", "## Tags that do not pass", ""]
    lines += [f"- `{r['tag']}`: {r['status']}: {_detail(r)}" for r in bad] or ["None."]
    lines += ["", "## Every tag", "", "| tag | depth | input | params (as run) | max abs / max(1, \\|out\\|) | s |",
              "| --- | ---: | --- | ---: | ---: | ---: |"]
    for r in sorted(results, key=lambda r: r["tag"]):
        err = f"{r['max_abs'] / r['scale']:.1e}" if "max_abs" in r else r["status"]
        lines.append(f"| {r['tag']} | {r['depth']}{' (full)' if r.get('full') else ''} | "
                     f"{r['input'][0]}x{r['input'][1]} | {r['params'] / 1e6:.1f}M | {err} | {r['seconds']} |")
    DOC.write_text("\n".join(lines) + "\n")


def doc_results() -> tuple[list[dict], float, float, str, dict[str, str]]:
    """The results the doc records (its every-tag table and the statuses of the tags that did not pass), with its
    wall time (s), peak RSS (MB), CPU and family table lines: what --merge keeps of the rows it does not run again."""
    text = DOC.read_text()
    head = re.search(r"wall time ([\d.]+) min, peak RSS ([\d,]+) MB \(this process and its children\), on ([^.]+)\.",
                     text)
    families = {line.split("|")[1].strip(): line for line in text.split("| family |", 1)[1].split("\n\n")[0]
                .splitlines()[2:]}
    failed = dict(re.findall(r"^- `([^`]+)`: (\w+):", text, flags=re.M))
    from vitexport.model.archs import resolve

    rows = []
    for line in text.split("## Every tag", 1)[1].splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != 6 or not re.match(r"\d", cells[1]):
            continue
        tag, depth, size, params, err, sec = cells
        r = {"tag": tag, "family": family(tag), "module": resolve(tag)[0].module, "depth": int(depth.split()[0]),
             "full": "(full)" in depth, "input": [int(v) for v in size.split("x")],
             "params": float(params.rstrip("M")) * 1e6, "seconds": float(sec), "status": failed.get(tag, "ok")}
        if re.match(r"[\d.]+e", err):
            r.update(max_abs=float(err), scale=1.0)
        rows.append(r)
    return rows, float(head.group(1)) * 60, float(head.group(2).replace(",", "")), head.group(3), families


def _detail(r: dict) -> str:
    if "max_abs" in r:
        return f"max abs {r['max_abs']:.3g} against max(1, |out|) = {r['scale']:.3g}"
    return r.get("why", "")


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{os.cpu_count()} cores"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="a shell pattern of ARCH.TAG names: run those only, print, write no doc")
    ap.add_argument("--module", action="append", help="timm modules to run (eva, beit, ...): those only, print, "
                                                       "write no doc")
    ap.add_argument("--merge", action="store_true", help="with --only/--module: the doc written again with those "
                                                         "tags' rows replaced by this run's, the others kept")
    ap.add_argument("--json", type=Path, help="also write every result as JSON")
    a = ap.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    import timm

    from vitexport.model.archs import known_tags

    tags = known_tags()
    full = full_depth_tags(tags)
    if a.only:
        tags = [t for t in tags if fnmatch.fnmatchcase(t, a.only)]
    if a.module:
        from vitexport.model.archs import resolve

        tags = [t for t in tags if resolve(t)[0].module in a.module]
    t0 = time.time()
    results = []
    with tempfile.TemporaryDirectory(prefix="timm-coverage-") as tmp:
        os.environ["HF_HUB_CACHE"] = str(Path(tmp) / "hf-cache")
        for i, tag in enumerate(tags, 1):
            r = run_tag(tag, None if tag in full else 2, Path(tmp))
            r["full"] = tag in full
            results.append(r)
            detail = f"{r['max_abs'] / r['scale']:.1e}" if "max_abs" in r else r.get("why", "")
            print(f"[{i}/{len(tags)}] {tag}: {r['status']} {detail} ({r['seconds']} s)", flush=True)
    wall = time.time() - t0
    rss = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
              resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    ok = sum(r["status"] == "ok" for r in results)
    print(f"{ok}/{len(results)} pass; {wall / 60:.1f} min; peak RSS {rss / 1024:,.0f} MB")
    if not a.only and not a.module:
        write_doc(results, wall, rss / 1024, timm.__version__)
        print(f"wrote {DOC}")
    elif a.merge:
        kept, doc_wall, doc_rss, cpu, lines = doc_results()
        ran = {r["tag"] for r in results}
        lines = {f: line for f, line in lines.items() if f not in {r["family"] for r in results}}
        note = (f" The {len(ran)} tags matching `{a.only or ' '.join(a.module)}` were run again on "
                f"{time.strftime('%Y-%m-%d')} with `--merge` ({wall / 60:.1f} min, peak RSS {rss / 1024:,.0f} MB, on "
                f"{_cpu()}).")
        write_doc([r for r in kept if r["tag"] not in ran] + results, doc_wall, doc_rss, timm.__version__, note, cpu,
                  lines)
        print(f"merged into {DOC}")
    return 0 if ok == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
