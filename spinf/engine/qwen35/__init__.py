"""The Qwen3.5 hybrid stack (engine spec B.14): Gated DeltaNet and full-attention layers over a packed pass.

`config` reads the checkpoint's config; `model` is the decoder over a pass of jobs with tries (tree attention on the
full-attention layers, the delta-rule recurrence and the causal convolution along each token's path on the GDN
layers of `gdn`), on the CPU in fp32 and on a GPU, `plan` the plan of a pass its layers read and `ops` the small
pieces they share; `gptq` reads GPTQ int4 checkpoints and `int4` runs their linears in their modes, `outliers` finds
and reads the i8 mode's outlier table (ours or spinf-serve 0.1.1's), `int4_write` writes small int4 checkpoints in
the real layout; `readout` is the decider's head; `loading` opens a checkpoint for the engine; `tiny` writes the
tiny twin and the tiny decider; `vision` is the image tower, `media` what the engine reads with it.
`chunked` runs a long fixed prefix through flash-linear-attention's chunked delta rule. On a GPU, small scoring
passes replay CUDA graphs in pieces around the recurrences (`graphs`), and extraction's decode steps replay graphs
of their own.
"""
