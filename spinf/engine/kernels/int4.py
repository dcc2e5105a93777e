"""Int4 GPTQ weights on the GPU (engine spec B.14.3, api spec §9.8): unpacking per call and the block-scaled int8
product. `spinf.engine.qwen35.int4` keeps every int4 linear packed (``q`` uint8 [out, in/2], fp16 group scales
[out, in/32]) and states each mode's arithmetic in plain torch; these kernels compute the same bits faster.

* `unpack_int4`: one pass over the packed weight, writing either the ``i8`` mode's int8 weight
  ``round(s_g · (q − 8) · 127 / amax_row)`` (``amax_row`` read from a table made once at load) or the float weight
  ``s_g · (q − 8)`` in any float dtype. The product ``s_g · (q − 8)`` is exact in fp32; ``· 127`` rounds once and the
  division is correctly rounded (``div_rn``), as torch's are, so the int8 codes equal the torch path's. The weight is
  written into the rows ``[row0, row0 + out)`` of a fused buffer, so a fused linear's parts land in one tensor.
* `int8_mm`: the i8 mode's products with their epilogue, written in the activations' dtype (no [M, N] int32 or fp32
  temporaries): the block-scaled scheme of the norm-free linears (int8 activations with one scale per (token,
  128-channel block), each block's products summed exactly in int32, the blocks added in fp32 in ascending order,
  then the weight's per-channel scale) and the split scheme of the norm-fed ones (the whole row's sum exact in
  int32, both scales, plus the fp16 outlier channels' product summed in fp32). Multiplications and additions are
  asked to stay apart (``enable_fp_fusion=False``); through the interpreter the block-scaled result equals the torch
  loop bit for bit, compiled it has differed from the CPU's in the last bits. A row's result depends on that row
  alone (one fixed tiling, no split along K), which is what the engine's invariance needs.

Both run through Triton's interpreter on the CPU (the tests), compiled on a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ACT_BLOCK = 128  # input channels per activation scale (`spinf.engine.qwen35.int4.ACT_BLOCK`)
_UNPACK_ROWS, _UNPACK_COLS = 64, 128  # output rows × packed bytes per program of `unpack_int4`
_MM_M, _MM_N = 128, 128  # the product's tile (fixed: no autotuning, so a row's bits never depend on M)


@triton.jit
def _unpack_kernel(
    q_ptr, s_ptr, amax_ptr, out_ptr, rows, half, row0,
    INT8: tl.constexpr, BR: tl.constexpr, BJ: tl.constexpr,
):  # fmt: skip
    r = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)
    j = (tl.program_id(1) * BJ + tl.arange(0, BJ)).to(tl.int64)
    mask = (r < rows)[:, None] & (j < half)[None, :]
    q = tl.load(q_ptr + r[:, None] * half + j[None, :], mask=mask, other=0x88).to(tl.int32)
    s = tl.load(s_ptr + r[:, None] * (half // 16) + (j // 16)[None, :], mask=mask, other=0.0).to(tl.float32)
    low = ((q & 15) - 8).to(tl.float32) * s  # the even input
    high = ((q >> 4) - 8).to(tl.float32) * s  # the odd one
    if INT8:
        amax = tl.load(amax_ptr + r, mask=r < rows, other=1.0)[:, None]
        # x / amax correctly rounded, then to nearest even (adding and taking away 1.5 · 2^23 does it for |y| < 2^22)
        low = tl.math.div_rn(low * 127.0, amax)
        high = tl.math.div_rn(high * 127.0, amax)
        low = tl.minimum(tl.maximum((low + 12582912.0) - 12582912.0, -127.0), 127.0)
        high = tl.minimum(tl.maximum((high + 12582912.0) - 12582912.0, -127.0), 127.0)
    both = tl.reshape(tl.join(low, high), (BR, 2 * BJ))  # even and odd inputs interleaved: one contiguous row
    cols = tl.program_id(1) * 2 * BJ + tl.arange(0, 2 * BJ).to(tl.int64)
    at = out_ptr + (row0 + r[:, None]) * (2 * half) + cols[None, :]
    tl.store(at, both.to(out_ptr.dtype.element_ty), mask=(r < rows)[:, None] & (cols < 2 * half)[None, :])


def unpack_int4(
    q: torch.Tensor,
    scales: torch.Tensor,
    out: torch.Tensor,
    row0: int = 0,
    amax: torch.Tensor | None = None,
) -> torch.Tensor:
    """Write the weight of the packed ``q`` [out, in/2] and ``scales`` [out, in/32] into ``out[row0 : row0 + out]``
    (``out`` [rows, in], contiguous): the int8 codes of the ``i8`` mode when ``amax`` (fp32 [out], each row's largest
    |weight|, 1 for an all-zero row) is given (``out`` int8), else the float weight in ``out``'s dtype."""
    rows, half = q.shape
    assert out.is_contiguous() and out.shape[1] == 2 * half and half % 16 == 0
    assert (amax is None) == (out.dtype != torch.int8)
    grid = (triton.cdiv(rows, _UNPACK_ROWS), triton.cdiv(half, _UNPACK_COLS))
    _unpack_kernel[grid](
        q, scales, scales if amax is None else amax, out, rows, half, row0,
        INT8=amax is not None, BR=_UNPACK_ROWS, BJ=_UNPACK_COLS, num_warps=8,
    )  # fmt: skip
    return out


@triton.jit
def _int8_kernel(
    a_ptr, a_scale_ptr, b_ptr, w_scale_ptr, xo_ptr, wo_ptr, out_ptr, M, N, K, C,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr,
    BLOCKED: tl.constexpr, OUTLIERS: tl.constexpr,
):  # fmt: skip
    rm = (tl.program_id(0) * BM + tl.arange(0, BM)).to(tl.int64)
    rn = (tl.program_id(1) * BN + tl.arange(0, BN)).to(tl.int64)
    rk = tl.arange(0, BK)
    blocks = tl.cdiv(K, BK)
    w_scale = tl.load(w_scale_ptr + rn, mask=rn < N, other=0.0)
    if BLOCKED:  # one activation scale per (row, block): each block's exact sum scaled, blocks added in order
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kb in range(0, blocks):
            k = kb * BK + rk
            a = tl.load(a_ptr + rm[:, None] * K + k[None, :], mask=(rm < M)[:, None] & (k < K)[None, :], other=0)
            b = tl.load(b_ptr + rn[None, :] * K + k[:, None], mask=(k < K)[:, None] & (rn < N)[None, :], other=0)
            sums = tl.dot(a, b, out_dtype=tl.int32)  # exact: 128 int8 products fit int32 with room
            scale = tl.load(a_scale_ptr + rm * blocks + kb, mask=rm < M, other=0.0)
            acc += sums.to(tl.float32) * scale[:, None]
        out = acc * w_scale[None, :]
    else:  # one scale per row: the whole row's sum exact in int32, then both scales and the outliers' product
        exact = tl.zeros((BM, BN), dtype=tl.int32)
        for kb in range(0, blocks):
            k = kb * BK + rk
            a = tl.load(a_ptr + rm[:, None] * K + k[None, :], mask=(rm < M)[:, None] & (k < K)[None, :], other=0)
            b = tl.load(b_ptr + rn[None, :] * K + k[:, None], mask=(k < K)[:, None] & (rn < N)[None, :], other=0)
            exact = tl.dot(a, b, exact, out_dtype=tl.int32)
        x_scale = tl.load(a_scale_ptr + rm, mask=rm < M, other=0.0)
        out = exact.to(tl.float32) * x_scale[:, None] * w_scale[None, :]
        if OUTLIERS:  # fp16 values, their products and sums in fp32 (no TF32)
            c = tl.arange(0, BC)
            xo = tl.load(xo_ptr + rm[:, None] * C + c[None, :], mask=(rm < M)[:, None] & (c < C)[None, :], other=0.0)
            wo = tl.load(wo_ptr + rn[None, :] * C + c[:, None], mask=(c < C)[:, None] & (rn < N)[None, :], other=0.0)
            out = out + tl.dot(xo.to(tl.float32), wo.to(tl.float32), input_precision="ieee")
    tl.store(
        out_ptr + rm[:, None] * N + rn[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=(rm < M)[:, None] & (rn < N)[None, :],
    )


def int8_mm(
    a: torch.Tensor,
    a_scales: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.float32,
    *,
    blocked: bool,
    x_out: torch.Tensor | None = None,
    w_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The i8 mode's product of ``a`` int8 [M, K] and ``w`` int8 [N, K] with the weight's per-channel ``w_scale``
    fp32 [N], into [M, N] of ``out_dtype``:

    * ``blocked``: ``a_scales`` fp32 [M, ceil(K / 128)], one per (row, 128-channel block, the last one narrower):
      ``Σ_b (a_b · w_bᵀ) · a_scales[:, b]`` summed in ascending b, then ``· w_scale``;
    * else: ``a_scales`` fp32 [M] or [M, 1]: ``(a · wᵀ) · a_scale · w_scale``, the sum exact in int32, plus
      ``x_out · w_outᵀ`` (fp16 [M, C] and [N, C], the split scheme's outlier channels) summed in fp32."""
    (m, k), n = a.shape, w.shape[0]
    blocks = triton.cdiv(k, ACT_BLOCK)
    assert w.shape[1] == k and a_scales.numel() == m * (blocks if blocked else 1)
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if not m:
        return out
    outliers = x_out is not None
    channels = x_out.shape[1] if outliers else 0
    grid = (triton.cdiv(m, _MM_M), triton.cdiv(n, _MM_N))
    _int8_kernel[grid](
        a.contiguous(), a_scales.contiguous(), w.contiguous(), w_scale.contiguous(),
        x_out.contiguous() if outliers else a, w_out.contiguous() if outliers else a, out, m, n, k, channels,
        BM=_MM_M, BN=_MM_N, BK=ACT_BLOCK, BC=max(16, triton.next_power_of_2(channels)),
        BLOCKED=blocked, OUTLIERS=outliers, num_warps=8, num_stages=3, enable_fp_fusion=False,
    )  # fmt: skip
    return out
