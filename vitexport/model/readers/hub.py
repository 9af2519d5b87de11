"""Checkpoints by name from the Hugging Face hub: `-c hf-hub:ORG/NAME[@REVISION]` and timm's tagged names for `-m`.

Files come through huggingface_hub's own cache (`hf_hub_download`), so a repository fetched once is shared with
timm and transformers and works offline (`HF_HUB_OFFLINE=1`). The repository's `config.json` says what the model
is; `describe` turns it into the facts a ModelSpec needs:

- timm repositories (`model.safetensors` + `config.json` with `architecture`, `num_classes`, `pretrained_cfg`):
  the variant, ViTConfig fields from `model_args`, and the preprocessing (mean, std, crop_pct, interpolation,
  input size);
- transformers repositories (`config.json` with a `model_type` of `hf_configs.FAMILIES`: ViT, DeiT, DINOv2, CLIP,
  SigLIP): the ViTConfig fields of any size the config describes, and the preprocessing of
  `preprocessor_config.json` (the family's documented one without it).

Local checkpoint folders are described the same way (`local_config`).

The weights then go through the checkpoint converters like any local file (`checkpoints.load_checkpoint`).
No torch here: the CLI resolves names before anything heavy is imported.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...data.preprocess import Preprocess
from ...errors import VitexportError
from ..config import CHOICES, ViTConfig
from ..variants import get_variant

HUB_PREFIX = "hf-hub:"
TIMM_ORG = "timm"  # where timm's tagged names live on the hub
CONFIG_FILE = "config.json"
PREPROCESSOR_FILE = "preprocessor_config.json"  # transformers' image processor settings
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # tried in this order
# ViTConfig fields a timm config's model_args may set (the same names as timm's VisionTransformer arguments; the
# training and run-time ones are dropped first, _TIMM_IGNORED)
MODEL_ARGS = tuple(f for f in ViTConfig.__dataclass_fields__ if f not in ("pos_embed_grid", "pos_embed_interp"))
# timm's spellings of the parts that ViTConfig names otherwise (timm's get_act_layer takes both)
_TIMM_PART_NAMES = {"swish": "silu"}
_TIMM_IGNORED = ("drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate", "attn_drop_rate",
                 "drop_path_rate", "weight_init", "fix_init", "dynamic_img_size")  # training and run-time options
_CACHE_DIR = re.compile(r"^models--(?P<org>[^/]+?)--(?P<name>[^/]+)$")


@dataclass(frozen=True)
class HubRef:
    repo_id: str  # ORG/NAME
    revision: str | None = None  # a branch, tag or commit hash; None: the default branch

    def __str__(self) -> str:
        return f"{HUB_PREFIX}{self.repo_id}" + (f"@{self.revision}" if self.revision else "")


def parse_ref(text: str | Path | None) -> HubRef | None:
    """'hf-hub:ORG/NAME[@REVISION]' -> HubRef; None for anything that is not a hub reference (a path)."""
    s = "" if text is None else str(text)
    if not s.startswith(HUB_PREFIX):
        return None
    repo, _, revision = s[len(HUB_PREFIX):].partition("@")
    parts = repo.split("/")
    usage = f"{s!r} is not a hub checkpoint; write it as hf-hub:ORG/NAME or hf-hub:ORG/NAME@REVISION"
    if len(parts) != 2 or not all(parts) or not all(re.fullmatch(r"[\w.-]+", p) for p in parts):
        raise VitexportError(f"{usage}.")
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:  # the hub's own rules ('..', '--', leading or trailing '.' and '-', length), before any path is built
        validate_repo_id(repo)
    except HFValidationError:
        raise VitexportError(f"{usage} ({repo!r} breaks the hub's rules for repository names).") from None
    # a revision becomes a path in the cache (refs/<revision>): a branch, tag or commit, never a way out of it
    if revision and (not re.fullmatch(r"[\w.\-/]+", revision) or revision.startswith("/")
                     or ".." in revision.split("/") or "" in revision.split("/")):
        raise VitexportError(f"{usage} ({revision!r} is not a branch, tag or commit name).")
    return HubRef(repo, revision or None)


def is_hub_ref(text: str | Path | None) -> bool:
    return text is not None and str(text).startswith(HUB_PREFIX)


def tagged_ref(model: str) -> HubRef | None:
    """timm's tagged name 'vit_base_patch16_224.augreg2_in21k_ft_in1k' -> hf-hub:timm/<that name>; None untagged."""
    arch, dot, tag = model.partition(".")
    return HubRef(f"{TIMM_ORG}/{model}") if dot and arch and tag else None


# -- the cache -------------------------------------------------------------------------------------------------

def offline() -> bool:
    """HF_HUB_OFFLINE as it is now (huggingface_hub reads it once, at import)."""
    value = os.environ.get("HF_HUB_OFFLINE")
    if value is not None:
        return value.strip().upper() in ("1", "ON", "YES", "TRUE")
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def cache_dir() -> Path:
    """huggingface_hub's cache folder as the environment says now: $HF_HUB_CACHE, else $HF_HOME/hub, else default."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def origin(path: Path | str) -> tuple[str, str] | None:
    """(ORG/NAME, commit) of a file inside a Hugging Face cache (.../models--ORG--NAME/snapshots/<commit>/...)."""
    parts = Path(path).absolute().parts
    for i in range(len(parts) - 3, -1, -1):
        m = _CACHE_DIR.match(parts[i])
        if m and parts[i + 1] == "snapshots":
            return f"{m['org']}/{m['name']}", parts[i + 2]
    return None


@dataclass
class Snapshot:
    """A repository's files at one commit, in the local cache."""

    ref: HubRef  # as the user asked for it
    commit: str  # the commit hash the revision resolved to
    config: dict[str, Any]  # config.json
    weights: Path  # the weights file (in snapshots/<commit>/)
    extra: dict[str, dict[str, Any]] = field(default_factory=dict)  # other JSON files read: name -> contents


_FETCHED: dict[tuple[str, str, bool], Snapshot] = {}  # one fetch per reference, cache and mode in a process


def fetch(ref: HubRef) -> Snapshot:
    """config.json and the weights of a repository, through the cache; one sentence when they cannot be had."""
    key = (str(ref), str(cache_dir()), offline())
    if key not in _FETCHED:
        config_path = _download(ref, CONFIG_FILE)
        config = _read_json(config_path, ref)
        weights = next((p for name in WEIGHT_FILES if (p := _download(ref, name, optional=True))), None)
        if weights is None:
            weights = _sharded(ref)
        if weights is None:
            where = " in the cache" if offline() else ""
            raise VitexportError(f"{ref} holds none of {', '.join(WEIGHT_FILES)}{where}; vitexport reads timm and "
                                 f"transformers ViT repositories.")
        extra = {}
        if config.get("model_type") and (pp := _download(ref, PREPROCESSOR_FILE, optional=True)):
            extra[PREPROCESSOR_FILE] = _read_json(pp, ref)
        _FETCHED[key] = Snapshot(ref, config_path.parent.name, config, weights, extra)
    return _FETCHED[key]


def _sharded(ref: HubRef) -> Path | None:
    """A sharded repository's index and every shard it names (checked as any index: plain names beside it), through
    the cache; the index's path, or None when the repository has none."""
    from .checkpoints.reading import SHARD_INDEXES, shard_map, shard_names

    for name in SHARD_INDEXES:
        if (index := _download(ref, name, optional=True)) is not None:
            for shard in shard_names(index):
                _download(ref, shard)
            shard_map(index)
            return index
    return None


def _download(ref: HubRef, filename: str, optional: bool = False) -> Path | None:
    """One file through the cache; None for a missing optional file; otherwise one sentence saying why not."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(hf_hub_download(ref.repo_id, filename, revision=ref.revision, cache_dir=cache_dir(),
                                    local_files_only=offline()))
    except LocalEntryNotFoundError:
        cached = (cache_dir() / f"models--{ref.repo_id.replace('/', '--')}").is_dir()
        if optional and cached:
            return None
        raise VitexportError(_not_cached(ref, cached)) from None
    except GatedRepoError:
        raise VitexportError(f"{ref} is gated: accept its terms on huggingface.co and log in with "
                             f"`hf auth login`.") from None
    except RepositoryNotFoundError:
        raise VitexportError(f"{ref} does not exist on the Hugging Face hub, or is private (log in with "
                             f"`hf auth login`).") from None
    except RevisionNotFoundError:
        raise VitexportError(f"{ref.repo_id} has no revision {ref.revision!r}.") from None
    except EntryNotFoundError:
        if optional:
            return None
        raise VitexportError(f"{ref} has no {filename}: it is not a timm or transformers model repository.") from None
    except HFValidationError as e:
        raise VitexportError(f"{ref} is not a valid repository name ({str(e).splitlines()[0]}).") from None
    except OSError as e:  # network errors (huggingface_hub's HTTP errors are OSErrors too)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise VitexportError(f"Could not fetch {filename} of {ref}: {first}.") from None


def _not_cached(ref: HubRef, repo_cached: bool) -> str:
    what = f"{ref} is not in the Hugging Face cache ({cache_dir()}" + \
        (", which holds other files or revisions of it)" if repo_cached else ")")
    fetch_it = f"`hf download {ref.repo_id}" + (f" --revision {ref.revision}`" if ref.revision else "`")
    if offline():
        return f"{what} and HF_HUB_OFFLINE is set; fetch it once with {fetch_it} on a machine with network access."
    return f"{what} and could not be downloaded (no network?); fetch it with {fetch_it} and try again."


def _read_json(path: Path, ref: HubRef) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VitexportError(f"{Path(path).name} of {ref} is not valid JSON ({e.__class__.__name__}).") from None
    if not isinstance(data, dict):
        raise VitexportError(f"{Path(path).name} of {ref} holds a JSON {type(data).__name__}, not an object.")
    return data


# -- what the config says ----------------------------------------------------------------------------------------

@dataclass
class HubModel:
    """What a checkpoint's config says about its model, in vitexport's terms."""

    kind: str  # 'timm' | 'transformers'
    architecture: str  # as the config names it (timm's model name, or the transformers class)
    variant: str | None  # the matching variants.VARIANTS name; None when there is none
    preprocess: Preprocess | None  # at the checkpoint's input size; None: the variant's
    overrides: dict[str, Any] = field(default_factory=dict)  # ViTConfig fields the config sets
    pos_embed_interp: str | None = None  # how its own code resamples the position embedding; None: vitexport's
    notes: list[str] = field(default_factory=list)  # what the user should know (preprocessing assumed)


def describe(snapshot: Snapshot) -> HubModel:
    return describe_config(snapshot.config, snapshot.extra.get(PREPROCESSOR_FILE), str(snapshot.ref))


def describe_config(cfg: dict[str, Any], processor: dict[str, Any] | None, where: str) -> HubModel:
    """A timm config (architecture, pretrained_cfg) or a transformers one (model_type) -> HubModel."""
    if "architecture" in cfg or "pretrained_cfg" in cfg:
        return _describe_timm(cfg, where)
    if "model_type" in cfg:
        return _describe_transformers(cfg, processor, where)
    raise VitexportError(f"{where}'s {CONFIG_FILE} is neither a timm config (architecture, pretrained_cfg) nor a "
                         f"transformers one (model_type).")


def local_config(path: Path) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
    """(config.json, preprocessor_config.json or None) of a checkpoint folder, or of the folder of a weights file;
    None when there is no config.json or it is neither timm's nor transformers' (a file that merely sits beside
    one)."""
    folder = path if path.is_dir() else path.parent
    try:
        cfg = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(cfg, dict) or not ({"architecture", "pretrained_cfg", "model_type"} & set(cfg)):
        return None
    proc = None
    if (folder / PREPROCESSOR_FILE).is_file():
        try:
            proc = json.loads((folder / PREPROCESSOR_FILE).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            raise VitexportError(f"{folder / PREPROCESSOR_FILE} is not valid JSON.") from None
        if not isinstance(proc, dict):
            raise VitexportError(f"{folder / PREPROCESSOR_FILE} holds a JSON {type(proc).__name__}, not an object.")
    return cfg, proc


CHECKPOINT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".npz")
CHECKPOINT_FOLDER_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                           "pytorch_model.bin.index.json", "open_clip_model.safetensors")


def checkpoint_refusal(path: Path) -> str | None:
    """The sentence for a checkpoint (a timm or transformers folder, or a weights file) given where an exported
    model folder belongs, with the command that exports it; None when `path` is not a checkpoint."""
    what = None
    if path.is_dir():
        try:
            local = local_config(path)
        except VitexportError:
            local = None
        if local is not None and "model_type" in local[0]:
            names = local[0].get("architectures")
            what = f"a transformers {names[0] if isinstance(names, list) and names else local[0]['model_type']} " \
                   f"checkpoint"
        elif local is not None:
            what = f"a timm {local[0].get('architecture') or ''} checkpoint".replace("  ", " ")
        elif any((path / n).is_file() for n in CHECKPOINT_FOLDER_FILES):
            what = "a checkpoint folder"
    elif path.is_file() and path.suffix.lower() in CHECKPOINT_SUFFIXES:
        what = "a checkpoint file"
    if what is None:
        return None
    return (f"{path} is {what}, not an exported model; export it first with `vitexport onnx -c {path} -o FOLDER` "
            f"and give that FOLDER.")


def _describe_timm(cfg: dict[str, Any], ref: str) -> HubModel:
    arch = str(cfg.get("architecture") or "")
    pcfg = cfg.get("pretrained_cfg") if isinstance(cfg.get("pretrained_cfg"), dict) else cfg  # legacy: one dict
    args = cfg.get("model_args") or {}
    if not isinstance(args, dict):
        raise VitexportError(f"{ref}'s model_args is a JSON {type(args).__name__}, not an object.")
    from .timm_args import translate_overrides

    module = get_variant(arch).module if _known(arch) else "vision_transformer"
    args = {k: _TIMM_PART_NAMES.get(v, v) if k in CHOICES and isinstance(v, str) else v
            for k, v in args.items() if k not in _TIMM_IGNORED}
    if module != "vision_transformer" and module != "deit":  # the module's own names -> ViTConfig's
        args = translate_overrides(module, args)
        if bad := args.pop("unsupported", None):
            raise VitexportError(f"{ref} builds {arch} with {', '.join(sorted(bad))}, which vitexport's model does "
                                 f"not take from a config.")
    unknown = sorted(k for k in args if k not in MODEL_ARGS)
    if unknown:
        raise VitexportError(f"{ref} builds {arch} with {', '.join(unknown)}, which vitexport's ViT does not have.")
    if args.get("in_chans", 3) != 3:
        raise VitexportError(f"{ref} takes {args['in_chans']}-channel inputs; vitexport's preprocessing makes RGB.")
    # the size and the head come from the input size and the weights (and --img-size / --num-classes)
    overrides = {k: (tuple(v) if isinstance(v, list) else v) for k, v in args.items()
                 if k not in ("img_size", "num_classes", "in_chans")}
    size = pcfg.get("input_size") or [3, 224, 224]
    if args.get("img_size") is not None:
        s = args["img_size"]
        size = [size[0], *((s, s) if isinstance(s, int) else s)]
    try:
        pp = Preprocess(input_size=(int(size[-2]), int(size[-1])),
                        mean=_triple(pcfg.get("mean", (0.5, 0.5, 0.5))), std=_triple(pcfg.get("std", (0.5, 0.5, 0.5))),
                        crop_pct=float(pcfg.get("crop_pct", 0.9)),
                        interpolation=str(pcfg.get("interpolation", "bicubic")),
                        crop_mode=str(pcfg.get("crop_mode") or "center"))
    except (TypeError, ValueError, IndexError):
        raise VitexportError(f"{ref}'s pretrained_cfg has an unreadable input_size, mean, std, crop_pct or "
                             f"crop_mode.") from None
    _check_preprocess(pp, ref)
    return HubModel("timm", arch, arch if _known(arch) else None, pp, overrides)


def _triple(v: Any) -> tuple[float, float, float]:
    t = tuple(float(x) for x in v)
    if len(t) != 3:
        raise ValueError
    return t  # type: ignore[return-value]


def _check_preprocess(pp: Preprocess, ref: str) -> None:
    """A hub config is input: sizes and ratios a model could really be fed, or one sentence."""
    from ...data.preprocess import CROP_MODES

    h, w = pp.input_size
    problems = []
    if not (0 < h <= 16384 and 0 < w <= 16384):
        problems.append(f"input size {h}x{w} is not 1..16384 a side")
    if not 0.05 <= pp.crop_pct <= 4:
        problems.append(f"crop_pct {pp.crop_pct} is not 0.05..4")
    if any(not (s > 0 and s < 1e3) for s in pp.std) or any(abs(m) > 1e3 for m in pp.mean):
        problems.append(f"mean {pp.mean} / std {pp.std} are not usable")
    if pp.crop_mode not in CROP_MODES:
        problems.append(f"crop_mode {pp.crop_mode!r} is not one of {', '.join(CROP_MODES)}")
    if problems:
        raise VitexportError(f"{ref}'s pretrained_cfg: {'; '.join(problems)}.")


def _known(arch: str) -> bool:
    try:
        get_variant(arch)
    except VitexportError:
        return False
    return True


def _describe_transformers(cfg: dict[str, Any], processor: dict[str, Any] | None, where: str) -> HubModel:
    from .hf_models import describe_transformers as describe_hf

    d = describe_hf(cfg, processor, where)
    arch = ",".join(str(a) for a in (cfg.get("architectures") or [])) or d.family.model_type
    return HubModel("transformers", arch, None, d.preprocess, d.fields, d.family.pos_embed_interp, d.notes)
