"""The int4 kernels (`spinf.engine.kernels.int4`) against the torch code of `spinf.engine.qwen35.int4`: the
unpacked int8 codes and float weights, the block-scaled int8 product, and the GPU's i8 forward, bit for bit. The
kernels run on the GPU where there is one, else through Triton's interpreter (tests/conftest.py); the torch
references run on the CPU."""

from __future__ import annotations

import pytest
import torch

from spinf.engine.kernels import int4 as kernels
from spinf.engine.kernels.int4 import (
    ACT_BLOCK,
    Tile,
    int8_mm,
    product_tile,
    quantize_blocks,
    quantize_split,
    unpack_int4,
)
from spinf.engine.qwen35.gptq import GROUP, Int4Weight
from spinf.engine.qwen35.int4 import Int4Linear, _per_token, _to_int8

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # where the kernels run


def packed(out: int, width: int, seed: int, group: int = GROUP) -> Int4Weight:
    """A random packed weight on the CPU in groups of ``group`` inputs (-1: whole rows); row 1 is all zero (code
    8), so its amax is the floor of 1."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 256, (out, width // 2), generator=gen, dtype=torch.int32).to(torch.uint8)
    q[1] = 0x88
    scales = ((torch.rand((out, 1 if group == -1 else width // group), generator=gen) + 0.5) / 64).half()
    scales[0, 0] = -scales[0, 0]  # a negative scale: |s| is what bounds the row
    return Int4Weight(q, scales)


def twins(parts, channels=None) -> tuple[Int4Linear, Int4Linear]:
    """The same i8 linear on the CPU (the torch reference) and on `DEVICE` (the kernels)."""
    moved = [
        Int4Weight(p.q.to(DEVICE), p.scales.to(DEVICE)) if isinstance(p, Int4Weight) else p.to(DEVICE) for p in parts
    ]
    return Int4Linear(parts, "i8", channels), Int4Linear(moved, "i8", channels)


@pytest.mark.parametrize(
    "out,width,group",
    [(48, 64, 32), (40, 320, 32), (7 * 8, 96, 32), (40, 384, 128), (24, 256, 64), (24, 320, -1), (16, 128, 128)],
)
def test_unpacking_gives_the_torch_paths_int8_codes_and_float_weights(out, width, group):
    """At the published checkpoints' group of 32 and the others a GPTQ config may name (issue 35 item 4)."""
    parts = [
        packed(out, width, 1, group),
        torch.randn(8, width, generator=torch.Generator().manual_seed(2)),
        packed(16, width, 3, group),
    ]
    assert parts[0].group == (width if group == -1 else group)
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


@pytest.mark.parametrize("group", [32, 128, -1])
@pytest.mark.parametrize("split", [False, True], ids=["block-scaled", "split"])
def test_the_kernels_i8_forward_equals_the_torch_reference_and_is_row_invariant(split, group):
    width = 384 if group == 128 else 320  # blocks of 128, 128 and 128 (or 64)
    parts = [packed(40, width, 4, group), packed(24, width, 5, group)]
    cpu, kernel = twins(parts, [5, 77, 300] if split else None)
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


@pytest.mark.parametrize("split", [False, True], ids=["block-scaled", "split"])
def test_every_tile_and_a_kept_int8_weight_give_the_same_bits(split):
    """The product at other tiles, and over the int8 weight kept unpacked: integer sums are exact and the epilogue
    runs per element, so the bits are one whatever the tile (the engine picks it by row count) or the way."""
    width = 320  # blocks of 128, 128 and 64
    _, kernel = twins([packed(40, width, 12), packed(24, width, 13)], [5, 77, 300] if split else None)
    assert kernel.kinds == ["int4"]  # the two parts read as one packed weight
    x = activations(70, width, 14).to(DEVICE)
    unpacked = kernel._gpu_i8(x)
    xq, x_scale, scheme = kernel.gpu_quantized(x)
    # mma and wgmma shapes, and the tiles a GPU with 99 KiB of shared memory per block gets (`product_tile`)
    for tile in (
        Tile(16, 32, 4, 2),
        Tile(64, 16, 4, 3),
        Tile(128, 64, 4, 4),
        Tile(64, 64, 4, 3),
        Tile(128, 128, 8, 3),
        # persistent programs over grouped tiles, read by TMA: rows past 70 and the last block's 64 missing channels
        # come in as zeros
        Tile(16, 32, 4, 2, persistent=True, group=2),
        Tile(64, 64, 4, 3, persistent=True),
        Tile(128, 128, 8, 3, persistent=True, group=1),
        Tile(16, 16, 4, 2, persistent=True, group=2, per_sm=2),  # 8 programs over 20 tiles: some walk 3, some 2
        kernels.BLOCKED_PERSISTENT,
    ):
        assert not tile.persistent or kernels._tma_ready(xq, kernel._gpu_weight(int8=True))
        got = int8_mm(xq, x_scale, kernel._gpu_weight(int8=True), kernel.w_scale, tile=tile, **scheme)
        assert torch.equal(got, unpacked), tile
    assert kernel.keep_int8() == 64 * width
    assert torch.equal(kernel._gpu_i8(x), unpacked)
    assert torch.equal(kernel._gpu_i8(x[:1]), unpacked[:1])


@pytest.mark.parametrize("split", [False, True], ids=["block-scaled", "split"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_residual_added_in_the_product_is_torchs_sum_and_lands_in_the_given_rows(split, dtype):
    """``residual=`` adds the residual stream in the product's kernel with the bits of torch's ``residual + y``;
    ``out=`` writes rows of a larger tensor (or the residual itself) and nothing around them."""
    width = 256
    _, kernel = twins([packed(48, width, 21)], [9, 130] if split else None)
    x = activations(40, width, 22).to(dtype).to(DEVICE)
    residual = (torch.randn(40, 48, generator=torch.Generator().manual_seed(23)) * 4).to(dtype).to(DEVICE)
    want = residual + kernel._gpu_i8(x)
    assert torch.equal(kernel.plus(x, residual), want)
    big = torch.full((60, 48), 7.0, dtype=dtype, device=DEVICE)
    xq, x_scale, scheme = kernel.gpu_quantized(x)
    for tile in (None, Tile(64, 64, 4, 3), Tile(16, 32, 4, 2, persistent=True, group=2)):
        big.fill_(7.0)
        got = int8_mm(
            xq, x_scale, kernel._gpu_weight(int8=True), kernel.w_scale, dtype, tile=tile, residual=residual,
            out=big[10:50], **scheme,
        )  # fmt: skip
        assert got.data_ptr() == big[10:50].data_ptr() and torch.equal(got, want), tile
        assert (big[:10] == 7).all() and (big[50:] == 7).all()
    in_place = residual.clone()
    assert torch.equal(kernel.plus(x, in_place, out=in_place), want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_block_scaled_linear_takes_codes_made_elsewhere_with_the_same_bits(dtype):
    """`Int4Linear.blocks_plus` of `quantize_blocks`' codes and scales is `plus` of the rows; `made_plus` asks the
    maker for codes exactly where the linear reads block-scaled int8 (a GPU, i8, no outlier channels)."""
    from spinf.engine.qwen35.ops import made_plus

    width = 224  # blocks of 128 and 96
    _, kernel = twins([packed(40, width, 31)], None)
    x = activations(12, width, 32).to(dtype).to(DEVICE)
    residual = (torch.randn(12, 40, generator=torch.Generator().manual_seed(33)) * 4).to(dtype).to(DEVICE)
    want = kernel.plus(x, residual)
    assert torch.equal(kernel.blocks_plus(*quantize_blocks(x), dtype, residual), want)
    assert torch.equal(kernel.blocks_plus(*quantize_blocks(x), dtype), kernel._gpu_i8(x))
    asked = []

    def make(blocks=False):
        asked.append(blocks)
        return quantize_blocks(x) if blocks else x

    assert torch.equal(made_plus(kernel, make, x, residual), want)
    assert asked == [kernel.takes_blocks(x)] == [DEVICE.type == "cuda"]
    kernel.takes_blocks = lambda rows: True  # as on a GPU
    out = torch.empty_like(residual)
    assert made_plus(kernel, make, x, residual, out) is out and torch.equal(out, want) and asked[-1] is True
    made_plus(kernel, make, x, residual.double())  # a residual of another dtype: no fused sum, so the rows
    assert asked[-1] is False
    _, split = twins([packed(40, width, 31)], [5, 77])
    assert not split.takes_blocks(x)  # the split scheme quantizes its own rows


def test_a_linear_without_a_fused_sum_adds_the_residual_apart():
    """`linear_plus` on a float linear: the two ops, into ``out`` when given; no residual, the linear alone."""
    from spinf.engine.qwen35.ops import Dense, linear_plus

    dense = Dense(torch.randn(6, 8, generator=torch.Generator().manual_seed(3)))
    x, residual = torch.randn(5, 8), torch.randn(5, 6)
    assert torch.equal(linear_plus(dense, x, residual), residual + dense(x))
    assert torch.equal(linear_plus(dense, x, None), dense(x))
    out = torch.zeros(5, 6)
    assert linear_plus(dense, x, residual, out) is out and torch.equal(out, residual + dense(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_one_pass_quantizers_give_the_torch_codes_and_scales(dtype):
    x = activations(9, 200, 15).to(dtype).float()  # blocks of 128 and 72; values the dtype holds
    x[3] = 0.0  # a row of zeros: scale 1
    outliers = torch.tensor([5, 77, 199])
    keep = torch.ones(200, dtype=torch.int8).index_fill_(0, outliers, 0)
    xq, scale, x_out = (
        t.cpu() for t in quantize_split(x.to(DEVICE, dtype), keep.to(DEVICE), outliers.to(DEVICE))
    )  # the kernel reads the dtype itself
    inliers = x.index_fill(1, outliers, 0.0)
    want = _per_token(inliers, 127.0)
    assert torch.equal(scale, want) and scale[3].item() == 1.0
    assert torch.equal(xq, _to_int8(inliers, want))
    assert torch.equal(x_out, x.index_select(1, outliers).half())
    xq, scales = (t.cpu() for t in quantize_blocks(x.to(DEVICE, dtype)))
    for b, start in enumerate(range(0, 200, ACT_BLOCK)):
        block = x[:, start : start + ACT_BLOCK]
        assert torch.equal(scales[:, b : b + 1], _per_token(block, 127.0))
        assert torch.equal(xq[:, start : start + ACT_BLOCK], _to_int8(block, scales[:, b : b + 1]))


def test_a_non_finite_activation_gets_code_zero_and_leaves_the_other_rows_alone():
    x = activations(4, 256, 16)
    x[1, 7], x[2, 9] = float("nan"), float("inf")
    outliers = torch.tensor([5])
    keep = torch.ones(256, dtype=torch.int8).index_fill_(0, outliers, 0)
    xq, scale, _ = (t.cpu() for t in quantize_split(x.to(DEVICE), keep.to(DEVICE), outliers.to(DEVICE)))
    assert xq[1, 7] == 0 and torch.isfinite(scale[1]).all()  # the NaN: code 0, the row scaled by the rest
    assert (xq[2] == 0).all()  # an inf: every code of its row 0 (each finite value over an infinite scale)
    finite = [0, 3]
    assert torch.equal(xq[finite], _to_int8(x[finite].index_fill(1, outliers, 0.0), scale[finite]))
    blocks, scales = (t.cpu() for t in quantize_blocks(x.to(DEVICE)))
    assert blocks[1, 7] == 0 and (blocks[2, :128] == 0).all()  # per block: only the inf's own block is lost
    assert torch.equal(blocks[2, 128:], _to_int8(x[2:3, 128:], scales[2:3, 1:2])[0])


def test_product_tiles_fit_a_card_with_less_shared_memory(monkeypatch):
    assert product_tile(4096, False) == Tile(128, 256, 8, 4, persistent=True)
    assert product_tile(4096, True) == Tile(64, 128, 4, 3, persistent=True, per_sm=2)
    assert product_tile(16, True) == Tile(64, 64, 4, 4)
    monkeypatch.setattr(kernels, "_tma", lambda device: False)  # an A100: the pointer tiles
    assert product_tile(4096, False) == Tile(128, 256, 8, 4) and product_tile(4096, True) == Tile(64, 128, 4, 4)
    monkeypatch.setattr(
        kernels, "_large_tiles", lambda device: False
    )  # 99 KiB per block (Ada, Ampere's consumer cards)
    assert {product_tile(rows, blocked) for rows in (16, 4096) for blocked in (False, True)} == {
        Tile(64, 64, 4, 3),
        Tile(128, 128, 8, 3),
    }


def test_int4_parts_fuse_into_one_packed_weight_and_float_parts_stay_apart():
    parts = [packed(16, 64, 16), packed(8, 64, 17), torch.randn(8, 64), packed(8, 64, 18), packed(8, 64, 19, 64)]
    linear = Int4Linear(parts, "i8", None)
    assert linear.kinds == ["int4", "float", "int4", "int4"]  # another group size is another packed weight
    want = torch.cat([parts[0].dequantize(), parts[1].dequantize(), parts[2], *(p.dequantize() for p in parts[3:])])
    assert torch.equal(linear.weight(), want)


@pytest.mark.parametrize("group", [32, 64, -1])
def test_the_split_scheme_reads_the_outlier_columns_without_unpacking(group):
    linear = Int4Linear([packed(40, 320, 7, group), torch.randn(8, 320)], "i8", [0, 1, 31, 32, 63, 64, 319])
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
    channels = list(range(3, 640, 10))[:64]  # the 27B's 64 outlier channels: four k-steps of the outlier dot
    cpu, cuda = twins([packed(256, width, 9), packed(128, width, 10)], channels if split else None)
    x = activations(1100, width, 11)
    got = cuda(x.cuda()).cpu()
    want = cpu(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(cuda(x.cuda().bfloat16()).cpu(), cuda(x.cuda().bfloat16().float()).bfloat16().cpu())
    for rows in (1, 16, 17, 31, 33, 129, 513, 1025):
        assert torch.equal(cuda(x[:rows].cuda()).cpu(), got[:rows]), rows
    assert torch.equal(cuda(x[[1000, 3]].cuda()).cpu(), got[[1000, 3]])


@pytest.mark.gpu
def test_on_the_gpu_a_model_keeps_its_int8_weights_unpacked_when_there_is_room(monkeypatch):
    from spinf.engine.qwen35 import int4

    cpu, cuda = twins([packed(256, 640, 19)], [5, 77])
    model = torch.nn.Sequential(cuda)
    x = activations(40, 640, 20).cuda()
    per_call = cuda(x)
    monkeypatch.setattr(int4, "KEEP_RESERVE", 10**15)  # more than any GPU has: stays packed
    assert int4.keep_unpacked(model, torch.device("cuda")) == 0 and cuda.int8 is None
    monkeypatch.undo()
    assert int4.keep_unpacked(model, torch.device("cuda")) == 256 * 640 and cuda.int8 is not None
    assert torch.equal(cuda(x), per_call)
    assert int4.keep_unpacked(torch.nn.Sequential(cpu), torch.device("cpu")) == 0


@pytest.mark.parametrize("width", [300, 2500], ids=["one-pass", "three-passes"])
def test_the_norm_and_the_split_quantizer_in_one_kernel_give_the_quantizers_bits_for_its_normed_rows(width):
    """300 channels: one block of the kernel's 1,024, with masked lanes; 2,500: three, the last part-full."""
    from spinf.engine.kernels.int4 import norm_quantize_split
    from spinf.engine.qwen35.ops import rms_norm

    gen = torch.Generator().manual_seed(9)
    h = (torch.randn(6, width, generator=gen) * 3).bfloat16()
    h[4] = 0  # a zero row: scale 1, all codes 0
    w = (torch.randn(width, generator=gen) * 0.2).bfloat16()
    outliers = torch.tensor([3, 150, 299, width - 1])
    keep = torch.ones(width, dtype=torch.int8).index_fill_(0, outliers, 0)
    on = [t.to(DEVICE) for t in (h, w, keep, outliers)]
    x, q, scale, x_out = (t.cpu() for t in norm_quantize_split(on[0], on[1], 1e-6, on[2], on[3], want_x=True))
    want_x = rms_norm(on[0], on[1], 1e-6).cpu()  # qwen_norm's kernel on a GPU, else torch's: other sum orders
    torch.testing.assert_close(x.float(), want_x.float(), rtol=2**-7, atol=0)
    assert (x != want_x).float().mean() < 0.05
    # the quantizer's part, from the normed rows the kernel gave: the split quantizer's bits
    for got, want in zip((q, scale, x_out), quantize_split(x.to(DEVICE), on[2], on[3]), strict=True):
        assert torch.equal(got, want.cpu())
    assert scale[4].item() == 1.0 and (q[4] == 0).all()
    none, *alone = norm_quantize_split(on[0][2:4], on[1], 1e-6, on[2], on[3])
    assert none is None
    for part, whole in zip(alone, (q, scale, x_out), strict=True):
        assert torch.equal(part.cpu(), whole[2:4])
    with pytest.raises(ValueError, match="norm weight"):
        norm_quantize_split(on[0], on[1][:-1], 1e-6, on[2], on[3])
