"""The Qwen3.5 stack's small pieces, shared by its layers: its RMSNorm and L2 norm (row by row on a GPU), and its
float linears (`Dense`, made by a `MakeLinear` factory: `float_linears` here, the int4 ones in
`spinf.engine.qwen35.int4`). Elementwise functions on vector-padded widths are `spinf.engine.elementwise`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from spinf.engine.gemm import stable_mm


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, *, offset: float = 1.0) -> torch.Tensor:
    """RMSNorm over the last dim in fp32, times ``offset + weight`` (Qwen3.5's norms: 1; the GDN's gated norm: 0).

    A square root and a division (correctly rounded in every code path) rather than ``rsqrt``, as in
    `spinf.engine.norm.rms_norm`. On a GPU one row per program (`spinf.engine.kernels.rows.qwen_norm`): torch's
    reductions there split a row by how many rows there are."""
    if x.is_cuda:
        from spinf.engine.kernels.rows import qwen_norm

        return qwen_norm(x, weight, eps, offset=offset)
    xf = x.float()
    out = xf * (1.0 / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps))
    if weight is not None:
        out = out * (offset + weight.float())
    return out.type_as(x)


def l2_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / ‖x‖`` over the last dim in x's dtype; on a GPU row by row, as `rms_norm`."""
    if x.is_cuda:
        from spinf.engine.kernels.rows import qwen_norm

        return qwen_norm(x, None, eps, l2=True)
    return x * (1.0 / torch.sqrt((x * x).sum(-1, keepdim=True) + eps))


class Dense(nn.Module):
    """A float linear without bias: ``x · Wᵀ`` in fixed row blocks (`row_stable_mm`). The int4 checkpoints' linears
    (`spinf.engine.qwen35.int4`) take the same place with the same call."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return stable_mm(x, self.weight.to(x.dtype))


def linear_plus(
    linear: nn.Module, x: torch.Tensor, residual: torch.Tensor | None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``residual + linear(x)`` (``linear(x)`` when ``residual`` is None), written into ``out`` when given: in one
    kernel where the linear adds it to its product (`spinf.engine.qwen35.int4.Int4Linear.plus`), else as two."""
    if residual is None:
        y = linear(x)
    elif (plus := getattr(linear, "plus", None)) is not None:
        return plus(x, residual, out)
    else:
        y = residual + linear(x)
    return y if out is None else out.copy_(y)


def made_plus(
    linear: nn.Module,
    make: Callable[..., Any],
    like: torch.Tensor,
    residual: torch.Tensor | None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`linear_plus` of the rows ``make()`` gives; where the linear reads block-scaled int8 activations
    (`spinf.engine.qwen35.int4.Int4Linear.takes_blocks`, rows like ``like``), ``make(blocks=True)`` gives their
    codes and scales instead, from the same kernel, so the rows never reach memory: the same bits."""
    if (takes := getattr(linear, "takes_blocks", None)) is not None and takes(like):
        if residual is None or residual.dtype == like.dtype:
            return linear.blocks_plus(*make(blocks=True), like.dtype, residual, out)
    return linear_plus(linear, make(), residual, out)


def norm_linear(
    linear: nn.Module,
    h: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    want_x: bool = False,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``linear(rms_norm(h, weight, eps))`` and the normed rows when ``want_x`` (else None, or them anyway): in
    one pass with the activations' quantizer where the linear can (`spinf.engine.qwen35.int4.Int4Linear.normed`),
    the quantizer's bits for the normed rows (their sum of squares in the kernel's own order). The product goes
    into ``out`` when given (by the product's kernel where it can, else copied)."""
    if (normed := getattr(linear, "normed", None)) is not None:
        return normed(h, weight, eps, want_x=want_x, out=out)
    x = rms_norm(h, weight, eps)
    y = linear(x)
    return (y if out is None else out.copy_(y)), x


# Makes one linear from the checkpoint's tensors: the full weight names without ``.weight`` (several: fused along
# the output, in that order); float (`float_linears`) or int4 (`spinf.engine.qwen35.int4`).
MakeLinear = Callable[[list[str]], nn.Module]


def float_linears(take: Callable[[str], torch.Tensor], dtype: torch.dtype | None = None) -> MakeLinear:
    """`MakeLinear` for float checkpoints: the weights concatenated along the output, as `Dense`."""

    def make(names: list[str]) -> nn.Module:
        weight = torch.cat([take(name + ".weight") for name in names])
        return Dense(weight if dtype is None else weight.to(dtype))

    return make
