"""What `vitexport triton` prints once the entry is written: how to start Triton on the repository, and one request
that asks the model about an image (a Segment Anything encoder: then its decoder about one point)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..artifacts.folder import CPU_INT8_WEIGHT_MAX_EXACT, ModelFolder

if TYPE_CHECKING:
    from ..artifacts.manifest import Manifest
    from .triton import TritonModel


def serve_instructions(result: "TritonModel", folder: ModelFolder) -> str:
    """How to start Triton on the repository, and one request that classifies an image with this model (a dense
    model: that asks for its map)."""
    repo = result.folder.path.parent.resolve()
    inp, out = result.inputs[0], result.outputs[0]
    pixels = ('x = np.asarray(resize_and_crop(Image.open("IMAGE.jpg"), pp)).transpose(2, 0, 1)[None].copy()  # uint8'
              if inp.data_type == "TYPE_UINT8" else 'x = load_image("IMAGE.jpg", pp)[None]  # normalised float32')
    manifest = folder.read_manifest()
    dense = manifest.dense_task is not None
    asked, var, shown = (f'out = tc.InferRequestedOutput("{out.name}")  # the whole map', "out", ".shape") if dense \
        else (f'top5 = tc.InferRequestedOutput("{out.name}", class_count=5)  # \'score:index:label\' via labels.txt',
              "top5", "")
    note = {"tensorrt_plan": "; the plan runs only on the TensorRT version that built it, so pick the release that "
                             "ships that TensorRT",
            "openvino": "; OpenVINO's backend serves on the CPU (leave out --gpus all), its float layers in bf16 "
                        "where the CPU has BF16 (OpenVINO's default; the backend takes no f32 hint): `vitexport bench "
                        "--endpoint` judges what it serves"}.get(result.platform,
                                                                   "; leave out --gpus all to serve on the CPU")
    return f"""{_weights_note(result, folder, manifest)}Start Triton on the repository (NGC container; YY.MM: a tritonserver release{note}):
  docker run --rm --gpus all -p 8000:8000 -p 8001:8001 -p 8002:8002 -v {repo}:/models \\
      nvcr.io/nvidia/tritonserver:YY.MM-py3 tritonserver --model-repository=/models
Ask it about one image (pip install tritonclient[http]; the preprocessing is the model's own):
  python - <<'EOF'
  import numpy as np, tritonclient.http as tc
  from PIL import Image
  from vitexport.data.images import load_image, resize_and_crop
  from vitexport.artifacts.manifest import read_manifest
  pp = read_manifest("{folder.manifest_path.resolve()}").preprocess
  {pixels}
  client = tc.InferenceServerClient("localhost:8000")
  pixels = tc.InferInput("{inp.name}", list(x.shape), "{inp.data_type.removeprefix('TYPE_')}")
  pixels.set_data_from_numpy(x)
  {asked}
  print(client.infer("{result.folder.name}", [pixels], outputs=[{var}]).as_numpy("{out.name}"){shown})
{_decoder_request(result, manifest)}  EOF"""


def _weights_note(result: "TritonModel", folder: ModelFolder, manifest: "Manifest") -> str:
    """The CPU INT8 graph with 8-bit weights (made on a CPU with VNNI or AMX): which server CPUs compute it right."""
    record = manifest.precisions.get("int8")
    if result.source.name != folder.onnx("int8").name or record is None or \
            (record.qdq or {}).get("weight_max") != CPU_INT8_WEIGHT_MAX_EXACT:
        return ""
    return ("Its INT8 weights have 8 bits, exact on a server CPU with VNNI or AMX; one without (AVX2 only) sums them "
            "with saturation: for such a server, make the graph with `vitexport quantize --int8 --weight-bits 7` and "
            "write the entry again with --force.\n")


def _decoder_request(result: "TritonModel", manifest: "Manifest") -> str:
    """Segment Anything: the lines that send the image's embedding and one point to the decoder's entry."""
    if result.decoder is None:
        return ""
    dense = manifest.dense or {}
    dec, side, mask = result.decoder.folder.name, int(dense["image_size"]), 4 * int(dense["embedding_size"])
    return f"""  # the image's embedding once, then any number of prompts (here a foreground point at x=100, y=200)
  from vitexport.model.heads.sam_decoder import prompts_to_inputs
  emb = client.infer("{result.folder.name}", [pixels]).as_numpy("{result.outputs[0].name}")
  w, h = Image.open("IMAGE.jpg").size
  coords, labels = prompts_to_inputs([(100, 200, 1)], None, ({side} / max(w, h),) * 2)
  feeds = {{"image_embeddings": emb, "point_coords": coords[None], "point_labels": labels[None],
           "mask_input": np.zeros((1, 1, {mask}, {mask}), np.float32),
           "has_mask_input": np.zeros(1, np.float32)}}
  inputs = []
  for n, v in feeds.items():
      inputs.append(tc.InferInput(n, list(v.shape), "FP32"))
      inputs[-1].set_data_from_numpy(v)
  answer = client.infer("{dec}", inputs)
  print(answer.as_numpy("masks").shape, answer.as_numpy("iou_predictions"))  # 4 masks ({mask}x{mask} logits), scores
"""
