"""The reference ViT's building blocks, one kind per module, as timm splits `layers/` from `models/`: norms and
activations (`norm`), MLPs (`mlp`), attention (`attention`), the patch embedding (`patch`), the blocks that compose
them (`blocks`) and pooling (`pool`). Parameter names are timm's, so its state dicts load as they are.

A block takes its parts by name (`norm_layer="rmsnorm"`, `mlp_layer="swiglu"`), so a model's configuration is
plain data (`ViTConfig`); the tables mapping names to parts are each module's `*_LAYERS`.
"""
