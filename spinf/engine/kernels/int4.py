"""Int4 GPTQ weights on the GPU (engine spec B.14.3, api spec §9.8): unpacking, the activation quantizers and the
int8 product. `spinf.engine.qwen35.int4` keeps every int4 linear packed (``q`` uint8 [out, in/2], fp16 group scales
[out, in/G] for the checkpoint's group of G inputs) and states each mode's arithmetic in plain torch; these kernels
compute the same bits faster. Only the unpacking reads the groups (``GROUP_BYTES``, G / 2 packed bytes per scale);
the products see int8 or float weights.

* `unpack_int4`: one pass over the packed weight, writing either the ``i8`` mode's int8 weight
  ``round(s_g · (q − 8) · 127 / amax_row)`` (``amax_row`` read from a table made once at load) or the float weight
  ``s_g · (q − 8)`` in any float dtype. The product ``s_g · (q − 8)`` is exact in fp32; ``· 127`` rounds once and the
  division is correctly rounded (``div_rn``), as torch's are, so the int8 codes equal the torch path's. The weight is
  written into the rows ``[row0, row0 + out)`` of a fused buffer, so a fused linear's parts land in one tensor.
* `quantize_split` and `quantize_blocks`: the activations of either scheme in one pass (torch's codes and scales,
  bit for bit, for finite inputs; a NaN or an inf gets code 0 and its row a scale torch would not give it),
  instead of the several passes over fp32 copies the torch code takes.
* `norm_quantize_split`: a norm-fed linear's activations straight from the residual rows: Qwen3.5's RMSNorm (the
  steps of `spinf.engine.kernels.rows.qwen_norm`, rounded to the rows' dtype) and the split scheme's codes, scale
  and outlier channels in one pass, the normed rows written only when asked (the GDN's b/a product reads them):
  `quantize_split`'s bits for the normed rows it makes (its sum of squares in its own order, so a normed value may
  differ from `qwen_norm`'s in the last place), without the normed rows' round trip through memory.
* `int8_mm`: the i8 mode's products with their epilogue, written in the activations' dtype (no [M, N] int32 or fp32
  temporaries): the block-scaled scheme of the norm-free linears (int8 activations with one scale per (token,
  128-channel block), each block's products summed exactly in int32, the blocks added in fp32 in ascending order,
  then the weight's per-channel scale) and the split scheme of the norm-fed ones (the whole row's sum exact in
  int32, both scales, plus the fp16 outlier channels' product on the tensor cores). Multiplications and additions
  are asked to stay apart (``enable_fp_fusion=False``); through the interpreter the block-scaled result equals the
  torch loop bit for bit, compiled it has differed from the CPU's in the last bits. A row's result depends on that
  row alone, and not on the tile (`Tile`): no split along K, integer sums exact, the rest per element or one dot
  whose bits no tile tried on the H200 changed (mma and wgmma alike). So the tile is picked by row count and device
  (`product_tile`) without breaking the engine's invariance; tests/engine/qwen35/test_int4_kernels.py checks it on
  the GPU (through the interpreter the fp16 dot is numpy's, so the CPU cannot).

All run through Triton's interpreter on the CPU (the tests), compiled on a GPU.
"""

from __future__ import annotations

import functools

import attrs
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from spinf.engine.kernels.gemm import _sms
from spinf.engine.kernels.rows import _qwen_inv_rms, _round_to, int8_code

ACT_BLOCK = 128  # input channels per activation scale (`spinf.engine.qwen35.int4.ACT_BLOCK`)
_UNPACK_ROWS, _UNPACK_COLS = 64, 128  # output rows × packed bytes per program of `unpack_int4`


@triton.jit
def _weights(q, s):
    """The float weights ``s_g · (q − 8)`` of packed bytes ``q`` (int32) and their fp32 scales: (even, odd) input."""
    return ((q & 15) - 8).to(tl.float32) * s, ((q >> 4) - 8).to(tl.float32) * s


@triton.jit
def _codes(q, s, amax):
    """The i8 mode's int8 weight codes (as fp32) ``round(s_g · (q − 8) · 127 / amax_row)`` of packed bytes ``q``:
    the division correctly rounded (``div_rn``), then to nearest even, as torch computes them."""
    low, high = _weights(q, s)
    return int8_code(tl.math.div_rn(low * 127.0, amax)), int8_code(tl.math.div_rn(high * 127.0, amax))


@triton.jit
def _unpack_kernel(
    q_ptr, s_ptr, amax_ptr, out_ptr, rows, half, row0,
    INT8: tl.constexpr, GROUP_BYTES: tl.constexpr, BR: tl.constexpr, BJ: tl.constexpr,
):  # fmt: skip
    r = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)
    j = (tl.program_id(1) * BJ + tl.arange(0, BJ)).to(tl.int64)
    mask = (r < rows)[:, None] & (j < half)[None, :]
    q = tl.load(q_ptr + r[:, None] * half + j[None, :], mask=mask, other=0x88).to(tl.int32)
    groups = half // GROUP_BYTES
    s = tl.load(s_ptr + r[:, None] * groups + (j // GROUP_BYTES)[None, :], mask=mask, other=0.0).to(tl.float32)
    if INT8:
        amax = tl.load(amax_ptr + r, mask=r < rows, other=1.0)[:, None]
        low, high = _codes(q, s, amax)
    else:
        low, high = _weights(q, s)
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
    """Write the weight of the packed ``q`` [out, in/2] and ``scales`` [out, in/G] (groups of G inputs, G even and
    dividing the input width: the kernel is compiled per G) into ``out[row0 : row0 + out]`` (``out`` [rows, in],
    contiguous): the int8 codes of the ``i8`` mode when ``amax`` (fp32 [out], each row's largest |weight|, 1 for an
    all-zero row) is given (``out`` int8), else the float weight in ``out``'s dtype."""
    rows, half = q.shape
    assert out.is_contiguous() and out.shape[1] == 2 * half and half % scales.shape[1] == 0
    assert (amax is None) == (out.dtype != torch.int8)
    grid = (triton.cdiv(rows, _UNPACK_ROWS), triton.cdiv(half, _UNPACK_COLS))
    _unpack_kernel[grid](
        q, scales, scales if amax is None else amax, out, rows, half, row0,
        INT8=amax is not None, GROUP_BYTES=half // scales.shape[1], BR=_UNPACK_ROWS, BJ=_UNPACK_COLS, num_warps=8,
    )  # fmt: skip
    return out


@attrs.frozen
class Tile:
    """A product kernel's fixed configuration: rows and columns per program, warps, pipeline stages. On the H200 it
    changed no bit of the result at any of nine tiles (integer sums are exact, the epilogue is per element, and the
    outlier product's one dot gave the same bits at each), so it is chosen by row count and device.

    ``persistent``: one program per SM walks the tiles in groups of ``group`` row tiles (the weight's columns stay
    in L2 while those rows pass) and reads both operands through TMA descriptors (Hopper; any card through the
    interpreter); the sums and the epilogue are the same, so are the bits. ``per_sm`` programs share each SM (the
    interpreter: 4 × ``per_sm`` programs)."""

    rows: int
    cols: int
    warps: int
    stages: int
    persistent: bool = False
    group: int = 8
    per_sm: int = 1  # persistent programs per SM (two: one program's loads overlap the other's products)


SMALL_ROWS = 256  # up to this many rows, the small tiles
# the measured tiles' shared memory (Triton's, sm_90: 192 KiB for the large split tile) needs a Hopper- or
# A100-sized opt-in (228 / 164 KiB); a card with less (Ada, Ampere's consumer parts: 99 KiB) gets tiles that fit it
LARGE_TILE_SHARED = 160 * 2**10


# the block-scaled products past SMALL_ROWS on Hopper: two programs of 64 × 128 per SM. On an H100
# (benchmarks/int4_linears.py, RESULTS.md) o_proj at 16,384 rows took 1.20 ms against 1.35 at one 128 × 128
# program per SM; down_proj at 16,384 rows came out 3.63 against 3.54 in that run and 3.36 against 3.61 in a probe
# an hour earlier (run-to-run noise); at 768 rows the new tile was the fastest tried for both
BLOCKED_PERSISTENT = Tile(64, 128, 4, 3, persistent=True, per_sm=2)


def product_tile(rows: int, blocked: bool, device: torch.device | None = None) -> Tile:
    """The tile for a product of ``rows`` rows on ``device``: the fastest measured at the 27B's shapes
    (benchmarks/int4_linears.py, RESULTS.md), small tiles for few rows (on the H200) and, past `SMALL_ROWS`,
    persistent TMA programs where the card has TMA (Hopper; on an H100 at 16,384 rows they took 17–28% less time
    than the pointer tiles, and the same at 768); on a GPU with less shared memory per block than
    `LARGE_TILE_SHARED`, three-stage tiles that fit 99 KiB (not timed here)."""
    if not _large_tiles(device):
        return Tile(64, 64, 4, 3) if rows <= SMALL_ROWS or blocked else Tile(128, 128, 8, 3)
    if rows > SMALL_ROWS and _tma(device):
        return BLOCKED_PERSISTENT if blocked else Tile(128, 256, 8, 4, persistent=True)
    if blocked:
        return Tile(64, 64, 4, 4) if rows <= SMALL_ROWS else Tile(64, 128, 4, 4)
    return Tile(64, 128, 4, 4) if rows <= SMALL_ROWS else Tile(128, 256, 8, 4)


@functools.cache
def _tma(device: torch.device | None) -> bool:
    """Whether ``device`` reads through TMA descriptors: Hopper and later, and the interpreter."""
    if device is None or device.type != "cuda":
        return True
    index = torch.cuda.current_device() if device.index is None else device.index
    return torch.cuda.get_device_capability(index) >= (9, 0)


@functools.cache
def _large_tiles(device: torch.device | None) -> bool:
    if device is None or device.type != "cuda":
        return True  # the interpreter: any tile runs
    index = torch.cuda.current_device() if device.index is None else device.index
    return torch.cuda.get_device_properties(index).shared_memory_per_block_optin >= LARGE_TILE_SHARED


@triton.jit
def _epilogue(
    acc, rm, rn, M, N, C, a_scale_ptr, w_scale_ptr, xo_ptr, wo_ptr, res_ptr, out_ptr,
    BC: tl.constexpr, BLOCKED: tl.constexpr, OUTLIERS: tl.constexpr, RESIDUAL: tl.constexpr,
):  # fmt: skip
    """The product's ending: ``acc`` is the blocked scheme's fp32 sum of scaled blocks, or the split scheme's exact
    int32 sum, which gets both scales and the fp16 outliers' product: one tensor-core dot of all C channels (fp16
    products are exact in fp32, the sums fp32), which gave the same bits at every tile tried on the H200, from
    64 × 64 to 256 × 128 (benchmarks/int4_linears.py), and at a third of the time of an fp32 dot. ``RESIDUAL``:
    the residual stream's rows added as torch adds them."""
    w_scale = tl.load(w_scale_ptr + rn, mask=rn < N, other=0.0)
    if BLOCKED:
        out = acc * w_scale[None, :]
    else:
        x_scale = tl.load(a_scale_ptr + rm, mask=rm < M, other=0.0)
        out = acc.to(tl.float32) * x_scale[:, None] * w_scale[None, :]
        if OUTLIERS:
            c = tl.arange(0, BC)
            xo = tl.load(xo_ptr + rm[:, None] * C + c[None, :], mask=(rm < M)[:, None] & (c < C)[None, :], other=0.0)
            wo = tl.load(wo_ptr + rn[None, :] * C + c[:, None], mask=(c < C)[:, None] & (rn < N)[None, :], other=0.0)
            out = out + tl.dot(xo, wo, out_dtype=tl.float32)
    offsets = rm[:, None] * N + rn[None, :]
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    if RESIDUAL:  # torch's ``residual + y``: y rounded to the output's dtype, the sum in fp32, rounded once
        res = tl.load(res_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        if out_ptr.dtype.element_ty == tl.bfloat16:
            out = _round_to(out, True) + res
        else:
            out = out.to(out_ptr.dtype.element_ty).to(tl.float32) + res
    if out_ptr.dtype.element_ty == tl.bfloat16:  # to nearest on the bits, as a compiled cast (the interpreter's
        out = _round_to(out, True)  # truncates)
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _int8_kernel(
    a_ptr, a_scale_ptr, b_ptr, w_scale_ptr, xo_ptr, wo_ptr, res_ptr, out_ptr, M, N, K, C,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr,
    BLOCKED: tl.constexpr, OUTLIERS: tl.constexpr, RESIDUAL: tl.constexpr,
):  # fmt: skip
    rm = (tl.program_id(0) * BM + tl.arange(0, BM)).to(tl.int64)
    rn = (tl.program_id(1) * BN + tl.arange(0, BN)).to(tl.int64)
    rk = tl.arange(0, BK)
    blocks = tl.cdiv(K, BK)
    if BLOCKED:  # one activation scale per (row, block): each block's exact sum scaled, blocks added in order
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kb in range(0, blocks):
            k = kb * BK + rk
            a = tl.load(a_ptr + rm[:, None] * K + k[None, :], mask=(rm < M)[:, None] & (k < K)[None, :], other=0)
            b = tl.load(b_ptr + rn[None, :] * K + k[:, None], mask=(k < K)[:, None] & (rn < N)[None, :], other=0)
            sums = tl.dot(a, b, out_dtype=tl.int32)  # exact: 128 int8 products fit int32 with room
            scale = tl.load(a_scale_ptr + rm * blocks + kb, mask=rm < M, other=0.0)
            acc += sums.to(tl.float32) * scale[:, None]
    else:  # one scale per row: the whole row's sum exact in int32
        acc = tl.zeros((BM, BN), dtype=tl.int32)
        for kb in range(0, blocks):
            k = kb * BK + rk
            a = tl.load(a_ptr + rm[:, None] * K + k[None, :], mask=(rm < M)[:, None] & (k < K)[None, :], other=0)
            b = tl.load(b_ptr + rn[None, :] * K + k[:, None], mask=(k < K)[:, None] & (rn < N)[None, :], other=0)
            acc = tl.dot(a, b, acc, out_dtype=tl.int32)
    _epilogue(
        acc, rm, rn, M, N, C, a_scale_ptr, w_scale_ptr, xo_ptr, wo_ptr, res_ptr, out_ptr, BC, BLOCKED, OUTLIERS,
        RESIDUAL,
    )  # fmt: skip


@triton.jit(do_not_specialize=["M", "programs"])
def _int8_tma_kernel(
    a_desc, a_scale_ptr, b_desc, w_scale_ptr, xo_ptr, wo_ptr, res_ptr, out_ptr, M, N, K, C, programs,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr, GROUP_M: tl.constexpr,
    BLOCKED: tl.constexpr, OUTLIERS: tl.constexpr, RESIDUAL: tl.constexpr,
):  # fmt: skip
    """`_int8_kernel`'s sums and epilogue, persistent over grouped tiles, the operands read by TMA (rows and
    channels past the ends read as zeros, which add nothing)."""
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    blocks = tl.cdiv(K, BK)
    per_group = GROUP_M * tiles_n
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, programs):
        first_m = (tile // per_group) * GROUP_M
        rows_in_group = tl.minimum(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (tile % per_group) % rows_in_group
        pid_n = (tile % per_group) // rows_in_group
        om = pid_m * BM
        on = pid_n * BN
        rm = (om + tl.arange(0, BM)).to(tl.int64)
        rn = (on + tl.arange(0, BN)).to(tl.int64)
        if BLOCKED:
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for kb in range(0, blocks):
                sums = tl.dot(a_desc.load([om, kb * BK]), b_desc.load([on, kb * BK]).T, out_dtype=tl.int32)
                scale = tl.load(a_scale_ptr + rm * blocks + kb, mask=rm < M, other=0.0)
                acc += sums.to(tl.float32) * scale[:, None]
        else:
            acc = tl.zeros((BM, BN), dtype=tl.int32)
            for kb in range(0, blocks):
                acc = tl.dot(a_desc.load([om, kb * BK]), b_desc.load([on, kb * BK]).T, acc, out_dtype=tl.int32)
        _epilogue(
            acc, rm, rn, M, N, C, a_scale_ptr, w_scale_ptr, xo_ptr, wo_ptr, res_ptr, out_ptr, BC, BLOCKED, OUTLIERS,
            RESIDUAL,
        )  # fmt: skip


def _tma_ready(*tensors: torch.Tensor) -> bool:
    """Whether TMA descriptors can read these int8 matrices: contiguous, rows a multiple of 16 bytes, 16-byte
    aligned starts."""
    return all(t.is_contiguous() and t.shape[1] % 16 == 0 and t.data_ptr() % 16 == 0 for t in tensors)


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
    tile: Tile | None = None,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The i8 mode's product of ``a`` int8 [M, K] and ``w`` int8 [N, K] with the weight's per-channel ``w_scale``
    fp32 [N], into [M, N] of ``out_dtype``:

    * ``blocked``: ``a_scales`` fp32 [M, ceil(K / 128)], one per (row, 128-channel block, the last one narrower):
      ``Σ_b (a_b · w_bᵀ) · a_scales[:, b]`` summed in ascending b, then ``· w_scale``;
    * else: ``a_scales`` fp32 [M] or [M, 1]: ``(a · wᵀ) · a_scale · w_scale``, the sum exact in int32, plus
      ``x_out · w_outᵀ`` (fp16 [M, C] and [N, C], the split scheme's outlier channels) summed in fp32.

    ``tile`` None: `product_tile` for M rows on ``a``'s device. ``residual`` [M, N] of ``out_dtype``: added to the
    result as torch's ``residual + result`` would (the result rounded to ``out_dtype``, the sum once), in the same
    kernel. ``out``: a contiguous [M, N] tensor of ``out_dtype`` to write (a new one when None); it may be
    ``residual`` itself (each element is read before it is written, by the program that writes it)."""
    (m, k), n = a.shape, w.shape[0]
    assert w.shape[1] == k and a_scales.numel() == m * (triton.cdiv(k, ACT_BLOCK) if blocked else 1)
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    assert out.shape == (m, n) and out.dtype == out_dtype and out.is_contiguous()
    if residual is not None:
        assert residual.shape == (m, n) and residual.dtype == out_dtype
        residual = residual.contiguous()
    if not m:
        return out
    tile = tile or product_tile(m, blocked, a.device)
    outliers = x_out is not None
    channels = x_out.shape[1] if outliers else 0
    a, w = a.contiguous(), w.contiguous()
    # both kernels take the same tensors after their operands (unread ones get any pointer) and the same constants
    rest = (
        w_scale.contiguous(), x_out.contiguous() if outliers else a, w_out.contiguous() if outliers else a,
        out if residual is None else residual, out, m, n, k, channels,
    )  # fmt: skip
    meta = dict(
        BM=tile.rows, BN=tile.cols, BK=ACT_BLOCK, BC=max(16, triton.next_power_of_2(channels)), BLOCKED=blocked,
        OUTLIERS=outliers, RESIDUAL=residual is not None, num_warps=tile.warps, num_stages=tile.stages,
        enable_fp_fusion=False,
    )  # fmt: skip
    if tile.persistent and _tma_ready(a, w):
        tiles = triton.cdiv(m, tile.rows) * triton.cdiv(n, tile.cols)
        programs = min(tiles, tile.per_sm * (_sms(a.device.index or 0) if a.is_cuda else 4))
        a_desc = TensorDescriptor(a, [m, k], [k, 1], [tile.rows, ACT_BLOCK])
        w_desc = TensorDescriptor(w, [n, k], [k, 1], [tile.cols, ACT_BLOCK])
        _int8_tma_kernel[(programs,)](
            a_desc, a_scales.contiguous(), w_desc, *rest, programs, GROUP_M=tile.group, **meta
        )
    else:
        grid = (triton.cdiv(m, tile.rows), triton.cdiv(n, tile.cols))
        _int8_kernel[grid](a, a_scales.contiguous(), w, *rest, **meta)
    return out


@triton.jit
def _quantize_blocks_kernel(x_ptr, q_ptr, scale_ptr, M, K, BR: tl.constexpr):
    r = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)
    k = tl.program_id(1) * 128 + tl.arange(0, 128)
    mask = (r < M)[:, None] & (k < K)[None, :]
    x = tl.load(x_ptr + r[:, None] * K + k[None, :], mask=mask, other=0.0).to(tl.float32)
    store_blocks(
        x, q_ptr + r[:, None] * K + k[None, :], scale_ptr + r * tl.num_programs(1) + tl.program_id(1), mask, r < M
    )


@triton.jit
def store_blocks(y, q_ptrs, scale_ptrs, mask, scale_mask):
    """The block-scaled scheme's codes and scales of ``y`` [B, 128] (B blocks of 128 columns, of one row or of B
    rows): each block's scale ``amax / 127`` over its live columns (``mask``; 1 for a block of zeros) to
    ``scale_ptrs`` [B] where ``scale_mask``, its codes to ``q_ptrs`` [B, 128] where ``mask``. `quantize_blocks`
    writes through it, and so do the row-wise kernels that make the activations and quantize them before they
    reach memory (`spinf.engine.kernels.qwen_rows`)."""
    y = tl.where(mask, y, 0.0)
    amax = tl.max(tl.abs(y), axis=1)
    scale = tl.where(amax > 0, tl.math.div_rn(amax, 127.0), 1.0)
    tl.store(scale_ptrs, scale, mask=scale_mask)
    tl.store(q_ptrs, _round_int8(y, scale[:, None]), mask=mask)


def blocks_like(rows: int, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty codes int8 [rows, width] and scales fp32 [rows, ceil(width / 128)] of the block-scaled scheme."""
    codes = torch.empty((rows, width), dtype=torch.int8, device=device)
    return codes, torch.empty((rows, triton.cdiv(width, ACT_BLOCK)), dtype=torch.float32, device=device)


@triton.jit
def _round_int8(x, scale):
    """``round(x / scale)`` to nearest even, clamped to ±127, as int8, as torch's ``_to_int8`` computes it for
    finite values."""
    y = tl.math.div_rn(x, scale)
    y = tl.where(y == y, y, 0.0)  # NaN (a NaN input, or inf over an inf scale): code 0, never an undefined cast
    return int8_code(y).to(tl.int8)


def quantize_split(
    x: torch.Tensor, keep: torch.Tensor, outliers: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The split scheme's activations in one pass over ``x`` [M, K] (any float dtype): the int8 codes [M, K] of the
    channels where ``keep`` (int8 [K]) is 1 (the rest 0), quantized per token by ``amax / 127`` over those channels
    (scale fp32 [M, 1], 1 for a row of zeros), and the ``outliers`` channels (int64 [C]) in fp16 [M, C]."""
    return _split(x, None, 0.0, keep, outliers, norm=False)[1:]


@triton.jit
def _split_kernel(
    h_ptr, w_ptr, keep_ptr, idx_ptr, x_ptr, q_ptr, scale_ptr, xo_ptr, K, C, eps, offset,
    NORM: tl.constexpr, WRITE_X: tl.constexpr, BF16: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    """The split scheme's activations of one row of ``h``, or (``NORM``) of its RMSNorm, in passes of ``BK``
    channels (not one block of the whole row, which held too many registers for more than one program an SM): the
    norm's sum of squares, the activations' largest kept magnitude (the normed rows written if ``WRITE_X``), then
    the codes, from the same values computed again."""
    row = tl.program_id(0).to(tl.int64)
    inv = 1.0
    if NORM:
        sq = tl.zeros((BK,), dtype=tl.float32)
        for k0 in range(0, K, BK):
            k = k0 + tl.arange(0, BK)
            h = tl.load(h_ptr + row * K + k, mask=k < K, other=0.0).to(tl.float32)
            sq += h * h
        inv = _qwen_inv_rms(tl.sum(sq, axis=0), K, eps)
    top = tl.zeros((BK,), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        y = _split_input(h_ptr, w_ptr, row, k, K, inv, offset, NORM, BF16)
        if WRITE_X:
            tl.store(x_ptr + row * K + k, y.to(x_ptr.dtype.element_ty), mask=k < K)
        keep = tl.load(keep_ptr + k, mask=k < K, other=0)
        top = tl.maximum(top, tl.where(keep != 0, tl.abs(y), 0.0))
    amax = tl.max(top, axis=0)
    scale = tl.where(amax > 0, tl.math.div_rn(amax, 127.0), 1.0)
    tl.store(scale_ptr + row, scale)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        y = _split_input(h_ptr, w_ptr, row, k, K, inv, offset, NORM, BF16)
        keep = tl.load(keep_ptr + k, mask=k < K, other=0)
        tl.store(q_ptr + row * K + k, _round_int8(tl.where(keep != 0, y, 0.0), scale), mask=k < K)
    c = tl.arange(0, BC)
    yo = _split_input(h_ptr, w_ptr, row, tl.load(idx_ptr + c, mask=c < C, other=0), K, inv, offset, NORM, BF16)
    tl.store(xo_ptr + row * C + c, yo.to(tl.float16), mask=c < C)  # the same steps on the same inputs: y's bits


@triton.jit
def _split_input(h_ptr, w_ptr, row, k, K, inv, offset, NORM: tl.constexpr, BF16: tl.constexpr):
    """Row ``row``'s activations at channels ``k`` (0 past K), fp32: ``h`` itself, or (``NORM``) its normed values
    ``h · inv · (offset + w)`` rounded to the rows' dtype."""
    h = tl.load(h_ptr + row * K + k, mask=k < K, other=0.0).to(tl.float32)
    if NORM:
        h = _round_to(h * inv * (offset + tl.load(w_ptr + k, mask=k < K, other=0.0).to(tl.float32)), BF16)
    return h


def _split(h, weight, eps, keep, outliers, *, norm: bool, offset: float = 1.0, want_x: bool = False):
    """`_split_kernel` over the rows of ``h`` [M, K]: (normed rows or None, codes, scales, outlier channels)."""
    m, k = h.shape
    c = outliers.numel()
    x = torch.empty_like(h) if want_x else None
    q = torch.empty((m, k), dtype=torch.int8, device=h.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=h.device)
    x_out = torch.empty((m, c), dtype=torch.float16, device=h.device)
    if m:
        h = h.contiguous()
        _split_kernel[(m,)](
            h, h if weight is None else weight.contiguous(), keep, outliers, q if x is None else x, q, scale, x_out,
            k, c, eps, offset, NORM=norm, WRITE_X=want_x, BF16=h.dtype == torch.bfloat16,
            BK=min(1024, triton.next_power_of_2(k)), BC=max(16, triton.next_power_of_2(c)), num_warps=4,
        )  # fmt: skip
    return x, q, scale, x_out


def norm_quantize_split(
    h: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    keep: torch.Tensor,
    outliers: torch.Tensor,
    *,
    offset: float = 1.0,
    want_x: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The normed rows ``rms_norm(h) · (offset + weight)`` in h's dtype (None unless ``want_x``) and what
    `quantize_split` gives for them: int8 codes [M, K], scales fp32 [M, 1], the outlier channels fp16 [M, C]."""
    if weight.shape != (h.shape[1],):
        raise ValueError(f"a norm weight of {tuple(weight.shape)} for rows of {h.shape[1]}")
    return _split(h, weight, eps, keep, outliers, norm=True, offset=offset, want_x=want_x)


def quantize_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The block-scaled scheme's activations in one pass over ``x`` [M, K]: int8 codes [M, K] and one scale fp32
    [M, ceil(K / 128)] per (token, 128-channel block, the last one narrower), ``amax / 127`` (1 for zeros)."""
    m, k = x.shape
    blocks = triton.cdiv(k, ACT_BLOCK)
    q, scales = blocks_like(m, k, x.device)
    if m:
        _quantize_blocks_kernel[(triton.cdiv(m, 16), blocks)](x.contiguous(), q, scales, m, k, BR=16, num_warps=4)
    return q, scales
