"""The pictures a report shows of the images that explain a miss (parity.examples picked them, bounded): a thumbnail
of each image a row's examples name, made from the input the model saw, and the class names of their top-3s. Only
the images shown are read again, so a report's size and memory do not grow with the set."""

from __future__ import annotations

import numpy as np

from ..data.stream import InputCache
from ..parity.examples import picture_uri
from ..paths import display_path
from ..validate.evaluate import ValidationSet

THUMB_SIDE = 96  # pixels, the longest side of a thumbnail
IMAGE_KEYS = ("index", "reference_neighbour", "output_neighbour")  # the example fields that name an image


def thumbnail(inputs: InputCache, i: int, side: int = THUMB_SIDE) -> str:
    """Input i as the model saw it (its crop; a .npy input unnormalised with the model's mean and std), as a JPEG
    data: URI."""
    x = inputs.item(i)
    if x.dtype != np.uint8:
        pp = inputs.pp
        x = x.transpose(1, 2, 0) * np.asarray(pp.std, np.float32) + np.asarray(pp.mean, np.float32)
        x = (np.clip(x, 0, 1) * 255).round().astype(np.uint8)
    return picture_uri(x, side, "JPEG")


def image_name(vset: ValidationSet, i: int) -> str:
    """Where input i came from: its file, or '<source> #i' for .npy inputs."""
    images = vset.images
    if images.npy or not images.files:
        return f"{display_path(images.source)} #{i}"
    f = images.files[int(vset.inputs.kept[i])]
    try:
        return str(f.relative_to(images.source))  # within the data set, as its user knows it
    except ValueError:
        return display_path(f)


def attach(examples_of: list[list[dict]], vset: ValidationSet, names: list[str] | None,
           pictures: dict[str, dict]) -> None:
    """Name the classes of each example's top-3 (and its label's, labelled data), and add a thumbnail of every image
    they name to `pictures` ({str(index): {file, thumb}}), once each."""
    for examples in examples_of:
        for ex in examples:
            for entry in ex.get("reference", []) + ex.get("output", []):  # a classifier's top-3s: [class, p]
                if len(entry) == 2:
                    entry.append(_name(names, entry[0]))
            if vset.labels is not None and "reference" in ex and "label" not in ex:
                ex["label"] = [int(vset.labels[ex["index"]]), _name(names, int(vset.labels[ex["index"]]))]
            for key in IMAGE_KEYS:
                if key in ex and str(ex[key]) not in pictures:
                    pictures[str(ex[key])] = {"file": image_name(vset, ex[key]),
                                              "thumb": thumbnail(vset.inputs, ex[key])}


def _name(names: list[str] | None, c: int) -> str:
    return names[c] if names and 0 <= c < len(names) else f"class {c}"
