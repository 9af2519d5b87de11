"""Using a model folder: top-k predictions of images on a chosen backend (`predict`) and a Triton Inference
Server model repository entry (`triton`).

Goes through `ensure` for the files it serves; imports every layer below it, never cli or bench.
"""
