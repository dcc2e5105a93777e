"""fp8s arithmetic (engine spec B.8-B.9): power-of-two scales, row-wise quantization, the linear's product."""

from __future__ import annotations

import math

import pytest
import torch

from spinf.engine.quant import E4M3_MAX, AmaxRecorder, Fp8Weight, activation_scale, fp8_matmul, quantize


def fp8_linear(x: torch.Tensor, weight: Fp8Weight, x_scale: float, out_dtype=torch.bfloat16) -> torch.Tensor:
    """``x @ W.T`` with ``x`` quantized by its static scale, as the model's linears run it."""
    return fp8_matmul(quantize(x, x_scale), weight, x_scale, out_dtype)


@pytest.mark.parametrize("amax", [1e-3, 0.5, 12.6, 447.0, 448.0, 6592.0])
def test_activation_scales_are_powers_of_two_with_headroom(amax):
    scale = activation_scale(amax)
    assert math.log2(scale) == int(math.log2(scale))
    assert scale * E4M3_MAX >= 2 * amax  # at least twice the largest input fits the e4m3 range
    assert scale * E4M3_MAX < 4 * amax  # and the next power of two down would not


def test_a_zero_or_bad_maximum():
    assert activation_scale(0.0) == 1.0
    with pytest.raises(ValueError, match=r"^an activation maximum must be finite and non-negative, got nan$"):
        activation_scale(float("nan"))


def test_quantization_is_row_wise_and_clamps():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 32, generator=gen) * 100
    q = quantize(x, 0.5)
    assert q.dtype == torch.float8_e4m3fn
    assert q.float().abs().max() <= E4M3_MAX
    assert torch.equal(quantize(x[5:6], 0.5).float(), q[5:6].float())  # a row alone quantizes the same


def test_the_fp8_linear_is_close_to_the_float_product_and_rows_are_independent():
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(48, 32, generator=gen) / 32**0.5
    x = torch.randn(20, 32, generator=gen)
    w8 = Fp8Weight.from_float(weight)
    scale = activation_scale(float(x.abs().max()))
    out = fp8_linear(x, w8, scale, out_dtype=torch.float32)
    exact = x @ weight.t()
    assert ((out - exact).norm() / exact.norm()).item() < 0.1  # e4m3 keeps about 3 bits of mantissa
    assert torch.equal(fp8_linear(x[3:4], w8, scale, out_dtype=torch.float32), out[3:4])


def test_calibration_records_the_largest_input_per_linear():
    recorder = AmaxRecorder()
    recorder.observe("layers.0.wqkv", torch.tensor([[1.0, -3.0]]))
    recorder.observe("layers.0.wqkv", torch.tensor([[2.0, 0.5]]))
    recorder.observe("layers.0.wo", torch.tensor([[0.25]]))
    assert recorder.amax == {"layers.0.wqkv": 3.0, "layers.0.wo": 0.25}
    assert recorder.scales() == {"layers.0.wo": activation_scale(0.25), "layers.0.wqkv": activation_scale(3.0)}


@pytest.mark.gpu
def test_on_the_gpu_scaled_mm_gives_the_dequantized_product_with_invariant_rows():
    gen = torch.Generator(device="cuda").manual_seed(2)
    weight = torch.randn(512, 256, device="cuda", generator=gen) / 16
    x = torch.randn(300, 256, device="cuda", generator=gen)
    w8 = Fp8Weight.from_float(weight)
    scale = activation_scale(float(x.abs().max()))
    out = fp8_linear(x, w8, scale, out_dtype=torch.float32)
    expected = (quantize(x, scale).float() * scale) @ w8.dequantized().t()
    # Hopper's fp8 tensor cores accumulate with fewer bits than fp32 (measured 1.3e-4 relative on the H200)
    assert ((out - expected).norm() / expected.norm()).item() < 1e-3
    for rows, offset in [(1, 0), (3, 7), (17, 100), (129, 150)]:
        assert torch.equal(
            fp8_linear(x[offset : offset + rows], w8, scale, out_dtype=torch.float32), out[offset : offset + rows]
        )
