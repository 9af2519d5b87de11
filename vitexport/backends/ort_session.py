"""Creating ONNX Runtime sessions the same way everywhere (export check, calibration, bench)."""

from __future__ import annotations

import os
from pathlib import Path

from ..environment import ort_threads
from ..errors import VitexportError, first_line


def optimization_for(precision: str) -> str:
    """How far ONNX Runtime may rewrite a graph of this precision before running it: 'all', or 'basic' for FP8.

    With its extended (Q/DQ) optimizations ONNX Runtime 1.31 breaks an FP8 Q/DQ graph on the CPU: it fuses an FP8
    DequantizeLinear into MatMulIntegerToFloat, which takes no FP8 input, or moves a Q above a Squeeze it has no FP8
    kernel for. The basic level (constant folding, redundant nodes) runs it as the graph says: fake quantization.
    """
    return "basic" if precision == "fp8" else "all"


def session_options(precision: str) -> dict[str, str] | None:
    """The ONNX Runtime session options a user needs to run a graph of this precision, as recorded in the manifest
    and shown by `vitexport info` (None: the defaults run it). Written for a user's own session, where
    ONNX Runtime's default (ORT_ENABLE_ALL) refuses an FP8 graph (optimization_for)."""
    if optimization_for(precision) == "all":
        return None
    return {"graph_optimization_level": "ORT_ENABLE_BASIC"}


LIFTED = "vitexport-in-memory"  # the external-data location of weights handed to ONNX Runtime as arrays


def split_weights(model, min_bytes: int = 1024, outputs=()) -> tuple[bytes, dict]:
    """(a copy of the graph serialized without its inline weights, {initializer: array}) for create_session(bytes,
    weights=): a graph rewritten in memory (calibration's, with more outputs) is then not serialized with its
    weights and parsed back (ViT-B/16: 2.0 s -> 1.0 s to a session). `outputs` (ValueInfoProtos) follow the graph's
    own in the copy (lifted). The model is not changed: another step can use it after the session."""
    light, weights = lifted(model, min_bytes)
    light.graph.output.extend(outputs)
    return light.SerializeToString(), weights


def lifted(model, min_bytes: int = 1024) -> tuple:
    """(a copy of the model whose inline initializers of at least min_bytes, of numpy's own types, are stubs marked
    external (LIFTED); {initializer: array of its bytes}): a graph to rewrite and serialize without its weights, for
    create_session(bytes, weights=). The model is not changed."""
    import numpy as np
    from onnx import GraphProto, ModelProto, TensorProto, helper

    weights, inits = {}, []
    for t in model.graph.initializer:
        # ONNX Runtime takes numpy's own types as arrays; FP8, INT4 and bfloat16 (ml_dtypes') stay in the graph
        if t.data_location != TensorProto.EXTERNAL and len(t.raw_data) >= min_bytes and \
                (dtype := np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))).kind in "biuf":
            weights[t.name] = np.frombuffer(t.raw_data, dtype=dtype).reshape(tuple(t.dims))
            t = TensorProto(name=t.name, data_type=t.data_type, dims=t.dims, data_location=TensorProto.EXTERNAL)
            t.external_data.add(key="location", value=LIFTED)
        inits.append(t)
    light = _copy_but(model, "graph", ModelProto())
    light.graph.CopyFrom(_copy_but(model.graph, "initializer", GraphProto()))
    light.graph.initializer.extend(inits)
    return light, weights


def _copy_but(message, skip: str, out):
    """`out` with every field of `message` set, but `skip` (a copy of a graph without its weights, cheaply)."""
    for field, value in message.ListFields():
        if field.name == skip:
            continue
        if field.is_repeated:
            getattr(out, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(out, field.name).CopyFrom(value)
        else:
            setattr(out, field.name, value)
    return out


def create_session(path: Path | str | bytes, providers: list[str] | None = None, threads: int | None = None,
                   external_folder: Path | None = None, optimize: str = "all", weights: dict | None = None,
                   graph_order: bool = False, lean: bool = False):
    """A session on a model file, or on a serialized model (bytes: e.g. a graph rewritten in memory). A serialized
    graph whose weights stay in external data names the folder they are read from (`external_folder`), so a model
    over protobuf's 2 GB cap is never serialized whole; one whose inline weights were split off (split_weights)
    hands them over as `weights`. optimize: 'all' or 'basic' (optimization_for).

    graph_order: run the nodes in the graph's own order where it is free to choose (ONNX Runtime's priority-based
    order, which breaks ties by node index). Its default order runs a node's consumers depth-first along the longest
    chain, so a reduction placed right after each tensor's producer (ranges.reduced_model) ran only after the whole
    forward pass, with every activation alive: DINOv3-S at 512 px held 2.0 GB for one image instead of 0.4 GB, and
    Sapiens2-B at 1024x768 (3,072 tokens) went past 20 GB.

    lean: a session run a few times (an export's check), whose peak memory matters more than its speed: without the
    CPU arena (which keeps what it allocated for the next call, grown in powers of two; SAM's global attention at
    batch 3 asks for 3.2 GB a score tensor at 4,096 tokens) and without prepacked copies of the weights (2.5 GB
    more for SAM ViT-H)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if graph_order:
        so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    values = [ort.OrtValue.ortvalue_from_numpy(a) for a in (weights or {}).values()]
    if values:
        so.add_external_initializers(list(weights or {}), values)
    so.log_severity_level = 3
    if lean:
        so.enable_cpu_mem_arena = False
        so.add_session_config_entry("session.disable_prepacking", "1")
    so.intra_op_num_threads = threads or ort_threads()
    if external_folder is not None:
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", os.fspath(external_folder))
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if optimize == "basic"
                                   else ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    try:
        model = path if isinstance(path, bytes) else os.fspath(path)
        sess = ort.InferenceSession(model, sess_options=so, providers=providers or ["CPUExecutionProvider"])
        sess._vitexport_weights = values  # ONNX Runtime may read them in place: they live as long as the session
        return sess
    except Exception as e:  # onnxruntime raises its own exception types (Fail, InvalidGraph, ...)
        what = "the model" if isinstance(path, bytes) else str(path)
        raise VitexportError(f"ONNX Runtime could not load {what}: {first_line(e)[:300]}") from None


def session_infer(sess, input_name: str, output_name: str):
    """(B, 3, H, W) -> outputs of a session, run in the chunks infer_in_chunks uses (the held-out checks)."""
    from .base import infer_in_chunks

    return lambda x: infer_in_chunks(lambda b: sess.run([output_name], {input_name: b})[0], x)


def interleaved_latency(models: list[Path], x, optimize: str = "all", rounds: int = 5, runs: int = 5,
                        threads: int | None = None) -> list[float]:
    """Median milliseconds of one run of each model on input x (CPU), measured in interleaved rounds so drift of the
    machine (clock, other load) falls on all of them alike; one warm-up run each first."""
    import statistics
    import time

    sessions = [create_session(m, threads=threads, optimize=optimize) for m in models]
    feeds = [{s.get_inputs()[0].name: x} for s in sessions]
    for s, f in zip(sessions, feeds):
        s.run(None, f)
    times: list[list[float]] = [[] for _ in sessions]
    for _ in range(rounds):
        for i, (s, f) in enumerate(zip(sessions, feeds)):
            for _ in range(runs):
                t0 = time.perf_counter()
                s.run(None, f)
                times[i].append((time.perf_counter() - t0) * 1e3)
    return [statistics.median(t) for t in times]
