"""The fp8 GEMM of `spinf.engine.kernels.gemm`: its products, its fused GLU, and rows that keep their bits.

Compiled on a GPU, through Triton's interpreter elsewhere (tests/conftest.py), like tests/engine/test_kernels.py.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from spinf.engine.kernels import gelu_mul, gemm  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
E4M3 = torch.float8_e4m3fn


def operands(rows: int, inner: int, k: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen).to(E4M3)
    w = (torch.randn(2 * inner, k, generator=gen) * 0.05).to(E4M3)
    # gate's rows and up's rows carry different scales, as a fused checkpoint weight's do
    scale = torch.cat([torch.full((inner,), 0.5 * 0.03), torch.full((inner,), 0.5 * 0.02)])
    return x.to(DEVICE), w.to(DEVICE), scale.to(DEVICE)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().view(torch.int16 if t.dtype == torch.bfloat16 else torch.uint8)


def test_the_product_is_the_sum_of_the_e4m3_values_times_each_columns_scale():
    x, w, scale = operands(37, 128, 256)
    got = gemm.fp8_gemm(x, w, scale).float().cpu()
    want = (x.float().cpu() @ w.float().cpu().T) * scale.cpu()[None, :]
    # one bf16 rounding apart (the sums' order differs from torch's)
    torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-3)


def test_the_fused_glu_is_gelu_mul_of_the_same_product():
    x, w, scale = operands(37, 256, 256)
    product = gemm.fp8_gemm(x, w, scale, tiles=gemm.GLU_TILES)  # the same tiles: the same sums
    for out_scale in (None, 0.25):
        fused = gemm.fp8_gemm(x, w, scale, glu=True, out_scale=out_scale)
        assert torch.equal(bits(fused), bits(gelu_mul(product, out_scale)))


def test_a_rows_bits_do_not_depend_on_how_many_rows_share_the_launch():
    x, w, scale = operands(300, 128, 256, seed=1)
    together = gemm.fp8_gemm(x, w, scale, glu=True, out_scale=0.5)
    for start, stop in ((0, 1), (5, 12), (129, 300), (0, 257)):
        alone = gemm.fp8_gemm(x[start:stop].contiguous(), w, scale, glu=True, out_scale=0.5)
        assert torch.equal(bits(alone), bits(together[start:stop]))


def test_no_rows_and_a_half_that_is_no_whole_tile():
    x, w, scale = operands(0, 128, 256)
    assert gemm.fp8_gemm(x, w, scale, glu=True, out_scale=0.5).shape == (0, 128)
    _, odd, _ = operands(1, 96, 256)
    assert not gemm.glu_fits(odd)
    with pytest.raises(ValueError, match="not a multiple"):
        gemm.fp8_gemm(x, odd, scale[:192], glu=True)


@pytest.mark.gpu
def test_on_the_gpu_the_fused_glu_is_one_e4m3_step_at_most_from_cublas_then_gelu_mul():
    x, w, scale = operands(1000, 15_360 // 4, 3_840)
    ones = torch.ones((x.shape[0], 1), device=DEVICE)
    today = gelu_mul(torch._scaled_mm(x, w.t(), scale_a=ones, scale_b=scale[None, :], out_dtype=torch.bfloat16), 0.25)
    fused = gemm.fp8_gemm(x, w, scale, glu=True, out_scale=0.25)
    assert float((bits(fused) == bits(today)).float().mean()) > 0.9
    # the rest one e4m3 step apart (3 mantissa bits: 1/8 of the value; near zero, a subnormal step of 2^-9)
    torch.testing.assert_close(fused.float(), today.float(), rtol=0.125, atol=2**-9, check_device=False)
