"""Gemma 4's RMSNorm in plain torch: the decoder's (`spinf.engine.gemma4.model`), the experts'
(`spinf.engine.gemma4.moe`) and the vision tower's, one definition for all."""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Gemma 4's RMSNorm in fp32: ``x / sqrt(mean(x^2) + eps) * weight`` (the weight multiplies directly).

    Written with a square root and a division, which are correctly rounded in every code path, rather than a
    ``pow(-0.5)`` whose vectorised and scalar CPU versions can differ in the last bit (which would make a row's
    result depend on where it sits in the tensor).
    """
    xf = x.float()
    out = xf * (1.0 / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps))
    if weight is not None:
        out = out * weight.float()
    return out.type_as(x)
