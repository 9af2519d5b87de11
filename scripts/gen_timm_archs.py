"""Generate vitexport/resources/timm_archs.json: every architecture of timm's vision transformer modules
(`vision_transformer.py`, `deit.py`, `eva.py`, `beit.py`, `naflexvit.py`, `vision_transformer_sam.py`) with its constructor arguments in
ViTConfig's vocabulary, and every pretrained tag with its input size, preprocessing, class count and parameter
count.

timm keeps the arguments in code (each registered function builds `model_args` and hands them to the module's
model class), not in the hub's config.json, so they are read here by calling each entrypoint with the model class's
constructor replaced by a recorder: nothing is built, nothing is downloaded. Callables (norm, activation, MLP and
block classes) become their names, and `vitexport.model.readers.timm_args` translates each module's arguments (the same
rules read a hub repository's model_args); anything it cannot is kept under `unsupported`, so vitexport can name
it and refuse.

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

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from vitexport.model.readers.timm_args import MODULES, translate  # noqa: E402

TABLE = ROOT / "vitexport" / "resources" / "timm_archs.json"


class _Recorded(Exception):
    def __init__(self, kwargs: dict) -> None:
        super().__init__()
        self.kwargs = kwargs


def _plain(obj):
    """A recorded argument as plain data: a part (class, function) by its name, a functools.partial as
    {"partial": NAME, **keywords}, a tuple as a list; numbers, strings and None as they are."""
    if isinstance(obj, functools.partial):
        return {"partial": _plain(obj.func), **{k: _plain(v) for k, v in obj.keywords.items()}}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (bool, int, float, str)) or obj is None:
        return obj
    return getattr(obj, "__name__", repr(obj))


def _model_classes() -> dict:
    """timm's module name -> the model class its registered functions build."""
    from timm.models import beit, eva, naflexvit, vision_transformer_sam
    from timm.models.vision_transformer import VisionTransformer

    return {"vision_transformer": VisionTransformer, "deit": VisionTransformer, "eva": eva.Eva,
            "beit": beit.Beit, "naflexvit": naflexvit.NaFlexVit,
            "vision_transformer_sam": vision_transformer_sam.VisionTransformerSAM}


def _record(tag: str, module: str) -> dict:
    """The keyword arguments timm hands the module's model class for `tag`, as plain data (`distilled` set for
    DeiT's distilled subclass; NaFlexVit's configuration dataclass spread into its fields, keywords overlaid)."""
    import dataclasses

    import timm

    model_cls = _model_classes()[module]
    original = model_cls.__init__

    def recorder(self, *args, **kwargs):
        if dataclasses.is_dataclass(kwargs.get("cfg")):  # NaFlexVit(cfg=NaFlexVitCfg(...), **overlay)
            cfg = kwargs.pop("cfg")
            kwargs = {**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}, **kwargs}
        if type(self).__name__ == "VisionTransformerDistilled":
            kwargs = dict(kwargs, distilled=True)
        raise _Recorded(kwargs)

    model_cls.__init__ = recorder
    try:
        timm.create_model(tag, pretrained=False)
    except _Recorded as r:
        return {k: _plain(v) for k, v in r.kwargs.items()}
    finally:
        model_cls.__init__ = original
    raise RuntimeError(f"{tag} built no {model_cls.__name__}")


def normalise(kwargs: dict, module: str = "vision_transformer") -> dict:
    """timm's recorded arguments -> ViTConfig fields (vitexport.model.readers.timm_args; 'unsupported': the rest)."""
    return translate(module, {k: _plain(v) for k, v in kwargs.items()})


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
            entry = {"module": module, "args": normalise(_record(arch, module), module)}
            tags = {}
            for name in pcfg_names:
                cfg = timm.models.get_pretrained_cfg(name).to_dict()
                data = resolve_data_config({}, pretrained_cfg=cfg)
                tag_kwargs = normalise(_record(name, module), module)
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
            if "img_size" not in entry["args"] and tags:
                # NaFlexViT takes any size: its architecture's size is its default tag's
                entry["args"]["img_size"] = next(iter(tags.values()))["input_size"]
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
