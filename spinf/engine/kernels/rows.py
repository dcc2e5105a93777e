"""Row-wise fused kernels around the linears: norms, the fp8s quantizer, GELU·up, and q/k/v preparation.

Each program reads one row (or one head of one row), so a row's result depends on that row alone. The arithmetic
follows the plain torch path of `spinf.engine.gemma4.model` step by step, rounding to bf16 where that path rounds:

* `norm_rows`: RMSNorm in fp32 (``x / sqrt(mean(x²) + eps) * w``), rounded to bf16, then optionally the fp8s
  quantizer (``/ scale``, clamp ±448, cast to e4m3): the activation of a fused projection is quantized once,
  inside the norm that precedes it;
* `add_norm`: ``h + norm(y)`` (and the layer scalar), the residual update after attention and after the MLP;
* `gelu_mul`: ``gelu_tanh(gate) * up`` from the fused gate/up product, optionally quantized for the down projection;
* `quantize_rows`: the quantizer alone (the attention output before the o projection);
* `quantize_dynamic`: the dynamic quantizers of the other schemes (`spinf.engine.schemes`): e4m3 by a scale read
  from the device (fp8), or e4m3 / int8 by each row's own ``amax / 448`` or ``amax / 127`` (fp8row, w8a8), which
  the kernel also writes;
* `prepare_qkv`: per head, the q/k RMSNorm with its weight, the weightless v norm, and rotate-half rope from the
  token positions, written into one ``[N, H + 2·Hkv, D]`` buffer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_GELU_COLUMNS = 1024  # columns per program of `gelu_mul` (fixed)


def _block(n: int) -> int:
    return triton.next_power_of_2(n)


@triton.jit
def int8_code(y):
    """``y`` rounded to nearest even and clamped to ±127 (adding and taking away 1.5 · 2^23 rounds for |y| < 2^22), as
    torch's ``round(y).clamp(-127, 127)``: every int8 quantizer's last step (here and `spinf.engine.kernels.int4`)."""
    return tl.minimum(tl.maximum((y + 12582912.0) - 12582912.0, -127.0), 127.0)


@triton.jit
def _bf16(x):
    """Round fp32 to the nearest bf16 and back, as the torch path's bf16 tensors do between operations."""
    return x.to(tl.bfloat16).to(tl.float32)


@triton.jit
def _rms(x, w, n, eps):
    """RMSNorm of one fp32 row ``x`` (masked lanes hold 0) with fp32 weights ``w``, rounded to bf16."""
    mean = tl.sum(x * x, axis=0) / n
    return _bf16(x * (1.0 / tl.sqrt(mean + eps)) * w)


# Stores a row in bf16, or quantized: ``y / scale`` clamped to ±448 (`spinf.engine.quant.E4M3_MAX`), cast to e4m3.
@triton.jit
def _store_row(out_ptr, offs, mask, y, inv_scale, QUANT: tl.constexpr):
    if QUANT:
        q = tl.minimum(tl.maximum(y * inv_scale, -448.0), 448.0)
        tl.store(out_ptr + offs, q.to(tl.float8e4nv), mask=mask)
    else:
        tl.store(out_ptr + offs, y.to(tl.bfloat16), mask=mask)


@triton.jit
def _norm_kernel(
    x_ptr, w_ptr, out_ptr, n, eps, inv_scale, HAS_W: tl.constexpr, QUANT: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) if HAS_W else 1.0
    _store_row(out_ptr + row * n, cols, mask, _rms(x, w, n, eps), inv_scale, QUANT)


@triton.jit
def _add_norm_kernel(
    h_ptr,
    y_ptr,
    w_ptr,
    s_ptr,
    out_ptr,
    w_next_ptr,
    next_ptr,
    n,
    eps,
    inv_scale,
    HAS_SCALAR: tl.constexpr,
    NEXT: tl.constexpr,
    QUANT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    y = tl.load(y_ptr + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    h = tl.load(h_ptr + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    out = _bf16(h + _rms(y, w, n, eps))
    if HAS_SCALAR:
        out = _bf16(out * _bf16(tl.load(s_ptr).to(tl.float32)))
    tl.store(out_ptr + row * n + cols, out.to(tl.bfloat16), mask=mask)
    if NEXT:  # the norm that opens the next block, on the row just written (masked lanes hold 0)
        w_next = tl.load(w_next_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        _store_row(next_ptr + row * n, cols, mask, _rms(out, w_next, n, eps), inv_scale, QUANT)


@triton.jit
def _gelu_times(gate, up):
    """``bf16(bf16(gelu_tanh(gate)) · up)`` of bf16-valued fp32 values (also the fused GLU's, `kernels.gemm`)."""
    # gelu with the tanh approximation; tanh(u) = 1 - 2 / (exp(2u) + 1)
    u = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
    tanh = 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)
    return _bf16(_bf16(0.5 * gate * (1.0 + tanh)) * up)


@triton.jit
def _gelu_mul_kernel(gu_ptr, out_ptr, inner, inv_scale, QUANT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inner
    gate = tl.load(gu_ptr + row * 2 * inner + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * 2 * inner + inner + cols, mask=mask, other=0.0).to(tl.float32)
    _store_row(out_ptr + row * inner, cols, mask, _gelu_times(gate, up), inv_scale, QUANT)


@triton.jit
def _quantize_kernel(x_ptr, out_ptr, n, inv_scale, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    _store_row(out_ptr + row * n, cols, mask, x, inv_scale, True)


# The dynamic quantizer: the scale is read from ``scale_ptr`` or, with PER_ROW, made from the row's largest |x| and
# written there; then ``x / scale`` (correctly rounded, as torch divides), for int8 rounded to nearest even (adding
# and taking away 1.5 · 2^23 does it in fp32 for |y| < 2^22) and clamped to ±127, for e4m3 clamped to ±448 and cast.
@triton.jit
def _dynamic_quantize_kernel(
    x_ptr, out_ptr, scale_ptr, n, PER_ROW: tl.constexpr, INT8: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    if PER_ROW:
        amax = 0.0
        for start in range(0, n, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.abs(x), axis=0))
        amax = tl.maximum(amax, 1.1754943508222875e-38)  # the smallest normal fp32: an all-zero row quantizes to 0
        if INT8:
            scale = tl.math.div_rn(amax, 127.0)
        else:
            scale = tl.math.div_rn(amax, 448.0)
        tl.store(scale_ptr + row, scale)
    else:
        scale = tl.load(scale_ptr)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n
        y = tl.math.div_rn(tl.load(x_ptr + row * n + cols, mask=mask, other=0.0).to(tl.float32), scale)
        if INT8:
            tl.store(out_ptr + row * n + cols, int8_code(y).to(tl.int8), mask=mask)
        else:
            y = tl.minimum(tl.maximum(y, -448.0), 448.0)
            tl.store(out_ptr + row * n + cols, y.to(tl.float8e4nv), mask=mask)


@triton.jit
def _qkv_kernel(
    qkv_ptr,
    pos_ptr,
    inv_ptr,
    w_ptr,
    out_ptr,
    width,
    eps,
    H: tl.constexpr,
    HKV: tl.constexpr,
    HB: tl.constexpr,
    K_EQ_V: tl.constexpr,
    D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    kind = tl.program_id(1)  # 0: the query heads, 1: the key heads, 2: the value heads of one row
    count = tl.where(kind == 0, H, HKV)
    slot = tl.where(kind == 0, 0, tl.where(kind == 1, H, H + HKV))  # first head of this kind in the output
    src = tl.where(kind == 0, 0, H * D)
    if not K_EQ_V:
        src = tl.where(kind == 2, H * D + HKV * D, src)
    half: tl.constexpr = D // 2
    head = tl.arange(0, HB)
    live = (head < count)[:, None]
    cols = tl.arange(0, D)
    other = (cols + half) % D  # rotate-half partner
    base = qkv_ptr + row * width + src + head[:, None] * D
    x = tl.load(base + cols[None, :], mask=live, other=0.0).to(tl.float32)
    x_other = tl.load(base + other[None, :], mask=live, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + kind * D + cols).to(tl.float32)[None, :]
    w_other = tl.load(w_ptr + kind * D + other).to(tl.float32)[None, :]
    inv = (1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps))[:, None]
    y = _bf16(x * inv * w)
    y_other = _bf16(x_other * inv * w_other)
    if kind < 2:
        angle = tl.load(pos_ptr + row).to(tl.float32) * tl.load(inv_ptr + cols % half)
        cos, sin = _bf16(tl.cos(angle))[None, :], _bf16(tl.sin(angle))[None, :]
        sign = tl.where(cols < half, -1.0, 1.0)[None, :]
        y = _bf16(_bf16(y * cos) + _bf16(sign * y_other * sin))
    out = out_ptr + (row * (H + 2 * HKV) + slot + head[:, None]) * D + cols[None, :]
    tl.store(out, y.to(tl.bfloat16), mask=live)


def _inverse(scale: float | None) -> float:
    # exact for a table's power-of-two scales; a pre-quantized checkpoint's own input scales are any number, whose
    # inverse is rounded once here: the same for every row, so no row depends on another
    return 1.0 if scale is None else 1.0 / scale


def _out(x: torch.Tensor, cols: int, quantized: bool) -> torch.Tensor:
    dtype = torch.float8_e4m3fn if quantized else torch.bfloat16
    return torch.empty((x.shape[0], cols), dtype=dtype, device=x.device)


def norm_rows(x: torch.Tensor, weight: torch.Tensor | None, eps: float, scale: float | None = None) -> torch.Tensor:
    """RMSNorm of every row of ``x`` [N, n] (bf16), quantized to e4m3 by ``scale`` when given."""
    n = x.shape[1]
    out = _out(x, n, scale is not None)
    if x.shape[0]:
        w = weight if weight is not None else x  # any pointer; unread without HAS_W
        _norm_kernel[(x.shape[0],)](
            x, w, out, n, eps, _inverse(scale), HAS_W=weight is not None, QUANT=scale is not None, BLOCK=_block(n)
        )
    return out


def add_norm(
    h: torch.Tensor,
    y: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    scalar: torch.Tensor | None = None,
    *,
    next_weight: torch.Tensor | None = None,
    next_scale: float | None = None,
):
    """``(h + norm(y)) * scalar`` row by row, bf16 [N, n] (the residual update).

    With ``next_weight``, also the norm that opens the next block (``norm_rows(result, next_weight, eps,
    next_scale)``) from the same kernel, and returns ``(result, normed)``.
    """
    n = h.shape[1]
    out = torch.empty_like(h)
    normed = _out(h, n, next_scale is not None) if next_weight is not None else out
    if h.shape[0]:
        _add_norm_kernel[(h.shape[0],)](
            h,
            y,
            weight,
            scalar if scalar is not None else h,
            out,
            next_weight if next_weight is not None else weight,
            normed,
            n,
            eps,
            _inverse(next_scale),
            HAS_SCALAR=scalar is not None,
            NEXT=next_weight is not None,
            QUANT=next_scale is not None,
            BLOCK=_block(n),
        )
    return (out, normed) if next_weight is not None else out


def gelu_mul(gate_up: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """``gelu_tanh(gate) * up`` from the fused product [N, 2I] -> [N, I], quantized by ``scale`` when given."""
    inner = gate_up.shape[1] // 2
    out = _out(gate_up, inner, scale is not None)
    if gate_up.shape[0]:
        grid = (gate_up.shape[0], triton.cdiv(inner, _GELU_COLUMNS))
        _gelu_mul_kernel[grid](gate_up, out, inner, _inverse(scale), QUANT=scale is not None, BLOCK=_GELU_COLUMNS)
    return out


def quantize_rows(x: torch.Tensor, scale: float) -> torch.Tensor:
    """The fp8s quantizer of `spinf.engine.quant.quantize` on bf16 rows [N, n]."""
    out = _out(x, x.shape[1], True)
    if x.shape[0]:
        _quantize_kernel[(x.shape[0],)](x, out, x.shape[1], 1.0 / scale, BLOCK=_block(x.shape[1]))
    return out


_DYNAMIC_BLOCK = 4096  # columns per step of `quantize_dynamic` (fixed)


def quantize_dynamic(
    x: torch.Tensor, *, int8: bool = False, scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [N, n] quantized by ``scale`` (an fp32 device scalar: e4m3), or, without one, each row by its own
    ``amax / 448`` (e4m3) or ``amax / 127`` (``int8``); returns the quantized rows and the scale (the one given, or
    the rows' ``[N, 1]`` fp32 scales)."""
    x = x.contiguous()  # the kernel reads row r at r · n
    rows, n = x.shape
    out = torch.empty((rows, n), dtype=torch.int8 if int8 else torch.float8_e4m3fn, device=x.device)
    per_row = scale is None
    if per_row:
        scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    if rows:
        block = min(_block(n), _DYNAMIC_BLOCK)
        _dynamic_quantize_kernel[(rows,)](x, out, scale, n, PER_ROW=per_row, INT8=int8, BLOCK=block, num_warps=8)
    return out, scale


def qkv_norm_weights(q_norm: torch.Tensor, k_norm: torch.Tensor) -> torch.Tensor:
    """The [3, D] fp32 norm weights `prepare_qkv` reads: q's, k's, and ones for v's weightless norm."""
    return torch.stack([q_norm.float(), k_norm.float(), torch.ones_like(q_norm, dtype=torch.float32)])


def prepare_qkv(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    weights: torch.Tensor,
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    k_eq_v: bool,
    eps: float,
):
    """q [N, H, D], k and v [N, Hkv, D] from the fused projection: normed, q and k rotated (views of one buffer).

    ``positions`` int32 [N]; ``inv_freq`` fp32 [D/2] (zeros for pairs that do not rotate); ``weights`` from
    `qkv_norm_weights`. ``kv_heads`` 0: the projection holds queries only (a KV-shared layer), k and v are empty.
    """
    n = qkv.shape[0]
    out = torch.empty((n, heads + 2 * kv_heads, head_dim), dtype=torch.bfloat16, device=qkv.device)
    if n:
        _qkv_kernel[(n, 3 if kv_heads else 1)](
            qkv,
            positions,
            inv_freq,
            weights,
            out,
            qkv.shape[1],
            eps,
            H=heads,
            HKV=kv_heads,
            HB=_block(max(heads, kv_heads)),
            K_EQ_V=k_eq_v,
            D=head_dim,
        )
    return out[:, :heads], out[:, heads : heads + kv_heads], out[:, heads + kv_heads :]


@triton.jit
def _softcap_lse_kernel(x_ptr, out_ptr, vocab, cap, HAS_CAP: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    m = float("-inf")
    total = 0.0
    for start in range(0, vocab, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < vocab
        x = tl.load(x_ptr + row * vocab + cols, mask=inside, other=0.0)
        if HAS_CAP:
            x = cap * (1.0 - 2.0 / (tl.exp(2.0 * x / cap) + 1.0))  # cap · tanh(x / cap)
        x = tl.where(inside, x, float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=0))
        total = total * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    tl.store(out_ptr + row, m + tl.log(total))


_LSE_BLOCK = 4096  # vocabulary columns per step of `softcap_logsumexp` (fixed)


def softcap_logsumexp(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """``logsumexp(cap · tanh(logits / cap))`` of every row of fp32 ``logits`` [R, V] (no soft-cap when None).

    One program per row walks the vocabulary in fixed blocks, so a row's normaliser depends on that row alone and
    no capped copy of the logits is made.
    """
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows:
        _softcap_lse_kernel[(rows,)](
            logits, out, vocab, cap or 1.0, HAS_CAP=cap is not None, BLOCK=_LSE_BLOCK, num_warps=8
        )
    return out


@triton.jit
def _masked_lse_kernel(x_ptr, mask_ptr, which_ptr, out_ptr, vocab, KEEP: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    mask_row = tl.load(which_ptr + row).to(tl.int64)
    m = float("-inf")
    total = 0.0
    for start in range(0, vocab, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < vocab
        x = tl.load(x_ptr + row * vocab + cols, mask=inside, other=float("-inf"))
        flag = tl.load(mask_ptr + mask_row * vocab + cols, mask=inside, other=0) != 0
        x = tl.where(inside & (flag == KEEP), x, float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=0))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        total = total * tl.exp(m - m_use) + tl.sum(tl.exp(x - m_use), axis=0)
        m = m_new
    tl.store(out_ptr + row, tl.where(total > 0, m + tl.log(total), float("-inf")))


def masked_logsumexp(x: torch.Tensor, mask: torch.Tensor, which: torch.Tensor, keep: bool = True) -> torch.Tensor:
    """``logsumexp`` of each row of fp32 ``x`` [R, V] over the columns where ``mask[which[r]]`` is ``keep``
    (mask [M, V] bool): -inf where no column counts.

    The extraction search's ``log P(end)`` (A.12.2, A.12.3). One program per row walks the vocabulary in fixed
    blocks, so a row's sum never depends on how many rows share the call (torch's reductions may split a row over
    blocks when there are few rows)."""
    rows, vocab = x.shape
    out = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows:
        flags = mask.contiguous().view(torch.uint8)
        _masked_lse_kernel[(rows,)](
            x.contiguous(), flags, which.contiguous(), out, vocab, KEEP=keep, BLOCK=_LSE_BLOCK, num_warps=8
        )
    return out


# Qwen3.5's norms (`spinf.engine.qwen35.ops.rms_norm` and `l2_norm`) one row per program: torch's GPU reductions
# choose how to split a row by the number of rows, so a row's sum, and its bits, changed with what shared the pass.
# RMS: ``x / sqrt(mean(x²) + eps)`` in fp32, times ``offset + w``; L2: ``x / sqrt(sum(x²) + eps)`` in x's dtype,
# each step rounded to bf16 as torch's bf16 ops round (BF16), the sum accumulated in fp32.
@triton.jit
def _round_to(v, BF16: tl.constexpr):
    """``v`` rounded to the nearest bf16 (ties to even) and back, as torch's bf16 ops round, when ``BF16``. Spelled
    on the bits, which a compiled cast gives too, so that Triton's interpreter (whose cast does not round to nearest)
    gives the same numbers on the CPU; NaN stays NaN."""
    if BF16:
        bits = v.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return tl.where(v != v, v, bits.to(tl.float32, bitcast=True))
    return v


@triton.jit
def _l2_row(x, eps, BF16: tl.constexpr):
    """``x / sqrt(sum(x²) + eps)`` over a row in fp32, each step rounded as bf16 ops round (``BF16``)."""
    total = _round_to(tl.sum(_round_to(x * x, BF16), axis=0), BF16)
    root = _round_to(tl.sqrt_rn(_round_to(total + eps, BF16)), BF16)
    return _round_to(x * _round_to(tl.math.div_rn(1.0, root), BF16), BF16)


@triton.jit
def _qwen_inv_rms(sum_sq, n, eps):
    """Qwen3.5's ``1 / sqrt(mean(x²) + eps)`` from a row's fp32 sum of squares over ``n`` elements, every step
    correctly rounded: `_qwen_norm_kernel` and the kernels that fold this norm into their own work share it, so a
    row gets the same bits from each."""
    return tl.math.div_rn(1.0, tl.sqrt_rn(tl.math.div_rn(sum_sq, n.to(tl.float32)) + eps))


@triton.jit
def _qwen_norm_kernel(
    x_ptr, w_ptr, out_ptr, n, eps, offset, L2: tl.constexpr, HAS_W: tl.constexpr, BF16: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    if L2:
        out = _l2_row(x, eps, BF16)
    else:
        out = x * _qwen_inv_rms(tl.sum(x * x, axis=0), n, eps)
        if HAS_W:
            out = out * (offset + tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32))
    tl.store(out_ptr + row * n + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def qwen_norm(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, *, offset: float = 1.0, l2: bool = False
) -> torch.Tensor:
    """Qwen3.5's RMSNorm (``l2`` False: fp32 inside, ``offset + weight``) or L2 norm (``l2``: in x's dtype, no
    weight) over the last dim of ``x``, row by row; the result in x's dtype and shape."""
    n = x.shape[-1]
    flat = x.reshape(-1, n).contiguous()
    out = torch.empty_like(flat)
    if flat.shape[0]:
        w = weight if weight is not None else flat  # any pointer; unread without HAS_W
        _qwen_norm_kernel[(flat.shape[0],)](
            flat, w, out, n, eps, offset,
            L2=l2, HAS_W=weight is not None, BF16=l2 and x.dtype == torch.bfloat16, BLOCK=_block(n),
        )  # fmt: skip
    return out.view(x.shape)
