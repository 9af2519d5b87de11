"""PyTorch's own compiled CPU path as a file: the reference model through `torch.export` and AOTInductor into a
package (`.pt2`) that `torch._inductor.aoti_load_package` runs without Python model code.

    fp32   the reference model, compiled by Inductor with freezing (weights folded in, linears prepacked)
    bf16   the same under bf16 autocast (the matmuls and attention in bf16; what autocast keeps in FP32 stays)
    int8   PT2E static quantization with torchao's X86InductorQuantizer (per-channel weights, ranges calibrated
           on the images `quantize --int8` uses), the float parts under bf16 autocast where the CPU has BF16
           arithmetic, in FP32 elsewhere

Inductor fuses a quantized linear (oneDNN's qlinear_pointwise) only with freezing on; without it a package
dequantizes the weights and runs FP32 matmuls, silently (pytorch/ao #4566). `package_facts` reads the package's
generated wrapper for what it calls, and `fusion_problem` says when an INT8 package has no fused quantized linear,
or a bf16 one holds no bf16 at all.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
import zipfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from ..data.digits import cache_dir
from ..environment import cpu_has_bf16
from ..errors import BackendUnavailable, VitexportError, first_line

AOTI_PRECISIONS = ("fp32", "bf16", "int8")
MAX_BATCH = 1024  # the package's symbolic batch axis: 1 to this
INSTALL_TORCHAO = "pip install 'vitexport[torch]'"  # torchao: PT2E's quantizer for Inductor
_CALLS = {"qlinear": r"aoti_torch_cpu__qlinear_pointwise\w*\(", "linear": r"aoti_torch_cpu__linear_pointwise\w*\(",
          "unfused": r"aoti_torch_cpu_(?:addmm|mm)_out\(", "qconv": r"aoti_torch_cpu__qconv\w*\("}


@contextmanager
def _quiet(name: str) -> Iterator[None]:
    """A library logger's warnings left out meanwhile (torch's C++ extension builder says it found no CUDA on every
    CPU-only compile; torchao registers an enum torch now takes natively)."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def import_torchao_pt2e() -> tuple[Any, Any, Any]:
    """(prepare_pt2e, convert_pt2e, the x86_inductor_quantizer module); BackendUnavailable without torchao."""
    try:
        with _quiet("torch.utils._pytree"):
            import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
            from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    except ImportError as e:
        raise BackendUnavailable(f"PyTorch's INT8 path needs torchao ({INSTALL_TORCHAO}): {e}") from None
    return prepare_pt2e, convert_pt2e, xiq


def _autocast(module, bf16: bool):
    """`module` whose forward runs under bf16 autocast (when asked) and answers in float32."""
    import torch

    class Cast(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = module

        def forward(self, x):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                y = self.inner(x)
            return y.float()

    cast = Cast()
    cast.training = False  # not .eval(): a PT2E-converted graph module refuses train()/eval()
    return cast


def _linear_only(xiq):
    """X86InductorQuantizer that leaves convolutions alone: annotating one (EoMT's upscaling, a DPT head's) can
    fail on its partition ("conv partition has more than one output node") even where a module-type config
    quantizes the linear layers only, which is all an INT8 package here quantizes."""

    class LinearOnly(xiq.X86InductorQuantizer):
        def _annotate_conv2d_fusion_pattern(self, *args, **kwargs) -> None:
            return None

    return LinearOnly


def float_parts(precision: str) -> str:
    """The arithmetic of a package's float parts: 'bf16' for bf16, and for int8 where the CPU has BF16."""
    return "bf16" if precision == "bf16" or (precision == "int8" and cpu_has_bf16() is True) else "fp32"


def build_package(model, precision: str, example: np.ndarray, path: Path,
                  calibration: Iterable[np.ndarray] = (), freezing: bool = True) -> int:
    """Compile `model` (an eval nn.Module: images (B, 3, H, W) -> one tensor) into an AOTInductor package at
    `path`, with a symbolic batch axis; int8 calibrates on `calibration`'s batches first, its linear layers only
    (convolutions, a dense head's among them, stay float as in vitexport's own INT8 graphs). Returns the number of
    linear layers the traced forward runs (what a fused package calls a kernel for each). freezing=False exists
    for the test that the check catches such a package."""
    import torch

    # Inductor's work files (and its cache, reused by later compiles of this process) outside the model folder,
    # whose temporaries a finished command removes; an absolute path, since its compiler runs in other folders
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str((cache_dir() / "inductor").resolve()))
    if precision not in AOTI_PRECISIONS:
        raise VitexportError(f"Unknown package precision {precision!r}; choose one of: {', '.join(AOTI_PRECISIONS)}.")
    x = torch.from_numpy(np.ascontiguousarray(example[:2] if len(example) > 1 else np.repeat(example, 2, 0)))
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    with torch.no_grad(), warnings.catch_warnings(), _quiet("torch.utils.cpp_extension"):
        warnings.simplefilter("ignore")  # Inductor's own deprecation and copy-construct warnings
        if precision == "int8":
            prepare_pt2e, convert_pt2e, xiq = import_torchao_pt2e()
            quantizer = _linear_only(xiq)()
            quantizer.set_module_type_qconfig(torch.nn.Linear, xiq.get_default_x86_inductor_quantization_config())
            graph = torch.export.export(model, (x,), dynamic_shapes=({0: batch},)).module()
            linears = _linear_nodes(graph)
            try:
                prepared = prepare_pt2e(graph, quantizer)
            except (ValueError, NotImplementedError, AssertionError) as e:
                raise VitexportError(f"torchao's PT2E quantizer cannot annotate this model ({first_line(e)[:300]}); "
                                     f"make its fp32 or bf16 package instead.") from None
            seen = 0
            for b in calibration:
                prepared(torch.from_numpy(np.ascontiguousarray(b)))
                seen += len(b)
            if not seen:
                raise VitexportError("PyTorch's INT8 package needs calibration images; none could be read.")
            model = convert_pt2e(prepared)
        wrapped = _autocast(model, float_parts(precision) == "bf16")
        program = torch.export.export(wrapped, (x,), dynamic_shapes=({0: batch},))
        if precision != "int8":
            linears = _linear_nodes(program.graph_module)
        torch._inductor.aoti_compile_and_package(program, package_path=str(Path(path).resolve()),
                                                 inductor_configs={"freezing": freezing})
    return linears


def _linear_nodes(graph_module) -> int:
    """The linear ops of a traced graph, its submodules' included (autocast's region is one)."""
    import torch

    return sum(n.op == "call_function" and n.target is torch.ops.aten.linear.default
               for m in graph_module.modules() if isinstance(getattr(m, "graph", None), torch.fx.Graph)
               for n in m.graph.nodes)


@dataclass(frozen=True)
class PackageFacts:
    """What a package's generated wrapper calls (counts of call sites) and holds."""

    qlinear: int  # oneDNN quantized linears (fused: the weights int8, prepacked)
    linear: int  # oneDNN float linears (fused: prepacked)
    unfused: int  # plain addmm / mm: a linear Inductor did not fuse (no freezing), or another matmul
    qconv: int  # quantized convolutions (the patch embedding)
    bf16: bool  # the wrapper holds bf16 tensors
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def package_facts(path: Path) -> PackageFacts:
    """Read a package's generated C++ wrapper (the archive's `*.wrapper.cpp`); one sentence for a file that is not
    an AOTInductor package."""
    try:
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if n.endswith(".wrapper.cpp")]
            if not names:
                raise VitexportError(f"{path} holds no AOTInductor wrapper: not a package `vitexport aoti` wrote.")
            text = "\n".join(z.read(n).decode("utf-8", "replace") for n in names)
    except (OSError, zipfile.BadZipFile) as e:
        raise VitexportError(f"{path} is not a readable AOTInductor package ({e.__class__.__name__}).") from None
    counts = {k: len(re.findall(pat, text)) for k, pat in _CALLS.items()}
    return PackageFacts(counts["qlinear"], counts["linear"], counts["unfused"], counts["qconv"],
                        "BFloat16" in text or "bfloat16" in text, Path(path).stat().st_size)


def fusion_problem(facts: PackageFacts, precision: str, linears: int) -> str | None:
    """Why a package is not what its precision says, or None: an INT8 package with no fused quantized linear
    (built without Inductor's freezing, it dequantizes its weights and runs FP32 matmuls), or a bf16 package
    holding no bf16. linears: how many linear layers the traced forward runs (build_package's); some may stay float
    by the quantizer's choice (EoMT's mask MLP, run once per masked block), which the record shows."""
    if precision == "int8" and linears and not facts.qlinear:
        return (f"none of the model's {linears} linear layers runs as a fused INT8 kernel ({facts.unfused} plain "
                f"matmuls): it was compiled without Inductor's freezing, so it dequantizes its weights and runs FP32 "
                f"matmuls")
    if precision in ("bf16", "int8") and float_parts(precision) == "bf16" and not facts.bf16:
        return "it holds no bf16 tensor: it fell back to FP32"
    return None
