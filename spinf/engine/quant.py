"""fp8 quantization with static scales ("fp8s", engine spec B.8–B.9): the arithmetic, independent of any kernel.

Weights are e4m3 with one fp32 scale per tensor (``amax / 448``). Activations use a **static** per-linear scale, a
power of two at least ``headroom`` times the largest input seen in calibration, so no statistic is ever shared
between rows: a row's quantized value depends on that row alone, which per-question invariance needs. Quantizing
is ``x / scale``, clamped to ±448, cast, all in fp32. `fp8_matmul` runs ``torch._scaled_mm`` on a GPU on an input so
quantized; elsewhere it computes the same product from the dequantized operands, which is what the CPU tests compare
against.
"""

from __future__ import annotations

import math

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


def quantize(x: torch.Tensor, scale: float | torch.Tensor) -> torch.Tensor:
    """``x / scale`` clamped to the e4m3 range and cast, in fp32 math (row-wise: no cross-row statistic)."""
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


@attrs.frozen
class Fp8Weight:
    """An e4m3 weight ``[out, in]`` and its per-tensor fp32 scale."""

    data: torch.Tensor
    scale: torch.Tensor

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Fp8Weight:
        weight = weight.detach()  # a Parameter would tie its fp32 temporaries to the result through autograd
        amax = weight.abs().max().float().clamp(min=torch.finfo(torch.float32).tiny)
        scale = amax / E4M3_MAX
        return cls(quantize(weight, scale), scale.reshape(()))

    def dequantized(self) -> torch.Tensor:
        return self.data.float() * self.scale


_SCALES: dict[tuple[float, torch.device], torch.Tensor] = {}  # static scales as device scalars, made once


def _scale_tensor(scale: float, device: torch.device) -> torch.Tensor:
    key = (scale, device)
    if key not in _SCALES:
        _SCALES[key] = torch.tensor(scale, dtype=torch.float32, device=device)
    return _SCALES[key]


def fp8_matmul(xq: torch.Tensor, weight: Fp8Weight, x_scale: float, out_dtype=torch.bfloat16) -> torch.Tensor:
    """``(xq · x_scale) @ W.T`` for an input already quantized (e4m3): ``_scaled_mm`` on CUDA, emulated elsewhere.

    ``_scaled_mm`` with per-tensor scales gives every row the same bits whatever the row count (measured for every
    12B shape on the H200, benchmarks/RESULTS.md), so no minimum row count is needed.
    """
    if xq.is_cuda:
        scale_a = _scale_tensor(x_scale, xq.device)
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
