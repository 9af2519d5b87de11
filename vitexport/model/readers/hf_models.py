"""Any transformers `config.json` vitexport builds, to the reader of its kind: a vision tower's (`hf_configs`), a dense
model's (`hf_dense`), Segment Anything's (`hf_sam`) or a detector's (`hf_detection`); one sentence naming every model
type it builds for another. No torch here."""

from __future__ import annotations

from typing import Any

from ...errors import VitexportError
from .hf_configs import FAMILIES, Described, describe
from .hf_dense import DENSE_FAMILIES, describe_dense
from .hf_detection import DETECTION_FAMILIES, NOT_BUILT as DETECTORS_NOT_BUILT, describe_detection
from .hf_sam import NOT_BUILT, SAM_FAMILIES, describe_sam


def describe_transformers(cfg: dict[str, Any], processor: dict[str, Any] | None, where: str) -> Described:
    """config.json (+ preprocessor_config.json) -> the fields, the preprocessing and the notes, by its reader."""

    model_type = cfg.get("model_type")
    if model_type in DENSE_FAMILIES:
        return describe_dense(cfg, processor, where)
    if model_type in DETECTION_FAMILIES or model_type in DETECTORS_NOT_BUILT:
        return describe_detection(cfg, processor, where)
    if model_type in SAM_FAMILIES or model_type in NOT_BUILT:
        return describe_sam(cfg, processor, where)
    if model_type not in FAMILIES:
        every = [*FAMILIES.values(), *DENSE_FAMILIES.values(), *SAM_FAMILIES.values(), *DETECTION_FAMILIES.values()]
        kinds = ", ".join(sorted({f.title for f in every}))
        raise VitexportError(f"{where} is a transformers {model_type!r} model; vitexport builds the vision "
                             f"transformers {kinds} (model_type {', '.join(f.model_type for f in every)}).")
    return describe(cfg, processor, where)


__all__ = ["describe_transformers"]
