"""PyTorch -> ONNX: a symbolic batch axis, readable node names, the preprocessing in the metadata, written atomically.

Models over protobuf's 2 GB cap keep their weights in an external data file beside the graph
(`model.onnx.data`). Graph and data are written to temporaries, checked, and renamed into place data first,
so a reader never sees a graph without its weights and a failed check never replaces a good model.
"""

from __future__ import annotations

import json
import logging
import warnings
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

import torch

from ..version import __version__
from ..artifacts.folder import external_data_of
from ..data.preprocess import Preprocess
from ..errors import VitexportError
from ..model.spec import DEFAULT_OPSET, MIN_OPSET
from ..model.outputs import WithOutputs
from ..model.vit import VisionTransformer
from ..paths import atomic_path
from ..tensorrt_engine.graph_rules import describe, rule_breakers

INPUT_NAME = "pixel_values"
OUTPUT_NAME = "logits"
PROTOBUF_LIMIT = 2 * 1024**3 - 64 * 1024**2  # stay clear of protobuf's 2 GiB cap: larger models use external data


def _scope_of(node) -> str:
    """The module path a node came from ('blocks.0.attn.qkv'), read from the exporter's metadata."""
    for p in node.metadata_props:
        if p.key == "namespace":
            mods = [part.split(":")[0].strip() for part in p.value.split("/")[:-1]]
            mods = [m for m in mods if m]
            scope = mods[-1] if mods else ""
            # a model exported through model.outputs.WithOutputs: its modules' names as the model's own; a dense
            # model's backbone's as the family model's ('blocks.3.attn.qkv'), so every rule that reads node names
            # (--exclude-block, sensitivity groups, fusion) reads them alike; its head's under 'neck.' and 'head.'
            return "" if scope == "model" else scope.removeprefix("model.").removeprefix("backbone.")
    return ""


def _tidy_graph(model_proto) -> None:
    """Readable, stable node names ('blocks.3.mlp.fc1/MatMul') and no exporter metadata (it holds local paths)."""
    seen: dict[str, int] = {}
    for node in model_proto.graph.node:
        scope = _scope_of(node)
        base = f"{scope}/{node.op_type}" if scope else node.op_type
        count = seen.get(base, 0)
        seen[base] = count + 1
        node.name = base if count == 0 else f"{base}_{count}"
        del node.metadata_props[:]
    for vi in list(model_proto.graph.input) + list(model_proto.graph.output):
        del vi.metadata_props[:]
    del model_proto.metadata_props[:]


def onnx_metadata(variant: str, preprocess: Preprocess, num_classes: int, pos_embed_interp: str,
                  img_size_range=None) -> dict[str, str]:
    """What a runtime needs to feed the graph, stored in the ONNX file itself."""
    dynamic = {} if img_size_range is None else {"img_size_range": json.dumps([list(s) for s in img_size_range])}
    return {**dynamic, "vitexport.version": __version__, "vitexport.variant": variant,
            "vitexport.preprocess": json.dumps(preprocess.to_dict()),
            "input_size": json.dumps(list(preprocess.input_size)), "mean": json.dumps(list(preprocess.mean)),
            "std": json.dumps(list(preprocess.std)), "crop_pct": str(preprocess.crop_pct),
            "interpolation": preprocess.interpolation, "crop_mode": preprocess.crop_mode,
            "num_classes": str(num_classes),
            "pos_embed_interp": pos_embed_interp}


@contextmanager
def quiet_exporter() -> Iterator[None]:
    """torch.onnx's exporter without its warnings and logs (it logs a failed conversion to another opset with a
    traceback, then carries on with its own opset), gradients off."""
    quiet = [logging.getLogger(name) for name in ("onnxscript", "torch.onnx")]
    levels = [q.level for q in quiet]
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        for q in quiet:
            q.setLevel(logging.CRITICAL)
        try:
            yield
        finally:
            for q, level in zip(quiet, levels):
                q.setLevel(level)


def _trace(model: VisionTransformer, opset: int, example_batch: int, img_size_range=None,
           outputs: tuple[str, ...] = (OUTPUT_NAME,)):
    """The model as an ONNX ModelProto with a symbolic batch axis (and symbolic height and width, multiples of the
    patch size within `img_size_range`, for a dynamic-size model), one named output per entry of `outputs`
    (model.outputs)."""
    model = WithOutputs(model.eval(), outputs) if tuple(outputs) != (OUTPUT_NAME,) or model.cfg.num_classes <= 0 \
        else model.eval()
    model.set_fused_attn(False)  # explicit MatMul/Softmax: what every runtime and quantizer understands
    inner = getattr(model, "model", model)
    if hasattr(inner, "prepare_export"):  # the same function in the form runtimes fuse; tables from the final weights
        inner.prepare_export()
    cfg = model.cfg
    x = torch.randn(example_batch, cfg.in_chans, *cfg.img_size)
    batch = torch.export.Dim("batch", min=1, max=65536)
    axes = {0: batch}
    if cfg.dynamic_img_size:
        (h0, w0), (h1, w1) = img_size_range
        (ph, pw) = cfg.patch_size
        axes[2] = ph * torch.export.Dim("grid_h", min=h0 // ph, max=h1 // ph)
        axes[3] = pw * torch.export.Dim("grid_w", min=w0 // pw, max=w1 // pw)
    with quiet_exporter():
        program = torch.onnx.export(
            model, (x,), dynamo=True, input_names=[INPUT_NAME], output_names=list(outputs),
            dynamic_shapes={"x": axes}, opset_version=opset, optimize=True, verbose=False,
        )
    got = {o.domain: o.version for o in program.model_proto.opset_import}.get("", opset)
    if got != opset:
        raise VitexportError(f"--opset {opset} is out of reach: torch.onnx's exporter could not convert this graph "
                             f"to it (the graph stays at opset {got}); use a lower --opset (default {DEFAULT_OPSET}).")
    proto = program.model_proto
    if breakers := rule_breakers(proto):
        raise VitexportError(f"The exported graph has {describe(breakers)}; this is a bug in vitexport's model, "
                             f"please report it with the model's name.")
    if cfg.dynamic_img_size:
        _name_image_axes(proto)
    return proto


def _name_image_axes(proto) -> None:
    """'height' and 'width' for the input's symbolic image axes (the exporter writes '16*grid_h')."""
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    for i, name in ((2, "height"), (3, "width")):
        if dims[i].dim_param:
            old = dims[i].dim_param
            for vi in list(proto.graph.input) + list(proto.graph.value_info) + list(proto.graph.output):
                for d in vi.type.tensor_type.shape.dim:
                    if d.dim_param == old:
                        d.dim_param = name


def export_onnx(model: VisionTransformer, out_path: Path, opset: int = DEFAULT_OPSET,
                metadata: dict[str, str] | None = None, example_batch: int = 2, img_size_range=None,
                outputs: tuple[str, ...] = (OUTPUT_NAME,)) -> Path:
    """Export with a symbolic batch axis to `out_path` atomically (external data beside it for > 2 GB models)."""
    with staged_onnx(model, out_path, opset, metadata, example_batch, img_size_range, outputs):
        pass
    return Path(out_path)


@contextmanager
def staged_onnx(model: VisionTransformer, out_path: Path, opset: int = DEFAULT_OPSET,
                metadata: dict[str, str] | None = None, example_batch: int = 2,
                img_size_range=None, outputs: tuple[str, ...] = (OUTPUT_NAME,)) -> Iterator[Path]:
    """Export to a temporary beside `out_path` and yield it; it replaces `out_path` only if the block succeeds.

    The block checks the temporary (ONNX Runtime against PyTorch); raising there keeps the previous file.
    """
    if opset < MIN_OPSET:
        raise VitexportError(f"--opset {opset} is too old: LayerNormalization needs opset {MIN_OPSET} or newer.")
    if example_batch < 2:
        raise VitexportError("The example batch must be at least 2 (size-1 dimensions get specialised).")
    out_path, data_path = Path(out_path), external_data_of(out_path)
    proto = _trace(model, opset, example_batch, img_size_range, outputs)
    _tidy_graph(proto)
    for k, v in (metadata or {}).items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = k, v
    proto.producer_name, proto.producer_version = "vitexport", __version__
    external = sum(p.numel() * p.element_size() for p in model.state_dict().values()) > PROTOBUF_LIMIT
    with ExitStack() as stack:
        tmp = stack.enter_context(atomic_path(out_path, suffix=".onnx"))
        # entered last, so renamed first: the data is in place before the graph that needs it
        tmp_data = stack.enter_context(atomic_path(data_path, suffix=".data")) if external else None
        _save(proto, tmp, tmp_data)
        del proto  # the weights' bytes (2.5 GB for SAM ViT-H) are on disk now, not needed during the check
        yield tmp
        if tmp_data is not None:
            _relink_external_data(tmp, data_path.name)
    if not external and data_path.exists():
        data_path.unlink()  # left by an earlier, larger export of this name


@contextmanager
def _writes(path: Path) -> Iterator[None]:
    """A write() that fails names no file: give it `path` (a temporary), so that its atomic_path names the file it
    is for, graph or external data, in one sentence (a full disk: with the file system)."""
    try:
        yield
    except OSError as e:
        if e.filename is None:
            e.filename = str(path)
        raise


def _save(proto, path: Path, data_path: Path | None) -> None:
    """Write (and check) a graph; its weights go to `data_path` first when given (onnx.save_model's own steps)."""
    import onnx
    from onnx.external_data_helper import convert_model_to_external_data, write_external_data_tensors

    try:
        if data_path is not None:
            convert_model_to_external_data(proto, all_tensors_to_one_file=True, location=data_path.name,
                                           size_threshold=1024)
            with _writes(data_path):
                write_external_data_tensors(proto, str(path.parent))
        with _writes(path):
            onnx.save_model(proto, path)
        onnx.checker.check_model(str(path))  # by path: works for external data
    except onnx.checker.ValidationError as e:
        raise VitexportError(f"The exported ONNX failed onnx.checker: {str(e).splitlines()[0]}") from None


def _relink_external_data(onnx_path: Path, location: str) -> None:
    """Point the tensors of a written graph at the final data file name."""
    import onnx

    proto = onnx.load(str(onnx_path), load_external_data=False)
    for init in proto.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = location
    with _writes(onnx_path):
        onnx.save_model(proto, str(onnx_path))
