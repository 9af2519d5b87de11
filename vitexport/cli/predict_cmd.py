"""`vitexport predict [MODEL_DIR] IMAGE_OR_FOLDER...`: top-k classes of images on one backend."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import VitexportError
from .groups import MODEL, QUIET, use

BACKEND_NAMES = ("onnxruntime", "pytorch", "openvino", "tensorrt", "aoti")  # predict.BACKENDS, without importing numpy


def _split_target(paths: tuple[Path, ...]) -> tuple[Path | None, list[Path]]:
    """A first path that is an exported model (a folder or .onnx with a manifest) is the model; the rest, images."""
    from ..artifacts.folder import ModelFolder

    first = paths[0]
    if not first.exists() and len(paths) > 1:  # a model name typed where the model folder goes
        from ..model.variants import missing_path_sentence, names_a_model

        if names_a_model(str(first)):
            raise VitexportError(missing_path_sentence(first))
    is_model = first.exists() and (first.is_dir() or first.suffix == ".onnx") and \
        ModelFolder.containing(first).has_manifest()
    if not is_model:
        from ..model.readers.hub import checkpoint_refusal

        if (refusal := checkpoint_refusal(first)) is not None:  # a checkpoint meant as the model
            raise VitexportError(refusal)
        return None, list(paths)
    if len(paths) == 1:
        raise VitexportError(f"{first} is a model; give the images to classify after it.")
    return first, list(paths[1:])


@click.command("predict")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path),
                metavar="[MODEL_DIR] IMAGE_OR_FOLDER...")
@click.option("--precision", type=click.Choice(["fp32", "fp16", "int8", "bf16"]), default="fp32", show_default=True,
              help="Which model file to run (made first when missing; TensorRT needs `vitexport trt`; bf16: PyTorch's "
                   "autocast or an AOTInductor package, --backend pytorch or aoti).")
@click.option("--backend", type=click.Choice(BACKEND_NAMES), default="onnxruntime", show_default=True)
@click.option("--top-k", type=int, default=5, show_default=True, help="Classes shown per image (at least 1).")
@click.option("--json", "as_json", is_flag=True,
              help='Print a JSON list of {"image", "top": [{"index", "label", "prob"}]} instead of a table.')
@click.option("--jsonl", "as_jsonl", is_flag=True,
              help="Print one JSON object per image, per line, as each is classified (for large folders).")
@click.option("--embeddings", "embeddings_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="OUT.npy", help="Write the model's embeddings (its pooled output: --outputs logits,pooled, or a "
                                      "model exported with --num-classes 0) as "
                                      "an (N, D) float32 array, with the images in row order in OUT.files.txt. "
                                      "(--jsonl/--json give them as vectors instead.)")
@click.option("--out-dir", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="A depth or segmentation model: where each image's maps go (depth: .npy, 16-bit PNG, colour map; "
                   "segmentation: palette PNG of class indices, overlay); SAM: its masks, an overlay; one JSON line "
                   "per image is printed.")
@click.option("--point", "points", multiple=True, metavar="X,Y[,LABEL]",
              help="SAM: a point prompt in the image's pixels, LABEL 1 foreground (default) or 0 background; "
                   "repeatable.")
@click.option("--box", default=None, metavar="X0,Y0,X1,Y1", help="SAM: a box prompt in the image's pixels.")
@click.option("--threshold", type=click.FloatRange(0, 1), default=None,
              help="A detector: the score a detection must pass to be kept. Default: the model's (0.5 for RF-DETR).")
@use(MODEL, QUIET)
def predict_command(paths, precision, backend, top_k, as_json, as_jsonl, embeddings_out, out_dir, points, box,
                    threshold, spec, log):
    """Run a model on images with its own preprocessing: a classifier's top-k classes, a depth or segmentation
    model's maps and a detector's boxes (--out-dir), SAM's masks for prompts, or embeddings.

    MODEL_DIR is an exported model folder (or its model.onnx). Without it, the folder of --model
    (default: the default model) is used, exported first if absent. Folders are searched for images
    recursively. Class names come from the checkpoint, ImageNet-1k for 1000-class heads, or indices.
    """
    import json

    from ..deploy.predict import iter_predictions, label_width, table_block, to_json
    from ..ensure import open_model

    target, images = _split_target(paths)
    if top_k < 1:  # before any work
        raise VitexportError(f"--top-k must be at least 1, not {top_k}.")
    if as_json and as_jsonl:
        raise click.UsageError("--json and --jsonl are exclusive: give one.")
    if embeddings_out is not None and (as_json or as_jsonl):
        raise click.UsageError("--embeddings writes a file; --json and --jsonl print: give one.")
    if embeddings_out is not None and embeddings_out.suffix != ".npy":
        raise click.UsageError(f"--embeddings {embeddings_out}: give a .npy file name.")
    from ..deploy.sam import parse_box, parse_point

    prompts, box_prompt = [parse_point(p) for p in points], None if box is None else parse_box(box)
    folder = open_model(target, spec, log=log)
    task = folder.read_manifest().dense_task
    if (prompts or box_prompt) and task != "masks":
        raise click.UsageError("--point and --box are prompts for a Segment Anything model with its decoder graph.")
    if threshold is not None and task != "detection":
        raise click.UsageError("--threshold is a detector's score threshold; this model is no detector.")
    if task == "detection":
        _detections(folder, images, backend, precision, out_dir, threshold, as_json, log)
        return
    if task == "masks" and embeddings_out is None:
        _masks(folder, images, backend, precision, out_dir, prompts, box_prompt, as_json, log)
        return
    if embeddings_out is not None and task == "masks":
        _embeddings(folder, images, backend, precision, False, False, embeddings_out, log)
        return
    if task is not None or out_dir is not None:
        _dense(folder, images, backend, precision, out_dir, as_json, log)
        return
    if embeddings_out is not None or (folder.read_manifest().num_classes <= 0 and (as_json or as_jsonl)):
        _embeddings(folder, images, backend, precision, as_json, as_jsonl, embeddings_out, log)
        return  # a feature extractor asked for classes: iter_predictions says what to ask instead
    results = iter_predictions(folder, images, backend=backend, precision=precision, top_k=top_k, log=log)
    if as_json:  # one JSON document: the whole list at the end
        click.echo(to_json(list(results)))
        return
    width = label_width(folder)
    for p in results:  # streamed: memory stays flat however many images
        click.echo(json.dumps(p.to_dict()) if as_jsonl else table_block(p, width))


def _embeddings(folder, images, backend, precision, as_json, as_jsonl, out, log) -> None:
    """A feature extractor's embeddings: to OUT.npy (+ OUT.files.txt), or as vectors in JSON lines / a JSON list."""
    import json

    from ..deploy.predict import collect_images, iter_embeddings, write_embeddings
    from ..paths import display_path

    files = collect_images(images)
    batches = iter_embeddings(folder, files, backend=backend, precision=precision, log=log)
    if out is not None:
        npy, listing = write_embeddings(batches, len(files), out)
        log.info(f"wrote {len(files):,} embeddings to {display_path(npy)} (images in row order: "
                 f"{display_path(listing)})")
        return
    rows = ({"image": display_path(f), "embedding": [float(v) for v in e]} for fs, emb in batches
            for f, e in zip(fs, emb))
    if as_json:
        click.echo(json.dumps(list(rows)))
        return
    for row in rows:
        click.echo(json.dumps(row))


def _masks(folder, images, backend, precision, out_dir, points, box, as_json, log) -> None:
    """SAM's masks for the prompts to --out-dir, one JSON line per image (a JSON list with --json)."""
    import json

    from ..deploy.sam import iter_masks

    if out_dir is None:
        raise click.UsageError(f"{folder.path} holds a Segment Anything model: give --out-dir DIR for its masks (and "
                               f"--point/--box prompts), or --embeddings OUT.npy for its image embeddings.")
    results = iter_masks(folder, images, out_dir, points, box, backend=backend, precision=precision, log=log)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in results]))
        return
    for r in results:
        click.echo(json.dumps(r.to_dict()))


def _detections(folder, images, backend, precision, out_dir, threshold, as_json, log) -> None:
    """A detector's boxes drawn into --out-dir with COCO's results file, one JSON line per image (a list with
    --json)."""
    import json

    from ..deploy.detect import iter_detections

    if out_dir is None:
        raise click.UsageError(f"{folder.path} holds a detector: give --out-dir DIR for its pictures and COCO "
                               f"results file (detections.json).")
    results = iter_detections(folder, images, out_dir, threshold=threshold, backend=backend, precision=precision,
                              log=log)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in results]))
        return
    for r in results:
        click.echo(json.dumps(r.to_dict()))


def _dense(folder, images, backend, precision, out_dir, as_json, log) -> None:
    """A dense model's maps to --out-dir, one JSON line per image (a JSON list with --json)."""
    import json

    from ..deploy.dense import iter_dense

    if folder.read_manifest().dense_task is None:
        raise click.UsageError("--out-dir is for a depth or segmentation model; this one gives classes or "
                               "embeddings.")
    if out_dir is None:
        raise click.UsageError(f"{folder.path} holds a {folder.read_manifest().dense_task} model: give --out-dir DIR "
                               f"for its maps.")
    results = iter_dense(folder, images, out_dir, backend=backend, precision=precision, log=log)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in results]))
        return
    for r in results:
        click.echo(json.dumps(r.to_dict()))
