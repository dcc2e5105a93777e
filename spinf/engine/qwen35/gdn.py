"""The Qwen3.5 stack's Gated DeltaNet layers (engine spec B.14): the gated delta rule along each segment of a pass
(`delta_rule`), and the layer itself over a pass or a decode step (`GatedDeltaNet`).

``in_proj`` gives q/k/v (through a 4-tap causal depthwise convolution and SiLU), z (the output gate), b
(``beta = sigmoid(b)``) and a (the decay ``g = -exp(A_log) · softplus(a + dt_bias)``). Per value head, with q and k
L2-normed and q scaled by ``dk^-1/2``, the gated delta rule walks the tokens:
``S ← exp(g) S;  S ← S + k ⊗ beta (v − kᵀS);  o = qᵀS``; the output is ``rmsnorm(o) · w · silu(z)``. The recurrence
runs token by token on fixed ``[heads, dk, dv]`` shapes, so a path's numbers never depend on where its trie forks or
what else shares the pass (C.1); on a GPU in the Triton kernel by segment index (`spinf.engine.kernels.gdn`). A
decode step (extraction, `GatedDeltaNet.decode`) replays each row's recurrence from its prefix's state.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from spinf.engine.attention import DecodeKV
from spinf.engine.elementwise import pointwise
from spinf.engine.qwen35.chunked import run_chunked
from spinf.engine.qwen35.config import Qwen35Config
from spinf.engine.qwen35.ops import MakeLinear, float_linears, l2_norm, linear_plus, norm_linear, rms_norm
from spinf.engine.qwen35.plan import Qwen35Plan


def delta_step(
    state: torch.Tensor, q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, decay_t: torch.Tensor, beta_t
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the gated delta rule on one fp32 state [Hv, dk, dv]: the new state and the token's output
    [Hv, dv]. The scoring pass and the decoder both step with this, so a decoded token has the bits of a branch."""
    state = delta_update(state, k_t, v_t, decay_t, beta_t)
    return state, torch.bmm(q_t.to(state.dtype).unsqueeze(1), state).squeeze(1)


def delta_update(
    state: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, decay_t: torch.Tensor, beta_t: torch.Tensor
) -> torch.Tensor:
    """`delta_step`'s new state alone (a decode step replays a path's earlier tokens with it)."""
    heads, dtype = state.shape[0], state.dtype  # the state is fp32; bf16 activations join it in fp32
    k_t, v_t, decay_t, beta_t = (t.to(dtype) for t in (k_t, v_t, decay_t, beta_t))
    k_t = k_t.unsqueeze(1)  # [Hv, 1, dk]
    state = state * decay_t.view(heads, 1, 1)
    delta = (v_t - torch.bmm(k_t, state).squeeze(1)) * beta_t.view(heads, 1)  # [Hv, dv]
    return state + torch.bmm(k_t.transpose(1, 2), delta.unsqueeze(1))


def delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    plan: Qwen35Plan,
    states_at: dict[int, torch.Tensor | None] | None = None,
    decay: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The gated delta rule along each segment. q, k [N, Hv, dk]; v [N, Hv, dv]; g (log decay), beta [N, Hv]
    -> [N, Hv, dv]; ``decay`` is ``exp(g)`` when the caller has it. The plan's chunked segments (each a job's fixed
    prefix) run first in 64-token chunks (`spinf.engine.qwen35.chunked`), the others token by token; each step
    has the same shapes whatever the pass, and a segment starts from exactly the fp32 state its predecessor's
    segment ended with, so a token's output depends on its path alone. On a GPU the token-by-token part is the
    Triton kernel by segment index (`spinf.engine.kernels.gdn`) over the plan's ``recurrent`` table.
    ``states_at``: stream rows whose state after the row is wanted (filled in; the extraction slots' prefixes; on
    a GPU they must be the plan's ``captured_rows``). ``out``: the buffer [N, Hv, dv] the outputs go to (a CUDA
    graph's, `spinf.engine.qwen35.graphs`); only the rows of the plan's segments are written."""
    _, heads, dk = k.shape
    decay = pointwise(torch.exp, g) if decay is None else decay
    out = torch.empty_like(v) if out is None else out
    finals = run_chunked(plan.chunked_calls, q, k, v, g, beta, out) if plan.chunked_calls else {}
    if q.is_cuda:
        from spinf.engine.kernels.gdn import recurrent_delta_rule

        if plan.recurrent is None:
            raise ValueError("the delta rule on a GPU needs a plan made for the GPU (pass_plan with its device)")
        captured = None
        if states_at:
            if not set(states_at) <= set(plan.captured_rows):
                raise ValueError("the GPU recurrence keeps the state only after the plan's captured rows")
            captured = v.new_empty((len(plan.captured_rows), heads, dk, v.shape[-1]), dtype=torch.float32)
        seeds = [(slot, place, finals[s]) for s, slot, place in plan.chunked_seeds]
        recurrent_delta_rule(
            q, k, v, decay, beta, plan.recurrent, plan.levels, plan.num_slots, captured=captured, out=out,
            seeds=seeds,
        )  # fmt: skip
        for place, row in enumerate(plan.captured_rows if states_at else ()):
            if row in states_at:
                states_at[row] = captured[place]
        return out
    dv = v.shape[-1]
    kept: dict[int, torch.Tensor] = {}
    for index, (first, end, source) in enumerate(plan.segments):
        if index in finals:
            state = finals[index]
            if states_at is not None and end - 1 in states_at:
                states_at[end - 1] = state
        else:
            state = kept[source] if source >= 0 else v.new_zeros((heads, dk, dv), dtype=torch.float32)
            for t in range(first, end):
                state, out[t] = delta_step(state, q[t], k[t], v[t], decay[t], beta[t])
                if states_at is not None and t in states_at:
                    states_at[t] = state
        if index in plan.kept:
            kept[index] = state
    return out


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: Qwen35Config, take: Callable[[str], torch.Tensor], linear: MakeLinear, prefix: str):
        super().__init__()
        self.cfg = cfg
        self.sizes = (cfg.conv_dim, cfg.value_dim)  # qkv, z in the fused input projection
        self.w_in = linear([prefix + "in_proj_qkv", prefix + "in_proj_z"])
        self.w_ba = float_linears(take)([prefix + "in_proj_b", prefix + "in_proj_a"])  # never int4 (B.14.3)
        self.conv = nn.Parameter(take(prefix + "conv1d.weight").squeeze(1), requires_grad=False)
        self.dt_bias = nn.Parameter(take(prefix + "dt_bias"), requires_grad=False)
        self.A_log = nn.Parameter(take(prefix + "A_log"), requires_grad=False)
        self.norm = nn.Parameter(take(prefix + "norm.weight"), requires_grad=False)
        self.w_out = linear([prefix + "out_proj"])

    def project(
        self, h: torch.Tensor, norm: torch.Tensor, empty=None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The input projections of the residual rows ``h`` normed by the layer's input norm ``norm``
        (`norm_linear`): q/k/v before the convolution, z, b, a; q/k/v and z as views of one product, written into
        ``empty("projected", shape, dtype)`` when given (the CUDA graphs' buffer, so z needs no copy there)."""
        heads = self.cfg.linear_num_value_heads
        out = None if empty is None else empty("projected", (h.shape[0], sum(self.sizes)), h.dtype)
        y, x = norm_linear(self.w_in, h, norm, self.cfg.rms_norm_eps, want_x=True, out=out)
        qkv, z = y.split(self.sizes, dim=-1)
        b, a = self.w_ba(x).split((heads, heads), dim=-1)
        return qkv, z, b, a

    def recurrence_inputs(
        self, rows: torch.Tensor, taps: torch.Tensor, b: torch.Tensor, a: torch.Tensor, empty=None
    ) -> tuple[torch.Tensor, ...]:
        """q, k [n, Hv, dk], v [n, Hv, dv], g (the log decay), beta and the decay ``exp(g)`` [n, Hv] of the rows whose
        convolution reads ``taps`` [n, kernel] (oldest first) from ``rows`` (pre-convolution q/k/v rows; tap ``t``
        reads row ``t - 1``, tap 0 a zero row: the missing predecessor). On a GPU three row-wise kernels
        (`spinf.engine.kernels.qwen_rows`), writing into ``empty``'s tensors when given (`gdn_inputs`); else torch
        ops over the rows with a zero row in front, whose results are new tensors whatever ``empty`` is."""
        cfg, n = self.cfg, taps.shape[0]
        heads, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        if rows.is_cuda:
            from spinf.engine.kernels.qwen_rows import gdn_inputs

            return gdn_inputs(
                rows, taps, self.conv, b, a, self.dt_bias, self.A_log,
                key_heads=cfg.linear_num_key_heads, value_heads=heads, dk=dk, dv=dv, empty=empty,
            )  # fmt: skip
        stream = torch.cat([rows.new_zeros((1, rows.shape[1])), rows])
        mixed = stream[taps[:, 0]] * self.conv[:, 0]
        for tap in range(1, self.conv.shape[1]):
            mixed = mixed + stream[taps[:, tap]] * self.conv[:, tap]
        q, k, v = pointwise(F.silu, mixed).split((cfg.key_dim, cfg.key_dim, cfg.value_dim), dim=-1)
        repeat = heads // cfg.linear_num_key_heads  # each q/k head serves this many consecutive value heads
        q = l2_norm(q.reshape(n, -1, dk)).repeat_interleave(repeat, dim=1) * dk**-0.5
        k = l2_norm(k.reshape(n, -1, dk)).repeat_interleave(repeat, dim=1)
        beta = pointwise(torch.sigmoid, b)
        g = -torch.exp(self.A_log.float()) * pointwise(F.softplus, a + self.dt_bias)
        return q, k, v.reshape(n, heads, dv), g, beta, pointwise(torch.exp, g)

    def output(self, o: torch.Tensor, z: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual`` plus the gated norm and out_proj of the recurrence's outputs ``o`` (the sum in the product's
        kernel where the linear can: `linear_plus`). On a GPU the gated norm is one row-wise kernel
        (`spinf.engine.kernels.qwen_rows.gated_norm`)."""
        cfg, n = self.cfg, o.shape[0]
        if o.is_cuda and o.dtype in (torch.bfloat16, torch.float32) and z.dtype == o.dtype:
            from spinf.engine.kernels.qwen_rows import gated_norm

            return linear_plus(self.w_out, gated_norm(o, z, self.norm, cfg.rms_norm_eps), residual)
        gate = pointwise(F.silu, z).reshape(n, cfg.linear_num_value_heads, cfg.linear_value_head_dim)
        o = rms_norm(o, self.norm, cfg.rms_norm_eps, offset=0.0) * gate
        return linear_plus(self.w_out, o.reshape(n, -1), residual)

    def inputs(
        self, h: torch.Tensor, norm: torch.Tensor, plan: Qwen35Plan, empty=None
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        """Everything of a pass's layer before the recurrence, row by row, from the residual rows ``h`` and the
        input norm: the pre-convolution q/k/v rows, z, and the recurrence's inputs (q, k, v, g, beta, decay:
        `recurrence_inputs`, into ``empty``'s tensors on a GPU when given). A CUDA graph holds this part
        (`spinf.engine.qwen35.graphs`); the recurrence, which the pass's segments shape, runs eagerly."""
        qkv, z, b, a = self.project(h, norm, empty)
        return qkv, z, self.recurrence_inputs(qkv, plan.taps, b, a, empty)

    def forward(self, h: torch.Tensor, norm: torch.Tensor, plan: Qwen35Plan) -> torch.Tensor:
        """``h`` plus the layer's mixer over its rows normed by the input norm ``norm`` (`output` adds it)."""
        if plan.attention.decode is not None:
            return self.decode(h, norm, plan.attention.decode)
        qkv, z, (q, k, v, g, beta, decay) = self.inputs(h, norm, plan)
        capture = plan.attention.capture
        states_at = None if capture is None else {row: None for _, row in capture.prefixes if row >= 0}
        o = delta_rule(q, k, v, g, beta, plan, states_at, decay)
        if capture is not None:  # what the decoder steps on from (`decode`): rows, and the prefixes' states
            capture.keep_recurrent(qkv, _recurrent_rows(k, v, decay, beta))
            zero = v.new_zeros((v.shape[1], k.shape[2], v.shape[2]), dtype=torch.float32)
            capture.states.append(torch.stack([states_at[row] if row >= 0 else zero for _, row in capture.prefixes]))
        return self.output(o, z, h)

    def decode(self, h: torch.Tensor, norm: torch.Tensor, kv: DecodeKV) -> torch.Tensor:
        """A decode step's rows (engine spec B.14.4): each row's convolution reads its path's last rows (the
        template's, those generated so far, then the prefix's tail), and its recurrence runs again from its group's
        prefix state over its path, token by token (`delta_step`; on a GPU the kernel's decode step), so the row
        gets the bits it would get as a branch of its input's trie. The layer's buffers (``kv.keys`` /
        ``kv.values`` at its index) hold each row's pre-convolution q/k/v and its recurrence inputs
        (`_recurrent_rows`). Nothing here reads the device from the host on a GPU (a CUDA graph can hold it)."""
        kernel = self.conv.shape[1]
        rows_in, rows_out = kv.keys[self.index], kv.values[self.index]
        qkv, z, b, a = self.project(h, norm)
        group_of, write, path_index, taps = _recurrent_view(kv, kernel)
        rows_in.index_copy_(0, write, qkv.to(rows_in.dtype))
        n = h.shape[0]
        read = rows_in.index_select(0, taps.clamp(min=0).reshape(-1))
        read = torch.where((taps >= 0).reshape(-1, 1), read, torch.zeros((), dtype=read.dtype, device=read.device))
        local = torch.arange(1, n * kernel + 1, device=h.device).view(n, kernel)  # tap t reads row t - 1
        q, k, v, g, beta, decay = self.recurrence_inputs(read, local, b, a)
        rows_out.index_copy_(0, write, _recurrent_rows(k, v, decay, beta))
        states = kv.states[self.index]
        if h.is_cuda:
            from spinf.engine.kernels.gdn import decode_delta_rule

            out = decode_delta_rule(q, k, v, decay, beta, states, group_of, rows_out, path_index, kv.path_len)
            return self.output(out, z, h)
        cfg = self.cfg
        heads, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        key_end, value_end = heads * dk, heads * dk + heads * dv
        out = torch.empty_like(v)
        for r in range(n):
            state = states[int(group_of[r])]
            for p in path_index[r, : int(kv.path_len[r]) - 1].tolist():  # the path before the row
                row = rows_out[p]
                k_p, v_p = row[:key_end].view(heads, dk), row[key_end:value_end].view(heads, dv)
                decay_p, beta_p = row[value_end : value_end + heads], row[value_end + heads :]
                state = delta_update(state, k_p, v_p, decay_p, beta_p)
            _, out[r] = delta_step(state, q[r], k[r], v[r], decay[r], beta[r])
        return self.output(out, z, h)


def _recurrent_view(kv: DecodeKV, kernel: int) -> tuple[torch.Tensor, ...]:
    """A decode step's rows as every recurrent layer reads them, derived once per step: each row's group, the
    buffer rows it writes and its path (in the layers' own rows when their buffers are compact, ``kv.compact``), and
    its convolution's ``kernel`` taps (oldest first; -1: none, a zero row). Tap j of a row of path length L is its
    path's entry L - kernel + j, or before the path the prefix's row at that distance from its end."""
    view = kv.derived.get("recurrent")
    if view is None:
        group_of, starts, prefix_lens = kv.row_groups  # contiguous rows: the kernel reads ``group_of`` by row
        back = kv.path_len[:, None] - kernel + torch.arange(kernel, device=kv.path_len.device)[None, :]
        from_path = kv.path_index.gather(1, back.clamp(min=0))
        in_prefix = prefix_lens[:, None] + back >= 0
        from_prefix = torch.where(in_prefix, starts[:, None] + prefix_lens[:, None] + back, -1)
        taps = torch.where(back >= 0, from_path, from_prefix)
        write, path_index = kv.write, kv.path_index
        if kv.compact is not None:  # the layers' buffers hold their rows alone: buffer rows to theirs
            write, path_index = kv.compact[write], kv.compact[path_index]
            taps = torch.where(taps >= 0, kv.compact[taps.clamp(min=0)], -1)
        view = kv.derived["recurrent"] = (group_of, write, path_index, taps)
    return view


def _recurrent_rows(k: torch.Tensor, v: torch.Tensor, decay: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """Each row's recurrence inputs side by side, [n, Hv·dk + Hv·dv + 2·Hv]: what a later token's recurrence
    replays (`GatedDeltaNet.decode`)."""
    n = k.shape[0]
    return torch.cat([k.reshape(n, -1), v.reshape(n, -1), decay, beta], dim=1)
