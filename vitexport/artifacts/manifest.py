"""The manifest: a JSON file beside every exported model saying exactly what it is and how it was made. `Manifest`
is the typed form; `read_manifest` / `write_manifest` move it to and from `manifest.json` (atomically). The format
is versioned: this version reads `vitexport-manifest/1` and says so, in one sentence, for anything else."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..version import __version__
from ..data.preprocess import Preprocess
from ..errors import VitexportError
from ..parity.compare import ParityStats, ParityVerdict
from ..paths import plain_name, write_text_atomic
from .fields import Fields as _Fields, config_field as _config, outputs_field as _outputs, pair_field as _pair, \
    size_range_field as _size_range

FORMAT = "vitexport-manifest/1"  # written by this version
READABLE_FORMATS = (FORMAT,)  # read by this version


def _stats(f: _Fields) -> ParityStats:
    return ParityStats(**{x.name: f.data.get(x.name) for x in fields(ParityStats)})


# -- records ------------------------------------------------------------------------------------------------

@dataclass
class CheckpointRecord:
    """The weights an export was made from."""

    path: str  # absolute path of the weights file that was read
    sha256: str  # of that file: an export of other weights is another model
    format: str  # 'timm' | 'huggingface' | 'jax'
    repo: str | None = None  # a Hugging Face hub repository (ORG/NAME) the file came from, through the cache
    revision: str | None = None  # the commit hash of that repository the file was read at

    def to_dict(self) -> dict[str, Any]:
        d = {"path": self.path, "sha256": self.sha256, "format": self.format}
        return d if self.repo is None else {**d, "repo": self.repo, "revision": self.revision}

    @classmethod
    def from_fields(cls, f: _Fields) -> "CheckpointRecord":
        return cls(f.req("path", str), f.req("sha256", str), f.req("format", str), f.opt("repo", str),
                   f.opt("revision", str))


@dataclass
class LabelsRecord:
    """Where the class names of the head come from (vitexport.model.labels)."""

    source: str  # 'checkpoint' | 'imagenet-1k' | 'digits' | 'indices'
    names: list[str] | None = None  # 'checkpoint': the names it carries; the others are looked up

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, **({} if self.names is None else {"names": list(self.names)})}

    @classmethod
    def from_fields(cls, f: _Fields) -> "LabelsRecord":
        names = f.opt("names", list)
        return cls(f.req("source", str), None if names is None else [str(n) for n in names])


@dataclass
class BatchCheck:
    """ONNX Runtime against PyTorch at one batch size, at export time."""

    batch: int
    stats: ParityStats
    passed: bool
    img_size: tuple[int, int] | None = None  # a dynamic-size export: the image size of this check
    moved_queries: int | None = None  # a detector: its image's queries that took another proposal (a TopK near-tie)

    def to_dict(self) -> dict:
        size = {} if self.img_size is None else {"img_size": list(self.img_size)}
        moved = {} if self.moved_queries is None else {"moved_queries": self.moved_queries}
        return {"batch": self.batch, **size, "passed": self.passed, **moved, **self.stats.to_dict()}

    @classmethod
    def from_fields(cls, f: _Fields) -> "BatchCheck":
        size = f.opt("img_size", list)
        return cls(f.req("batch", int), _stats(f), f.req("passed", bool), None if size is None else tuple(size),
                   f.opt("moved_queries", int))


@dataclass
class ExportParity:
    atol: float  # max abs logit difference allowed
    checks: list[BatchCheck]  # one per checked batch size

    def to_dict(self) -> dict:
        return {"atol": self.atol, "checks": [c.to_dict() for c in self.checks]}

    @classmethod
    def from_fields(cls, f: _Fields) -> "ExportParity":
        checks = [BatchCheck.from_fields(_Fields(c, f"{f.where}.checks", f.path)) for c in f.req("checks", list)]
        return cls(float(f.req("atol", (int, float))), checks)


@dataclass
class CalibrationRecord:
    """How INT8 ranges were calibrated; a cache entry is reused only for the same key."""

    key: str  # content address: model bytes, data bytes, preprocessing, settings, version
    method: str  # 'minmax' | 'entropy' | 'percentile'
    samples: int  # inputs actually used
    data: str  # absolute path of the calibration data
    requested_samples: int | None  # --calib-samples (None: all)
    percentile: float | None  # for the percentile method
    quantize_attention: bool  # Q.K^T and A.V quantized too
    exclude_nodes: list[str]  # kept in float, by node name
    exclude_blocks: list[int]  # transformer blocks kept in float
    skipped: int = 0  # chosen files that could not be read (damaged, links out of the folder, ...): left out
    smoothquant: float | None = None  # SmoothQuant's alpha, when the LayerNorm-fed GEMMs were smoothed
    fallback: dict | None = None  # --min-cos/--max-drop: the target, the groups kept in float, the speed cost
    attention_auto: bool = False  # quantize_attention was the default's choice (long sequences, checked)

    def to_dict(self) -> dict:
        return {"key": self.key, "method": self.method, "samples": self.samples, "data": self.data,
                "requested_samples": self.requested_samples, "percentile": self.percentile,
                "quantize_attention": self.quantize_attention, "exclude_nodes": list(self.exclude_nodes),
                "exclude_blocks": list(self.exclude_blocks), **({"skipped": self.skipped} if self.skipped else {}),
                **{k: v for k, v in (("smoothquant", self.smoothquant), ("fallback", self.fallback)) if v is not None},
                **({"attention_auto": True} if self.attention_auto else {})}

    @classmethod
    def from_fields(cls, f: _Fields) -> "CalibrationRecord":
        return cls(f.req("key", str), f.req("method", str), f.req("samples", int), f.req("data", str),
                   f.opt("requested_samples", int), f.opt("percentile", (int, float)),
                   bool(f.opt("quantize_attention", bool, False)), list(f.opt("exclude_nodes", list, [])),
                   list(f.opt("exclude_blocks", list, [])), int(f.opt("skipped", int, 0)),
                   f.opt("smoothquant", (int, float)), f.opt("fallback", dict),
                   bool(f.opt("attention_auto", bool, False)))


@dataclass
class HeldOutCheck:
    """A converted model against the FP32 ONNX on held-out inputs."""

    data: str  # where the held-out inputs came from
    passed: bool  # no bound was missed (the file was kept)
    failures: list[str]  # the missed bounds, readable
    thresholds: dict[str, float | None]  # the bounds applied (compare.Thresholds)
    stats: ParityStats
    inconclusive: list[str] = field(default_factory=list)  # bounds the set was too small to decide
    img_size: tuple[int, int] | None = None  # a dynamic-size export's check at another size than the default

    @classmethod
    def from_verdict(cls, data: str, verdict: ParityVerdict,
                     img_size: tuple[int, int] | None = None) -> "HeldOutCheck":
        return cls(data, not verdict.failed, list(verdict.failures), verdict.thresholds.to_dict(), verdict.stats,
                   list(verdict.inconclusive), None if img_size is None else tuple(img_size))

    def to_dict(self) -> dict:
        return {"data": self.data, **({} if self.img_size is None else {"img_size": list(self.img_size)}),
                "passed": self.passed, "failures": list(self.failures),
                **({"inconclusive": list(self.inconclusive)} if self.inconclusive else {}),
                "thresholds": dict(self.thresholds), **self.stats.to_dict()}

    @classmethod
    def from_fields(cls, f: _Fields) -> "HeldOutCheck":
        size = f.opt("img_size", list)
        return cls(f.req("data", str), f.req("passed", bool), list(f.req("failures", list)),
                   dict(f.req("thresholds", dict)), _stats(f), list(f.opt("inconclusive", list) or []),
                   None if size is None else tuple(size))


@dataclass
class IrRecord:
    """An OpenVINO IR's second file and the ONNX it was converted from (records of the openvino-* kinds)."""

    weights: str  # the .bin beside the .xml (the record's `file`)
    weights_sha256: str  # its bytes: a .bin from another model or conversion is refused
    weights_bytes: int  # its size: a truncated .bin is named as such
    source: str  # the ONNX kind it was converted from (folder.IR_SOURCE)
    source_sha256: str  # that ONNX's bytes (external data folded in): another one makes the IR stale
    fp16_weights: bool  # weights stored in FP16 (compress_to_fp16)
    openvino: str  # the converting OpenVINO's version

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_fields(cls, f: _Fields) -> "IrRecord":
        return cls(plain_name(f.req("weights", str), f"{f.path.name}'s field {f._name('weights')!r}"),
                   f.req("weights_sha256", str), f.req("weights_bytes", int),
                   f.req("source", str), f.req("source_sha256", str), f.req("fp16_weights", bool),
                   f.req("openvino", str))


_PRECISION_FIELDS = {"file", "source_sha256", "sha256", "keep_fp32", "fp32_nodes", "calibration", "qdq", "check",
                     "openvino", "size_check", "onnxruntime"}


@dataclass
class PrecisionRecord:
    """One converted ONNX (FP16, INT8, ...) and what it was made from and with."""

    file: str  # its file name in the folder
    source_sha256: str  # the FP32 ONNX it was made from: another one makes it stale
    sha256: str = ""  # its own bytes: a changed file is stale too
    keep_fp32: list[str] | None = None  # FP16: op types kept in FP32
    calibration: CalibrationRecord | None = None  # INT8
    qdq: dict[str, int] | None = None  # INT8: Q/DQ counts and invariants (precision.convert.qdq_summary)
    check: HeldOutCheck | None = None  # the parity check against FP32, unless skipped
    extra: dict[str, Any] = field(default_factory=dict)  # fields of a newer minor version, kept
    openvino: IrRecord | None = None  # an OpenVINO IR: its .bin and its source ONNX
    size_check: HeldOutCheck | None = None  # a dynamic-size export: the same check at a second image size
    fp32_nodes: list[dict] | None = None  # FP16 parts: nodes kept in FP32 and why (precision.ranges.Kept)
    onnxruntime: dict[str, str] | None = None  # session options ONNX Runtime needs for it (FP8), None: its defaults

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"file": self.file, "source_sha256": self.source_sha256}
        for key, value in (("keep_fp32", self.keep_fp32), ("fp32_nodes", self.fp32_nodes)):
            if value is not None:
                d[key] = list(value)
        for key, part in (("calibration", self.calibration), ("check", self.check), ("openvino", self.openvino),
                          ("size_check", self.size_check)):
            if part is not None:
                d[key] = part.to_dict()
        if self.qdq is not None:
            d["qdq"] = dict(self.qdq)
        if self.onnxruntime is not None:
            d["onnxruntime"] = dict(self.onnxruntime)
        return {**d, "sha256": self.sha256, **self.extra}

    @classmethod
    def from_fields(cls, f: _Fields) -> "PrecisionRecord":
        cal, check, ov, size = f.sub("calibration"), f.sub("check"), f.sub("openvino"), f.sub("size_check")
        return cls(plain_name(f.req("file", str), f"{f.path.name}'s field {f._name('file')!r}"),
                   f.req("source_sha256", str), f.opt("sha256", str, ""),
                   f.opt("keep_fp32", list), CalibrationRecord.from_fields(cal) if cal else None,
                   f.opt("qdq", dict), HeldOutCheck.from_fields(check) if check else None,
                   f.rest(_PRECISION_FIELDS), openvino=IrRecord.from_fields(ov) if ov else None,
                   size_check=HeldOutCheck.from_fields(size) if size else None,
                   fp32_nodes=f.opt("fp32_nodes", list), onnxruntime=f.opt("onnxruntime", dict))


# -- the manifest -------------------------------------------------------------------------------------------

def _decoder(f: _Fields, path: Path) -> dict[str, Any] | None:
    """The decoder record, its file a plain name in the folder."""
    d = f.opt("decoder", dict)
    if d is None:
        return None
    plain_name(_Fields(d, "decoder", path).req("onnx", str), f"{path.name}'s field 'decoder.onnx'")
    return d


@dataclass
class Manifest:
    """Everything about an exported model that a later step, or a person, needs to know."""

    variant: str  # named variant (timm's name), e.g. 'vit_base_patch16_224'
    img_size: tuple[int, int]  # (H, W) the model takes
    patch_size: tuple[int, int]  # (P, P)
    grid: tuple[int, int]  # patches per side: img_size / patch_size
    num_classes: int  # classes of the head; 0: the model outputs features
    config: dict[str, Any]  # every model.ViTConfig field, to rebuild the PyTorch model
    preprocess: Preprocess  # image -> input tensor (timm's eval transform)
    checkpoint: CheckpointRecord | None  # None: deterministic random weights
    seed: int | None  # the random weights' seed (None with a checkpoint)
    pos_embed_interp: str  # how the position embedding was resized (posembed.INTERPOLATIONS)
    opset: int  # ONNX opset of the export
    onnx: str  # the FP32 ONNX's file name in the folder
    input_name: str  # the graph's input, (batch, C, H, W) float32
    output_name: str  # the graph's output
    input_shape: list[Any]  # ['batch', C, H, W]
    output_shape: list[Any]  # ['batch', classes] (or features, or per-token outputs)
    versions: dict[str, str] = field(default_factory=dict)  # library versions at export
    parity: ExportParity | None = None  # ONNX Runtime vs PyTorch at export
    onnx_sha256: str | None = None  # the FP32 ONNX's bytes: what derived files were made from
    onnx_bytes: int | None = None  # its size
    precisions: dict[str, PrecisionRecord] = field(default_factory=dict)  # converted ONNX files, by kind
    labels: LabelsRecord | None = None  # where the class names come from; None: features, or an older export
    img_size_range: tuple[tuple[int, int], tuple[int, int]] | None = None  # a dynamic-size export's (min, max) H x W
    outputs: dict[str, list[Any]] | None = None  # every graph output (model.outputs), name -> shape, in graph order;
    # None: an export made before --outputs, whose one output is output_name
    # SAM's prompt encoder and mask decoder graph beside the encoder's: {"onnx", "sha256", "bytes", "inputs",
    # "outputs", "checks"} (exporter.decoder); None: a model without one
    decoder: dict[str, Any] | None = None
    format: str = FORMAT  # the manifest format's name and version
    extra: dict[str, Any] = field(default_factory=dict)  # fields this version does not know, kept
    path: Path | None = field(default=None, compare=False, repr=False)  # the file it was read from (not written)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format, "variant": self.variant, "img_size": list(self.img_size),
            "patch_size": list(self.patch_size), "grid": list(self.grid), "num_classes": self.num_classes,
            "config": self.config, "preprocess": self.preprocess.to_dict(),
            "checkpoint": None if self.checkpoint is None else self.checkpoint.to_dict(),
            "seed": self.seed, "pos_embed_interp": self.pos_embed_interp, "opset": self.opset, "onnx": self.onnx,
            "input_name": self.input_name, "output_name": self.output_name, "input_shape": list(self.input_shape),
            "output_shape": list(self.output_shape), "versions": dict(self.versions),
            **({} if self.parity is None else {"parity": self.parity.to_dict()}),
            **({} if self.onnx_sha256 is None else {"onnx_sha256": self.onnx_sha256, "onnx_bytes": self.onnx_bytes}),
            "precisions": {k: r.to_dict() for k, r in self.precisions.items()},
            **({} if self.labels is None else {"labels": self.labels.to_dict()}),
            **({} if self.img_size_range is None else {"img_size_range": [list(s) for s in self.img_size_range]}),
            **({} if self.outputs is None else {"outputs": {k: list(v) for k, v in self.outputs.items()}}),
            **({} if self.decoder is None else {"decoder": self.decoder}),
            **self.extra,
        }

    @classmethod
    def from_dict(cls, data: Any, path: Path) -> "Manifest":
        f = _Fields(data, "", path)
        fmt = f.req("format", str)
        if fmt not in READABLE_FORMATS:
            raise VitexportError(f"{path} is a {fmt!r} manifest, which vitexport {__version__} cannot read (it "
                                 f"reads {', '.join(READABLE_FORMATS)}); upgrade vitexport or re-export the model.")
        ck, parity, precisions = f.sub("checkpoint"), f.sub("parity"), f.opt("precisions", dict, {})
        labels = f.sub("labels")
        pp = f.req("preprocess", dict)
        try:
            preprocess = Preprocess.from_dict(pp)
        except (KeyError, TypeError, ValueError) as e:
            raise VitexportError(f"{path} has an unreadable 'preprocess' field ({e.__class__.__name__}: {e}); "
                                 f"re-export the model.") from None
        known = {x.name for x in fields(cls)} - {"extra", "path"}
        return cls(
            variant=f.req("variant", str), img_size=_pair(f, "img_size"), patch_size=_pair(f, "patch_size"),
            grid=_pair(f, "grid"), num_classes=f.req("num_classes", int), config=_config(f),
            preprocess=preprocess, checkpoint=CheckpointRecord.from_fields(ck) if ck else None,
            seed=f.opt("seed", int), pos_embed_interp=f.req("pos_embed_interp", str), opset=f.req("opset", int),
            onnx=plain_name(f.req("onnx", str), f"{path.name}'s field 'onnx'"), input_name=f.req("input_name", str),
            output_name=f.req("output_name", str),
            input_shape=f.req("input_shape", list), output_shape=f.req("output_shape", list),
            versions=f.opt("versions", dict, {}), parity=ExportParity.from_fields(parity) if parity else None,
            onnx_sha256=f.opt("onnx_sha256", str), onnx_bytes=f.opt("onnx_bytes", int),
            precisions={k: PrecisionRecord.from_fields(_Fields(v, f"precisions.{k}", path))
                        for k, v in precisions.items()},
            labels=LabelsRecord.from_fields(labels) if labels else None, format=fmt, extra=f.rest(known),
            img_size_range=_size_range(f), outputs=_outputs(f), decoder=_decoder(f, path), path=path,
        )

    @property
    def sam_decoder(self) -> dict[str, Any] | None:
        """SAM's prompt decoder config (heads.config.PromptDecoderConfig's fields); None without a decoder graph."""
        d = self.config.get("sam_decoder")
        return d if isinstance(d, dict) and self.decoder is not None else None

    @property
    def dense(self) -> dict[str, Any] | None:
        """A dense model's head (model.heads.config.DenseConfig's fields, as config.dense records them); SAM with its
        decoder graph: task 'masks', the decoder's config and its file (judged by its masks, parity.masks); None for
        a ViT."""
        dense = self.config.get("dense")
        if self.sam_decoder is not None and self.decoder is not None and self.path is not None:
            return {"task": "masks", **self.sam_decoder, "decoder_onnx": str(self.path.parent / self.decoder["onnx"])}
        return dense if isinstance(dense, dict) else None

    @property
    def dense_task(self) -> str | None:
        """A dense model's task ('depth', 'segmentation'; parity.dense judges its output by it); None for a ViT."""
        return None if self.dense is None else self.dense.get("task")

    @property
    def output_names(self) -> list[str]:
        """The graph's outputs, in order (the judged one, output_name, among them)."""
        return list(self.outputs) if self.outputs else [self.output_name]

    def output_shape_of(self, name: str) -> list[Any]:
        return list((self.outputs or {}).get(name, self.output_shape))

    def provenance(self) -> dict[str, Any]:
        """The fields that make two exports the same model."""
        return {"variant": self.variant, "config": self.config,
                "checkpoint_sha256": None if self.checkpoint is None else self.checkpoint.sha256,
                "seed": self.seed, "pos_embed_interp": self.pos_embed_interp}



def read_manifest(path: Path) -> Manifest:
    """The manifest at `path` (a manifest.json); one sentence when it is missing, not JSON, or not readable."""
    path = Path(path)
    if not path.is_file():
        raise VitexportError(f"{path.parent} has no {path.name} beside it; export it with 'vitexport onnx' first.")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VitexportError(f"{path} is not valid JSON ({e.__class__.__name__}).") from None
    return Manifest.from_dict(data, path)


def write_manifest(path: Path, manifest: Manifest) -> Path:
    write_text_atomic(Path(path), json.dumps(manifest.to_dict(), indent=2) + "\n")
    return Path(path)
