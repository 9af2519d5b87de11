"""What a bench runs: the image sizes, the output judged (and whether as an embedding), the reference model
answering with it, and the default data set."""

from __future__ import annotations

from pathlib import Path

from ..artifacts.manifest import Manifest
from ..errors import VitexportError
from ..exporter.torch_model import model_from_manifest
from ..model.outputs import EMBEDDINGS, WithOutputs
from ..paths import DIGITS_VARIANT, default_heldout_dir
from ..progress import QUIET, Log

GENERATED_NOTE = ("generated once from the 360 held-out digits (moved, rescaled, noised: vitexport.data.digits), "
                  "which alone are too few to decide the default bounds; --data {heldout} for those")


def bench_sizes(manifest: Manifest, sizes: tuple[tuple[int, int], ...] | None) -> list[tuple[int, int] | None]:
    """The image sizes to bench at: [None] (the export's own) unless a dynamic-size export is given sizes in its
    range, in whole patches; one sentence otherwise."""
    if not sizes or (manifest.img_size_range is None and set(map(tuple, sizes)) == {tuple(manifest.img_size)}):
        return [None]
    if manifest.img_size_range is None:
        raise VitexportError(f"{manifest.variant} was exported for {manifest.img_size[0]}x{manifest.img_size[1]} "
                             f"only; bench other sizes with an export made with `vitexport onnx --dynamic-img-size`.")
    (h0, w0), (h1, w1) = manifest.img_size_range
    ph, pw = manifest.patch_size
    for h, w in sizes:
        if not (h0 <= h <= h1 and w0 <= w <= w1) or h % ph or w % pw:
            raise VitexportError(f"--img-size {h}x{w} is not one this export takes: from {h0}x{w0} to {h1}x{w1}, in "
                                 f"multiples of the patch size {ph}x{pw}.")
    return list(dict.fromkeys(tuple(s) for s in sizes))


def judged_output(manifest: Manifest, asked: str | None) -> tuple[str, bool]:
    """(the output the bench judges, whether it is an embedding: judged by its k-NN, parity.knn); one sentence for
    an output the export does not have."""
    name = asked or manifest.output_name
    if name not in manifest.output_names:
        raise VitexportError(f"--judge-output {name}: {manifest.onnx} has the outputs {', '.join(manifest.output_names)}"
                             f"; export it with `vitexport onnx --outputs {','.join([*manifest.output_names, name])}`.")
    if manifest.dense_task is not None:  # a map judged by its task (parity.dense), not by neighbours
        return name, False
    return name, manifest.num_classes <= 0 or name in EMBEDDINGS


def torch_model(manifest: Manifest, output: str, log: Log):
    """The PyTorch reference, answering with `output` (the model's own forward: logits, or a headless model's
    pooled embedding)."""
    try:
        model = model_from_manifest(manifest)
    except VitexportError as e:
        log.warn(f"PyTorch backends unavailable: {e}.")
        return None
    own = "logits" if manifest.num_classes > 0 else "pooled"
    return model if output == own else WithOutputs(model, (output,))


def generated_note(variant: str, given: Path | None, source: str) -> str:
    """What the report says of the set benched on: the note on the generated digits set when the default gave it."""
    heldout = default_heldout_dir(variant)
    return GENERATED_NOTE.format(heldout=heldout) if given is None and variant == DIGITS_VARIANT and \
        Path(source) != heldout else ""


def default_bench_data(variant: str, log: Log = QUIET) -> Path:
    """The set a bench without --data validates on: for the digits model, DEFAULT_COUNT images generated once from
    its held-out digits (data.digits: 360 cannot decide the default bounds); else the shipped held-out images."""
    from ..data.digits import DEFAULT_COUNT, cached_set

    shipped = default_heldout_dir(variant)
    if variant != DIGITS_VARIANT:
        return shipped
    try:
        return cached_set(shipped)
    except OSError as e:
        log.warn(f"Could not make the digits' default set of {DEFAULT_COUNT:,} images in the cache ({e.strerror or e}; "
                 f"$VITEXPORT_CACHE moves it): validating on the {shipped} images instead.")
        return shipped


def refuse_unusable(data: Path, manifest: Manifest) -> None:
    """The sentence the bench would give minutes later, after making graphs, when no image of `data` decodes; its
    images are tried until one does (one decode for a usable folder)."""
    from ..data.images import ImageError, decode_crop
    from ..data.stream import open_images

    images = open_images(data)
    if images.npy or not images.files:
        return  # read and judged by the run itself
    for f in images.files:
        try:
            decode_crop(f, manifest.preprocess)
            return
        except ImageError as e:
            images.skipped.add_error(e)
    raise images.skipped.nothing_usable(len(images.files), images.source)
