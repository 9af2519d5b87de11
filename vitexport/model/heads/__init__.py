"""Dense heads over a backbone's intermediate tokens: each head its own module, composed over the families'
models by `model.dense` (`dpt`: DPT's reassemble, fusion and depth head, for Depth Anything and DPT, and DPT's
segmentation head). What a head is, as data, is `config.DenseConfig`."""
