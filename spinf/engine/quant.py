"""fp8 quantization with static scales ("fp8s", engine spec B.8–B.9): the arithmetic, independent of any kernel.

Weights are e4m3 with one fp32 scale per tensor (``amax / 448``); a fused linear (q/k/v, gate/up) keeps each part's
scale, as a vector of one scale per output row (`Fp8Weight.fuse`), so that a bf16 checkpoint quantized at load and
a pre-quantized one with per-projection scales hold the same weights. Activations use a **static** per-linear scale, a
power of two at least ``headroom`` times the largest input seen in calibration, so no statistic is ever shared
between rows: a row's quantized value depends on that row alone, which per-question invariance needs. Quantizing
is ``x / scale``, clamped to ±448, cast, all in fp32. `fp8_matmul` runs ``torch._scaled_mm`` on a GPU on an input so
quantized; elsewhere it computes the same product from the dequantized operands, which is what the CPU tests compare
against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import torch

from spinf.engine.gemm import row_stable_mm

E4M3_MAX = 448.0
DEFAULT_HEADROOM = 2.0


def activation_scale(amax: float, headroom: float = DEFAULT_HEADROOM) -> float:
    """``2 ** ceil(log2(headroom * amax / 448))``: exact in the kernel, at least ``headroom`` × the largest input."""
    if not math.isfinite(amax) or amax < 0:
        raise ValueError(f"an activation maximum must be finite and non-negative, got {amax!r}")
    if amax == 0:
        return 1.0
    return 2.0 ** math.ceil(math.log2(headroom * amax / E4M3_MAX))


def divided(x: torch.Tensor, by: float) -> torch.Tensor:
    """``x / by``, correctly rounded on every device. CUDA turns a division by a Python number into a product with
    its rounded inverse, which moves last bits (a scale made on the GPU would not be the CPU's, nor the one a
    checkpoint written elsewhere holds), so the divisor goes as a tensor filled on ``x``'s device (no copy from the
    host, so it may run inside a CUDA graph's capture: fp8's dynamic scale does)."""
    return x / torch.full_like(x, by)


def quantize(x: torch.Tensor, scale: float | torch.Tensor) -> torch.Tensor:
    """``x / scale`` clamped to the e4m3 range and cast, in fp32 math (row-wise: no cross-row statistic)."""
    x = x.float()
    scaled = divided(x, scale) if isinstance(scale, int | float) else x / scale
    return scaled.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


@attrs.frozen
class Fp8Weight:
    """An e4m3 weight ``[out, in]`` and its fp32 scale: one per tensor (0-dim), or one per output row (``[out]``).

    A weight fused from several projections has a row vector: each projection's rows carry that projection's
    scale. Both load paths build it the same way (`from_float` with ``sizes``, or `fuse` of the parts a
    pre-quantized checkpoint holds), so they score bit-identically.
    """

    data: torch.Tensor
    scale: torch.Tensor
    # static input scale -> ``(x_scale * scale)[None, :]`` on the weight's device, for the row-wise product
    row_scales: dict[float, torch.Tensor] = attrs.field(factory=dict, eq=False, repr=False)

    @classmethod
    def from_float(cls, weight: torch.Tensor, sizes: Sequence[int] | None = None) -> Fp8Weight:
        """Quantize with ``amax / 448`` per tensor, or per part of a fused weight (``sizes``: each part's rows)."""
        weight = weight.detach()  # a Parameter would tie its fp32 temporaries to the result through autograd
        if sizes is not None and len(sizes) > 1:
            return cls.fuse([cls.from_float(part) for part in weight.split(list(sizes))])
        amax = weight.abs().max().float().clamp(min=torch.finfo(torch.float32).tiny)
        scale = divided(amax, E4M3_MAX)
        return cls(quantize(weight, scale), scale.reshape(()))

    @classmethod
    def fuse(cls, parts: Sequence[Fp8Weight]) -> Fp8Weight:
        """The weights stacked by rows; with more than one part, always a per-row scale vector."""
        if len(parts) == 1:
            return parts[0]
        scales = [p.scale.float().reshape(-1).expand(p.data.shape[0]) for p in parts]
        return cls(torch.cat([p.data for p in parts]), torch.cat(scales).contiguous())

    @property
    def per_row(self) -> bool:
        return self.scale.dim() == 1

    def dequantized(self) -> torch.Tensor:
        return self.data.float() * (self.scale[:, None] if self.per_row else self.scale)

    def scaled_rows(self, x_scale: float) -> torch.Tensor:
        """``(x_scale · scale)[None, :]``, made once per static input scale (exact: ``x_scale`` is a power of
        two)."""
        if x_scale not in self.row_scales:
            self.row_scales[x_scale] = (self.scale.float() * x_scale)[None, :].contiguous()
        return self.row_scales[x_scale]


_SCALES: dict[tuple[float, torch.device], torch.Tensor] = {}  # static scales as device scalars, made once
_ONES: dict[torch.device, torch.Tensor] = {}  # per-row scales of 1 ([rows, 1] fp32), sliced for every row count
MIN_ONES = 65_536


def _scale_tensor(scale: float, device: torch.device) -> torch.Tensor:
    key = (scale, device)
    if key not in _SCALES:
        _SCALES[key] = torch.tensor(scale, dtype=torch.float32, device=device)
    return _SCALES[key]


def ones_column(rows: int, device: torch.device) -> torch.Tensor:
    """A contiguous ``[rows, 1]`` fp32 tensor of ones: a slice of one buffer per device, grown when too short."""
    ones = _ONES.get(device)
    if ones is None or ones.shape[0] < rows:
        ones = _ONES[device] = torch.ones((max(rows, MIN_ONES), 1), dtype=torch.float32, device=device)
    return ones[:rows]


def fp8_matmul(
    xq: torch.Tensor, weight: Fp8Weight, x_scale: float | torch.Tensor, out_dtype=torch.bfloat16
) -> torch.Tensor:
    """``(xq · x_scale) @ W.T`` for an input already quantized (e4m3): ``_scaled_mm`` on CUDA, emulated elsewhere.

    ``x_scale`` is fp8s's static scale (a float, a power of two) or fp8's dynamic one (an fp32 device scalar).
    ``_scaled_mm`` with per-tensor scales gives every row the same bits whatever the row count (measured for every
    12B shape on the H200, benchmarks/RESULTS.md), so no minimum row count is needed. A per-row weight scale runs
    the row-wise ``_scaled_mm`` (bf16 output) with ones for the input rows and ``x_scale · scale`` for the output
    columns, so the epilogue multiplies each sum once by one product (exact for a static scale);
    ``benchmarks/schemes.py`` (its probe) measures whether its rows are invariant too.
    """
    if xq.is_cuda:
        dynamic = isinstance(x_scale, torch.Tensor)
        if weight.per_row:
            scale_b = (x_scale * weight.scale)[None, :] if dynamic else weight.scaled_rows(x_scale)
            out = torch._scaled_mm(
                xq,
                weight.data.t(),
                scale_a=ones_column(xq.shape[0], xq.device),
                scale_b=scale_b,
                out_dtype=torch.bfloat16,
            )
            return out if out_dtype == torch.bfloat16 else out.to(out_dtype)
        scale_a = x_scale if dynamic else _scale_tensor(x_scale, xq.device)
        return torch._scaled_mm(xq, weight.data.t(), scale_a=scale_a, scale_b=weight.scale, out_dtype=out_dtype)
    return row_stable_mm(xq.float() * x_scale, weight.dequantized()).to(out_dtype)


@attrs.define
class AmaxRecorder:
    """Calibration: the largest ``|input|`` each linear has seen, by name (the run itself uses no fp8)."""

    amax: dict[str, float] = attrs.field(factory=dict)

    def observe(self, name: str, x: torch.Tensor) -> None:
        seen = float(x.detach().abs().max())
        self.amax[name] = max(self.amax.get(name, 0.0), seen)

    def scales(self, headroom: float = DEFAULT_HEADROOM) -> dict[str, float]:
        return {name: activation_scale(value, headroom) for name, value in sorted(self.amax.items())}
