"""A model a user holds in memory (a timm model, a transformers vision model) as a checkpoint vitexport reads.

`vitexport.export(obj)` writes the object's weights and what it is (timm's `pretrained_cfg` architecture with the
object's own head, size and pooling; a transformers `config`) into a checkpoint folder, exports that folder like any
other checkpoint, and checks the export against the object's own forward pass. Neither timm nor transformers is
imported: an object is recognised by what it carries.

The checkpoint lives in the model folder (`source/<digest>/`), so every later step (the bench's PyTorch reference,
predict, triton) rebuilds the same model from it; its name is its contents' digest, so an export refused for
holding another model never touches the weights that model was made from.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import VitexportError

if TYPE_CHECKING:
    import numpy as np
    import torch

SOURCE_DIR = "source"  # in a model folder: the checkpoints written from model objects
PREPROCESS_KEYS = ("mean", "std", "crop_pct", "interpolation", "crop_mode")
# the exported outputs an object's own forward gives as vitexport computes them (model.outputs): a transformers
# tower's last_hidden_state is not always after the final norm (CLIP's is before it), so its tokens are not judged
OBJECT_OUTPUTS = {"timm": ("logits", "pooled", "tokens"), "transformers": ("logits", "pooled", "pred_boxes")}


@dataclass
class HeldModel:
    """What an object is, as far as vitexport needs to know before writing it out."""

    kind: str  # 'timm' | 'transformers'
    name: str  # timm's architecture, or the transformers config's model_type
    module: Any  # the object itself (a torch.nn.Module)
    img_size: tuple[int, int] | None  # the size it takes (timm: its patch embedding's); None: its config's


def _type_name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def describe_object(obj: Any) -> HeldModel:
    """A timm model (a `pretrained_cfg` naming its architecture) or a transformers model (a `config` with a
    `model_type` and `save_pretrained`); anything else is one sentence naming what it is."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        raise VitexportError("Exporting a model object needs torch.") from None
    if not isinstance(obj, torch.nn.Module):
        raise VitexportError(f"export() takes a model name, a folder or file, an hf-hub: reference, or a timm or "
                             f"transformers model object; got a {_type_name(obj)} object.")
    pcfg = getattr(obj, "pretrained_cfg", None)
    if isinstance(pcfg, dict) and pcfg.get("architecture"):
        size = getattr(getattr(obj, "patch_embed", None), "img_size", None)
        if size is None and isinstance(pcfg.get("input_size"), (list, tuple)):
            size = pcfg["input_size"][-2:]
        hw = None if size is None else (int(size[0]), int(size[1]))
        return HeldModel("timm", str(pcfg["architecture"]), obj, hw)
    config = getattr(obj, "config", None)
    if config is not None and getattr(config, "model_type", None) and hasattr(obj, "save_pretrained"):
        return HeldModel("transformers", str(config.model_type), obj, None)
    raise VitexportError(f"{_type_name(obj)} is neither a timm model (no pretrained_cfg naming its architecture) "
                         f"nor a transformers model (no config with a model_type); save its weights in a layout "
                         f"vitexport reads and export that file or folder.")


def cpu_copy(held: HeldModel) -> "torch.nn.Module":
    """The object in FP32 on the CPU, in eval mode; the user's object is left as it was."""
    import torch

    module = held.module
    params = list(module.parameters())
    if params and all(p.device.type == "cpu" and p.dtype == torch.float32 for p in params) and not module.training:
        return module
    return copy.deepcopy(module).to(device="cpu", dtype=torch.float32).eval()


def _timm_config(held: HeldModel, module: "torch.nn.Module") -> dict[str, Any]:
    """config.json as timm's hub helper writes it, with the object's own head, size, pooling, depth and width
    (what a fine-tune or a `create_model` keyword changes; anything else is the architecture's, and a difference
    shows as weights that do not fit or as the check against the object's forward)."""
    import torch

    pcfg = dict(module.pretrained_cfg)  # type: ignore[arg-type]
    pre = {k: pcfg[k] for k in PREPROCESS_KEYS if pcfg.get(k) is not None}
    args: dict[str, Any] = {}
    if held.img_size is not None:
        pre["input_size"] = [3, *held.img_size]
        args["img_size"] = list(held.img_size)
    blocks = getattr(module, "blocks", None)
    if isinstance(blocks, torch.nn.Sequential | torch.nn.ModuleList) and len(blocks):  # a depth or width of its own
        args["depth"] = len(blocks)
        heads = getattr(getattr(blocks[0], "attn", None), "num_heads", None)
        if isinstance(heads, int):
            args["num_heads"] = heads
    if isinstance(getattr(module, "embed_dim", None), int):
        args["embed_dim"] = module.embed_dim
    pool = getattr(module, "global_pool", None)
    if isinstance(pool, str):
        args["global_pool"] = pool
    num_classes = getattr(module, "num_classes", None)
    cfg: dict[str, Any] = {"architecture": held.name, "pretrained_cfg": pre, "model_args": args}
    if isinstance(num_classes, int):
        cfg["num_classes"] = num_classes
    return cfg


def write_checkpoint(held: HeldModel, module: "torch.nn.Module", folder: Path) -> Path:
    """The object as a checkpoint folder under `folder`/source/<digest of its files>/ (config.json and the weights
    in safetensors): `module` is its CPU FP32 copy (cpu_copy); an identical one already there is reused."""
    from safetensors.torch import save_file

    root = folder / SOURCE_DIR
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".writing-", dir=root))
    try:
        if held.kind == "timm":
            state = {k: v.detach().contiguous() for k, v in module.state_dict().items()}
            save_file(state, str(staging / "model.safetensors"))
            (staging / "config.json").write_text(json.dumps(_timm_config(held, module), indent=2))
        else:
            with contextlib.redirect_stderr(io.StringIO()):  # its progress bar: the API is silent unless asked
                module.save_pretrained(str(staging), safe_serialization=True)  # type: ignore[operator]
        digest = hashlib.sha256()
        for f in sorted(staging.iterdir()):
            digest.update(f.name.encode() + b"\0" + f.read_bytes())
        final = root / digest.hexdigest()[:16]
        if final.is_dir():
            shutil.rmtree(staging)
        else:
            os.replace(staging, final)
        return final
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def prune_sources(folder: Path, keep: Path) -> None:
    """Remove the checkpoints written from objects other than `keep` (the one the folder's export now uses)."""
    root = folder / SOURCE_DIR
    for d in root.iterdir() if root.is_dir() else ():
        if d.is_dir() and d.resolve() != keep.resolve():
            shutil.rmtree(d, ignore_errors=True)


def drop_source(path: Path) -> None:
    """Remove a checkpoint written for an export that did not happen, and the source folder if it is then empty."""
    shutil.rmtree(path, ignore_errors=True)
    try:
        path.parent.rmdir()
    except OSError:
        pass  # other checkpoints are there


def object_output(held: HeldModel, module: "torch.nn.Module", x: "torch.Tensor", output: str) -> "np.ndarray":
    """What the object itself gives for `x` as the export's `output` (OBJECT_OUTPUTS): timm's forward /
    forward_head(pre_logits=True) / forward_features; transformers' logits, or image_embeds (a projection's) else
    pooler_output."""
    import torch

    with torch.no_grad():
        if held.kind == "timm":
            if output == "logits":
                y = module(x)
            elif output == "pooled":
                y = module.forward_head(module.forward_features(x), pre_logits=True)  # type: ignore[operator]
            elif output == "tokens":
                y = module.forward_features(x)  # type: ignore[operator]
            else:
                raise VitexportError(f"the {output!r} output is not one a timm model's forward gives")
        else:
            out = module(pixel_values=x)
            fields = {"logits": ("logits",), "pooled": ("image_embeds", "pooler_output"),
                      "pred_boxes": ("pred_boxes",)}.get(output, ())
            y = next((getattr(out, f) for f in fields if getattr(out, f, None) is not None), None)
            if y is None:
                raise VitexportError(f"the {output!r} output is not one {type(module).__name__}'s forward gives")
    return y.float().numpy()
