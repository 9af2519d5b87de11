"""Checks before work: will a run fit in memory, and does what was asked for exist (opset, op types)?

A run that cannot fit is refused in one sentence with the numbers, in well under a second, instead of running the
machine out of memory minutes later. The estimate is a plain function of the ViT's shape (no torch):

    weights      = parameters x 4 bytes, held WEIGHT_COPIES times (PyTorch, the ONNX graph, ONNX Runtime's session)
    activations  = per image: the input, the residual stream, Q/K/V, the attention matrices (heads x N x N, before
                   and after the softmax) and the MLP's hidden layer, x 4 bytes
    needed       = weights + batch x activations        (N: tokens = patches + class token)
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Mapping

from .errors import VitexportError
from .progress import QUIET, Log

WEIGHT_COPIES = 4
EXPORT_WEIGHT_COPIES = 3  # an export's check: PyTorch's, ONNX Runtime's (no prepacked copies), the exporter's
FLOAT = 4  # bytes


def mem_available() -> int | None:
    """Bytes of memory available to a new process (Linux: MemAvailable in /proc/meminfo); None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def _pair(v: Any) -> tuple[int, int]:
    return (int(v[0]), int(v[1])) if isinstance(v, (list, tuple)) else (int(v), int(v))


def vit_memory(config: Mapping[str, Any]) -> tuple[int, int, int]:
    """(weight bytes, activation bytes per image, tokens) of a ViT of this shape (model.ViTConfig fields)."""
    (h, w), (ph, pw) = _pair(config["img_size"]), _pair(config["patch_size"])
    d, depth, heads = int(config["embed_dim"]), int(config["depth"]), int(config["num_heads"])
    hidden, chans = int(d * float(config.get("mlp_ratio", 4.0))), int(config.get("in_chans", 3))
    classes = int(config.get("num_classes", 0) or 0)
    prefix = int(config.get("class_token", True)) + int(config.get("distilled", False)) + int(config.get("reg_tokens", 0))
    n = (h // ph) * (w // pw) + prefix
    per_block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * hidden + hidden) + (hidden * d + d)
    params = chans * ph * pw * d + d + n * d + d + depth * per_block + 2 * d + d * classes + classes
    # (heads, n, n) score tensors alive at once in a runtime's unfused attention: the product and its softmax, and
    # with SAM's decomposed relative position two broadcast bias sums beside them (ONNX Runtime, measured: ViT-B at
    # 1024, batch 3, 9.5 GB of activations = 4 x 2.4 GB)
    scores = 4 if config.get("rel_pos_bias") == "decomposed" else 2
    acts = chans * h * w + 2 * n * d + 6 * n * d + scores * heads * n * n + 2 * n * d + 2 * n * hidden
    return params * FLOAT, acts * FLOAT, n


def spec_config(spec) -> dict[str, Any]:
    """The shape a ModelSpec asks for, from the architecture table alone (no weights, no torch)."""
    return spec.config().to_dict()


def require_memory(config: Mapping[str, Any], batch: int, what: str, name: str, fix: str,
                   available: int | None = None, copies: int = WEIGHT_COPIES) -> None:
    """Refuse, in one sentence with the numbers, a run of `batch` images that cannot fit in available memory.

    what: the option that decides it ('--batch 100000'); name: the model ('vit_base_patch16_224 at 224x224');
    fix: what to change ('use a smaller --img-size'); copies: of the weights held at the peak.
    """
    available = mem_available() if available is None else available
    if available is None:
        return
    weights, per_image, tokens = vit_memory(config)
    needed = copies * weights + batch * per_image
    if needed <= available:
        return
    raise VitexportError(f"{what} needs about {human(needed)} of memory for {name} ({tokens:,} tokens, "
                         f"{human(per_image)} of activations per image at batch {batch}, {human(weights)} of "
                         f"weights), but {human(available)} is available; {fix}.")


def max_batch(config: Mapping[str, Any], available: int | None = None) -> int | None:
    """The largest batch that fits (None where memory is unknown)."""
    available = mem_available() if available is None else available
    if available is None:
        return None
    weights, per_image, _ = vit_memory(config)
    return max(0, (available - WEIGHT_COPIES * weights) // per_image)


def check_export(spec, batches: tuple[int, ...], log: Log = QUIET) -> None:
    """An export traces at batch 2 and checks at `batches`: refuse an --img-size or --check-batch that cannot fit."""
    config = spec_config(spec)
    if spec.dynamic_img_size:  # checked at the largest size of its range
        from .model.spec import default_range

        rng = spec.img_size_range or default_range(_pair(config["img_size"]), _pair(config["patch_size"]))
        config["img_size"] = rng[1]
        h, w = rng[1]
        what = f"--img-size-range up to {h}x{w}"
    else:
        h, w = _pair(config["img_size"])
        what = f"--img-size {h}x{w}" if spec.img_size else f"Exporting {spec.variant}"
    # at the check's peak: the weights in PyTorch and in ONNX Runtime's lean session, and what the exporter held
    # (measured: SAM ViT-B at 1024 11.9 GB, estimated 11.6; ViT-H 21.1 GB, estimated 21.6)
    require_memory(config, max(2, *batches), what, f"{spec.variant} at {h}x{w}",
                   "use a smaller --img-size" if spec.img_size else "free some memory", copies=EXPORT_WEIGHT_COPIES)


def check_batches(config: Mapping[str, Any], batches: tuple[int, ...], name: str) -> None:
    """Refuse bench batch sizes that cannot fit, saying which batch would."""
    top = max(batches)
    fits = max_batch(config)
    fix = f"use --batch {fits} or less" if fits else "free some memory"
    require_memory(config, top, f"--batch {top}", name, fix)


def check_opset(opset: int) -> None:
    """An opset the installed onnx knows (torch's exporter converts to it with onnx's version converter)."""
    import onnx

    from .model.spec import DEFAULT_OPSET

    top = onnx.defs.onnx_opset_version()
    if opset > top:
        raise VitexportError(f"--opset {opset} is newer than onnx {onnx.__version__} knows (opset {top} at most); "
                             f"use --opset {DEFAULT_OPSET} (the default) or another between 17 and {top}.")


def check_op_types(ops: tuple[str, ...], graph: Path, option: str = "--keep-fp32", log: Log = QUIET) -> None:
    """Op types a user named must be ONNX operators; one the graph does not use is warned about (it does nothing)."""
    import onnx

    known = {s.name for s in onnx.defs.get_all_schemas()}
    present = {n.op_type for n in onnx.load(str(graph), load_external_data=False).graph.node}
    for op in ops:
        if op not in known:
            close = difflib.get_close_matches(op, sorted(present | known), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise VitexportError(f"{option} {op}: no ONNX operator has that type{hint}; this graph uses "
                                 f"{', '.join(sorted(present))}.")
        if op not in present:
            log.warn(f"{option} {op}: the graph has no {op} node, so it changes nothing.")


def check_bench(target, spec, batches: tuple[int, ...] | None) -> None:
    """`bench --batch N`: refused before any work when N cannot fit (the model's shape from its manifest)."""
    from .artifacts.folder import ModelFolder

    if not batches:
        return
    if target is not None:
        folder = ModelFolder.containing(target)
        if not folder.has_manifest():
            return  # opening the folder says what is wrong with it
        manifest = folder.read_manifest()
        config, name = manifest.config, f"{manifest.variant} at {manifest.img_size[0]}x{manifest.img_size[1]}"
    else:
        folder = spec.default_folder()
        config = folder.read_manifest().config if folder.has_manifest() else spec_config(spec)
        h, w = _pair(config["img_size"])
        name = f"{spec.variant} at {h}x{w}"
    check_batches(config, tuple(batches), name)
