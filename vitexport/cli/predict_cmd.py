"""`vitexport predict [MODEL_DIR] IMAGE_OR_FOLDER...`: top-k classes of images on one backend."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import VitexportError
from .groups import MODEL, QUIET, use

BACKEND_NAMES = ("onnxruntime", "pytorch", "openvino", "tensorrt")  # predict.BACKENDS, without importing numpy


def _split_target(paths: tuple[Path, ...]) -> tuple[Path | None, list[Path]]:
    """A first path that is an exported model (a folder or .onnx with a manifest) is the model; the rest, images."""
    from ..artifacts.folder import ModelFolder

    first = paths[0]
    is_model = first.exists() and (first.is_dir() or first.suffix == ".onnx") and \
        ModelFolder.containing(first).has_manifest()
    if not is_model:
        return None, list(paths)
    if len(paths) == 1:
        raise VitexportError(f"{first} is a model; give the images to classify after it.")
    return first, list(paths[1:])


@click.command("predict")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path),
                metavar="[MODEL_DIR] IMAGE_OR_FOLDER...")
@click.option("--precision", type=click.Choice(["fp32", "fp16", "int8"]), default="fp32", show_default=True,
              help="Which model file to run (made first when missing; TensorRT needs `vitexport trt`).")
@click.option("--backend", type=click.Choice(BACKEND_NAMES), default="onnxruntime", show_default=True)
@click.option("--top-k", type=int, default=5, show_default=True, help="Classes shown per image (at least 1).")
@click.option("--json", "as_json", is_flag=True,
              help='Print a JSON list of {"image", "top": [{"index", "label", "prob"}]} instead of a table.')
@click.option("--jsonl", "as_jsonl", is_flag=True,
              help="Print one JSON object per image, per line, as each is classified (for large folders).")
@use(MODEL, QUIET)
def predict_command(paths, precision, backend, top_k, as_json, as_jsonl, spec, log):
    """Classify images with the model's own preprocessing: top-k classes and their probabilities.

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
    folder = open_model(target, spec, log=log)
    results = iter_predictions(folder, images, backend=backend, precision=precision, top_k=top_k, log=log)
    if as_json:  # one JSON document: the whole list at the end
        click.echo(to_json(list(results)))
        return
    width = label_width(folder)
    for p in results:  # streamed: memory stays flat however many images
        click.echo(json.dumps(p.to_dict()) if as_jsonl else table_block(p, width))
