"""Generate vitexport/resources/timm_archs.json: every architecture of timm's VisionTransformer family
(`vision_transformer.py` and `deit.py`) with its constructor arguments, and every pretrained tag with its input
size, preprocessing, class count and parameter count.

timm keeps the arguments in code (each registered function builds `model_args` and hands them to
`_create_vision_transformer`), not in the hub's config.json, so they are read here by calling each entrypoint with
the model class's constructor replaced by a recorder: nothing is built, nothing is downloaded. Callables (norm,
activation, MLP and block classes) become vitexport's names for them (`model/archs.py` reads those); anything
else is kept as written under `unsupported`, so vitexport can name it and refuse.

    python scripts/gen_timm_archs.py            # rewrite the table from the installed timm
    python scripts/gen_timm_archs.py --check    # exit 1 when the table differs from the installed timm

tests/test_archs.py holds the committed table against the installed timm the same way.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

TABLE = Path(__file__).resolve().parents[1] / "vitexport" / "resources" / "timm_archs.json"
MODULES = ("vision_transformer", "deit")


class _Recorded(Exception):
    def __init__(self, kwargs: dict) -> None:
        super().__init__()
        self.kwargs = kwargs


def _name(obj) -> str:
    """A callable's name: a class, a function, or a string timm resolves itself."""
    if isinstance(obj, str):
        return obj
    return getattr(obj, "__name__", repr(obj))


_ACTS = {"GELU": "gelu", "gelu": "gelu", "gelu_tanh": "gelu_tanh", "GELUTanh": "gelu_tanh",
         "quick_gelu": "quick_gelu", "QuickGELU": "quick_gelu", "SiLU": "silu", "silu": "silu", "swish": "silu"}
_NORMS = {"LayerNorm": "layernorm", "layernorm": "layernorm", "RmsNorm": "rmsnorm", "rmsnorm": "rmsnorm"}
_BLOCKS = {"Block": "block", "ResPostBlock": "res_post", "ParallelScalingBlock": "parallel_scaling",
           "DiffParallelScalingBlock": "diff_parallel_scaling", "ParallelThingsBlock": "parallel_things"}
_PLAIN = ("img_size", "patch_size", "in_chans", "num_classes", "global_pool", "embed_dim", "depth", "num_heads",
          "mlp_ratio", "qkv_bias", "qk_norm", "scale_attn_norm", "scale_mlp_norm", "proj_bias", "init_values",
          "class_token", "no_embed_class", "reg_tokens", "pre_norm", "final_norm", "fc_norm", "pool_include_prefix",
          "dynamic_img_size", "distilled")
_IGNORED = ("weight_init", "drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate", "attn_drop_rate",
            "drop_path_rate", "fix_init", "out_indices", "pretrained_cfg", "pretrained_cfg_overlay", "cache_dir",
            "feature_cfg", "pretrained_strict")  # training-only, or how timm loads weights


def _norm(obj) -> tuple[str, float | None] | None:
    """A norm layer -> (vitexport's name, eps or None for the class default)."""
    eps = None
    if isinstance(obj, functools.partial):
        eps = obj.keywords.get("eps")
        if set(obj.keywords) - {"eps"}:
            return None
        obj = obj.func
    name = _NORMS.get(_name(obj))
    return None if name is None else (name, eps)


def _mlp(obj) -> str | None:
    if isinstance(obj, functools.partial):
        if _name(obj.func) == "GluMlp" and set(obj.keywords) <= {"act_layer", "gate_last"}:
            return "glu" if obj.keywords.get("gate_last", True) else "swiglu_packed"
        return None
    return {"Mlp": "mlp", "SwiGLU": "swiglu", "GluMlp": "glu"}.get(_name(obj))


def normalise(kwargs: dict) -> dict:
    """timm's constructor arguments -> plain JSON in vitexport's vocabulary; what has no name goes to 'unsupported'."""
    out: dict = {}
    bad: dict = {}
    for k, v in kwargs.items():
        if k in _IGNORED:
            continue
        if k in _PLAIN:
            out[k] = list(v) if isinstance(v, tuple) else v
        elif k == "act_layer":
            (out.__setitem__(k, _ACTS[_name(v)]) if _name(v) in _ACTS else bad.__setitem__(k, _name(v)))
        elif k in ("norm_layer", "embed_norm_layer"):
            n = _norm(v)
            if n is None:
                bad[k] = repr(v)
            else:
                out[k] = n[0]
                if n[1] is not None:
                    out[k.replace("_layer", "_eps")] = n[1]
        elif k == "mlp_layer":
            (out.__setitem__(k, m) if (m := _mlp(v)) else bad.__setitem__(k, repr(v)))
        elif k == "block_fn":
            (out.__setitem__(k, _BLOCKS[_name(v)]) if _name(v) in _BLOCKS else bad.__setitem__(k, _name(v)))
        elif k == "attn_layer":
            name = _name(v)
            (out.__setitem__(k, {"": "attn", "attn": "attn", "Attention": "attn", "diff": "diff",
                                 "DiffAttention": "diff"}[name]) if name in ("", "attn", "Attention", "diff",
                                                                              "DiffAttention") else
             bad.__setitem__(k, name))
        else:
            bad[k] = v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
    if bad:
        out["unsupported"] = bad
    return out


def _record(tag: str) -> dict:
    """The keyword arguments timm hands VisionTransformer (or its distilled subclass, which passes them on) for
    `tag`, with `distilled` set for the subclass."""
    import timm
    from timm.models.vision_transformer import VisionTransformer as model_cls

    original = model_cls.__init__

    def recorder(self, *args, **kwargs):
        raise _Recorded(dict(kwargs, distilled=True) if type(self).__name__ == "VisionTransformerDistilled"
                        else kwargs)

    model_cls.__init__ = recorder
    try:
        timm.create_model(tag, pretrained=False)
    except _Recorded as r:
        return r.kwargs
    finally:
        model_cls.__init__ = original
    raise RuntimeError(f"{tag} built no VisionTransformer")


def _params(tag: str) -> int:
    import timm
    import torch

    with torch.device("meta"):
        m = timm.create_model(tag, pretrained=False)
    return sum(p.numel() for p in m.parameters())


def generate(params: bool = True) -> dict:
    """The table; params=False leaves out the parameter counts (they take a model build per tag)."""
    import timm
    from timm.data import resolve_data_config

    archs: dict = {}
    for module in MODULES:
        for arch in timm.list_models(module=module):
            # timm's registration order: the first tag is the default pretrained config (`timm.create_model(arch)`)
            order = {t: i for i, t in enumerate(timm.models._registry._model_with_tags.get(arch, []))}
            pcfg_names = sorted(timm.list_pretrained(f"{arch}.*"), key=lambda t: order.get(t, len(order)))
            entry = {"module": module, "args": normalise(_record(arch))}
            tags = {}
            for name in pcfg_names:
                cfg = timm.models.get_pretrained_cfg(name).to_dict()
                data = resolve_data_config({}, pretrained_cfg=cfg)
                tag_kwargs = normalise(_record(name))
                tags[name.partition(".")[2]] = {
                    "input_size": list(data["input_size"][1:]),
                    "interpolation": data["interpolation"],
                    "mean": [float(x) for x in data["mean"]],
                    "std": [float(x) for x in data["std"]],
                    "crop_pct": float(data["crop_pct"]),
                    "crop_mode": data.get("crop_mode", "center"),
                    "num_classes": tag_kwargs.get("num_classes", 1000),
                    "args": {k: v for k, v in tag_kwargs.items() if entry["args"].get(k) != v},
                }
                if params:
                    tags[name.partition(".")[2]]["params"] = _params(name)
            entry["tags"] = tags
            archs[arch] = entry
    return {"timm_version": timm.__version__, "architectures": dict(sorted(archs.items()))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed table instead of writing it")
    ap.add_argument("--out", type=Path, default=TABLE)
    a = ap.parse_args()
    table = generate()
    text = json.dumps(table, indent=1, sort_keys=False) + "\n"
    if a.check:
        same = a.out.is_file() and json.loads(a.out.read_text()) == json.loads(text)
        print("the table matches the installed timm" if same else f"{a.out} differs from timm {table['timm_version']}")
        return 0 if same else 1
    tmp = a.out.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(a.out)
    n_tags = sum(len(e["tags"]) for e in table["architectures"].values())
    print(f"{a.out}: {len(table['architectures'])} architectures, {n_tags} pretrained tags "
          f"(timm {table['timm_version']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
