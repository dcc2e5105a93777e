"""The Qwen3.5 hybrid stack (engine spec B.14): Gated DeltaNet and full-attention layers over a packed pass.

Built so far, on the CPU in fp32: the checkpoint's config (`config`), a tiny random checkpoint in the published
layout (`tiny`) and the decoder's forward over a pass of jobs with tries (`model`: tree attention on the
full-attention layers, the delta-rule recurrence and the causal convolution along each token's path on the GDN
layers). Not yet: int4 GPTQ weights, the decider readout, GPU kernels, extraction and generation, Qwen images, and
the wiring into the engine, the loader and the catalog.
"""
