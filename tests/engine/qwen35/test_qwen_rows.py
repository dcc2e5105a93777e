"""The recurrence inputs of a GDN layer in three row-wise kernels (`spinf.engine.kernels.qwen_rows`): what the torch
form of `GatedDeltaNet.recurrence_inputs` gives, and rows that keep their bits.

Compiled on a GPU, through Triton's interpreter elsewhere (tests/conftest.py). Every bf16 step rounds to nearest
as torch's bf16 ops round (on the bits, which the interpreter follows too), so only the exponentials differ: Triton's
against torch's, a last fp32 place, which a bf16 rounding after them can turn into a bf16 place.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from spinf.engine.kernels.qwen_rows import gdn_inputs  # noqa: E402
from spinf.engine.qwen35.gdn import GatedDeltaNet  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
KEY_HEADS, VALUE_HEADS, DK, DV, KERNEL = 2, 6, 32, 32, 4  # each key head serves three value heads, as the 27B's


def layer(seed: int = 0) -> SimpleNamespace:
    """What `recurrence_inputs` reads of a layer: its config's sizes, the convolution and the gates' parameters."""
    gen = torch.Generator().manual_seed(seed)
    channels = 2 * KEY_HEADS * DK + VALUE_HEADS * DV  # 320: no whole number of the kernel's 256-channel blocks
    cfg = SimpleNamespace(
        linear_num_value_heads=VALUE_HEADS, linear_num_key_heads=KEY_HEADS, linear_key_head_dim=DK,
        linear_value_head_dim=DV, key_dim=KEY_HEADS * DK, value_dim=VALUE_HEADS * DV,
    )  # fmt: skip
    return SimpleNamespace(
        cfg=cfg,
        conv=(torch.randn(channels, KERNEL, generator=gen) * 0.5).bfloat16(),
        dt_bias=torch.randn(VALUE_HEADS, generator=gen).bfloat16(),
        A_log=torch.randn(VALUE_HEADS, generator=gen).bfloat16(),
    )


def inputs(rows: int, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    channels = 2 * KEY_HEADS * DK + VALUE_HEADS * DV
    qkv = torch.randn(rows + 3, channels, generator=gen).bfloat16()
    taps = torch.randint(0, rows + 4, (rows, KERNEL), generator=gen)  # tap t reads row t - 1 of qkv
    taps[:3, :2] = 0  # the first rows have no predecessor: they read zeros
    ba = torch.randn(rows, 2 * VALUE_HEADS, generator=gen).bfloat16() * 4
    ba[0, VALUE_HEADS:] = torch.tensor([30.0, -30.0, 0.0, 19.0, -14.0, 5.0])  # softplus's three branches
    b, a = ba.split((VALUE_HEADS, VALUE_HEADS), dim=-1)  # strided views, as the layer's split gives them
    return qkv, taps, b, a


def kernels(lay: SimpleNamespace, qkv, taps, b, a):
    on = [t.to(DEVICE) for t in (qkv, taps, lay.conv, b, a, lay.dt_bias, lay.A_log)]
    out = gdn_inputs(*on, key_heads=KEY_HEADS, value_heads=VALUE_HEADS, dk=DK, dv=DV)
    return [t.cpu() for t in out]


def test_the_kernels_give_what_the_torch_form_gives():
    lay = layer()
    qkv, taps, b, a = inputs(17)
    got = kernels(lay, qkv, taps, b, a)
    want = GatedDeltaNet.recurrence_inputs(lay, qkv, taps, b, a)  # on the CPU: the torch form
    names = ("q", "k", "v", "g", "beta", "decay")
    for name, x, y in zip(names, got, want, strict=True):
        assert (x.shape, x.dtype) == (y.shape, y.dtype), name
        if DEVICE.type == "cpu" and x.dtype == torch.bfloat16:  # the interpreter's exponentials are numpy's
            assert torch.equal(x, y), name
        else:  # a bf16 place: g and the decay are fp32 of a bf16 softplus, whose rounding an exponential can tip
            torch.testing.assert_close(x.float(), y.float(), rtol=2**-7, atol=2**-7, msg=name)
    q, k = got[0], got[1]
    assert torch.equal(q[:, 0], q[:, 2]) and torch.equal(k[:, 3], k[:, 5])  # a key head's copies for its values
    linear = (torch.tensor(30.0).bfloat16() + lay.dt_bias[0]).float()  # softplus(x) = x above 20
    assert got[3][0, 0].item() == pytest.approx(-torch.exp(lay.A_log[0].float()).item() * linear.item(), rel=1e-6)
    assert -1e-10 < got[3][0, 1] < 0  # exp branch: tiny, not rounded to zero


def test_a_rows_bits_do_not_depend_on_the_other_rows():
    lay = layer(2)
    qkv, taps, b, a = inputs(20, seed=3)
    together = kernels(lay, qkv, taps, b, a)
    for start, stop in ((0, 1), (7, 12), (19, 20)):
        alone = kernels(lay, qkv, taps[start:stop], b[start:stop], a[start:stop])
        for x, y in zip(alone, together, strict=True):
            assert torch.equal(x, y[start:stop])


def test_no_rows_and_sizes_that_disagree():
    lay = layer()
    qkv, taps, b, a = inputs(5)
    empty = kernels(lay, qkv, taps[:0], b[:0], a[:0])
    assert [tuple(t.shape) for t in empty] == [(0, 6, 32), (0, 6, 32), (0, 6, 32), (0, 6), (0, 6), (0, 6)]
    with pytest.raises(ValueError, match="disagree"):
        gdn_inputs(qkv, taps, lay.conv[:-1], b, a, lay.dt_bias, lay.A_log, key_heads=2, value_heads=6, dk=32, dv=32)


def test_the_kernels_write_into_the_buffers_they_are_given():
    lay = layer()
    qkv, taps, b, a = inputs(9)
    want = kernels(lay, qkv, taps, b, a)
    made: dict[str, torch.Tensor] = {}

    def empty(name, shape, dtype):  # NaN-filled larger buffers' first rows, as the CUDA graphs' arena gives
        made[name] = torch.full((shape[0] + 3, *shape[1:]), float("nan"), dtype=dtype, device=DEVICE)
        return made[name][: shape[0]]

    on = [t.to(DEVICE) for t in (qkv, taps, lay.conv, b, a, lay.dt_bias, lay.A_log)]
    got = gdn_inputs(*on, key_heads=KEY_HEADS, value_heads=VALUE_HEADS, dk=DK, dv=DV, empty=empty)
    assert set(made) == {"mixed", "q", "k", "beta", "g", "decay"}
    for x, y in zip(got, want, strict=True):
        assert torch.equal(x.cpu(), y)
    q, k, v, g, beta, decay = got
    for name, tensor in (("q", q), ("k", k), ("g", g), ("beta", beta), ("decay", decay)):
        assert tensor.data_ptr() == made[name].data_ptr(), name
    assert v.untyped_storage().data_ptr() == made["mixed"].untyped_storage().data_ptr()  # v: the mixed rows' view
    assert made["q"][9:].isnan().all()  # nothing past the rows

    def strided(name, shape, dtype):
        return torch.empty((shape[0], 2 * shape[1], *shape[2:]), dtype=dtype, device=DEVICE)[:, : shape[1]]

    with pytest.raises(ValueError, match="mixed buffer"):
        gdn_inputs(*on, key_heads=KEY_HEADS, value_heads=VALUE_HEADS, dk=DK, dv=DV, empty=strided)


def test_silu_mul_is_the_mlps_torch_form_and_row_wise():
    from spinf.engine.elementwise import pointwise
    from spinf.engine.kernels.qwen_rows import silu_mul

    gen = torch.Generator().manual_seed(4)
    gate_up = (torch.randn(9, 2 * 300, generator=gen) * 3).bfloat16()  # 300: no whole 256-column block
    got = silu_mul(gate_up.to(DEVICE)).cpu()
    gate, up = gate_up.chunk(2, dim=-1)
    want = pointwise(torch.nn.functional.silu, gate) * up  # DecoderLayer._mlp's torch form
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
    if DEVICE.type == "cuda":  # Triton's exponential against torch's: a bf16 place at most
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=2**-7)
    else:
        assert torch.equal(got, want)
    alone = silu_mul(gate_up[5:9].to(DEVICE)).cpu()
    assert torch.equal(alone, got[5:9])
    assert silu_mul(gate_up[:0].to(DEVICE)).shape == (0, 300)


def test_gated_norm_is_the_gdn_outputs_torch_form_and_row_wise():
    from spinf.engine.elementwise import pointwise
    from spinf.engine.kernels.qwen_rows import gated_norm
    from spinf.engine.qwen35.ops import rms_norm

    gen = torch.Generator().manual_seed(5)
    n, heads, dv = 7, 20, 48  # 20 heads: two blocks, the second part empty; 48 dims: masked lanes
    o = (torch.randn(n, heads, dv, generator=gen) * 2).bfloat16()
    zx = (torch.randn(n, heads * dv + 40, generator=gen) * 3).bfloat16()
    z = zx[:, 20 : 20 + heads * dv]  # a strided view, as the input projection's split gives it
    w = (torch.randn(dv, generator=gen) + 1).bfloat16()
    got = gated_norm(o.to(DEVICE), z.to(DEVICE), w.to(DEVICE), 1e-6).cpu()
    gate = pointwise(torch.nn.functional.silu, z).reshape(n, heads, dv)
    want = (rms_norm(o, w, 1e-6, offset=0.0) * gate).reshape(n, -1)  # GatedDeltaNet.output's torch form
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
    # the norm's sum may be ordered otherwise than torch's, and Triton's exponential is not torch's: a bf16 place
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=2**-7)
    assert (got != want).float().mean() < 0.05
    alone = gated_norm(o[2:5].to(DEVICE), z[2:5].to(DEVICE), w.to(DEVICE), 1e-6).cpu()
    assert torch.equal(alone, got[2:5])
    assert gated_norm(o[:0].to(DEVICE), z[:0].to(DEVICE), w.to(DEVICE), 1e-6).shape == (0, heads * dv)
    with pytest.raises(ValueError, match="do not fit"):
        gated_norm(o.to(DEVICE), z[:, :-1].to(DEVICE), w.to(DEVICE), 1e-6)
    with pytest.raises(ValueError, match="rows of contiguous"):
        columns = zx.to(DEVICE).t().contiguous().t()[:, : heads * dv]  # columns of contiguous elements
        gated_norm(o.to(DEVICE), columns, w.to(DEVICE), 1e-6)


def test_qk_rope_and_the_gate_are_the_attentions_torch_form_and_row_wise():
    """`Attention.forward`'s q and k (RMSNorm with 1 + weight, rope on the first dims, q times the scale) and its
    output gate, read in place from the fused q/gate/k/v product as the kernels read it."""
    from spinf.engine.elementwise import pointwise
    from spinf.engine.kernels.qwen_rows import qk_rope, sigmoid_mul
    from spinf.engine.qwen35.model import apply_rope
    from spinf.engine.qwen35.ops import rms_norm

    gen = torch.Generator().manual_seed(6)
    n, heads, kv_heads, d, rotary = 5, 10, 2, 48, 16  # 10 heads: two blocks of 8, the second part empty
    qkv = (torch.randn(n, 2 * heads * d + 2 * kv_heads * d, generator=gen) * 2).bfloat16()
    qw, kw = (torch.randn(d, generator=gen) * 0.3).bfloat16(), (torch.randn(d, generator=gen) * 0.3).bfloat16()
    angles = torch.rand(n, rotary // 2, generator=gen) * 50
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    scale = d**-0.5
    qg, k, _ = qkv.split((2 * heads * d, kv_heads * d, kv_heads * d), dim=-1)
    q, gate = qg.reshape(n, heads, 2 * d).split(d, dim=-1)
    want_q = apply_rope(rms_norm(q, qw, 1e-6), cos, sin) * scale
    want_k = apply_rope(rms_norm(k.reshape(n, -1, d), kw, 1e-6), cos, sin)
    on = [t.to(DEVICE) for t in (qkv, qw, kw, cos, sin)]
    got_q = qk_rope(on[0], heads, 2 * d, d, on[1], on[3], on[4], 1e-6, scale).cpu()
    got_k = qk_rope(on[0][:, 2 * heads * d :], kv_heads, d, d, on[2], on[3], on[4], 1e-6).cpu()
    for got, want in ((got_q, want_q), (got_k, want_k)):
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=2**-7)  # the norm's sum order
        assert (got != want).float().mean() < 0.05
    assert torch.equal(
        qk_rope(on[0][1:3], heads, 2 * d, d, on[1], on[3][1:3], on[4][1:3], 1e-6, scale).cpu(), got_q[1:3]
    )
    a = (torch.randn(n, heads, d, generator=gen)).bfloat16()
    got = sigmoid_mul(a.to(DEVICE), on[0][:, d:], d, 2 * d).cpu()
    want = a.reshape(n, -1) * pointwise(torch.sigmoid, gate.reshape(n, -1))
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
    if DEVICE.type == "cuda":  # Triton's exponential against torch's: a bf16 place at most
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=2**-7)
    else:
        assert torch.equal(got, want)
    assert torch.equal(sigmoid_mul(a[2:4].to(DEVICE), on[0][2:4, d:], d, 2 * d).cpu(), got[2:4])
    with pytest.raises(ValueError, match="do not fit"):
        qk_rope(on[0], heads, 2 * d, d, on[1], on[3][:-1], on[4][:-1], 1e-6)
    with pytest.raises(ValueError, match="do not fit"):
        qk_rope(on[0], heads + 3, 2 * d, d, on[1], on[3], on[4], 1e-6)  # past the rows' end
    with pytest.raises(ValueError, match="do not hold"):
        sigmoid_mul(a.to(DEVICE), on[0][:, : heads * d], d, 2 * d)


def test_the_producers_of_block_scaled_rows_quantize_them_as_quantize_blocks_does():
    """``blocks=True``: SiLU·up and the attention gate write their rows' block-scaled int8 codes and scales (what
    down_proj and o_proj read) instead of the rows: `quantize_blocks` of the rows they write otherwise, bit for bit,
    row by row; the last block narrower where the width is no multiple of 128."""
    from spinf.engine.kernels.int4 import quantize_blocks
    from spinf.engine.kernels.qwen_rows import sigmoid_mul, silu_mul

    gen = torch.Generator().manual_seed(8)
    n = 6
    gate_up = (torch.randn(n, 2 * 300, generator=gen) * 3).bfloat16().to(DEVICE)  # three blocks, the last of 44
    gate_up[2] = 0  # a zero row: scale 1, codes 0
    wide = (torch.randn(n, 2 * 2100, generator=gen) * 3).to(DEVICE)  # fp32, and more than one program of columns
    d, att = 192, 3  # 576 columns: five blocks, the last of 64
    a = torch.randn(n, att, d, generator=gen).bfloat16().to(DEVICE)
    g = (torch.randn(n, 2 * att * d, generator=gen) * 2).bfloat16().to(DEVICE)
    cases = {
        "silu_mul": lambda rows, **kw: silu_mul(gate_up[rows], **kw),
        "silu_mul, fp32": lambda rows, **kw: silu_mul(wide[rows], **kw),
        "sigmoid_mul": lambda rows, **kw: sigmoid_mul(a[rows], g[rows, d:], d, 2 * d, **kw),
    }
    for name, make in cases.items():
        every = slice(None)
        want_q, want_s = quantize_blocks(make(every))
        q, s = make(every, blocks=True)
        assert (q.dtype, s.dtype, q.shape, s.shape) == (torch.int8, torch.float32, want_q.shape, want_s.shape), name
        assert torch.equal(q, want_q) and torch.equal(s, want_s), name
        q2, s2 = make(slice(1, 4), blocks=True)
        assert torch.equal(q2, q[1:4]) and torch.equal(s2, s[1:4]), name
        assert make(slice(0, 0), blocks=True)[0].shape == (0, q.shape[1]), name
    assert torch.equal(silu_mul(gate_up, blocks=True)[1][2].cpu(), torch.ones(3))
