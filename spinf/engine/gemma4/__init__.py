"""The Gemma 4 stack: `config` reads the checkpoint's config; `model` is the decoder over a pass of jobs with tries
and `layer` one of its layers (plain torch on the CPU, the fused Triton path on a GPU), `moe` its experts (the 26B
A4B); `loading` opens a checkpoint layer by layer and `fp8_static` reads fp8-static checkpoints; `embedders` are the
unified layouts' media embedders and `tower` the 31B's vision tower; `tiny` writes the built-in tiny twin and
`tiny_tower` its 31B-layout sibling with a vision tower.
"""
