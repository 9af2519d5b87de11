"""A candidate against the reference over every image of a set, batch by batch: the inputs come from the run's
InputCache, the reference's outputs either from running it in step (a held-out check: two sessions, one batch at
a time) or from its OutputStore (the bench: the reference ran first), and only per-image figures are kept."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..data.stream import ImageSet, InputCache, OutputStore
from ..errors import VitexportError
from ..parity.accumulate import ParityAccumulator, Truth
from ..parity.compare import ParityStats
from ..progress import QUIET, Log

Infer = Callable[[np.ndarray], np.ndarray]  # (B, 3, H, W) float32 -> (B, ...) outputs
EVAL_BATCH = 32  # images per inference call while streaming (engines with a smaller range are chunked), at most
ATTENTION_BUDGET = 512 * 1024**2  # bytes of one block's attention scores (and their softmax) a batch may hold


def eval_batch(config: dict) -> int:
    """Images per inference call for a model (its manifest's config): EVAL_BATCH, fewer at a long sequence, where
    a runtime holds each block's attention scores and their softmax, heads x tokens^2 floats each, for the whole
    batch (Depth Anything at 518: 1,370 tokens, 90 MB an image)."""
    from ..model.config import ViTConfig

    try:
        cfg = ViTConfig.from_dict(config)
    except (VitexportError, TypeError):  # a config this version cannot read: the bench says so when it builds it
        return EVAL_BATCH
    tokens = cfg.grid_size[0] * cfg.grid_size[1] + cfg.num_prefix_tokens + \
        (cfg.dense.num_queries if cfg.dense is not None else 0)
    per_image = 2 * cfg.num_heads * tokens ** 2 * 4
    return max(1, min(EVAL_BATCH, ATTENTION_BUDGET // per_image))


@dataclass
class Evaluation:
    stats: ParityStats
    per_class: list[dict] = field(default_factory=list)
    seconds: float = 0.0  # inference, reference included when it ran in step
    read_seconds: float = 0.0  # reading and normalising the cached inputs
    examples: list[dict] = field(default_factory=list)  # the worst images, worst first (parity.examples)

    def timing(self) -> dict:
        n = self.stats.n
        return {"inference_s": round(self.seconds, 3), "read_s": round(self.read_seconds, 3),
                "images_per_s": round(n / self.seconds, 1) if self.seconds > 0 else None}


def evaluate(candidate: Infer, inputs: InputCache, labels: np.ndarray | Truth | None, *,
             reference: Infer | OutputStore | None = None, record: OutputStore | None = None,
             label: str = "evaluating", batch: int | None = None, log: Log = QUIET) -> Evaluation:
    """Run `candidate` on every input and compare it with the reference, `batch` images a call (None: the set's,
    `inputs.batch`, which open_validation sizes to the model, else EVAL_BATCH).

    reference: a function run on the same batch, the reference's stored outputs, or None when the candidate is the
    reference itself (its figures against itself are exact; `record` keeps its outputs for the backends after it).
    """
    batch = batch or getattr(inputs, "batch", None) or EVAL_BATCH
    acc = ParityAccumulator(inputs.n, labels, examples=reference is not None)  # itself: nothing to show
    infer_s = read_s = 0.0
    with log.bar(label, inputs.n) as advance:
        t_read = time.perf_counter()
        for start, x in inputs.batches(batch):
            t0 = time.perf_counter()
            read_s += t0 - t_read
            out = np.asarray(candidate(x))
            if callable(reference):
                ref = np.asarray(reference(x))
            elif reference is not None:
                ref = reference.read(start, len(x))
            else:
                ref = out
            infer_s += time.perf_counter() - t0
            if record is not None:
                record.append(out)
            acc.update(start, ref, out)
            advance(len(x))
            t_read = time.perf_counter()
    if record is not None:
        record.finish()
    return Evaluation(acc.stats(), acc.per_class(), infer_s, read_s, acc.examples())


@dataclass
class ValidationSet:
    """The images of a run, decoded once into `inputs`, with the model's labels when the set gives them (class
    folders or a label file, validate.labels), all indexed like `inputs`."""

    images: ImageSet
    inputs: InputCache
    labels: np.ndarray | None  # (N,) the model's class indices
    subset: np.ndarray | None = None  # the classes the set covers, when fewer than the head's
    real: np.ndarray | None = None  # (N, K) ImageNet-ReaL labels, -1 padded
    set_labels: np.ndarray | None = None  # (N,) the set's own classes (index into images.classes): k-NN's labels
    how: str = ""  # how the set's classes were read ('WordNet synset', ...)
    dense: str | None = None  # the model's output is a dense map of this kind (parity.dense), judged by its task
    dense_truth: list | None = None  # per image, its ground-truth map (data.dense_truth) or None; None: none has one
    relative_depth: bool = True  # a relative depth model (aligned to the truth by scale and shift)
    depth_scale: float = 1000.0  # a 16-bit depth PNG's value per unit
    masks: object = None  # SAM ('masks'): the prompted decoder its embeddings are judged through (parity.masks)
    detection: object = None  # a detector ('detection'): how its outputs become detections (parity.detections)
    truth_skipped: list = field(default_factory=list)  # truth files that could not be read, each named

    @property
    def source(self) -> str:
        return self.images.source

    @property
    def truth(self) -> Truth:
        reader = None
        if self.dense == "detection" and self.dense_truth is not None:
            reader = self.dense_truth.__getitem__
        elif self.dense is not None and self.dense_truth is not None:
            from ..data.dense_truth import truth_reader

            reader = truth_reader(self.dense_truth, self.dense, self.depth_scale)
        return Truth(self.labels, self.subset, self.real, self.dense, reader, self.relative_depth,
                     self.inputs.pp.image_part if reader is not None and self.dense != "detection" else None,
                     self.masks,  # type: ignore[arg-type]
                     self.detection)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return self.inputs.n

    def close(self) -> None:
        self.inputs.close()

    def __enter__(self) -> "ValidationSet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_validation(root, pp, num_classes: int, max_images: int | None = None, workers: int | None = None,
                    log: Log = QUIET, names: list[str] | None = None, label_files: tuple = (),
                    dense: dict | None = None, depth_scale: float = 1000.0,
                    batch: int | None = None, annotations: Path | None = None) -> ValidationSet:
    """List `root`, take `max_images` spread over it, decode each image once (with a progress bar); labels from
    class folders or `label_files` (paths) mapped onto the model's classes `names` (validate.labels; else a
    warning saying why not); dense: a dense model's head (Manifest.dense), whose outputs are judged by its task,
    and against the ground-truth maps beside the images (data.dense_truth) where there are any (a metric depth model
    as it is, a relative one aligned by scale and shift)."""
    from ..data.labelfile import read_label_file
    from ..data.stream import default_workers, open_images

    images = open_images(root, max_images, tuple(read_label_file(p) for p in label_files))
    labels, subset, how = _map_labels(images, num_classes, names, log)
    subset_note = f" ({len(images):,} of {images.total:,}, spread evenly)" if len(images) < images.total else ""
    workers = workers or default_workers()
    with log.step(f"Decoding {len(images):,} inputs from {images.source}{subset_note} with {workers} workers"):
        with log.bar("decoding", len(images)) as advance:
            inputs = InputCache(images, pp, workers, progress=advance)
    d = inputs.decode
    log.info(f"Decoded {d.images:,} inputs in {d.seconds:.1f}s ({d.images / max(d.seconds, 1e-9):,.0f}/s)"
             + (f", labels from {_from(images)} by {how}" if labels is not None else "")
             + (f", {len(subset)} of the model's {num_classes} classes present" if subset is not None else ""))
    if images.skipped:
        log.warn(images.skipped.summary(images.source) + f" Every backend is judged on the other {inputs.n:,}.")
    real = images.real if num_classes == 1000 else None
    if images.real is not None and real is None:
        log.warn(f"ImageNet-ReaL labels name ImageNet-1k's classes; the model has {num_classes}: not used.")
    keep = inputs.kept if inputs.n < len(images) else slice(None)
    pick = (lambda a: None if a is None else a[keep])  # the figures of the images the cache holds
    inputs.batch = batch or EVAL_BATCH  # images a call when the set is evaluated (eval_batch: fewer at long sequences)
    task = None if dense is None else dense.get("task")
    vset = ValidationSet(images, inputs, pick(labels), subset, pick(real), pick(images.labels), how, task)
    if task == "masks":  # SAM: the embedding judged by the masks the decoder graph gives with fixed prompts
        from ..parity.masks import PROMPTS
        from .sam_masks import PromptedMasks

        assert dense is not None
        vset.masks = PromptedMasks(dense["decoder_onnx"], dense["image_size"], 4 * dense["embedding_size"], pp)
        log.info(f"SAM's embeddings are judged by their masks: {len(PROMPTS)} fixed prompts an image through "
                 f"{Path(dense['decoder_onnx']).name}, IoU against the reference's.")
    if task == "detection":
        from ..parity.detections import DetectionSettings

        assert dense is not None
        vset.detection = DetectionSettings(dense["num_labels"], dense["top_k"], dense["threshold"],
                                           tuple(pp.input_size))
        log.info(f"Detections are judged by COCO's mAP against the reference's above {dense['threshold']:g} (each "
                 f"image's best {dense['top_k']} over queries x classes).")
        _detection_truth(vset, [images.files[i] for i in inputs.kept], Path(root), list(names or []),
                         dense["num_labels"], annotations, log)
    if task is not None and task != "detection" and not images.npy:
        from ..data.dense_truth import truth_for

        # the images the cache holds, in order; SAM's truth is a map of objects in the segmentation's file
        found = [truth_for(images.files[i], "segmentation" if task == "masks" else task) for i in inputs.kept]
        if any(p is not None for p in found):
            vset.dense_truth, vset.depth_scale = found, depth_scale
            vset.relative_depth = dense.get("depth_type") != "metric"
            what = {"depth": "depth maps", "segmentation": "class masks",
                    "masks": "object masks: each object prompted by a point and by its box"}[task]
            log.info(f"Ground truth for {sum(p is not None for p in found):,} of {len(found):,} images "
                     f"({what} beside them).")
    return vset


def _detection_truth(vset: ValidationSet, files: list[Path], root: Path, names: list[str], num_labels: int,
                     annotations: Path | None, log: Log) -> None:
    """A detection set's truth: COCO's JSON (annotations) or YOLO's labels beside the images (data.detection_truth),
    the categories read as the model's labels by name or by number, as the log says."""
    from ..data.detection_truth import read_coco, read_yolo

    named = any(n != str(i) for i, n in enumerate(names))  # the checkpoint names its classes
    names = names or [str(i) for i in range(num_labels)]
    truth = read_coco(annotations, files, root, names, num_labels, named) if annotations is not None else \
        read_yolo(files, root, names, num_labels, named)
    if truth is None:
        return
    found = sum(t is not None for t in truth.items)
    if not found:
        raise VitexportError(f"{annotations or root} gives no truth for any of the {len(files):,} images of {root}.")
    vset.dense_truth, vset.truth_skipped = truth.items, truth.skipped
    source = f"COCO {annotations}" if annotations else "YOLO labels beside them"
    boxes = sum(len(t.boxes) for t in truth.items if t is not None)
    log.info(f"Ground truth for {found:,} of {len(files):,} images ({source}, {boxes:,} boxes), the categories read "
             f"as the model's labels {truth.how}.")
    for s in truth.skipped:
        log.warn(f"Ground truth left out: {s}.")


def _from(images: ImageSet) -> str:
    n = len(images.classes or [])
    return f"{n:,} class folders" if images.label_source == "class folders" else \
        f"{images.label_source} ({n:,} classes)"


def _map_labels(images: ImageSet, num_classes: int, names: list[str] | None,
                log: Log) -> tuple[np.ndarray | None, np.ndarray | None, str]:
    """(the model's class per image, the classes present when fewer than the head's, how the classes were read);
    images of a class that maps to none are left out of `images` and noted in its skipped list."""
    from .labels import map_classes

    if images.labels is None or images.classes is None or num_classes <= 0:
        return None, None, ""
    m = map_classes(list(images.classes), num_classes, list(names or []))
    if m is None:
        log.warn(f"The classes of {images.source} ({_from(images)}) are not used as labels: none is one of the "
                 f"model's {num_classes} classes by index, WordNet synset or class name.")
        return None, None, ""
    if m.unmapped:
        mapped = m.index[images.labels] >= 0
        for f, c in zip(images.files, images.labels):
            if m.index[c] < 0:
                images.skipped.add(f, "class of no model class", f"{images.classes[c]!r} is none of the model's classes")
        images.keep(mapped)
        if not images.files:
            raise VitexportError(f"None of the images of {images.source} is of a class the model has "
                                 f"({images.skipped.details()}).")
    labels = m.index[images.labels]
    present = np.unique(labels)
    return labels, (present if len(present) < num_classes else None), m.how
