"""`vitexport predict`: images through one backend, with the model's own preprocessing, to its top-k classes.

    folder = open_model(None, user_spec("vit_digits_patch4_32"))
    for p in predict(folder, [Path("digit.png")], backend="onnxruntime", precision="int8", top_k=3):
        print(p.image, p.top[0].label, p.top[0].prob)

The ONNX file of the precision is made first when missing (`ensure_artifact`); TensorRT needs its plan built
(`vitexport trt`). Class names come from the manifest's label source (vitexport.model.labels).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from ..artifacts.folder import ModelFolder
from ..artifacts.manifest import Manifest
from ..artifacts.workspace import reading
from ..backends.base import Runner
from ..data.images import IMAGE_SUFFIXES, Skipped, list_images, normalise
from ..data.stream import Decoded, decoded_crops, default_workers
from ..errors import BackendUnavailable, VitexportError
from ..model.labels import class_names
from ..paths import atomic_path, display_path
from ..progress import QUIET, Log

BACKENDS = ("onnxruntime", "pytorch", "openvino", "tensorrt", "aoti")
PRECISIONS = ("fp32", "fp16", "int8", "bf16")  # bf16: PyTorch's autocast or an AOTInductor package's


@dataclass
class ClassScore:
    index: int  # the class index in the model's head
    label: str  # its name (the index as text when the model has no names)
    prob: float  # softmax probability


@dataclass
class Prediction:
    image: str  # the image as the user named it (relative to the working directory when below it)
    top: list[ClassScore]  # best first

    def to_dict(self) -> dict:
        return {"image": self.image, "top": [asdict(c) for c in self.top]}


def collect_images(paths: Sequence[Path | str]) -> list[Path]:
    """Files as given (decoding says whether each is an image) and the images below each folder, in order."""
    files: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise VitexportError(f"{p} does not exist.")
        if p.is_dir():
            skipped = Skipped()
            found = list_images(p, skipped)
            if skipped:
                raise VitexportError(f"{p} holds {len(skipped):,} file(s) that cannot be read safely: "
                                     f"{skipped.details()}; remove or fix them, or name the images to predict.")
            if not found:
                raise VitexportError(f"{p} holds no images ({', '.join(IMAGE_SUFFIXES)}).")
            files += found
        else:
            files.append(p)
    if not files:
        raise VitexportError("No images given.")
    return files


def top_classes(logits: np.ndarray, k: int, names: list[str]) -> list[list[ClassScore]]:
    """Softmax over each row of (B, C) logits, then its k most probable classes."""
    z = logits.astype(np.float64)
    z = np.exp(z - z.max(axis=1, keepdims=True))
    probs = z / z.sum(axis=1, keepdims=True)
    order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    return [[ClassScore(int(i), names[i] if i < len(names) else str(i), float(row[i])) for i in idx]
            for row, idx in zip(probs, order)]


# -- runners -------------------------------------------------------------------------------------------------------

def _runner_factories(folder: ModelFolder, manifest: Manifest, backend: str, precision: str,
                      log: Log, output: str | None = None) -> list[Callable[[], Runner]]:
    """Ways to run the model on `backend` at `precision`, answering with `output` (default: the manifest's
    output_name), best first (a GPU where there is one, then the CPU)."""
    from ..ensure import ensure_artifact
    from ..environment import cuda_gpu

    output = output or manifest.output_name
    io = {"input_name": manifest.input_name, "output_name": output}
    gpu = cuda_gpu() is not None
    if backend == "pytorch":
        if precision == "int8":
            raise VitexportError("PyTorch runs fp32 (or fp16 on a CUDA GPU); run INT8 on onnxruntime, openvino or "
                                 "tensorrt.")
        from ..backends.torch_backend import TorchRunner
        from ..exporter.torch_model import model_from_manifest

        model = model_from_manifest(manifest)
        if output != ("logits" if manifest.num_classes > 0 else "pooled"):  # not the model's own forward
            from ..model.outputs import WithOutputs

            model = WithOutputs(model, (output,))
        devices = ["cuda"] if precision == "fp16" else (["cuda", "cpu"] if gpu else ["cpu"])
        return [lambda d=d: TorchRunner(model, precision, d) for d in devices]
    if backend == "aoti":
        from ..backends.aoti_backend import AotiRunner

        package = ensure_artifact(folder, _kind(backend, precision), log=log).path
        return [lambda: AotiRunner(package, precision, output)]
    _kind(backend, precision)  # bf16 elsewhere: one sentence
    if backend == "tensorrt":
        from ..backends.tensorrt import TensorRTRunner

        return [lambda: TensorRTRunner(folder.plan(precision), output_name=output)]
    path = ensure_artifact(folder, precision, log=log).path
    if backend == "openvino":
        try:
            from ..backends.openvino_backend import OpenVinoRunner
        except ImportError:
            raise BackendUnavailable("This vitexport has no OpenVINO backend.") from None
        return [lambda: OpenVinoRunner(path, precision, **io)]
    from ..backends.ort_backend import OrtRunner

    return [lambda ep=ep: OrtRunner(path, precision, ep, **io) for ep in (["cuda", "cpu"] if gpu else ["cpu"])]


def _kind(backend: str, precision: str) -> str:
    """The folder's artifact kind a backend runs at a precision; one sentence for a pair that has none."""
    if backend == "aoti":
        if precision == "fp16":
            raise VitexportError("An AOTInductor package is fp32, bf16 or int8 (PyTorch's CPU path).")
        from ..aoti.make import aoti_kind

        return aoti_kind(precision)
    if precision == "bf16":
        raise VitexportError("bf16 runs on --backend pytorch (autocast) or --backend aoti (a package).")
    return precision


def open_runner(folder: ModelFolder, backend: str, precision: str, log: Log = QUIET,
                output: str | None = None) -> Runner:
    """A loaded runner of the model in `folder`; BackendUnavailable (one sentence) when none can run here."""
    if backend not in BACKENDS:
        raise VitexportError(f"Unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}.")
    if precision not in PRECISIONS:
        raise VitexportError(f"Unknown precision {precision!r}; choose one of: {', '.join(PRECISIONS)}.")
    reasons = []
    for make in _runner_factories(folder, folder.read_manifest(), backend, precision, log, output):
        runner = make()
        try:
            runner.load()
        except BackendUnavailable as e:
            reasons.append(f"{runner.name}: {str(e).rstrip('.')}")
            continue
        log.info(f"Running on {runner.name}.")
        return runner
    raise BackendUnavailable(f"{backend} cannot run the {precision.upper()} model here ({'; '.join(reasons)}).")


# -- the job ---------------------------------------------------------------------------------------------------------

def iter_predictions(folder: ModelFolder, images: Sequence[Path | str], *, backend: str = "onnxruntime",
                     precision: str = "fp32", top_k: int = 5, batch: int = 8, workers: int | None = None,
                     log: Log = QUIET) -> Iterator[Prediction]:
    """The top-k classes of every image (files, or folders searched recursively), one Prediction at a time: images
    are decoded by a pool of threads a few batches ahead, so memory holds a few batches whatever their number."""
    if top_k < 1:
        raise VitexportError(f"--top-k must be at least 1, not {top_k}.")
    manifest = folder.read_manifest()
    if manifest.dense_task is not None:
        raise VitexportError(f"{folder.path} holds a {manifest.dense_task} model: its maps are written as files; "
                             f"give --out-dir DIR.")
    if manifest.num_classes <= 0:
        raise VitexportError(f"{folder.path} holds a feature extractor (no classification head): it has no classes "
                             f"to predict; write its embeddings with --embeddings OUT.npy or --jsonl.")
    if manifest.checkpoint is None:
        log.warn(f"{folder.path} holds random weights: its classes are meaningless.")
    names = class_names(manifest)
    k = min(top_k, manifest.num_classes)
    for files, out in _outputs(folder, manifest, images, backend, precision, batch, workers, log):
        yield from (Prediction(display_path(f), top) for f, top in zip(files, top_classes(out, k, names)))


def iter_embeddings(folder: ModelFolder, images: Sequence[Path | str], *, backend: str = "onnxruntime",
                    precision: str = "fp32", batch: int = 8, workers: int | None = None,
                    log: Log = QUIET) -> Iterator[tuple[list[Path], np.ndarray]]:
    """The embeddings of every image, batch by batch: (files, (B, D)): a model's `pooled` output (`onnx --outputs`),
    or a feature extractor's (`--num-classes 0`) one output."""
    manifest = folder.read_manifest()
    if "pooled" not in manifest.output_names and manifest.num_classes > 0:
        raise VitexportError(f"{folder.path} holds a classifier ({manifest.num_classes} classes) whose output is "
                             f"logits, not embeddings; export it with --outputs logits,pooled (or --num-classes 0).")
    output = "pooled" if "pooled" in manifest.output_names else manifest.output_name
    # SAM's image embedding keeps its (C, h, w) shape: what an application running the decoder itself reads
    yield from _outputs(folder, manifest, images, backend, precision, batch, workers, log, output,
                        dense_shape=output == "image_embeddings")


def _outputs(folder: ModelFolder, manifest: Manifest, images: Sequence[Path | str], backend: str, precision: str,
             batch: int, workers: int | None, log: Log, output: str | None = None,
             dense_shape: bool = False) -> Iterator[tuple[list[Path], np.ndarray]]:
    """The model's outputs, batch by batch, with their files: images are decoded by a pool of threads a few
    batches ahead, so memory holds a few batches whatever their number. Each output flattened per image, or as
    it is (dense_shape: a dense model's maps). A long sequence runs fewer images a call (validate.eval_batch: SAM
    at 1024, one), so its attention scores do not grow with the batch."""
    from ..validate.evaluate import eval_batch

    pp, batch = manifest.preprocess, max(1, min(batch, eval_batch(manifest.config)))
    files = collect_images(images)
    crops = _every_crop(decoded_crops(files, pp, workers or default_workers(), chunk=batch))
    first = next(crops)  # a bad first image fails before any runner is loaded
    if backend in ("onnxruntime", "openvino", "aoti") and precision in PRECISIONS:
        from ..ensure import ensure_artifact

        # a missing FP16/INT8 file (or package) is made under the folder's writer lock first: under the reader's
        # lock below, ensure_artifact only checks it (a lock held for reading cannot become a writer's)
        ensure_artifact(folder, _kind(backend, precision), log=log)
    with reading(folder, log):  # no other run replaces the file between its check and its loading
        runner = open_runner(folder, backend, precision, log, output)
    try:
        with log.bar("predicting", len(files)) as advance:
            for start, chunk in zip(range(0, len(files), batch), itertools.chain([first], crops)):
                out = np.asarray(runner.infer_all(normalise(chunk, pp), chunk=batch), np.float32)
                yield files[start:start + batch], out if dense_shape else out.reshape(len(out), -1)
                advance(len(chunk))
    finally:
        runner.close()


def write_embeddings(batches: Iterator[tuple[list[Path], np.ndarray]], count: int, out: Path) -> tuple[Path, Path]:
    """OUT.npy, an (N, D) float32 array (SAM: (N, C, h, w)) written as the batches come (its header first: N is
    known), and the
    sidecar OUT.files.txt, its rows' images one per line; both renamed into place at the end, never half-written."""
    import numpy.lib.format as npformat

    listing = out.with_suffix(".files.txt")
    with atomic_path(out) as tmp, atomic_path(listing) as tmp_list, open(tmp, "wb") as f, \
            open(tmp_list, "w", encoding="utf-8") as names:
        rows = 0
        for files, emb in batches:
            if rows == 0:
                npformat.write_array_header_1_0(f, {"descr": npformat.dtype_to_descr(np.dtype("<f4")),
                                                    "fortran_order": False, "shape": (count, *emb.shape[1:])})
            f.write(np.ascontiguousarray(emb, "<f4").tobytes())
            names.writelines(f"{display_path(p)}\n" for p in files)
            rows += len(emb)
        if rows != count:
            raise VitexportError(f"{rows} embeddings were computed for {count} images; nothing was written.")
    return out, listing


def _every_crop(chunks: Iterator[Decoded]) -> Iterator[np.ndarray]:
    """The crops of every image asked for: one the user named that cannot be decoded is its one sentence (a
    prediction is asked of each file, so none is left out quietly)."""
    for crops, _, errors in chunks:
        if errors:
            raise errors[0]
        yield crops


def predict(folder: ModelFolder, images: Sequence[Path | str], **kw) -> list[Prediction]:
    """Every Prediction of iter_predictions, as a list."""
    return list(iter_predictions(folder, images, **kw))


def to_json(predictions: list[Prediction]) -> str:
    return json.dumps([p.to_dict() for p in predictions], indent=2)


def to_table(predictions: Sequence[Prediction], max_label: int = 48) -> str:
    """Per image: its path, then one row per class: rank, class index, label, probability."""
    label_width = min(max_label, max([5] + [len(c.label) for p in predictions for c in p.top]))
    return "\n".join(table_block(p, label_width) for p in predictions)


def table_block(p: Prediction, label_width: int) -> str:
    """One image's lines of the table (printed as each prediction comes)."""
    lines = [p.image, f"  {'rank':>4}  {'class':>5}  {'label':<{label_width}}  {'prob':>7}"]
    for rank, c in enumerate(p.top, 1):
        label = c.label if len(c.label) <= label_width else c.label[:label_width - 3] + "..."
        lines.append(f"  {rank:>4}  {c.index:>5}  {label:<{label_width}}  {c.prob:>7.4f}")
    return "\n".join(lines)


def label_width(folder: ModelFolder, max_label: int = 48) -> int:
    """The label column's width for a streamed table: that of the model's longest class name, capped."""
    return min(max_label, max([5] + [len(n) for n in class_names(folder.read_manifest())]))
