"""The sidecar: the JSON file beside each plan saying what it was built from, with what, on which machine (made by
`tensorrt_engine.compiler.make_sidecar`); reading and writing it, and the verdict on whether a plan can run on this
machine, with the exact difference and what to do.

Never imports tensorrt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import VitexportError
from ..paths import plain_name, write_text_atomic
from .folder import SIDECAR_SUFFIX, plan_name

SIDECAR_FORMAT = "vitexport-plan/1"


def rebuild_command(precision: str, folder: Path | str | None = None) -> str:
    """The command that rebuilds a plan, for error messages: `vitexport trt [MODEL_DIR] --<precision>`."""
    where = f" {folder}" if folder is not None else ""
    return f"vitexport trt{where} --{precision}"


# -- sidecar --------------------------------------------------------------------------------------------------

def write_sidecar(path: Path, data: dict[str, Any]) -> Path:
    write_text_atomic(Path(path), json.dumps(data, indent=2) + "\n")
    return Path(path)


_REQUIRED = ("tensorrt", "gpu", "precision", "profile", "plan_sha256")


def read_sidecar(path: Path) -> dict[str, Any]:
    path = Path(path)
    plan = path.name.removesuffix(SIDECAR_SUFFIX)
    if not path.is_file():
        raise VitexportError(f"{path} is missing, so nothing says where {plan} was built; rebuild the engine with "
                             f"`vitexport trt` on this machine.")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VitexportError(f"{path} is not valid JSON ({e.__class__.__name__}: {e}); rebuild the engine with "
                             f"`vitexport trt` on this machine.") from None
    if not isinstance(data, dict):
        raise VitexportError(f"{path} holds a JSON {type(data).__name__}, not an object; rebuild the engine with "
                             f"`vitexport trt` on this machine.")
    missing = [k for k in _REQUIRED if k not in data]
    gpu = data.get("gpu")
    if not missing and (not isinstance(gpu, dict) or "name" not in gpu or "compute_capability" not in gpu):
        missing.append("gpu.name/gpu.compute_capability")
    if missing:
        raise VitexportError(f"{path} lacks {', '.join(missing)}; rebuild the engine with `vitexport trt` on this "
                             f"machine.")
    for key in ("plan", "source_onnx"):  # names of files beside it: never a path out of the folder
        if data.get(key) is not None:
            plain_name(data[key], f"{path.name}'s field {key!r}")
    return data


# -- may this plan run here? ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Compatibility:
    ok: bool  # TensorRT will deserialize and run the plan here
    kind: str  # 'same' | 'other_tensorrt' | 'other_compute_capability' | 'other_gpu'
    message: str  # '' when same; otherwise one sentence: what differs and what to do
    differences: tuple[str, ...] = ()


def check_compatibility(sidecar: dict[str, Any], current: dict[str, Any], folder: Path | str | None = None) -> Compatibility:
    """Compare where a plan was built (its sidecar) with this machine (`current`: {'tensorrt', 'gpu'}).

    A plan only deserializes on the TensorRT version that built it, and only on GPUs of the same compute
    capability (engines are built without hardware compatibility). Another GPU model of the same compute
    capability runs it, with kernels tuned for the other model: that is ok, with a message.
    """
    plan = sidecar.get("plan") or plan_name(str(sidecar.get("precision", "?")))
    rebuild = f"rebuild with `{rebuild_command(str(sidecar.get('precision', 'fp16')), folder)}` on this machine"
    built_gpu, here_gpu = sidecar.get("gpu") or {}, current.get("gpu") or {}
    diffs: list[str] = []
    kinds: list[str] = []
    if str(sidecar.get("tensorrt")) != str(current.get("tensorrt")):
        diffs.append(f"TensorRT {sidecar.get('tensorrt')} (plan) vs {current.get('tensorrt')} (here)")
        kinds.append("other_tensorrt")
    if str(built_gpu.get("compute_capability")) != str(here_gpu.get("compute_capability")):
        diffs.append(f"compute capability {built_gpu.get('compute_capability')} on {built_gpu.get('name')} (plan) vs "
                     f"{here_gpu.get('compute_capability')} on {here_gpu.get('name')} (here)")
        kinds.append("other_compute_capability")
    if diffs:
        return Compatibility(False, kinds[0], f"{plan} cannot run here: it was built for {'; '.join(diffs)}; {rebuild}.",
                       tuple(kinds))
    if str(built_gpu.get("name")) != str(here_gpu.get("name")):
        return Compatibility(True, "other_gpu",
                       f"{plan} was built on {built_gpu.get('name')}, not on this {here_gpu.get('name')} (same compute "
                       f"capability {here_gpu.get('compute_capability')}): it runs, with kernels tuned for the other "
                       f"GPU; {rebuild} for full speed.", ("other_gpu",))
    return Compatibility(True, "same", "", ())
