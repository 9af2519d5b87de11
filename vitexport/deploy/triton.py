"""`vitexport triton`: one model of a folder as a Triton Inference Server model repository entry.

    REPO/NAME/config.pbtxt     platform, max_batch_size, inputs/outputs, dynamic_batching, instance_group
    REPO/NAME/labels.txt       class names, wired to the output through label_filename (classification extension)
    REPO/NAME/1/model.onnx     the ONNX of the precision (onnxruntime_onnx; or Triton's OpenVINO backend, the
                               CPU path the bench finds fastest for an INT8 graph) ...
    REPO/NAME/1/model.plan     ... or its TensorRT plan (tensorrt_plan)

With `uint8_input`, the ONNX takes uint8 pixels (B, 3, H, W), already resized and center-cropped
(data.resize_and_crop), and normalises them inside the graph, so clients need not know the mean and std.

Names, data types and dims come from the model file: the ONNX graph itself, or for a plan the ONNX it was built
from (a strongly typed build keeps its interface) named by the plan's sidecar, whose profile gives the largest
batch. The entry is written in a staging folder and renamed into place, so Triton never sees half of it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

from ..artifacts.folder import TRITON_LABELS, TRITON_MODEL_FILES, ModelFolder, TritonModelFolder, external_data_of
from ..artifacts.manifest import Manifest
from ..artifacts.verify import require
from ..artifacts.workspace import reading
from ..data.preprocess import Preprocess
from ..errors import VitexportError
from ..model.labels import class_names
from ..paths import FILE_SYSTEM_LIMITS, sha256_file, write_error
from ..progress import QUIET, Log


@dataclass(frozen=True)
class Format:
    """What a --format puts in the entry."""

    runtime: str  # Triton's platform, or the backend's name where it has no platform (`backend:`, its file named)
    file: str  # the model file in the version folder (TritonModelFolder.model): 'onnx' | 'plan'
    instances: str  # the instance_group kind
    backend: bool = False


FORMATS = {"onnx": Format("onnxruntime_onnx", "onnx", "KIND_AUTO"), "plan": Format("tensorrt_plan", "plan", "KIND_GPU"),
           "openvino": Format("openvino", "onnx", "KIND_CPU", backend=True)}  # OpenVINO's backend reads the ONNX
DEFAULT_MAX_BATCH = 32  # for an ONNX with a symbolic batch axis (a plan's comes from its profile)
# ONNX TensorProto element types -> Triton data types
TRITON_TYPES = {1: "TYPE_FP32", 2: "TYPE_UINT8", 3: "TYPE_INT8", 4: "TYPE_UINT16", 5: "TYPE_INT16", 6: "TYPE_INT32",
                7: "TYPE_INT64", 8: "TYPE_STRING", 9: "TYPE_BOOL", 10: "TYPE_FP16", 11: "TYPE_FP64",
                12: "TYPE_UINT32", 13: "TYPE_UINT64", 16: "TYPE_BF16"}


@dataclass
class TritonOptions:
    precision: str = "fp32"  # 'fp32' | 'fp16' | 'int8'
    format: str = "onnx"  # 'onnx' | 'plan' | 'openvino' (the ONNX file, on Triton's OpenVINO backend)
    name: str | None = None  # the model's name in the repository; None: <variant>-<precision>[-plan|-openvino]
    max_batch: int | None = None  # None: 32 for an ONNX, the profile's largest batch for a plan
    instances: int = 1  # model instances per device (instance_group count)
    force: bool = False  # replace REPO/NAME when it holds another model
    uint8_input: bool = False  # ONNX only: uint8 pixels in, the normalisation inside the graph


@dataclass
class TensorConfig:
    name: str
    data_type: str  # 'TYPE_FP32', ...
    dims: list[int]  # without the batch axis when the model is batched; -1: any size


@dataclass
class TritonModel:
    folder: TritonModelFolder  # REPO/NAME, written
    platform: str
    max_batch_size: int  # 0: the model takes no batch axis
    inputs: list[TensorConfig]
    outputs: list[TensorConfig]
    source: Path  # the model file copied in
    config_text: str  # config.pbtxt
    decoder: TritonModel | None = None  # Segment Anything: the decoder graph's entry, REPO/NAME-decoder


# -- the model's interface ---------------------------------------------------------------------------------------

def graph_io(onnx_path: Path) -> tuple[list[TensorConfig], list[TensorConfig], bool]:
    """(inputs, outputs, batched) of an ONNX graph; batched: every tensor's first axis is symbolic."""
    import onnx

    try:
        graph = onnx.load(str(onnx_path), load_external_data=False).graph
    except Exception as e:  # a damaged file: protobuf's DecodeError, or OSError
        raise VitexportError(f"{onnx_path} is not a readable ONNX model ({e.__class__.__name__}).") from None
    init = {i.name for i in graph.initializer}
    tensors = [[v for v in graph.input if v.name not in init], list(graph.output)]
    shapes = [[[d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim] for v in vs]
              for vs in tensors]
    batched = all(shape and not v.type.tensor_type.shape.dim[0].HasField("dim_value")
                  for vs, ss in zip(tensors, shapes) for v, shape in zip(vs, ss))
    out: list[list[TensorConfig]] = []
    for vs, ss in zip(tensors, shapes):
        configs = []
        for v, shape in zip(vs, ss):
            elem = v.type.tensor_type.elem_type
            if elem not in TRITON_TYPES:
                raise VitexportError(f"{onnx_path.name}: {v.name} has ONNX element type {elem}, which Triton has no "
                                     f"type for.")
            configs.append(TensorConfig(v.name, TRITON_TYPES[elem], shape[1:] if batched else shape))
        out.append(configs)
    return out[0], out[1], batched


def render_config(name: str, fmt: Format, max_batch_size: int, inputs: list[TensorConfig],
                  outputs: list[TensorConfig], instances: int, label_output: str | None) -> str:
    """config.pbtxt in protobuf text format (Triton's ModelConfig)."""

    def tensor(t: TensorConfig, labels: bool) -> str:
        label = f'\n    label_filename: "{TRITON_LABELS}"' if labels else ""
        return (f'  {{\n    name: "{t.name}"\n    data_type: {t.data_type}\n'
                f'    dims: [ {", ".join(map(str, t.dims))} ]{label}\n  }}')

    runtime = [f'backend: "{fmt.runtime}"', f'default_model_filename: "{TRITON_MODEL_FILES[fmt.file]}"'] \
        if fmt.backend else [f'platform: "{fmt.runtime}"']
    lines = [f'name: "{name}"', *runtime, f"max_batch_size: {max_batch_size}",
             "input [\n" + ",\n".join(tensor(t, False) for t in inputs) + "\n]",
             "output [\n" + ",\n".join(tensor(t, t.name == label_output) for t in outputs) + "\n]"]
    if max_batch_size > 0:
        lines.append("dynamic_batching { }")
    lines.append(f"instance_group [\n  {{\n    count: {instances}\n    kind: {fmt.instances}\n  }}\n]")
    return "\n".join(lines) + "\n"


def pixel_input_graph(src: Path, dst: Path, pp: Preprocess) -> None:
    """Write the graph of `src` behind a uint8 input of the same name and shape: Cast, then x / (255 std) - mean / std,
    which is data.preprocess_image's (x / 255 - mean) / std."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(src))  # external data too: the file written holds the whole model
    graph = model.graph
    old = graph.input[0]
    name, elem = old.name, old.type.tensor_type.elem_type
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    for node in graph.node:
        node.input[:] = [f"{name}_normalised" if x == name else x for x in node.input]
    mean, std = (np.asarray(v, np.float64).reshape(1, 3, 1, 1) for v in (pp.mean, pp.std))
    graph.initializer.extend([numpy_helper.from_array((1.0 / (255.0 * std)).astype(dtype), f"{name}_scale"),
                              numpy_helper.from_array((mean / std).astype(dtype), f"{name}_shift")])
    steps = [helper.make_node("Cast", [name], [f"{name}_float"], to=elem, name="pixels_cast"),
             helper.make_node("Mul", [f"{name}_float", f"{name}_scale"], [f"{name}_scaled"], name="pixels_scale"),
             helper.make_node("Sub", [f"{name}_scaled", f"{name}_shift"], [f"{name}_normalised"], name="pixels_shift")]
    nodes = steps + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    shape = [d.dim_param or d.dim_value for d in old.type.tensor_type.shape.dim]
    inputs = [helper.make_tensor_value_info(name, TensorProto.UINT8, shape)] + list(graph.input)[1:]
    del graph.input[:]
    graph.input.extend(inputs)
    external = external_data_of(src).is_file()
    onnx.save(model, str(dst), save_as_external_data=external, all_tensors_to_one_file=True,
              location=external_data_of(dst).name)


# -- which file --------------------------------------------------------------------------------------------------

def _onnx_source(folder: ModelFolder, opts: TritonOptions, log: Log) -> tuple[Path, Path, int | None]:
    """(model file, the ONNX describing its interface, the largest batch it takes or None: any)."""
    from ..ensure import ensure_artifact

    path = ensure_artifact(folder, opts.precision, log=log).path
    return path, path, None


def _plan_source(folder: ModelFolder, opts: TritonOptions, log: Log) -> tuple[Path, Path, int | None]:
    """The plan (built when missing or made from an earlier ONNX), its source ONNX and its profile's max batch."""
    from ..artifacts.sidecar import read_sidecar
    from ..artifacts.verify import check_plan
    from ..ensure import build_plan
    from ..tensorrt_engine.options import BuildOptions

    plan, sidecar_path = folder.plan(opts.precision), folder.sidecar(opts.precision)
    sidecar = read_sidecar(sidecar_path) if plan.is_file() and sidecar_path.is_file() else None
    # built from an earlier ONNX, or not the plan its sidecar describes: rebuilt, never copied into the repository
    stale = sidecar is not None and not check_plan(folder, opts.precision).ok
    if sidecar is None or stale:
        log.info(f"{'Rebuilding' if stale else 'Building'} {plan.name} for the repository.")
        biggest = opts.max_batch or DEFAULT_MAX_BATCH
        result = build_plan(folder, BuildOptions(precision=opts.precision, min_batch=1,
                                                 opt_batch=min(8, biggest), max_batch=biggest), log=log)
        sidecar, source = result.sidecar, result.onnx_path
    else:
        source = folder.member(sidecar["source_onnx"], sidecar_path.name)  # check_plan: there and current
    mn, mx = sidecar["profile"]["min"][0], sidecar["profile"]["max"][0]
    if mn > 1:
        raise VitexportError(f"{plan.name} takes batches of {mn} to {mx}, but Triton sends batches from 1; rebuild "
                             f"it with `vitexport trt {folder.path} --{opts.precision} --min-batch 1`.")
    if opts.max_batch is not None and opts.max_batch > mx:
        raise VitexportError(f"{plan.name} takes batches up to {mx}; rebuild it with `vitexport trt {folder.path} "
                             f"--{opts.precision} --max-batch {opts.max_batch}` or ask for --max-batch {mx} or less.")
    return plan, source, int(mx)


# -- writing -----------------------------------------------------------------------------------------------------

def _check_name(name: str) -> str:
    if not name or name in (".", "..") or any(c in name for c in "/\\") or name.startswith("."):
        raise VitexportError(f"{name!r} cannot be a Triton model name (a folder name, not starting with '.').")
    return name


def _check_existing(target: TritonModelFolder, model_sha: str, force: bool) -> None:
    """REPO/NAME may be replaced when it is absent, empty, holds this same model file, or --force says so."""
    if not target.path.exists():
        return
    if not target.path.is_dir():
        raise VitexportError(f"{target.path} exists and is not a folder.")
    present = target.models()
    same = bool(present) and all(sha256_file(p) == model_sha for p in present)
    if force or same or not any(target.path.iterdir()):
        return
    raise VitexportError(f"{target.path} already holds another model; pass --force to replace it, or --name to "
                         f"write this one beside it.")


@contextmanager
def _writing(final: Path, staging: Path | None = None) -> Iterator[None]:
    """A write the file system refuses (full disk, quota, file-size limit, read-only), or a write() that names no
    file, is one sentence naming `final`, the file as it will lie in the repository: not its staged copy, nor the
    file it is copied from (which shutil names). The staging folder is removed first, so that the space a full
    disk has left is said without it."""
    try:
        yield
    except OSError as e:
        if e.errno not in FILE_SYSTEM_LIMITS and e.filename is not None:
            raise
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        raise write_error(final, e) from e


def _stage_model(staging: TritonModelFolder, target: TritonModelFolder, opts: TritonOptions, model: Path,
                 pp: Preprocess) -> Path:
    """The model file in the staging folder: a copy (an ONNX keeps its external data's name beside it), or the
    graph behind a uint8 input."""
    fmt = FORMATS[opts.format].file
    staged = staging.model(fmt)
    with _writing(target.model(fmt), staging.path):
        staging.version_dir.mkdir(parents=True)
        if opts.uint8_input:
            pixel_input_graph(model, staged, pp)
            return staged
        shutil.copyfile(model, staged)
    data = external_data_of(model)
    if fmt == "onnx" and data.is_file():
        with _writing(target.version_dir / data.name, staging.path):
            shutil.copyfile(data, staging.version_dir / data.name)
    return staged


def _swap_in(staging: Path, target: Path) -> None:
    """Rename the staged folder into place; a previous one is moved aside first and removed after."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        old.rmdir()
        os.replace(target, old)
    try:
        os.replace(staging, target)
    except OSError:
        if old is not None:
            os.replace(old, target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_triton(folder: ModelFolder, repo: Path | str, opts: TritonOptions, log: Log = QUIET) -> TritonModel:
    """Write REPO/NAME for the model in `folder` (see the module's docstring); a Segment Anything folder's decoder
    graph goes beside it as REPO/NAME-decoder (ONNX, FP32: the client calls the encoder once an image, then the
    decoder once a prompt). Every entry is staged before any is renamed into place."""
    if opts.format not in FORMATS:
        raise VitexportError(f"Unknown format {opts.format!r}; choose one of: {', '.join(FORMATS)}.")
    if opts.instances < 1 or (opts.max_batch is not None and opts.max_batch < 1):
        raise VitexportError("--instances and --max-batch must be at least 1.")
    if opts.uint8_input and opts.format == "plan":
        raise VitexportError("--uint8-input is for --format onnx or openvino; a plan's input is the one it was built "
                             "with.")
    manifest = folder.read_manifest()
    repo = Path(repo)
    name = _check_name(opts.name or f"{manifest.variant}-{opts.precision}" + ("" if opts.format == "onnx" else
                                                                                f"-{opts.format}")
                       + ("-uint8" if opts.uint8_input else ""))
    if repo.exists() and not repo.is_dir():
        raise VitexportError(f"{repo} exists and is not a folder.")
    model, describing, plan_max = (_plan_source if opts.format == "plan" else _onnx_source)(folder, opts, log)
    manifest = folder.read_manifest()  # with the record of a file just made for the entry
    repo.mkdir(parents=True, exist_ok=True)
    staged: list[tuple[TritonModelFolder, TritonModel]] = []
    try:
        staged.append(_stage_entry(folder, manifest, repo / name, opts, model, describing, plan_max,
                                   f"plan:{opts.precision}" if opts.format == "plan" else opts.precision, log))
        if manifest.decoder is not None:
            decoder = folder.decoder()
            dec_opts = replace(opts, format="onnx", uint8_input=False)
            staged.append(_stage_entry(folder, manifest, repo / f"{name}-decoder", dec_opts, decoder, decoder, None,
                                       "decoder", log))
        for staging, entry in staged:
            _swap_in(staging.path, entry.folder.path)
    finally:
        for staging, _ in staged:
            shutil.rmtree(staging.path, ignore_errors=True)
    for _, entry in staged:
        log.info(f"Wrote {entry.folder.path} ({entry.platform}, max batch {entry.max_batch_size}).")
    result = staged[0][1]
    result.decoder = staged[1][1] if len(staged) > 1 else None
    return result


def _stage_entry(folder: ModelFolder, manifest: Manifest, path: Path, opts: TritonOptions, model: Path,
                 describing: Path, plan_max: int | None, kind: str, log: Log) -> tuple[TritonModelFolder, TritonModel]:
    """REPO/NAME staged in a folder beside it (removed again when anything fails): the model file of `kind`, once
    it verifies, its config and labels; the staging folder and the entry as it will be."""
    target = TritonModelFolder(path)
    with _writing(target.path):
        staging = TritonModelFolder(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".staging", dir=path.parent))
    try:
        with reading(folder, log):  # no other run replaces the file between its check and its copy
            require(folder, kind, manifest)
            staged = _stage_model(staging, target, opts, model, manifest.preprocess)
        _check_existing(target, sha256_file(staged), opts.force)
        fmt = FORMATS[opts.format]
        inputs, outputs, batched = graph_io(staged if fmt.file == "onnx" else describing)
        if kind == "decoder":  # whole tensors, as SAM's own graph takes them (has_mask_input (B,) has no dims but
            # the batch, and requests of other point counts are never batched together anyway)
            inputs, outputs = ([replace(t, dims=[-1, *t.dims]) for t in ts] for ts in (inputs, outputs))
            batched = False
        # a graph with a fixed batch axis gets max_batch_size 0: Triton passes whole tensors through
        max_batch = (opts.max_batch or plan_max or DEFAULT_MAX_BATCH) if batched else 0
        labels = class_names(manifest) if kind != "decoder" else []
        label_output = next((o.name for o in outputs if batched and o.dims == [len(labels)]), None)
        config = render_config(path.name, fmt, max_batch, inputs, outputs, opts.instances,
                               label_output if labels else None)
        if labels and label_output:
            with _writing(target.labels, staging.path):
                staging.labels.write_text("\n".join(labels) + "\n")
        with _writing(target.config, staging.path):
            staging.config.write_text(config)
    except BaseException:
        shutil.rmtree(staging.path, ignore_errors=True)
        raise
    return staging, TritonModel(target, fmt.runtime, max_batch, inputs, outputs, model, config)
