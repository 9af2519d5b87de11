"""The readers of formats from outside: hub repositories (`hub`), transformers' configs (`hf_configs` for
the vision towers, `hf_dense` for the dense models), timm's argument table (`timm_args`), model objects
(`objects`) and checkpoint files (`checkpoints`, one converter a format). They turn what a user has into
what the architectures in `model/` are built from; none of them builds a model."""
