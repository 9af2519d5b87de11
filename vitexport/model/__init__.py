"""The model: the reference ViT read top-down (`vit`), the size table and each variant's preprocessing
(`variants`), position-embedding resampling (`posembed`), one converter per checkpoint format (`checkpoints`),
hub checkpoints (`hub`), class names (`labels`) and what a user asked to build (`spec`).

Imports artifacts (the records it fills), data, parity and the base modules.
"""
