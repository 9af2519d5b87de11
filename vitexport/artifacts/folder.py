"""The model folder: every file an export, a precision step or an engine build leaves, named here and only here.

    models/<variant>-<H>x<W>/
        manifest.json              what the folder holds and how it was made (vitexport.artifacts.manifest)
        model.onnx                 the FP32 export (or the name the manifest records, e.g. from `-o dir/custom.onnx`)
        model.onnx.data            its weights, for models over protobuf's 2 GB cap
        model.fp16.onnx            mixed FP16, FP32 inputs/outputs
        model.int8.onnx            Q/DQ INT8 with an FP32 remainder, for CPU runtimes
        model.fp16.trt.onnx        FP16 shaped for TensorRT: every op in FP16, FP32 inputs/outputs
        model.int8.trt.onnx        INT8 shaped for TensorRT: that FP16 graph with Q/DQ on the GEMM inputs
        model.fp8.onnx             FP8 (E4M3) shaped for TensorRT on Hopper/Ada: that FP16 graph with FP8 Q/DQ
        model.<fp32|fp16|int8|fp8>.plan       TensorRT engines ...
        model.<fp32|fp16|int8|fp8>.plan.json  ... and their sidecars
        model.openvino.<fp32|fp16|int8>.xml/.bin  OpenVINO IR, converted from the ONNX named in IR_SOURCE
        model.<kind>.rejected.onnx a conversion that failed its parity check, kept for inspection
        calib-cache/<key>.json     calibration ranges, addressed by what they were computed from

A new artifact is one line in ARTIFACTS (an ONNX graph, or an OpenVINO IR with its line in IR_SOURCE too) or in
PLAN_SOURCE (a TensorRT engine and the graph it is built from). Callers ask a ModelFolder for paths; they never spell a file name.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import VitexportError
from ..paths import artifacts_dir, plain_name, sha256_file
from .manifest import Manifest, PrecisionRecord, read_manifest, write_manifest

MANIFEST_NAME = "manifest.json"
DEFAULT_ONNX_NAME = "model.onnx"
DECODER_NAME = "decoder.onnx"  # SAM's prompt encoder and mask decoder, written by the export beside the encoder
CALIB_CACHE_DIR = "calib-cache"
EXTERNAL_DATA_SUFFIX = ".data"  # model.onnx -> model.onnx.data
SIDECAR_SUFFIX = ".json"  # model.fp16.plan -> model.fp16.plan.json
REJECTED_SUFFIX = ".rejected.onnx"  # model.fp16.onnx -> model.fp16.rejected.onnx
IR_WEIGHTS_SUFFIX = ".bin"  # model.openvino.fp32.xml -> model.openvino.fp32.bin
LOCK_NAME = ".vitexport.lock"  # the writers' lock (vitexport.artifacts.workspace); stays in place between runs
OWNER_NAME = ".vitexport.owner"  # who holds that lock (pid, command), for the message of a run that waits


@dataclass(frozen=True)
class ArtifactKind:
    """One kind of ONNX graph a model folder can hold."""

    name: str  # how commands, records and PLAN_SOURCE refer to it
    filename: str  # its file in the folder (fp32: the default; the manifest's name wins)
    precision: str  # the arithmetic its graph asks for: 'fp32' | 'fp16' | 'int8' | 'fp8'
    made_by: str  # the command that writes it, for messages


ARTIFACTS: dict[str, ArtifactKind] = {k.name: k for k in [
    ArtifactKind("fp32", DEFAULT_ONNX_NAME, "fp32", "vitexport onnx"),  # the export, checked against PyTorch
    ArtifactKind("fp16", "model.fp16.onnx", "fp16", "vitexport quantize --fp16"),  # LayerNorm/Softmax in FP32
    ArtifactKind("fp16-trt", "model.fp16.trt.onnx", "fp16",  # every op FP16 (LayerNorm's stash FP32): TensorRT
                 "vitexport quantize --fp16 --target tensorrt"),
    ArtifactKind("int8", "model.int8.onnx", "int8", "vitexport quantize --int8"),  # GEMM-input Q/DQ, FP32 rest: CPUs
    ArtifactKind("int8-trt", "model.int8.trt.onnx", "int8",  # GEMM-input Q/DQ, FP16 rest + FP16 scales: TensorRT
                 "vitexport quantize --int8 --target tensorrt"),
    ArtifactKind("fp8", "model.fp8.onnx", "fp8",  # FP8 Q/DQ on GEMM and attention inputs, FP16 rest: TensorRT
                 "vitexport quantize --fp8"),
    ArtifactKind("openvino-fp32", "model.openvino.fp32.xml", "fp32", "vitexport openvino --precision fp32"),
    ArtifactKind("openvino-fp16", "model.openvino.fp16.xml", "fp16",  # weights stored in FP16
                 "vitexport openvino --precision fp16"),
    ArtifactKind("openvino-int8", "model.openvino.int8.xml", "int8", "vitexport openvino --precision int8"),
    # AOTInductor packages of the reference model (vitexport.aoti): PyTorch's compiled CPU path, no ONNX
    ArtifactKind("aoti-fp32", "model.aoti.fp32.pt2", "fp32", "vitexport aoti --precision fp32"),
    ArtifactKind("aoti-bf16", "model.aoti.bf16.pt2", "bf16", "vitexport aoti --precision bf16"),
    ArtifactKind("aoti-int8", "model.aoti.int8.pt2", "int8", "vitexport aoti --precision int8"),  # PT2E INT8
]}

# OpenVINO IR kinds -> the ARTIFACTS kind each is converted from (its weights: the .bin beside the .xml)
IR_SOURCE: dict[str, str] = {"openvino-fp32": "fp32", "openvino-fp16": "fp32", "openvino-int8": "int8"}

# TensorRT engines: plan precision -> the ARTIFACTS kind it is built from. The FP16 and INT8 plans are built from
# graphs that differ only in the GEMMs' precision (int8-trt is fp16-trt with Q/DQ), so their speed compares the
# GEMMs alone; model.fp16.onnx keeps Softmax in FP32, which breaks TensorRT's attention fusion (docs/TENSORRT.md)
PLAN_SOURCE: dict[str, str] = {"fp32": "fp32", "fp16": "fp16-trt", "int8": "int8-trt", "fp8": "fp8"}
PLAN_PRECISIONS = tuple(PLAN_SOURCE)


# model.int8.onnx's weights lie in [-63, 63] (7 bits, right on every CPU) or, made on a CPU that sums INT8 products
# exactly (VNNI, AMX, Arm), in [-127, 127] (precision/qdq.py says why); the manifest's qdq.weight_max says which. A
# file without that record (made before) is stale everywhere, an 8-bit one on a CPU that saturates them:
# verify.check_onnx says so, the precision step remakes it
CPU_INT8_WEIGHT_MAX = 63
CPU_INT8_WEIGHT_MAX_EXACT = 127


def artifact_kind(name: str) -> ArtifactKind:
    try:
        return ARTIFACTS[name]
    except KeyError:
        raise VitexportError(f"Unknown precision {name!r}; choose one of: {', '.join(ARTIFACTS)}.") from None


def check_plan_precision(precision: str) -> str:
    if precision not in PLAN_SOURCE:
        raise VitexportError(f"Unknown precision {precision!r}; choose one of: {', '.join(PLAN_PRECISIONS)}.")
    return precision


# -- digests ------------------------------------------------------------------------------------------------

def external_data_of(onnx_path: Path) -> Path:
    """Where an ONNX file's external weights live (model.onnx -> model.onnx.data)."""
    onnx_path = Path(onnx_path)
    return onnx_path.with_name(onnx_path.name + EXTERNAL_DATA_SUFFIX)


_LOCATION_KEY = b"\x0a\x08location"  # how an external_data entry's key 'location' is serialized


def external_locations(onnx_path: Path) -> list[str]:
    """The external-data files an ONNX file's tensors name, read from its protobuf without loading them. A file
    whose bytes never spell the 'location' key has none, which a scan tells without parsing the graph."""
    import mmap

    with open(onnx_path, "rb") as f:
        try:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                if m.find(_LOCATION_KEY) < 0:
                    return []
        except ValueError:  # an empty file
            return []
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    tensors = list(model.graph.initializer) + [a.t for n in model.graph.node for a in n.attribute if a.HasField("t")]
    return sorted({e.value for t in tensors for e in t.external_data if e.key == "location"})


def external_data_problem(onnx_path: Path) -> str | None:
    """Why an ONNX file's external data may not be read (a location that leaves its folder), or None."""
    folder = Path(onnx_path).parent.resolve()
    for loc in external_locations(onnx_path):
        target = (folder / loc).resolve()
        if Path(loc).is_absolute() or ".." in Path(loc).parts or not target.is_relative_to(folder):
            return f"names external data {loc!r} outside its folder (vitexport reads only inside a model folder)"
    return None


def onnx_digest(onnx_path: Path) -> str:
    """sha256 of an ONNX file, folding in its external data file when it has one."""
    digest = sha256_file(onnx_path)
    data = external_data_of(onnx_path)
    if data.is_file():
        digest = hashlib.sha256(f"{digest}:{sha256_file(data)}".encode()).hexdigest()
    return digest


def ir_weights_of(xml_path: Path) -> Path:
    """The .bin OpenVINO reads with an IR's .xml (same folder, same stem)."""
    return Path(xml_path).with_suffix(IR_WEIGHTS_SUFFIX)


def sidecar_for(plan_path: Path) -> Path:
    plan_path = Path(plan_path)
    return plan_path.with_name(plan_path.name + SIDECAR_SUFFIX)


def plan_name(precision: str) -> str:
    """model.<precision>.plan"""
    return f"model.{precision}.plan"


def precision_from_plan_name(plan_path: Path) -> str | None:
    """'fp16' from 'model.fp16.plan' (or '.engine'); None when the name does not say."""
    parts = Path(plan_path).name.split(".")
    if len(parts) >= 3 and parts[-1] in ("plan", "engine") and parts[-2] in PLAN_SOURCE:
        return parts[-2]
    return None


# -- the folder ---------------------------------------------------------------------------------------------

class ModelFolder:
    """One exported model's folder: paths of every artifact, and its manifest read and written atomically."""

    def __init__(self, path: Path | str, onnx_name: str | None = None) -> None:
        self.path = Path(path)
        self._onnx_name = onnx_name  # the FP32 ONNX's name when known (an export's -o); None: ask the manifest

    def __repr__(self) -> str:
        return f"ModelFolder({str(self.path)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ModelFolder) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    # -- where -----------------------------------------------------------------------------------------
    @classmethod
    def default_for(cls, variant: str, img_size: tuple[int, int], dynamic: bool = False) -> "ModelFolder":
        """models/<variant>-<H>x<W> under the artifact folder ($VITEXPORT_MODELS, default ./models);
        models/<variant>-<H>x<W>-dynamic for an export that takes any image size (H x W: its default size)."""
        return cls(artifacts_dir() / f"{variant}-{img_size[0]}x{img_size[1]}{'-dynamic' if dynamic else ''}")

    @classmethod
    def for_output(cls, output: Path | str) -> "ModelFolder":
        """`--output`: a folder, or a .onnx file path whose folder holds the rest."""
        output = Path(output)
        if output.suffix == ".onnx":
            return cls(output.parent, onnx_name=output.name)
        return cls(output)

    @classmethod
    def containing(cls, path: Path | str) -> "ModelFolder":
        """The folder of a path a user gave: the folder itself, or the one a file lies in."""
        path = Path(path)
        return cls(path if path.is_dir() else path.parent)

    def create(self) -> "ModelFolder":
        """Make the folder (and parents); one sentence when it cannot be made or written to."""
        if self.path.exists() and not self.path.is_dir():
            raise VitexportError(f"Output {self.path} exists and is not a folder.")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise VitexportError(f"Cannot create the output folder {self.path}: {e.strerror or e}.") from None
        if not os.access(self.path, os.W_OK):
            raise VitexportError(f"The output folder {self.path} is not writable.")
        return self

    # -- files -----------------------------------------------------------------------------------------
    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST_NAME

    @property
    def onnx_name(self) -> str:
        """The FP32 ONNX's file name: given, else the manifest's, else model.onnx."""
        if self._onnx_name is not None:
            return self._onnx_name
        if self.has_manifest():
            try:
                return self.read_manifest().onnx
            except VitexportError:  # unreadable: whoever reads the manifest itself says so; the export replaces it
                pass
        return DEFAULT_ONNX_NAME

    def inside(self, path: Path) -> Path:
        """`path` of this folder, refused in one sentence when it is a link that leaves the folder: nothing is read
        or written through it."""
        if path.is_symlink() and not (real := path.resolve()).is_relative_to(self.path.resolve()):
            raise VitexportError(f"{path} is a link to {real}, outside the model folder {self.path}; vitexport "
                                 f"reads and writes only inside it (replace the link with the file).")
        return path

    def decoder(self) -> Path:
        """SAM's decoder graph."""
        return self.inside(self.path / DECODER_NAME)

    def onnx(self, kind: str = "fp32") -> Path:
        """The ONNX file of an artifact kind ('fp32', 'fp16', 'int8', 'int8-trt')."""
        if kind == "fp32":
            return self.inside(self.path / self.onnx_name)
        return self.inside(self.path / artifact_kind(kind).filename)

    def external_data(self, kind: str = "fp32") -> Path:
        return external_data_of(self.onnx(kind))

    def ir_weights(self, kind: str) -> Path:
        """The .bin of an OpenVINO IR kind."""
        return self.inside(ir_weights_of(self.onnx(kind)))

    def rejected(self, kind: str) -> Path:
        """Where a conversion that failed its parity check is kept (model.fp16.rejected.onnx)."""
        name = artifact_kind(kind).filename
        if kind in IR_SOURCE:  # model.openvino.fp16.rejected.xml (its .bin beside it)
            return self.path / (name.removesuffix(".xml") + ".rejected.xml")
        if name.endswith(".pt2"):  # model.aoti.int8.rejected.pt2
            return self.path / (name.removesuffix(".pt2") + ".rejected.pt2")
        return self.path / (name.removesuffix(".onnx") + REJECTED_SUFFIX)

    def plan(self, precision: str) -> Path:
        return self.inside(self.path / plan_name(check_plan_precision(precision)))

    def sidecar(self, precision: str) -> Path:
        return self.inside(sidecar_for(self.plan(precision)))

    def member(self, name: object, what: str) -> Path:
        """A file a record of the folder names (a sidecar's source ONNX): a plain name, not a link out."""
        return self.inside(self.path / plain_name(name, what))

    def plan_source(self, precision: str) -> Path:
        """The ONNX a plan of this precision is built from."""
        return self.onnx(PLAN_SOURCE[check_plan_precision(precision)])

    @property
    def calib_cache_dir(self) -> Path:
        return self.path / CALIB_CACHE_DIR

    def calib_cache(self, key: str) -> Path:
        if self.calib_cache_dir.is_symlink():  # the folder itself may not be a link, even one that stays inside
            raise VitexportError(f"{self.calib_cache_dir} is a link; vitexport reads and writes only inside the "
                                 f"model folder {self.path} (remove the link).")
        return self.inside(self.calib_cache_dir / f"{key}.json")

    def derived_files(self) -> list[Path]:
        """Everything made from the FP32 export: stale (and removed) once the export's bytes change."""
        onnx = [self.onnx(k) for k in ARTIFACTS if k != "fp32"]
        plans = [p for prec in PLAN_PRECISIONS for p in (self.plan(prec), self.sidecar(prec))]
        return onnx + [self.ir_weights(k) for k in IR_SOURCE] + plans

    @property
    def lock_path(self) -> Path:
        return self.path / LOCK_NAME

    @property
    def owner_path(self) -> Path:
        return self.path / OWNER_NAME

    def own_names(self) -> set[str]:
        """Every file name this folder's steps write: a hidden '.<name>.*' beside them is one of their temporaries."""
        onnx_names = {self.onnx_name, DEFAULT_ONNX_NAME}
        names = {MANIFEST_NAME, DECODER_NAME, *onnx_names, *(n + EXTERNAL_DATA_SUFFIX for n in onnx_names)}
        names |= {k.filename for k in ARTIFACTS.values()} | {self.rejected(k).name for k in ARTIFACTS if k != "fp32"}
        names |= {p.name for prec in PLAN_PRECISIONS for p in (self.plan(prec), self.sidecar(prec))}
        return names

    def artifacts(self, plan_order: tuple[str, ...] = PLAN_PRECISIONS) -> list[Path]:
        """The ONNX files, IR files and plans that exist, in table order."""
        files = [self.onnx(k) for k in ARTIFACTS] + [self.ir_weights(k) for k in IR_SOURCE] + \
            [self.plan(p) for p in plan_order]
        return [p for p in files if p.is_file()]

    # -- manifest --------------------------------------------------------------------------------------
    def has_manifest(self) -> bool:
        return self.manifest_path.is_file()

    def read_manifest(self) -> Manifest:
        return read_manifest(self.manifest_path)

    def write_manifest(self, manifest: Manifest) -> Path:
        write_manifest(self.manifest_path, manifest)
        return self.manifest_path

    def record_precision(self, kind: str, record: PrecisionRecord) -> Manifest:
        """Add (or replace) one precision's record in the manifest."""
        manifest = self.read_manifest()
        manifest.precisions[kind] = record
        self.write_manifest(manifest)
        return manifest


# -- a Triton Inference Server model: REPO/<name>/config.pbtxt, labels.txt, <version>/model.onnx | model.plan -----

TRITON_CONFIG = "config.pbtxt"
TRITON_LABELS = "labels.txt"  # one class name per line, in head order (config.pbtxt's label_filename)
TRITON_MODEL_FILES = {"onnx": DEFAULT_ONNX_NAME, "plan": "model.plan"}  # Triton's default file name per format


class TritonModelFolder:
    """One model of a Triton model repository, laid out the way Triton reads it."""

    def __init__(self, path: Path | str, version: int = 1) -> None:
        self.path = Path(path)  # REPO/<name> (or a staging folder with the same layout)
        self.version = version

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def config(self) -> Path:
        return self.path / TRITON_CONFIG

    @property
    def labels(self) -> Path:
        return self.path / TRITON_LABELS

    @property
    def version_dir(self) -> Path:
        return self.path / str(self.version)

    def model(self, fmt: str) -> Path:
        """The model file of a format ('onnx' | 'plan') in the version folder."""
        return self.version_dir / TRITON_MODEL_FILES[fmt]

    def models(self) -> list[Path]:
        """Model files present in any version folder."""
        return sorted(p for name in TRITON_MODEL_FILES.values() for p in self.path.glob(f"*/{name}") if p.is_file())
