"""transformers' CLIP and SigLIP vision towers (`CLIPVisionModel`, `CLIPVisionModelWithProjection`,
`SiglipVisionModel`, and the vision half of a whole `CLIPModel` / `SiglipModel`) -> timm names.

The two share their encoder's names (`encoder.layers.N.self_attn.q_proj`, `layer_norm1`, `mlp.fc1`). What the
tensors say about the structure:

- CLIP: a class embedding, `pre_layrnorm` (timm's `norm_pre`, with a patch conv without bias), and
  `post_layernorm` on the class token (timm's final norm, which normalises every token before taking that one);
  `visual_projection` (no bias) is the representation layer without activation, whose output is `image_embeds`;
- SigLIP2 NaFlex: SigLIP's names, with the patch embedding a Linear over each patch's pixels in (row, column,
  channel) order, which is the patch convolution with its weight laid out so;
- SigLIP: no class token; `head` is the attention-pool head (timm's `attn_pool`): a learned probe, PyTorch's
  MultiheadAttention (its packed in-projection split into q and kv), then LayerNorm and a residual MLP. Without a
  head (`vision_use_head=False`) the tower's users average the normalised tokens.
"""

from __future__ import annotations

import math
from typing import Any

from .common import StateDict, convert_encoder

_LAYER = r"encoder\.layers\.(\d+)\."
_QKV = _LAYER + r"self_attn\.(q_proj|k_proj|v_proj)\.(weight|bias)"
_ENCODER = [
    (_LAYER + r"layer_norm([12])\.(weight|bias)", r"blocks.\1.norm\2.\3"),
    (_LAYER + r"self_attn\.out_proj\.(weight|bias)", r"blocks.\1.attn.proj.\2"),
    (_LAYER + r"mlp\.(fc[12])\.(weight|bias)", r"blocks.\1.mlp.\2.\3"),
    (r"embeddings\.patch_embedding\.(weight|bias)", r"patch_embed.proj.\1"),
    (r"embeddings\.position_ids", ""),  # a buffer of older checkpoints
    (r"post_layernorm\.(weight|bias)", r"norm.\1"),
    (r"pre_layrnorm\.(weight|bias)", r"norm_pre.\1"),  # sic: transformers' name
    (r"head\.probe", "attn_pool.latent"),
    (r"head\.attention\.out_proj\.(weight|bias)", r"attn_pool.proj.\1"),
    (r"head\.layernorm\.(weight|bias)", r"attn_pool.norm.\1"),
    (r"head\.mlp\.(fc[12])\.(weight|bias)", r"attn_pool.mlp.\1.\2"),
]
# a whole CLIPModel / SiglipModel: the text tower and the contrastive scalars are not part of the image encoder
_OTHER_TOWER = ("text_model.", "text_projection.", "logit_scale", "logit_bias")


class _Tower:
    def __init__(self, name: str, anchor: str, cls: bool):
        self.NAME, self.ANCHOR, self._cls = name, anchor, cls

    def matches(self, keys: set[str]) -> bool:
        has_cls = any(k.endswith("embeddings.class_embedding") for k in keys)
        return any(k.endswith(self.ANCHOR) for k in keys) and has_cls == self._cls

    def convert(self, raw: dict) -> StateDict:
        out = convert_encoder(raw, self.ANCHOR, _ENCODER, _QKV, {"visual_projection": "pre_logits.fc"}, _OTHER_TOWER)
        if "embeddings.class_embedding" in out:
            out["cls_token"] = out.pop("embeddings.class_embedding").reshape(1, 1, -1)  # (D,) -> (1, 1, D)
        w = out.get("patch_embed.proj.weight")
        if w is not None and w.ndim == 2:  # SigLIP2 NaFlex: a Linear over (row, column, channel) patch pixels
            side = math.isqrt(w.shape[1] // 3)
            out["patch_embed.proj.weight"] = w.reshape(w.shape[0], side, side, 3).permute(0, 3, 1, 2).contiguous()
        if "embeddings.position_embedding.weight" in out:
            out["pos_embed"] = out.pop("embeddings.position_embedding.weight").unsqueeze(0)  # (N, D) -> (1, N, D)
        if "head.attention.in_proj_weight" in out:
            for kind in ("weight", "bias"):
                w = out.pop(f"head.attention.in_proj_{kind}")  # (3D, ...): q, k, v
                d = w.shape[0] // 3
                out[f"attn_pool.q.{kind}"], out[f"attn_pool.kv.{kind}"] = w[:d], w[d:]
        return out

    def fields(self, sd: StateDict) -> dict[str, Any]:
        """ViTConfig fields the converted tensors decide."""
        f: dict[str, Any] = {"class_token": "cls_token" in sd, "pre_norm": "norm_pre.weight" in sd,
                             "no_embed_class": False, "reg_tokens": 0, "pre_logits_size": 0}
        if self._cls:
            f["global_pool"] = "token"
        elif "attn_pool.latent" in sd:
            f.update(global_pool="map", fc_norm=False)
        else:
            f.update(global_pool="avg", fc_norm=False)  # the mean of the normalised tokens
        if "pre_logits.fc.weight" in sd:
            f.update(pre_logits_size=int(sd["pre_logits.fc.weight"].shape[0]), pre_logits_act="",
                     pre_logits_bias=False)
        return f


CLIP = _Tower("hf-clip", "embeddings.patch_embedding.weight", cls=True)
SIGLIP = _Tower("hf-siglip", "embeddings.patch_embedding.weight", cls=False)
