"""Elementwise functions whose value at an element never depends on the tensor's size (`pointwise`).

On the CPU, torch runs an elementwise op over a contiguous tensor as one flat loop: two vectors at a time (32 fp32
lanes under AVX-512, 16 under AVX2), the last elements in scalar code, which for exp, tanh, GELU, sigmoid, softplus
or cos can differ from the vector code in the last bit. A row's elements therefore got vector or scalar code by
where the row sat in the flat buffer and how many rows there were: a one-row decode step of 16 columns runs wholly
in scalar code, the same row inside a pass in vector code. `pointwise` computes on rows padded to `VECTOR_BLOCK`
columns, so every row starts and ends on a vector boundary and meets only the vector code.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

VECTOR_BLOCK = 64  # columns a row is padded to: a whole number of two-vector steps at every vector width torch uses


def pointwise(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``fn(x)`` for an elementwise ``fn`` on a 2-D ``x``, computed with the columns padded to `VECTOR_BLOCK`."""
    width = x.shape[-1]
    pad = -width % VECTOR_BLOCK
    return fn(F.pad(x, (0, pad)) if pad else x.contiguous())[..., :width]
