"""Qwen3.5's row-wise kernels on a GPU (engine spec B.14): the inputs of a Gated DeltaNet layer's recurrence in three
kernels, and the MLP's ``silu(gate) · up`` in one.

`spinf.engine.qwen35.gdn.GatedDeltaNet.recurrence_inputs` spelled in torch ops is about thirty launches a layer over
the pass's rows: the causal convolution's taps gathered from the stream one by one, multiplied and added, SiLU, the
q and k L2 norms, the value heads' copies of each key head, the q scale, and the gates. On a GPU they are these
kernels, each reading a row (or one head of a row) and nothing else, so a row's numbers never depend on what shares
the pass:

* `_conv_silu_kernel`: per row and block of channels, ``Σ_j rows[taps[r, j] - 1] · w[:, j]`` (tap 0: zeros, the
  missing predecessor, so the rows need no zero row copied in front) with each product and
  each partial sum rounded to the stream's dtype in tap order, as the torch ops round, then SiLU in fp32 and the
  result in the stream's dtype;
* `_qk_kernel`: per row and key head, the L2 norm of q and of k (`spinf.engine.kernels.rows.qwen_norm`'s L2 steps,
  `_l2_row`), q times ``dk^-1/2``, each written to the value heads that key head serves;
* `_gates_kernel`: per row, ``beta = sigmoid(b)``, ``g = -exp(A_log) · softplus(a + dt_bias)`` and the decay
  ``exp(g)`` (fp32);
* `_silu_mul_kernel`: per row and block of columns of the fused gate/up product, ``silu(gate)`` rounded to its
  dtype, times ``up``, rounded again: `DecoderLayer._mlp`'s ``pointwise(F.silu, gate) * up`` without the copy of
  the gate half, the SiLU's own pass and the product's;
* `_gated_norm_kernel`: per row and block of value heads, each head's RMSNorm of the recurrence output (the steps
  of `spinf.engine.kernels.rows.qwen_norm`) rounded to its dtype, times ``silu(z)`` rounded to its
  dtype, rounded again: `GatedDeltaNet.output`'s torch form, with z read in place from the input projection's
  output (no contiguous copy, no SiLU pass, no product pass);
* `_qk_rope_kernel`: per row and block of attention heads, the q or k RMSNorm (fp32, ``1 + weight``) rounded to
  the stream's dtype, rope on the first ``rotary`` dims (cos and sin rounded to the dtype, each product and the sum
  rounded, as `spinf.engine.qwen35.model.apply_rope`'s torch ops round), then q times the attention scale, rounded:
  `Attention.forward`'s q and k, read in place from the fused q/gate/k/v product (no copies, no concatenations);
* `_sigmoid_mul_kernel`: the attention output times ``sigmoid(gate)`` rounded to the dtype, the gate read in place
  from the fused product.

SiLU·up and the attention gate can write, instead of their rows, the rows' block-scaled int8 codes and scales
(``blocks=True``; `spinf.engine.kernels.int4.store_blocks`, `quantize_blocks`' bits), which is all the block-scaled
product after them reads. The gated norm does not: its sum of squares would then run in the order of the layout
Triton picks for int8 stores, not for bf16 ones, and on an H100 that moved 46 of 100,663,296 codes by one.

Every bf16 step rounds with `spinf.engine.kernels.rows._round_to`. The exponentials are Triton's, not torch's, so
the bits can differ from the torch form's in the last place (the GPU tests bound it); the scoring pass and the
decode step both run these kernels, so a decoded row keeps the bits it has as a branch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from spinf.engine.kernels.int4 import ACT_BLOCK, blocks_like, store_blocks
from spinf.engine.kernels.rows import _l2_row, _qwen_inv_rms, _round_to

CHANNELS = 256  # channels (columns) per program of SiLU·up
# channels and warps per program of the convolution: four channels a thread. On an H100 at 16,384 × 10,240 (four
# taps) 0.764 ms, against 0.883 ms at four warps; 256, 512 and 1,024 channels at 2, 4 and 8 warps all take 0.76 ms,
# and eight or more channels a thread 1.37 ms
CONV_COLUMNS, CONV_WARPS = 256, 2
# columns and warps per program of SiLU·up when it writes codes: on an H100 at 16,384 × 17,408, 0.58 ms, against
# 1.06 ms with CHANNELS and four warps, and 0.68 + 0.32 ms for the rows and then `quantize_blocks`
QUANT_COLUMNS, QUANT_WARPS = 1024, 2
GATED_HEADS = 16  # value heads per program of the gated norm (the 27B's 48: three programs a row)
ROPE_HEADS = 8  # attention heads per program of the q/k norm and rope
GATE_COLUMNS = 1024  # columns per program of the attention output's gate
# warps per program of the other kernels (Triton's default); benchmarks/qwen_rows.py times the alternatives
QK_WARPS = GATED_WARPS = ROPE_WARPS = GATE_WARPS = 4
_ACT = tl.constexpr(ACT_BLOCK)  # the kernels' name for it (a jit function reads only constexpr globals)


@triton.jit
def _silu(x):
    return tl.math.div_rn(x, 1.0 + tl.exp(-x))


@triton.jit
def _conv_silu_kernel(
    rows_ptr, taps_ptr, w_ptr, out_ptr, channels, rows_row, out_row,
    TAPS: tl.constexpr, BF16: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < channels
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(TAPS):
        source = tl.load(taps_ptr + row * TAPS + j).to(tl.int64)  # 1 + the row it reads; 0: none, a zero row
        present = cols < tl.where(source > 0, channels, 0)
        at = rows_ptr + (tl.maximum(source, 1) - 1) * rows_row + cols
        x = tl.load(at, mask=present, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols * TAPS + j, mask=mask, other=0.0).to(tl.float32)
        product = _round_to(x * w, BF16)
        if j == 0:
            acc = product
        else:
            acc = _round_to(acc + product, BF16)
    out = _round_to(_silu(acc), BF16)  # rounded here, so the store's cast is exact
    tl.store(out_ptr + row * out_row + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _qk_kernel(
    mixed_ptr, q_ptr, k_ptr, mixed_row, key_dim, scale, eps,
    KEY_HEADS: tl.constexpr, REPEAT: tl.constexpr, DK: tl.constexpr, BF16: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    dims = tl.arange(0, BLOCK)
    mask = dims < DK
    q = tl.load(mixed_ptr + row * mixed_row + head * DK + dims, mask=mask, other=0.0).to(tl.float32)
    k = tl.load(mixed_ptr + row * mixed_row + key_dim + head * DK + dims, mask=mask, other=0.0).to(tl.float32)
    q = _round_to(_l2_row(q, eps, BF16) * scale, BF16)
    k = _l2_row(k, eps, BF16)
    heads = KEY_HEADS * REPEAT
    for r in tl.static_range(REPEAT):
        at = row * heads * DK + (head * REPEAT + r) * DK + dims
        tl.store(q_ptr + at, q.to(q_ptr.dtype.element_ty), mask=mask)  # exact: q holds a bf16 value
        tl.store(k_ptr + at, k.to(k_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gates_kernel(
    b_ptr, a_ptr, dt_ptr, alog_ptr, beta_ptr, g_ptr, decay_ptr, b_row, a_row, heads,
    BF16: tl.constexpr, B_BF16: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < heads
    b = tl.load(b_ptr + row * b_row + cols, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + row * a_row + cols, mask=mask, other=0.0).to(tl.float32)
    dt = tl.load(dt_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    a_log = tl.load(alog_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    beta = _round_to(tl.math.div_rn(1.0, 1.0 + tl.exp(-b)), B_BF16)
    x = _round_to(a + dt, BF16)
    # softplus: x above torch's threshold of 20; exp(x) below -15, where log(1 + exp(x)) would round exp(x) away
    softplus = tl.where(x > 20.0, x, tl.where(x < -15.0, tl.exp(x), tl.log(1.0 + tl.exp(x))))
    g = -tl.exp(a_log) * _round_to(softplus, BF16)
    tl.store(beta_ptr + row * heads + cols, beta.to(beta_ptr.dtype.element_ty), mask=mask)
    tl.store(g_ptr + row * heads + cols, g, mask=mask)
    tl.store(decay_ptr + row * heads + cols, tl.exp(g), mask=mask)


@triton.jit
def _blocks_of(BLOCKS: tl.constexpr):
    """This program's column blocks [BLOCKS] and their columns [BLOCKS, 128] (the i8 activations' blocks)."""
    block = tl.program_id(1) * BLOCKS + tl.arange(0, BLOCKS)
    return block, block[:, None] * _ACT + tl.arange(0, _ACT)[None, :]


@triton.jit
def _store_row_blocks(y, q_ptr, scale_ptr, row, block, cols, mask, width):
    """`store_blocks` for this program's column blocks ``block`` (columns ``cols``, live where ``mask``) of row
    ``row`` of a [rows, width] activation: codes int8 [rows, width], scales [rows, ceil(width / 128)]."""
    blocks = tl.cdiv(width, _ACT)
    store_blocks(y, q_ptr + row * width + cols, scale_ptr + row * blocks + block, mask, block < blocks)


@triton.jit
def _silu_mul_kernel(
    gu_ptr, out_ptr, scale_ptr, inner, gu_row, BF16: tl.constexpr, BLOCKS: tl.constexpr, QUANT: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    block, cols = _blocks_of(BLOCKS)
    mask = cols < inner
    gate = tl.load(gu_ptr + row * gu_row + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * gu_row + inner + cols, mask=mask, other=0.0).to(tl.float32)
    out = _round_to(_round_to(_silu(gate), BF16) * up, BF16)
    if QUANT:
        _store_row_blocks(out, out_ptr, scale_ptr, row, block, cols, mask, inner)
    else:
        tl.store(out_ptr + row * inner + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor, *, blocks: bool = False):
    """``silu(gate) · up`` [n, inner] of the fused product ``gate_up`` [n, 2 · inner] (gate first), in its dtype;
    with ``blocks``, instead, its block-scaled int8 codes and scales (`spinf.engine.kernels.int4.quantize_blocks`'s,
    bit for bit), the rows themselves never written."""
    n, width = gate_up.shape
    inner = width // 2
    out, scales = blocks_like(n, inner, gate_up.device) if blocks else (gate_up.new_empty((n, inner)), None)
    if n:
        columns, warps = (QUANT_COLUMNS, QUANT_WARPS) if blocks else (CHANNELS, 4)
        _silu_mul_kernel[(n, triton.cdiv(inner, columns))](
            gate_up, out, out if scales is None else scales, inner, _rows(gate_up, "gate/up product"),
            BF16=gate_up.dtype == torch.bfloat16, BLOCKS=columns // ACT_BLOCK, QUANT=blocks, num_warps=warps,
        )  # fmt: skip
    return (out, scales) if blocks else out


@triton.jit
def _gated_norm_kernel(
    o_ptr, z_ptr, w_ptr, out_ptr, z_row, heads, dv, eps, HEADS: tl.constexpr, BF16: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1) * HEADS + tl.arange(0, HEADS)  # a block of heads, each a row of the norm
    dims = tl.arange(0, BLOCK)
    mask = (head < heads)[:, None] & (dims < dv)[None, :]
    cols = head[:, None] * dv + dims[None, :]
    x = tl.load(o_ptr + row * heads * dv + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * _qwen_inv_rms(tl.sum(x * x, axis=1), dv, eps)[:, None]
    y = _round_to(y * tl.load(w_ptr + dims, mask=dims < dv, other=0.0).to(tl.float32)[None, :], BF16)
    z = tl.load(z_ptr + row * z_row + cols, mask=mask, other=0.0).to(tl.float32)
    out = _round_to(y * _round_to(_silu(z), BF16), BF16)
    tl.store(out_ptr + row * heads * dv + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def gated_norm(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``rms_norm(o) · weight · silu(z)`` [n, heads · dv] of the recurrence's outputs ``o`` [n, heads, dv] and the
    gate's rows ``z`` [n, heads · dv] (rows of contiguous elements, any row stride), in o's dtype."""
    n, heads, dv = o.shape
    if z.shape != (n, heads * dv) or weight.shape != (dv,):
        shapes = f"gate rows {tuple(z.shape)} and norm weight {tuple(weight.shape)}"
        raise ValueError(f"{shapes} do not fit the recurrence's outputs {tuple(o.shape)}")
    o = o.contiguous()
    out = torch.empty((n, heads * dv), dtype=o.dtype, device=o.device)
    if n:
        block = min(GATED_HEADS, triton.next_power_of_2(heads))
        _gated_norm_kernel[(n, triton.cdiv(heads, block))](
            o, z, weight.contiguous(), out, _rows(z, "gate rows"), heads, dv, eps,
            HEADS=block, BF16=o.dtype == torch.bfloat16, BLOCK=triton.next_power_of_2(dv), num_warps=GATED_WARPS,
        )  # fmt: skip
    return out


@triton.jit
def _qk_rope_kernel(
    x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, x_row, head_stride, cos_row, heads, d, rotary, eps, scale,
    HEADS: tl.constexpr, BF16: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
    dims = tl.arange(0, BLOCK)
    live = head < heads
    mask = live[:, None] & (dims < d)[None, :]
    half = rotary // 2
    turned = tl.where(dims < half, dims + half, dims - half)  # rotate-half's partner of each rotary dim
    src = x_ptr + row * x_row + head[:, None] * head_stride
    x = tl.load(src + dims[None, :], mask=mask, other=0.0).to(tl.float32)
    inv = _qwen_inv_rms(tl.sum(x * x, axis=1), d, eps)[:, None]
    w = 1.0 + tl.load(w_ptr + dims, mask=dims < d, other=0.0).to(tl.float32)
    y = _round_to(x * inv * w[None, :], BF16)
    # the partner dims' normed values: the same steps on the same inputs, so the same bits
    in_rot = (dims < rotary)[None, :] & mask
    xp = tl.load(src + turned[None, :], mask=in_rot, other=0.0).to(tl.float32)
    wp = 1.0 + tl.load(w_ptr + turned, mask=dims < rotary, other=0.0).to(tl.float32)
    yp = _round_to(xp * inv * wp[None, :], BF16)
    yp = tl.where((dims < half)[None, :], -yp, yp)
    cos = _round_to(tl.load(cos_ptr + row * cos_row + dims, mask=dims < rotary, other=0.0), BF16)
    sin = _round_to(tl.load(sin_ptr + row * cos_row + dims, mask=dims < rotary, other=0.0), BF16)
    roped = _round_to(_round_to(y * cos[None, :], BF16) + _round_to(yp * sin[None, :], BF16), BF16)
    y = tl.where(in_rot, roped, y)
    y = _round_to(y * scale, BF16)
    tl.store(out_ptr + (row * heads + head[:, None]) * d + dims[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def qk_rope(
    x: torch.Tensor,
    heads: int,
    head_stride: int,
    d: int,
    weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    scale: float = 1.0,
) -> torch.Tensor:
    """[n, heads, d]: each head of ``x`` (rows of the fused product, head ``h`` at columns ``h · head_stride``
    onward) RMS-normed with ``1 + weight``, roped on the first ``cos.shape[1]`` dims by ``cos``, ``sin`` [n, rotary]
    (fp32), times ``scale``; in x's dtype."""
    n, rotary = cos.shape[0], cos.shape[1]
    if cos.shape != sin.shape or cos.stride() != sin.stride() or n != x.shape[0] or rotary > d or rotary % 2:
        raise ValueError(f"rope tables {tuple(cos.shape)} do not fit {n} rows of {heads} heads of {d}")
    if weight.shape != (d,) or (heads - 1) * head_stride + d > x.shape[1]:
        raise ValueError(f"{heads} heads of {d} at a stride of {head_stride} do not fit rows of {x.shape[1]}")
    out = torch.empty((n, heads, d), dtype=x.dtype, device=x.device)
    if n:
        block = min(ROPE_HEADS, triton.next_power_of_2(heads))
        _qk_rope_kernel[(n, triton.cdiv(heads, block))](
            x, weight.contiguous(), cos, sin, out, _rows(x, "q/k rows"), head_stride, _rows(cos, "rope table"),
            heads, d, rotary, eps, scale,
            HEADS=block, BF16=x.dtype == torch.bfloat16, BLOCK=triton.next_power_of_2(d), num_warps=ROPE_WARPS,
        )  # fmt: skip
    return out


@triton.jit
def _sigmoid_mul_kernel(
    a_ptr, g_ptr, out_ptr, scale_ptr, width, g_row, d, head_stride,
    BF16: tl.constexpr, BLOCKS: tl.constexpr, QUANT: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    block, cols = _blocks_of(BLOCKS)
    mask = cols < width
    a = tl.load(a_ptr + row * width + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + row * g_row + (cols // d) * head_stride + cols % d, mask=mask, other=0.0).to(tl.float32)
    out = _round_to(a * _round_to(tl.math.div_rn(1.0, 1.0 + tl.exp(-g)), BF16), BF16)
    if QUANT:
        _store_row_blocks(out, out_ptr, scale_ptr, row, block, cols, mask, width)
    else:
        tl.store(out_ptr + row * width + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def sigmoid_mul(a: torch.Tensor, gate: torch.Tensor, d: int, head_stride: int, *, blocks: bool = False):
    """``a · sigmoid(g)`` [n, heads · d] in a's dtype, ``a`` [n, heads, d] the attention output, g's head ``h`` at
    columns ``h · head_stride`` onward of the rows ``gate`` (rows of contiguous elements: the fused product, read in
    place); with ``blocks``, instead, its block-scaled int8 codes and scales, as `silu_mul`'s."""
    n, heads = a.shape[0], a.shape[1]
    if a.shape[2] != d or (heads - 1) * head_stride + d > gate.shape[1] or gate.shape[0] != n:
        raise ValueError(f"gate rows {tuple(gate.shape)} do not hold {heads} heads of {d} at a stride {head_stride}")
    a = a.reshape(n, heads * d).contiguous()
    out, scales = blocks_like(n, heads * d, a.device) if blocks else (torch.empty_like(a), None)
    if n:
        _sigmoid_mul_kernel[(n, triton.cdiv(heads * d, GATE_COLUMNS))](
            a, gate, out, out if scales is None else scales, heads * d, _rows(gate, "gate rows"), d, head_stride,
            BF16=a.dtype == torch.bfloat16, BLOCKS=GATE_COLUMNS // ACT_BLOCK, QUANT=blocks, num_warps=GATE_WARPS,
        )  # fmt: skip
    return (out, scales) if blocks else out


def _rows(t: torch.Tensor, name: str) -> int:
    if t.dim() != 2 or t.stride(1) != 1:
        raise ValueError(f"the {name} must be rows of contiguous elements, got {tuple(t.shape)}")
    return t.stride(0)


def gdn_inputs(
    rows: torch.Tensor,
    taps: torch.Tensor,
    conv: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    a_log: torch.Tensor,
    *,
    key_heads: int,
    value_heads: int,
    dk: int,
    dv: int,
    eps: float = 1e-6,
    empty: Callable[[str, tuple[int, ...], torch.dtype], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, ...]:
    """q, k [n, Hv, dk], v [n, Hv, dv] (a view of the convolution's output), g, beta and the decay [n, Hv] of the
    rows whose convolution reads ``taps`` [n, kernel] (oldest first) from ``rows`` (the pre-convolution q/k/v rows:
    tap ``t`` reads row ``t - 1``, tap 0 a zero row, the missing predecessor), with ``conv`` [channels, kernel] and
    the gates' inputs ``b``, ``a`` [n, Hv]: what `GatedDeltaNet.recurrence_inputs` gives, with the decay beside it.

    ``empty(name, shape, dtype)``, when given, is where each output goes (``mixed``, the convolution's output that v
    is a view of, then ``q``, ``k``, ``beta``, ``g``, ``decay``): a contiguous tensor of that shape and dtype on
    the rows' device, the CUDA graphs' buffers (`spinf.engine.qwen35.graphs.Static.place`), which the recurrence then
    reads with no copy between. Without it each is a new tensor."""
    n, kernel = taps.shape
    channels = conv.shape[0]
    key_dim = key_heads * dk
    if channels != 2 * key_dim + value_heads * dv or rows.shape[1] != channels or conv.shape[1] != kernel:
        raise ValueError("the rows, the convolution and the head sizes disagree")
    if value_heads % key_heads:
        raise ValueError(f"{value_heads} value heads do not share {key_heads} key heads evenly")
    bf16 = rows.dtype == torch.bfloat16
    made = empty or (lambda name, shape, dtype: torch.empty(shape, dtype=dtype, device=rows.device))

    def out(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        tensor = made(name, shape, dtype)
        if tuple(tensor.shape) != shape or tensor.dtype != dtype or not tensor.is_contiguous():
            raise ValueError(
                f"the {name} buffer is {tuple(tensor.shape)} {tensor.dtype}, not contiguous {shape} {dtype}"
            )
        return tensor

    mixed = out("mixed", (n, channels), rows.dtype)
    q = out("q", (n, value_heads, dk), rows.dtype)
    k = out("k", (n, value_heads, dk), rows.dtype)
    beta = out("beta", (n, value_heads), b.dtype)
    g = out("g", (n, value_heads), torch.float32)
    decay = out("decay", (n, value_heads), torch.float32)
    if n:
        taps = taps.to(torch.int64).contiguous()
        _conv_silu_kernel[(n, triton.cdiv(channels, CONV_COLUMNS))](
            rows, taps, conv.contiguous(), mixed, channels, _rows(rows, "recurrence inputs' rows"), channels,
            TAPS=kernel, BF16=bf16, BLOCK=CONV_COLUMNS, num_warps=CONV_WARPS,
        )  # fmt: skip
        _qk_kernel[(n, key_heads)](
            mixed, q, k, channels, key_dim, dk**-0.5, eps,
            KEY_HEADS=key_heads, REPEAT=value_heads // key_heads, DK=dk, BF16=bf16, BLOCK=triton.next_power_of_2(dk),
            num_warps=QK_WARPS,
        )  # fmt: skip
        _gates_kernel[(n,)](
            b, a, dt_bias.contiguous(), a_log.contiguous(), beta, g, decay, _rows(b, "gates' b"), _rows(a, "gates' a"),
            value_heads,
            BF16=a.dtype == torch.bfloat16, B_BF16=b.dtype == torch.bfloat16,
            BLOCK=triton.next_power_of_2(value_heads),
        )  # fmt: skip
    v = mixed[:, 2 * key_dim :].view(n, value_heads, dv)
    return q, k, v, g, beta, decay
