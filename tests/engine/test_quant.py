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


def test_a_fused_weight_keeps_one_scale_per_part_as_a_row_vector():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(rows, 32, generator=gen) * amp for rows, amp in [(16, 1.0), (8, 40.0), (8, 1e-4)])
    fused = Fp8Weight.from_float(torch.cat([q, k, v]), sizes=(16, 8, 8))
    parts = [Fp8Weight.from_float(w) for w in (q, k, v)]
    assert all(p.scale.shape == () for p in parts) and fused.scale.shape == (32,)
    assert torch.equal(fused.scale, torch.cat([p.scale.expand(p.data.shape[0]) for p in parts]))
    assert torch.equal(fused.data.view(torch.uint8), torch.cat([p.data for p in parts]).view(torch.uint8))
    rebuilt = Fp8Weight.fuse(parts)  # what a pre-quantized checkpoint's q, k and v give
    assert torch.equal(rebuilt.scale, fused.scale) and torch.equal(
        rebuilt.data.view(torch.uint8), fused.data.view(torch.uint8)
    )
    assert torch.equal(fused.dequantized(), torch.cat([p.dequantized() for p in parts]))
    # each part at its own scale: the small v rows are not flushed by k's range, as one per-tensor scale would
    one = Fp8Weight.from_float(torch.cat([q, k, v]))
    err = {name: (w.dequantized()[16 + 8 :] - v).abs().max().item() for name, w in [("fused", fused), ("one", one)]}
    assert err["fused"] <= 2**-4 * v.abs().max().item() and err["one"] > 10 * err["fused"]
    x = torch.randn(5, 32, generator=gen)
    out = fp8_linear(x, fused, 0.25, out_dtype=torch.float32)
    each = torch.cat([fp8_linear(x, p, 0.25, out_dtype=torch.float32) for p in parts], dim=1)
    torch.testing.assert_close(out, each, rtol=1e-5, atol=1e-6)  # the parts' products side by side (up to BLAS order)


def test_fusing_one_part_keeps_its_per_tensor_scale():
    w = Fp8Weight.from_float(torch.randn(8, 16), sizes=(8,))
    assert Fp8Weight.fuse([w]) is w and w.scale.shape == ()


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


@pytest.mark.gpu
def test_on_the_gpu_a_per_row_weight_scale_runs_the_row_wise_product_with_invariant_rows():
    """The row-wise ``_scaled_mm`` (ones for the input rows, ``x_scale · w_scale`` per column, bf16 out) of a fused
    weight: close to the dequantized product, and every row the same alone as inside 300 rows (fp8s's invariance
    with per-row weight scales rests on it; benchmarks/schemes.py probes the 12B shapes)."""
    gen = torch.Generator(device="cuda").manual_seed(4)
    weight = torch.cat([torch.randn(256, 256, device="cuda", generator=gen) * s for s in (1 / 16, 1 / 2)])
    x = torch.randn(300, 256, device="cuda", generator=gen)
    w8 = Fp8Weight.from_float(weight, sizes=(256, 256))
    assert w8.per_row
    scale = activation_scale(float(x.abs().max()))
    out = fp8_linear(x, w8, scale)
    assert out.dtype == torch.bfloat16
    expected = (quantize(x, scale).float() * scale) @ w8.dequantized().t()
    assert ((out.float() - expected).norm() / expected.norm()).item() < 1e-2  # bf16 output: 2^-9 relative
    for rows, offset in [(1, 0), (3, 7), (17, 100), (129, 150)]:
        assert torch.equal(fp8_linear(x[offset : offset + rows], w8, scale), out[offset : offset + rows])
