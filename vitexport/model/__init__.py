"""The model: the reference ViT read top-down (`vit`) and its parts (`layers/`), what a ViT is as data (`config`),
timm's VisionTransformer family by name (`archs`, from the generated table) and the shipped digits model
(`variants`), position-embedding resampling (`posembed`), one converter per checkpoint format (`checkpoints`), hub
checkpoints (`hub`), class names (`labels`) and what a user asked to build (`spec`).

Imports artifacts (the records it fills), data, parity and the base modules.
"""
