"""The Gemma quantization schemes of engine spec B.8 that quantize on the fly: how each stores a decoder linear's
weight and how the linear runs.

A `Scheme` is two plain functions: ``quantize(weight, sizes)`` makes the stored weight from the float one at load
(``sizes``: the rows of each projection fused into it, q/k/v or gate/up), and ``linear(x, stored, out_dtype)`` runs
``x @ W.T`` on an input in the model dtype, quantizing that input itself. On a GPU the product is the scheme's own
kernel; elsewhere the same arithmetic is emulated from the dequantized operands (row-stable, `row_stable_mm`), so the
CPU tests measure the scheme's error on the tiny model.

| scheme | weight | activation | GPU product |
|---|---|---|---|
| fp8 | e4m3, amax / 448 per projection | e4m3, one dynamic scale: amax of the whole input / 448 | ``_scaled_mm`` |
| fp8row | e4m3, amax / 448 per output row | e4m3, amax / 448 per row (token) | row-wise ``_scaled_mm`` |
| w8a16 | int8, amax / 127 per output row | bf16 | weight dequantized to bf16 per call, bf16 GEMM |
| w8a8 | int8, amax / 127 per output row | int8, amax / 127 per row, rounded | ``_int_mm`` (int32, exact), scales |

fp8s (static activation scales, `spinf.engine.quant`) is the batch-invariant scheme and runs through
``DecoderLayer.fp8``; fp32 and bf16 keep the float weights. None of these four is batch-invariant: fp8's scale is a
statistic of the whole pass, and the others' GEMM kernels (or, for w8a8, the padding below 17 rows and the kernels
around it) are not known to give a row the same bits whatever shares the pass; each is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import torch

from spinf.engine.gemm import gpu_mm, row_stable_mm
from spinf.engine.quant import E4M3_MAX, Fp8Weight, divided, fp8_matmul, quantize

INT8_MAX = 127.0
TINY = torch.finfo(torch.float32).tiny  # the floor of an amax, so an all-zero row or tensor quantizes to zeros
INT_MM_MIN_ROWS = 17  # torch._int_mm on CUDA takes more than 16 rows: shorter inputs are padded with zero rows


def kernels():
    from spinf.engine import kernels as module

    return module


@attrs.frozen
class Int8Weight:
    """An int8 weight ``[out, in]`` and one fp32 scale per output row (``amax / 127``)."""

    data: torch.Tensor
    scale: torch.Tensor  # [out]

    @classmethod
    def from_float(cls, weight: torch.Tensor, sizes: Sequence[int] | None = None) -> Int8Weight:
        """Per output row, so fusing projections changes nothing (``sizes`` is accepted for the common call)."""
        w = weight.detach().float()
        scale = divided(w.abs().amax(dim=1).clamp(min=TINY), INT8_MAX)
        return cls(torch.round(w / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scale)

    def dequantized(self) -> torch.Tensor:
        return self.data.float() * self.scale[:, None]


def fp8_per_row(weight: torch.Tensor, sizes: Sequence[int] | None = None) -> Fp8Weight:
    """e4m3 with one ``amax / 448`` per output row (fp8row's weight)."""
    w = weight.detach().float()
    scale = divided(w.abs().amax(dim=1).clamp(min=TINY), E4M3_MAX)
    return Fp8Weight(quantize(w, scale[:, None]), scale)


def tensor_scale(x: torch.Tensor) -> torch.Tensor:
    """fp8's dynamic activation scale: the largest ``|x|`` of the whole input / 448, an fp32 scalar on its device."""
    return divided(torch.linalg.vector_norm(x, float("inf")).float().clamp(min=TINY), E4M3_MAX)


def quantize_tokens(x: torch.Tensor, *, int8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row by its own ``amax / 448`` (e4m3) or ``amax / 127`` (int8, rounded to nearest even): the quantized
    rows and their ``[rows, 1]`` fp32 scales. A Triton kernel on a GPU, the same arithmetic in torch elsewhere."""
    if x.is_cuda:
        return kernels().quantize_dynamic(x, int8=int8)
    limit = INT8_MAX if int8 else E4M3_MAX
    scale = divided(x.abs().amax(dim=1, keepdim=True).float().clamp(min=TINY), limit)
    if int8:
        return torch.round(x.float() / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scale
    return quantize(x, scale), scale


def fp8_linear(x: torch.Tensor, weight: Fp8Weight, out_dtype: torch.dtype) -> torch.Tensor:
    """fp8: the input quantized by one scale for the whole pass, then the fp8 product (`fp8_matmul`)."""
    scale = tensor_scale(x)
    xq = kernels().quantize_dynamic(x, scale=scale)[0] if x.is_cuda else quantize(x, scale)
    return fp8_matmul(xq, weight, scale, out_dtype)


def fp8row_linear(x: torch.Tensor, weight: Fp8Weight, out_dtype: torch.dtype) -> torch.Tensor:
    """fp8row: per-token input scales [M, 1] and per-channel weight scales [1, N] in the row-wise ``_scaled_mm``."""
    xq, x_scale = quantize_tokens(x, int8=False)
    if x.is_cuda:
        out = torch._scaled_mm(
            xq, weight.data.t(), scale_a=x_scale, scale_b=weight.scale[None, :], out_dtype=torch.bfloat16
        )
        return out if out_dtype == torch.bfloat16 else out.to(out_dtype)
    return row_stable_mm(xq.float() * x_scale, weight.dequantized()).to(out_dtype)


def w8a16_linear(x: torch.Tensor, weight: Int8Weight, out_dtype: torch.dtype) -> torch.Tensor:
    """w8a16: the weight's scale folded in per call (int8 · fp32 scale, rounded once to bf16), then a bf16 product
    (fp32 accumulation; on the CPU emulated in fp32 from the bf16 operands)."""
    folded = torch.empty(weight.data.shape, dtype=torch.bfloat16, device=weight.data.device)
    torch.mul(weight.data, weight.scale[:, None], out=folded)
    if x.is_cuda:
        return gpu_mm(x.to(torch.bfloat16), folded).to(out_dtype)
    return row_stable_mm(x.to(torch.bfloat16).float(), folded.float()).to(out_dtype)


def w8a8_linear(x: torch.Tensor, weight: Int8Weight, out_dtype: torch.dtype) -> torch.Tensor:
    """w8a8: per-token int8 inputs, an int8 product with int32 sums (exact, so the same on every device), then
    ``sum · x_scale · w_scale`` in fp32. On CUDA ``_int_mm`` needs more than 16 rows: shorter inputs are padded."""
    xq, x_scale = quantize_tokens(x, int8=True)
    rows = xq.shape[0]
    if x.is_cuda and rows < INT_MM_MIN_ROWS:
        xq = torch.cat([xq, xq.new_zeros((INT_MM_MIN_ROWS - rows, xq.shape[1]))])
    sums = torch._int_mm(xq, weight.data.t())[:rows]
    return (sums.float() * x_scale * weight.scale[None, :]).to(out_dtype)


@attrs.frozen
class Scheme:
    """A scheme that quantizes on the fly: how a weight is stored, and how a linear runs on an input."""

    name: str
    quantize: Callable[[torch.Tensor, Sequence[int] | None], object]
    linear: Callable[[torch.Tensor, object, torch.dtype], torch.Tensor]


SCHEMES: dict[str, Scheme] = {
    "fp8": Scheme("fp8", Fp8Weight.from_float, fp8_linear),
    "fp8row": Scheme("fp8row", fp8_per_row, fp8row_linear),
    "w8a16": Scheme("w8a16", Int8Weight.from_float, w8a16_linear),
    "w8a8": Scheme("w8a8", Int8Weight.from_float, w8a8_linear),
}

__all__ = ["INT_MM_MIN_ROWS", "SCHEMES", "Int8Weight", "Scheme", "fp8_per_row", "quantize_tokens", "tensor_scale"]
