"""An fp8 GEMM of our own for the decoder's GLU (issue 36): gate and up products and ``gelu_tanh(gate) · up`` in one
kernel, quantized for the down projection on the way out.

cuBLAS's ``_scaled_mm`` writes the fused gate/up product as bf16 [N, 2I], and `spinf.engine.kernels.rows.gelu_mul`
reads it back to write [N, I] in e4m3: on the 12B the pair is the largest share of a pass (benchmarks/RESULTS.md,
"Where a call's time goes"). Here each program owns a tile of I columns: it runs the K loop over the tile's gate rows
and its up rows of the weight at once (two accumulators), rounds both sums to bf16 as ``_scaled_mm`` would, applies
the same GELU·up arithmetic as ``gelu_mul`` (`rows._gelu_times`) and stores e4m3. The plain form (``glu=False``)
writes ``x · W.T`` in bf16, for measuring against cuBLAS.

A row's result depends on that row and the weight only: tiles are fixed (never chosen by the row count), the K loop
always runs in the same order over the same block width, and rows past the input's end are zeros read by the tensor
descriptor. So the bits of a row are the same in every composition of a pass (tests/engine/test_gpu_gemm.py).
Programs are persistent (one per SM, each walking tiles in grouped order) and read through TMA descriptors (Hopper).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from spinf.engine.kernels.rows import _bf16, _gelu_times, _store_row


@triton.jit(do_not_specialize=["M", "programs"])
def _fp8_gemm_kernel(
    a_desc,
    b_desc,
    c_ptr,
    scale_ptr,
    inv_out_scale,
    M,
    N,
    K,
    programs,
    GLU: tl.constexpr,
    QUANT: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    FLATTEN: tl.constexpr,
):
    first = tl.program_id(0)
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    tiles = tiles_m * tiles_n
    k_tiles = tl.cdiv(K, BK)
    per_group = GROUP_M * tiles_n
    for tile in tl.range(first, tiles, programs, flatten=FLATTEN):
        group = tile // per_group
        first_m = group * GROUP_M
        rows_in_group = tl.minimum(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (tile % per_group) % rows_in_group
        pid_n = (tile % per_group) // rows_in_group
        om = pid_m * BM
        on = pid_n * BN
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        acc_up = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(k_tiles):
            ok = ki * BK
            a = a_desc.load([om, ok])
            acc = tl.dot(a, b_desc.load([on, ok]).T, acc)
            if GLU:
                acc_up = tl.dot(a, b_desc.load([N + on, ok]).T, acc_up)
        rows = om + tl.arange(0, BM)
        cols = on + tl.arange(0, BN)
        y = _bf16(acc * tl.load(scale_ptr + cols, mask=cols < N, other=0.0)[None, :])
        if GLU:
            y = _gelu_times(y, _bf16(acc_up * tl.load(scale_ptr + N + cols, mask=cols < N, other=0.0)[None, :]))
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        _store_row(c_ptr, rows.to(tl.int64)[:, None] * N + cols[None, :], mask, y, inv_out_scale, QUANT)


@functools.cache
def _sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


# (BM, BN, BK, GROUP_M, stages, warps, flatten): the best of `benchmarks/gemm_probe.py`'s configurations at the
# 12B's gate/up shape on an H100 (benchmarks/RESULTS.md, "One kernel for the GLU"); the plain form's, for measuring
GLU_TILES = (128, 128, 128, 8, 3, 8, False)
PLAIN_TILES = (128, 256, 128, 8, 3, 8, True)


def glu_fits(weight: torch.Tensor) -> bool:
    """Whether the fused GLU takes ``weight`` (gate rows then up rows, e4m3): its half a whole number of tiles, and
    its rows a multiple of 16 bytes (what the tensor descriptor reads)."""
    return (
        weight.dtype == torch.float8_e4m3fn
        and (weight.shape[0] // 2) % GLU_TILES[1] == 0
        and weight.shape[1] % 16 == 0
    )


def fp8_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    *,
    glu: bool = False,
    out_scale: float | None = None,
    tiles: tuple | None = None,
    programs: int | None = None,
) -> torch.Tensor:
    """``x`` [M, K] e4m3 times ``weight`` [N', K] e4m3 transposed, each sum times its column's ``scale`` ([N'] fp32
    on the device: the input's scale times the weight row's, as the row-wise ``_scaled_mm`` takes them) and rounded
    to bf16. ``glu``: ``weight`` is gate rows then up rows (N' = 2I) and the result is ``gelu_tanh(gate) · up``
    [M, I]. ``out_scale``: the result quantized to e4m3 by it."""
    bm, bn, bk, group_m, stages, warps, flatten = tiles or (GLU_TILES if glu else PLAIN_TILES)
    m, k = x.shape
    n = weight.shape[0] // 2 if glu else weight.shape[0]
    if glu and n % bn:
        raise ValueError(f"the GLU's {n} columns are not a multiple of the tile's {bn}")
    out = torch.empty((m, n), dtype=torch.float8_e4m3fn if out_scale else torch.bfloat16, device=x.device)
    if m == 0:
        return out
    a_desc = TensorDescriptor(x, [m, k], [k, 1], [bm, bk])
    b_desc = TensorDescriptor(weight, list(weight.shape), [k, 1], [bn, bk])
    tiles_total = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    grid = min(programs or (_sms(x.device.index or 0) if x.is_cuda else 4), tiles_total)
    _fp8_gemm_kernel[(grid,)](
        a_desc,
        b_desc,
        out,
        scale,
        1.0 / out_scale if out_scale else 1.0,
        m,
        n,
        k,
        grid,
        GLU=glu,
        QUANT=out_scale is not None,
        BM=bm,
        BN=bn,
        BK=bk,
        GROUP_M=group_m,
        FLATTEN=flatten,
        num_stages=stages,
        num_warps=warps,
    )
    return out
