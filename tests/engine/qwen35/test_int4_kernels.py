"""The int4 kernels (`spinf.engine.kernels.int4`) against the torch code of `spinf.engine.qwen35.int4`: the
unpacked int8 codes and float weights, the block-scaled int8 product, and the GPU's i8 forward, bit for bit. The
kernels run on the GPU where there is one, else through Triton's interpreter (tests/conftest.py); the torch
references run on the CPU."""

from __future__ import annotations

import pytest
import torch

from spinf.engine.kernels.int4 import ACT_BLOCK, int8_mm, unpack_int4
from spinf.engine.qwen35.int4 import GROUP, Int4Linear, Int4Weight, _per_token, _to_int8

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # where the kernels run


def packed(out: int, width: int, seed: int) -> Int4Weight:
    """A random packed weight on the CPU; row 1 is all zero (code 8), so its amax is the floor of 1."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 256, (out, width // 2), generator=gen, dtype=torch.int32).to(torch.uint8)
    q[1] = 0x88
    scales = ((torch.rand((out, width // GROUP), generator=gen) + 0.5) / 64).half()
    scales[0, 0] = -scales[0, 0]  # a negative scale: |s| is what bounds the row
    return Int4Weight(q, scales)


def twins(parts, channels=None) -> tuple[Int4Linear, Int4Linear]:
    """The same i8 linear on the CPU (the torch reference) and on `DEVICE` (the kernels)."""
    moved = [
        Int4Weight(p.q.to(DEVICE), p.scales.to(DEVICE)) if isinstance(p, Int4Weight) else p.to(DEVICE) for p in parts
    ]
    return Int4Linear(parts, "i8", channels), Int4Linear(moved, "i8", channels)


@pytest.mark.parametrize("out,width", [(48, 64), (40, 320), (7 * 8, 96)])
def test_unpacking_gives_the_torch_paths_int8_codes_and_float_weights(out, width):
    parts = [
        packed(out, width, 1),
        torch.randn(8, width, generator=torch.Generator().manual_seed(2)),
        packed(16, width, 3),
    ]
    cpu, kernel = twins(parts)
    assert torch.equal(kernel._gpu_weight(int8=True).cpu(), Int4Linear._int8_weight(cpu.weight())[0])
    assert torch.equal(kernel._gpu_weight(int8=False).cpu(), cpu.weight())
    weight = parts[0]
    # Triton's interpreter truncates to bf16 (numpy has no bf16): bf16 is checked on the GPU only
    for dtype in (torch.float16,) + ((torch.bfloat16,) if DEVICE.type == "cuda" else ()):
        buffer = torch.empty((out, width), dtype=dtype, device=DEVICE)
        got = unpack_int4(weight.q.to(DEVICE), weight.scales.to(DEVICE), buffer).cpu()
        assert torch.equal(got, weight.dequantize().to(dtype))


def torch_blocked(xq: torch.Tensor, scales: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """The ascending fp32 sum of exact int32 block products, as `Int4Linear._blocked` computes it."""
    acc = torch.zeros((xq.shape[0], wq.shape[0]))
    for b, start in enumerate(range(0, xq.shape[1], ACT_BLOCK)):
        block = torch._int_mm(
            xq[:, start : start + ACT_BLOCK].contiguous(), wq[:, start : start + ACT_BLOCK].t().contiguous()
        )
        acc += block.float() * scales[:, b : b + 1]
    return acc * w_scale


@pytest.mark.parametrize("rows,width,out", [(1, 256, 24), (33, 300, 136), (130, 128, 8)])
def test_the_block_scaled_product_equals_the_torch_loop(rows, width, out):
    gen = torch.Generator().manual_seed(rows)
    xq = torch.randint(-127, 128, (rows, width), generator=gen, dtype=torch.int32).to(torch.int8)
    wq = torch.randint(-127, 128, (out, width), generator=gen, dtype=torch.int32).to(torch.int8)
    scales = torch.rand((rows, -(-width // ACT_BLOCK)), generator=gen) / 100
    w_scale = torch.rand(out, generator=gen) / 100
    got = int8_mm(*(t.to(DEVICE) for t in (xq, scales, wq, w_scale)), blocked=True).cpu()
    want = torch_blocked(xq, scales, wq, w_scale)
    if DEVICE.type == "cuda":  # compiled, the last bits have differed from the CPU's (see the kernel's docstring)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    else:
        assert torch.equal(got, want)


@pytest.mark.parametrize("rows,width,out,channels", [(1, 256, 24, 3), (33, 320, 136, 64), (130, 128, 8, 0)])
def test_the_split_product_is_exact_in_int32_then_scaled(rows, width, out, channels):
    gen = torch.Generator().manual_seed(rows)
    xq = torch.randint(-127, 128, (rows, width), generator=gen, dtype=torch.int32).to(torch.int8)
    wq = torch.randint(-127, 128, (out, width), generator=gen, dtype=torch.int32).to(torch.int8)
    x_scale, w_scale = torch.rand((rows, 1), generator=gen) / 100, torch.rand(out, generator=gen) / 100
    x_out = torch.randn((rows, channels), generator=gen).half() if channels else None
    w_out = torch.randn((out, channels), generator=gen).half() if channels else None
    moved = [t if t is None else t.to(DEVICE) for t in (xq, x_scale, wq, w_scale, x_out, w_out)]
    got = int8_mm(*moved[:4], blocked=False, x_out=moved[4], w_out=moved[5]).cpu()
    want = torch._int_mm(xq, wq.t().contiguous()).float() * x_scale * w_scale
    if channels:
        want = want + x_out.float() @ w_out.float().t()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)  # the outlier sums' order is the kernel's
    if not channels:  # no outlier product: integer sums and two multiplications, the same bits anywhere
        assert torch.equal(got, want)


def activations(rows: int, width: int, seed: int) -> torch.Tensor:
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(seed))
    x[:, 5] *= 40  # an outlier channel
    return x


@pytest.mark.parametrize("split", [False, True], ids=["block-scaled", "split"])
def test_the_kernels_i8_forward_equals_the_torch_reference_and_is_row_invariant(split):
    width = 320  # blocks of 128, 128 and 64
    cpu, kernel = twins([packed(40, width, 4), packed(24, width, 5)], [5, 77, 300] if split else None)
    x = activations(37, width, 6)
    got = kernel._gpu_i8(x.to(DEVICE)).cpu()
    want = cpu._forward(x, cpu.weight())
    if (
        split and DEVICE.type == "cuda"
    ):  # the fp32 outlier sums run in another order on the GPU; the int8 part is exact
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(got, want)
    for rows in (1, 17, 33):
        assert torch.equal(kernel._gpu_i8(x[:rows].to(DEVICE)).cpu(), got[:rows]), rows
    assert torch.equal(kernel._gpu_i8(x[[30, 3]].to(DEVICE)).cpu(), got[[30, 3]])


def test_the_split_scheme_reads_the_outlier_columns_without_unpacking():
    linear = Int4Linear([packed(40, 320, 7), torch.randn(8, 320)], "i8", [0, 1, 31, 32, 319])
    assert torch.equal(linear._columns(linear.outliers), linear.weight()[:, linear.outliers])


def test_the_activation_quantizer_of_a_narrow_last_block_is_unchanged_by_padding():
    x = activations(3, 200, 8)
    padded = torch.nn.functional.pad(x, (0, 56)).view(3, 2, ACT_BLOCK)
    scale = _per_token(padded, 127.0)
    assert torch.equal(scale[:, 1], _per_token(x[:, 128:], 127.0))
    assert torch.equal(_to_int8(padded, scale).view(3, -1)[:, 128:200], _to_int8(x[:, 128:], scale[:, 1]))


@pytest.mark.gpu
@pytest.mark.parametrize("split", [False, True], ids=["block-scaled", "split"])
def test_on_the_gpu_the_i8_forward_is_row_invariant_at_many_row_counts(split):
    width = 640
    cpu, cuda = twins([packed(256, width, 9), packed(128, width, 10)], [5, 77, 300, 600] if split else None)
    x = activations(1100, width, 11)
    got = cuda(x.cuda()).cpu()
    want = cpu(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(cuda(x.cuda().bfloat16()).cpu(), cuda(x.cuda().bfloat16().float()).bfloat16().cpu())
    for rows in (1, 16, 17, 31, 33, 129, 513, 1025):
        assert torch.equal(cuda(x[:rows].cuda()).cpu(), got[:rows]), rows
    assert torch.equal(cuda(x[[1000, 3]].cuda()).cpu(), got[[1000, 3]])
