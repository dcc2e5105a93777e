"""The Qwen3.5 text decoder over one packed pass of jobs with tries, in plain torch (CPU, fp32; engine spec B.14).

Every layer is a token mixer and a SiLU MLP, each behind an RMSNorm that multiplies by ``(1 + w)``. The mixer is a
**full-attention layer** (every 4th in the published models) or a **Gated DeltaNet** (GDN):

* Full attention: q (with a per-head output gate beside it in ``q_proj``), k, v; q/k RMSNorm per head; rope on the
  first ``rotary_dim`` dims of each head, each pair turning with the t, h or w position as its 3-D section says
  (`rope_axes`; text has t = h = w, so the sections reduce to plain rope); tree
  attention over the pass (`spinf.engine.attention.tree_attention`), then ``· sigmoid(gate)``.
* GDN: ``in_proj`` gives q/k/v (through a 4-tap causal depthwise convolution and SiLU), z (the output gate), b
  (``beta = sigmoid(b)``) and a (the decay ``g = -exp(A_log) · softplus(a + dt_bias)``). Per value head, with q and k
  L2-normed and q scaled by ``dk^-1/2``, the gated delta rule walks the tokens:
  ``S ← exp(g) S;  S ← S + k ⊗ beta (v − kᵀS);  o = qᵀS``; the output is ``rmsnorm(o) · w · silu(z)``.

On a packed tree the GDN cannot be masked: a branch starts from its parent's final state (B.14.2). `pass_plan` cuts
the stream into segments (a new one where a token's path predecessor is not the previous row, where the predecessor
has several children, or where there is none); each segment starts from the kept final state of the segment that
ends at its predecessor, and the convolution reads each token's path predecessors through an index table with a
zero row. The recurrence runs token by token on fixed ``[heads, dk, dv]`` shapes, so a path's numbers never depend
on where its trie forks or what else shares the pass (C.1); the products run in fixed 128-row blocks
(`row_stable_mm`) and elementwise transcendental functions on widths padded to whole vector blocks (`_pointwise`).

On a GPU the recurrence runs in the Triton kernel by segment index (`spinf.engine.kernels.gdn`, token by token in
every segment) and the full-attention layers in the Gemma stack's tree-attention kernel. Linears are made by a
factory (`MakeLinear`): float (`Dense`) or int4 (`spinf.engine.qwen35.int4`). The LM head runs in ``head_mode``
(`spinf.engine.head`, engine spec B.7: the final norm in fp32 always, then the product's operands and logits as the
mode rounds them); the decider's readout replaces it. ``layers`` keeps the first that many decoder layers. A decode
step (extraction, `GatedDeltaNet.decode`) replays each row's recurrence from its prefix's state (on a GPU in the
kernel's decode step, from the state the scoring pass's kernel wrote at the prefix's end); of a prefix a recurrent
layer captures only that state and its last ``kernel - 1`` rows (`CaptureCost`). Not yet here: a chunked kernel for
long segments.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from spinf.engine.attention import AttentionPlan, DecodeKV, attention_plan, decode_attention, tree_attention
from spinf.engine.folder import read_tensors
from spinf.engine.gemm import stable_mm
from spinf.engine.head import DEFAULT_HEAD, HEAD_ROWS, check_mode, head_logits, head_precision, head_weight
from spinf.engine.layout import PassLayout
from spinf.engine.qwen35.chunked import cut_rows, fixed_segments, plan_calls, run_chunked
from spinf.engine.qwen35.config import FULL, Qwen35Config, read_qwen35_config
from spinf.errors import ModelError

# Elementwise exp/sigmoid/softplus/cos run vectorised in blocks and finish a tensor's last elements with scalar code
# that can differ in the last bit: computed on widths padded to this many columns, no row ever reaches the tail.
VECTOR_BLOCK = 64
# A pass's MLPs run in row chunks of this many: their [rows, 2 · inner] intermediate is the pass's largest tensor
# (1.1 GB at the 27B for 16,384 rows), and every row of them is its own (row-wise norms and quantizers, products in
# fixed row blocks that divide this, or whose tile changes no bit), so a chunk changes no bit, only the peak memory.
MLP_ROWS = 4096


def _pointwise(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``fn(x)`` for an elementwise ``fn`` on a 2-D ``x``, computed with the columns padded to `VECTOR_BLOCK`."""
    width = x.shape[-1]
    pad = -width % VECTOR_BLOCK
    return fn(F.pad(x, (0, pad)) if pad else x.contiguous())[..., :width]


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, *, offset: float = 1.0) -> torch.Tensor:
    """RMSNorm over the last dim in fp32, times ``offset + weight`` (Qwen3.5's norms: 1; the GDN's gated norm: 0).

    A square root and a division (correctly rounded in every code path) rather than ``rsqrt``, as in
    `spinf.engine.gemma4.model.rms_norm`. On a GPU one row per program (`spinf.engine.kernels.rows.qwen_norm`): torch's
    reductions there split a row by how many rows there are."""
    if x.is_cuda:
        from spinf.engine.kernels.rows import qwen_norm

        return qwen_norm(x, weight, eps, offset=offset)
    xf = x.float()
    out = xf * (1.0 / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps))
    if weight is not None:
        out = out * (offset + weight.float())
    return out.type_as(x)


def l2_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / ‖x‖`` over the last dim in x's dtype; on a GPU row by row, as `rms_norm`."""
    if x.is_cuda:
        from spinf.engine.kernels.rows import qwen_norm

        return qwen_norm(x, None, eps, l2=True)
    return x * (1.0 / torch.sqrt((x * x).sum(-1, keepdim=True) + eps))


@attrs.frozen
class Qwen35Plan:
    """What the layers need about a pass, beside the tree-attention plan.

    ``taps[r]`` lists the rows the convolution reads for row ``r``, oldest first and ``r`` itself last, as indices
    into the stream with one zero row in front (0: no such predecessor). ``segments`` are ``(first row, end row,
    source)`` in stream order, ``source`` the segment whose final state the segment starts from (-1: zero state);
    ``kept`` the segments some other segment starts from.

    On a GPU the plan also holds the kernel's view of the same segments (`spinf.engine.kernels.gdn.segment_table`):
    ``recurrent`` one row per segment, sorted by level, ``levels`` each level's first row (and the end), and
    ``num_slots`` the kept-states slots its rows refer to."""

    attention: AttentionPlan
    taps: torch.Tensor  # [num_tokens, kernel] int64
    segments: tuple[tuple[int, int, int], ...]
    kept: frozenset[int]
    # per row its (t, h, w) rotary positions (engine spec A.14.3: an image's tokens share t and add their row and
    # column); None: text only, t = h = w = the row's position
    positions3: torch.Tensor | None = None  # [num_tokens, 3] int64
    recurrent: torch.Tensor | None = None  # [num_segments, TABLE_COLUMNS] int32 on the GPU; None on the CPU
    levels: tuple[int, ...] = ()
    num_slots: int = 0
    # stream rows whose state after them the pass keeps (its capture's prefixes, each the end of a segment), in the
    # capture's order: the GPU kernel writes them to a buffer in this order
    captured_rows: tuple[int, ...] = ()
    # the segments that are a job's whole fixed prefix, run chunked (`spinf.engine.qwen35.chunked`), and its calls
    chunked: frozenset[int] = frozenset()
    chunked_calls: tuple = ()
    # on a GPU, per chunked segment (its index, its slot, its place among the captured states; -1: none): where the
    # token-by-token kernel finds its final state
    chunked_seeds: tuple[tuple[int, int, int], ...] = ()


def predecessors(layout: PassLayout) -> np.ndarray:
    """Per stream row, its path predecessor (the previous token of its own path), -1 for none."""
    pred = np.arange(-1, layout.num_tokens - 1, dtype=np.int64)
    branch_parent = dict(zip(layout.branch_rows, layout.parents, strict=True))
    for start, prefix_len, num_branch in layout.spans:
        pred[start] = -1
        base = start + prefix_len
        for row in range(base, base + num_branch):
            parent = branch_parent[row]
            pred[row] = parent if parent >= 0 else (base - 1 if prefix_len else -1)
    return pred


def segments(
    pred: np.ndarray, cut_after: frozenset[int] = frozenset()
) -> tuple[tuple[tuple[int, int, int], ...], frozenset[int]]:
    """The recurrence's segments of a stream with path predecessors ``pred`` (see `Qwen35Plan`); each row of
    ``cut_after`` ends a segment (a cut changes no bits: the next segment starts from the exact state)."""
    children = np.bincount(pred[pred >= 0], minlength=len(pred))
    out: list[list[int]] = []
    segment_of = np.full(len(pred), -1, dtype=np.int64)
    for row, p in enumerate(pred.tolist()):
        if p < 0 or p != row - 1 or children[p] > 1 or p in cut_after:
            source = int(segment_of[p]) if p >= 0 else -1
            if source >= 0 and out[source][1] != p + 1:
                raise ValueError(f"row {row}: its predecessor {p} does not end a segment (not a pre-order layout)")
            out.append([row, row + 1, source])
        else:
            out[-1][1] = row + 1
        segment_of[row] = len(out) - 1
    kept = frozenset(s for _, _, s in out if s >= 0)
    return tuple((a, b, s) for a, b, s in out), kept


def _job_of(layout: PassLayout, row: int) -> int:
    for j, (start, prefix_len, num_branch) in enumerate(layout.spans):
        if start <= row < start + prefix_len + num_branch:
            return j
    raise ValueError(f"row {row} is in no job of the pass")


def mrope_positions(layout: PassLayout) -> torch.Tensor | None:
    """Each row's (t, h, w) rotary positions [num_tokens, 3] (A.14.3), None for a pass without images: an image's
    tokens share its first position on t and add their row and column on h and w, and every later token of its job
    (the prefix's and every branch's) moves back by the image's `rope_shift`."""
    items = [(row, item) for row, item in layout.media if hasattr(item, "grid")]  # the Qwen tower's items
    if not items:
        return None
    base = np.asarray(layout.positions, dtype=np.int64)
    shift = np.zeros(len(base), dtype=np.int64)
    out = np.repeat(base[:, None], 3, axis=1)
    text = np.ones(len(base), dtype=bool)
    for row, item in sorted(items, key=lambda pair: pair[0]):
        start, prefix_len, num_branch = layout.spans[_job_of(layout, row)]
        first = base[row] - shift[row]
        r, c = np.divmod(np.arange(item.num_tokens), item.cols)
        out[row : row + item.num_tokens] = np.stack([np.full_like(r, first), first + r, first + c], axis=1)
        text[row : row + item.num_tokens] = False
        shift[row + item.num_tokens : start + prefix_len + num_branch] += item.rope_shift  # the job's later rows
    out[text] = (base - shift)[text][:, None]
    return torch.from_numpy(out)


def pass_plan(
    layout: PassLayout,
    kernel: int,
    device: torch.device | None = None,
    attention_shape: tuple[int, int] | None = None,
    attention: AttentionPlan | None = None,
) -> Qwen35Plan:
    """The plan of a pass for a model whose convolution has ``kernel`` taps, with its tensors on ``device`` (None:
    the CPU). On a GPU, ``attention_shape`` (head dim, query heads per KV head) of the full-attention layers gives
    the plan the Triton tree-attention kernel's tables (`Attention.kernel_config`); None: torch tree attention."""
    device = device or torch.device("cpu")
    pred = predecessors(layout)
    taps = [np.arange(1, layout.num_tokens + 1, dtype=np.int64)]  # +1: row 0 of the padded stream is zeros
    back = pred
    for _ in range(kernel - 1):
        taps.append(back + 1)
        back = np.where(back >= 0, pred[np.maximum(back, 0)], -1)
    given = attention is not None  # the scorer's plan (its kernel tables, capture and media): kept as it is
    attention = attention if given else attention_plan(layout, device)
    capture = attention.capture
    captured_rows = () if capture is None else tuple(row for _, row in capture.prefixes if row >= 0)
    chunk = chunked_on(device)
    segs, kept = segments(pred, frozenset(captured_rows) | (cut_rows(layout) if chunk else frozenset()))
    chunked = fixed_segments(layout, segs) if chunk else frozenset()
    calls = plan_calls(segs, chunked, device)
    taps_rows = np.stack(taps[::-1], axis=1).copy()
    positions3 = mrope_positions(layout)
    positions3 = None if positions3 is None else positions3.to(device)
    if device.type != "cuda":
        taps_on = torch.from_numpy(taps_rows).to(device)
        return Qwen35Plan(
            attention=attention,
            taps=taps_on,
            segments=segs,
            kept=kept,
            positions3=positions3,
            captured_rows=captured_rows,
            chunked=chunked,
            chunked_calls=calls,
        )
    from spinf.engine.kernels import kernel_plan, tile_rows, to_device
    from spinf.engine.kernels.gdn import segment_table

    if attention_shape is not None and not given:
        rows = tile_rows(*attention_shape, Attention.kernel_config(*attention_shape))
        attention = attrs.evolve(attention, kernel=kernel_plan(layout, device, {rows}))
    table, levels, num_slots = segment_table(segs, kept, captured_rows, chunked)
    seeds = tuple(
        (s, int(slot), int(place))
        for s, (slot, place) in zip(sorted(chunked), table[: len(chunked), [3, 5]], strict=True)
    )
    return Qwen35Plan(
        attention=attention,
        taps=to_device(taps_rows, device),
        segments=segs,
        kept=kept,
        recurrent=to_device(table, device),
        levels=levels,
        num_slots=num_slots,
        positions3=positions3,
        captured_rows=captured_rows,
        chunked=chunked,
        chunked_calls=calls,
        chunked_seeds=seeds,
    )


def chunked_on(device: torch.device) -> bool:
    """Whether passes on ``device`` run the fixed prefixes chunked: on the CPU always (the fp32 reference), on a
    GPU when fla's kernels load pinned (`spinf.engine.kernels.chunked`, which logs why once when they do not)."""
    if device.type != "cuda":
        return True
    from spinf.engine.kernels.chunked import chunked_kernel

    return chunked_kernel()[0] is not None


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
) -> torch.Tensor:
    """The gated delta rule along each segment. q, k [N, Hv, dk]; v [N, Hv, dv]; g (log decay), beta [N, Hv]
    -> [N, Hv, dv]; ``decay`` is ``exp(g)`` when the caller has it. The plan's chunked segments (each a job's fixed
    prefix) run first in 64-token chunks (`spinf.engine.qwen35.chunked`), the others token by token; each step
    has the same shapes whatever the pass, and a segment starts from exactly the fp32 state its predecessor's
    segment ended with, so a token's output depends on its path alone. On a GPU the token-by-token part is the
    Triton kernel by segment index (`spinf.engine.kernels.gdn`) over the plan's ``recurrent`` table.
    ``states_at``: stream rows whose state after the row is wanted (filled in; the extraction slots' prefixes; on
    a GPU they must be the plan's ``captured_rows``)."""
    _, heads, dk = k.shape
    decay = _pointwise(torch.exp, g) if decay is None else decay
    out = torch.empty_like(v)
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


class Dense(nn.Module):
    """A float linear without bias: ``x · Wᵀ`` in fixed row blocks (`row_stable_mm`). The int4 checkpoints' linears
    (`spinf.engine.qwen35.int4`) take the same place with the same call."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return stable_mm(x, self.weight.to(x.dtype))


# Makes one linear from the checkpoint's tensors: the full weight names without ``.weight`` (several: fused along
# the output, in that order); float (`float_linears`) or int4 (`spinf.engine.qwen35.int4`).
MakeLinear = Callable[[list[str]], nn.Module]


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

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The input projections of rows ``x``: q/k/v before the convolution, z, b, a."""
        heads = self.cfg.linear_num_value_heads
        qkv, z = self.w_in(x).split(self.sizes, dim=-1)
        b, a = self.w_ba(x).split((heads, heads), dim=-1)
        return qkv, z, b, a

    def recurrence_inputs(self, stream: torch.Tensor, taps: torch.Tensor, b: torch.Tensor, a: torch.Tensor):
        """q, k [n, Hv, dk], v [n, Hv, dv], g (the log decay) and beta [n, Hv] of the rows whose convolution reads
        ``taps`` [n, kernel] (oldest first) from ``stream`` (pre-convolution q/k/v rows, a zero row first)."""
        cfg, n = self.cfg, taps.shape[0]
        heads, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        mixed = stream[taps[:, 0]] * self.conv[:, 0]
        for tap in range(1, self.conv.shape[1]):
            mixed = mixed + stream[taps[:, tap]] * self.conv[:, tap]
        q, k, v = _pointwise(F.silu, mixed).split((cfg.key_dim, cfg.key_dim, cfg.value_dim), dim=-1)
        repeat = heads // cfg.linear_num_key_heads  # each q/k head serves this many consecutive value heads
        q = l2_norm(q.reshape(n, -1, dk)).repeat_interleave(repeat, dim=1) * dk**-0.5
        k = l2_norm(k.reshape(n, -1, dk)).repeat_interleave(repeat, dim=1)
        beta = _pointwise(torch.sigmoid, b)
        g = -torch.exp(self.A_log.float()) * _pointwise(F.softplus, a + self.dt_bias)
        return q, k, v.reshape(n, heads, dv), g, beta

    def output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        cfg, n = self.cfg, o.shape[0]
        gate = _pointwise(F.silu, z).reshape(n, cfg.linear_num_value_heads, cfg.linear_value_head_dim)
        o = rms_norm(o, self.norm, cfg.rms_norm_eps, offset=0.0) * gate
        return self.w_out(o.reshape(n, -1))

    def forward(self, x: torch.Tensor, plan: Qwen35Plan) -> torch.Tensor:
        if plan.attention.decode is not None:
            return self.decode(x, plan.attention.decode)
        qkv, z, b, a = self.project(x)
        stream = torch.cat([qkv.new_zeros((1, qkv.shape[1])), qkv])  # row 0: the missing predecessor
        q, k, v, g, beta = self.recurrence_inputs(stream, plan.taps, b, a)
        decay = _pointwise(torch.exp, g)
        capture = plan.attention.capture
        states_at = None if capture is None else {row: None for _, row in capture.prefixes if row >= 0}
        o = delta_rule(q, k, v, g, beta, plan, states_at, decay)
        if capture is not None:  # what the decoder steps on from (`decode`): rows, and the prefixes' states
            capture.keep_recurrent(qkv, _recurrent_rows(k, v, decay, beta))
            zero = v.new_zeros((v.shape[1], k.shape[2], v.shape[2]), dtype=torch.float32)
            capture.states.append(torch.stack([states_at[row] if row >= 0 else zero for _, row in capture.prefixes]))
        return self.output(o, z)

    def decode(self, x: torch.Tensor, kv: DecodeKV) -> torch.Tensor:
        """A decode step's rows (engine spec B.14.4): each row's convolution reads its path's last rows (the
        template's, those generated so far, then the prefix's tail), and its recurrence runs again from its group's
        prefix state over its path, token by token (`delta_step`; on a GPU the kernel's decode step), so the row
        gets the bits it would get as a branch of its input's trie. The layer's buffers (``kv.keys`` /
        ``kv.values`` at its index) hold each row's pre-convolution q/k/v and its recurrence inputs
        (`_recurrent_rows`). Nothing here reads the device from the host on a GPU (a CUDA graph can hold it)."""
        kernel = self.conv.shape[1]
        rows_in, rows_out = kv.keys[self.index], kv.values[self.index]
        qkv, z, b, a = self.project(x)
        group_of, write, path_index, taps = _recurrent_view(kv, kernel)
        rows_in.index_copy_(0, write, qkv.to(rows_in.dtype))
        n = x.shape[0]
        read = rows_in.index_select(0, taps.clamp(min=0).reshape(-1))
        read = torch.where((taps >= 0).reshape(-1, 1), read, torch.zeros((), dtype=read.dtype, device=read.device))
        stream = torch.cat([read.new_zeros((1, read.shape[1])), read])  # row 0: the missing predecessor
        local = torch.arange(1, n * kernel + 1, device=x.device).view(n, kernel)
        q, k, v, g, beta = self.recurrence_inputs(stream, local, b, a)
        decay = _pointwise(torch.exp, g)
        rows_out.index_copy_(0, write, _recurrent_rows(k, v, decay, beta))
        states = kv.states[self.index]
        if x.is_cuda:
            from spinf.engine.kernels.gdn import decode_delta_rule

            out = decode_delta_rule(q, k, v, decay, beta, states, group_of, rows_out, path_index, kv.path_len)
            return self.output(out, z)
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
        return self.output(out, z)


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


class Attention(nn.Module):
    def __init__(self, cfg: Qwen35Config, take: Callable[[str], torch.Tensor], linear: MakeLinear, prefix: str):
        super().__init__()
        self.cfg = cfg
        q_out, kv_out = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.sizes = (2 * q_out, kv_out, kv_out)  # q with its gate (per head: query, then gate), k, v
        self.wqkv = linear([prefix + "q_proj", prefix + "k_proj", prefix + "v_proj"])
        self.q_norm = nn.Parameter(take(prefix + "q_norm.weight"), requires_grad=False)
        self.k_norm = nn.Parameter(take(prefix + "k_norm.weight"), requires_grad=False)
        self.wo = linear([prefix + "o_proj"])

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], plan: Qwen35Plan) -> torch.Tensor:
        cfg, n, d = self.cfg, x.shape[0], self.cfg.head_dim
        qg, k, v = self.wqkv(x).split(self.sizes, dim=-1)
        q, gate = qg.reshape(n, cfg.num_heads, 2 * d).split(d, dim=-1)
        q = apply_rope(rms_norm(q, self.q_norm, cfg.rms_norm_eps), *rope)
        k = apply_rope(rms_norm(k.reshape(n, -1, d), self.k_norm, cfg.rms_norm_eps), *rope)
        scale = d**-0.5
        if plan.attention.capture is not None:  # what the decoder attends to: these rows' keys and values
            plan.attention.capture.keep(k, v.reshape(n, -1, d))
            plan.attention.capture.states.append(None)
        keys, values = k, v.reshape(n, -1, d)
        if plan.attention.decode is not None:  # a decode step: this step's keys and values into the buffers
            keys, values = plan.attention.decode.store(self.index, keys, values)
        if plan.attention.kernel is not None:  # a pass, or a decode step over the buffers (the scorer's plan)
            from spinf.engine.kernels import tree_attention_kernel

            config = self.kernel_config(d, cfg.num_heads // cfg.num_kv_heads)
            a = tree_attention_kernel(q * scale, keys, values, plan.attention.kernel, None, config)
        elif plan.attention.decode is not None:
            a = decode_attention(q * scale, keys, values, plan.attention, None)
        else:
            a = tree_attention(q * scale, k, v.reshape(n, -1, d), plan.attention, None)
        return self.wo(a.reshape(n, -1) * _pointwise(torch.sigmoid, gate.reshape(n, -1)))

    @staticmethod
    def kernel_config(head_dim: int, group: int) -> tuple[int, ...]:
        """The Triton tree-attention kernel's configuration for these layers: the Gemma stack's for the head dim,
        except that a group whose heads fill no power-of-two tile (the 27B's 6 query heads per KV head) is taken
        2 heads (or 1) per program."""
        from spinf.engine.kernels.attention import config_for

        pairs, heads, *rest = config_for(head_dim)
        if not heads and pairs % group:
            heads = 2 if group % 2 == 0 else 1
        return (pairs, heads, *rest)


def rope_axes(cfg: Qwen35Config) -> torch.Tensor:
    """Which of (t, h, w) each rotary pair turns with, as transformers' Qwen3.5 interleaves them: pair ``j`` is h
    when ``j % 3 == 1`` and ``j < 3 · sections[1]``, w when ``j % 3 == 2`` and ``j < 3 · sections[2]``, else t."""
    pairs = torch.arange(cfg.rotary_dim // 2)
    _, h, w = cfg.mrope_section
    axes = torch.zeros_like(pairs)
    axes[(pairs % 3 == 1) & (pairs < 3 * h)] = 1
    axes[(pairs % 3 == 2) & (pairs < 3 * w)] = 2
    return axes


def rope_inv_freq(cfg: Qwen35Config) -> torch.Tensor:
    """The rotary pairs' inverse frequencies (the exponent runs over the rotary dims only)."""
    exponents = torch.arange(0, cfg.rotary_dim, 2, dtype=torch.int64).float() / cfg.rotary_dim
    return 1.0 / (cfg.rope_theta**exponents)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rope on the first ``cos.shape[-1]`` dims of each head. x [N, heads, d]; cos, sin [N, rotary]."""
    rot = cos.shape[-1]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # bf16 stays bf16 (fp32 angles would promote the whole residual)
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    half = rot // 2
    turned = torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1)
    return torch.cat((x_rot * cos[:, None] + turned * sin[:, None], x_pass), dim=-1)


class DecoderLayer(nn.Module):
    def __init__(
        self,
        cfg: Qwen35Config,
        kind: str,
        take: Callable[[str], torch.Tensor],
        linear: MakeLinear,
        at: str,
        index: int = 0,
    ):
        super().__init__()
        self.is_attention = kind == FULL
        if self.is_attention:
            self.mixer = Attention(cfg, take, linear, at + "self_attn.")
        else:
            self.mixer = GatedDeltaNet(cfg, take, linear, at + "linear_attn.")
        self.mixer.index = index  # its buffers in a decode step (`DecodeKV`)
        self.eps = cfg.rms_norm_eps
        self.input_norm = nn.Parameter(take(at + "input_layernorm.weight"), requires_grad=False)
        self.post_norm = nn.Parameter(take(at + "post_attention_layernorm.weight"), requires_grad=False)
        self.w_gate_up = linear([at + "mlp.gate_proj", at + "mlp.up_proj"])
        self.w_down = linear([at + "mlp.down_proj"])

    def forward(self, h: torch.Tensor, rope, plan: Qwen35Plan) -> torch.Tensor:
        x = rms_norm(h, self.input_norm, self.eps)
        h = h + (self.mixer(x, rope, plan) if self.is_attention else self.mixer(x, plan))
        x = rms_norm(h, self.post_norm, self.eps)
        if x.shape[0] <= MLP_ROWS:
            return h + self._mlp(x)
        return h + torch.cat([self._mlp(part) for part in x.split(MLP_ROWS)])

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w_gate_up(x).chunk(2, dim=-1)
        return self.w_down(_pointwise(F.silu, gate) * up)


class Qwen35Text(nn.Module):
    """The decoder stack with an untied LM head; `forward` gives hidden states of a packed pass. Built from the
    checkpoint's tensors (``take``: a full name to its tensor) with each linear made by ``linear``."""

    def __init__(
        self,
        cfg: Qwen35Config,
        take: Callable[[str], torch.Tensor],
        linear: MakeLinear,
        prefix: str,
        head: torch.Tensor | None,
        readout=None,
    ):
        super().__init__()
        self.cfg = cfg
        # the decider's readout (`spinf.engine.qwen35.readout.Readout`, A.15) replaces the LM head when given
        self.readout = readout
        self.embed = nn.Parameter(take(prefix + "embed_tokens.weight"), requires_grad=False)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, kind, take, linear, f"{prefix}layers.{i}.", i) for i, kind in enumerate(cfg.layer_types)
        )
        self.final_norm = nn.Parameter(take(prefix + "norm.weight"), requires_grad=False)
        self.lm_head = None if head is None else nn.Parameter(head, requires_grad=False)
        self.head_mode = DEFAULT_HEAD  # the LM head's precision (spinf.engine.head)
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    def plan(self, layout: PassLayout) -> Qwen35Plan:
        """The plan of a pass on the model's device (on a GPU with the tree-attention kernel's tables)."""
        device = self.embed.device
        shape = self.attention_shape() if device.type == "cuda" else None
        return pass_plan(layout, self.cfg.linear_conv_kernel_dim, device, shape)

    def forward(self, token_ids: torch.Tensor, plan: Qwen35Plan | AttentionPlan) -> torch.Tensor:
        """Hidden states [num_tokens, hidden] (before the final norm) of one pass, or of a decode step's rows (the
        decoder's plan: an `AttentionPlan` with its ``decode``)."""
        if isinstance(plan, AttentionPlan):
            plan = Qwen35Plan(attention=plan, taps=None, segments=(), kept=frozenset())
        h = F.embedding(token_ids, self.embed)
        if plan.attention.media is not None:  # the placeholders' rows become the tower's embeddings (A.14.1)
            rows, embedded = plan.attention.media
            h = h.index_copy(0, rows, embedded.to(h.dtype))
        if plan.positions3 is None:
            freqs = plan.attention.positions[:, None].float() * self.inv_freq[None, :]
        else:  # each pair turns with its own axis's position (`rope_axes`)
            axes = rope_axes(self.cfg).to(plan.positions3.device)
            freqs = plan.positions3[:, axes].float() * self.inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        rope = (_pointwise(torch.cos, angles), _pointwise(torch.sin, angles))
        for layer in self.layers:
            h = layer(h, rope, plan)
        return h

    def head_weight(self) -> torch.Tensor | None:
        """The LM head as ``head_mode``'s product reads it (None under the readout): made once per pass, since the
        fp32 mode's copy of the 27B's head is 5 GB."""
        return None if self.readout is not None else head_weight(self.lm_head, self.head_mode)

    def read_logprobs(self, hidden_rows: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """Full-vocabulary fp32 log-softmax [rows, vocab] at the given (pre-norm) hidden rows: the LM head's in
        ``head_mode`` (``weight``: `head_weight`, made here when not given), or the decider's readout (−inf off its
        codes). The final norm runs in fp32; f32out and bf16 read its rows in the head's dtype (bf16 on a GPU: no
        fp32 copy of the 2.5 GB head per chunk), fp32 reads them as they are."""
        x = rms_norm(hidden_rows.float(), self.final_norm, self.cfg.rms_norm_eps)
        if self.readout is not None:
            return self.readout.logprobs(x)
        weight = self.head_weight() if weight is None else weight
        if self.head_mode != "fp32":
            x = x.to(self.lm_head.dtype)
        return torch.log_softmax(head_logits(x, weight, self.head_mode), dim=-1)

    def full_logprobs(self, hidden_rows: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """`read_logprobs` in chunks of exactly ``HEAD_ROWS`` rows (the last padded), so that on a GPU every product
        has one shape and a row's numbers never depend on the other rows."""
        weight = self.head_weight() if weight is None else weight
        out = []
        for start in range(0, hidden_rows.shape[0], HEAD_ROWS):
            chunk = hidden_rows[start : start + HEAD_ROWS]
            size = chunk.shape[0]
            if size < HEAD_ROWS and hidden_rows.is_cuda:
                chunk = torch.cat([chunk, chunk.new_zeros((HEAD_ROWS - size, chunk.shape[1]))])
            out.append(self.read_logprobs(chunk, weight)[:size])
        if not out:
            return hidden_rows.new_zeros((0, self.cfg.vocab_size), dtype=torch.float32)
        return torch.cat(out)

    def option_logprobs(
        self, hidden_rows: torch.Tensor, pick_rows: torch.Tensor, pick_cols: torch.Tensor, bounds: list[int]
    ) -> torch.Tensor:
        """fp32 log-probs of token ``pick_cols[i]`` at read row ``pick_rows[i]`` (the scorer's GPU call): the read
        rows in chunks of exactly ``HEAD_ROWS`` (the last padded), the picks of chunk ``c`` being
        ``bounds[c]:bounds[c + 1]``, so that no [read rows, vocab] tensor is held beyond one chunk's."""
        out = []
        weight = self.head_weight() if hidden_rows.shape[0] else None
        for c, start in enumerate(range(0, hidden_rows.shape[0], HEAD_ROWS)):
            logprobs = self.full_logprobs(hidden_rows[start : start + HEAD_ROWS], weight)
            rows = pick_rows[bounds[c] : bounds[c + 1]] - start
            out.append(logprobs[rows, pick_cols[bounds[c] : bounds[c + 1]]])
        return torch.cat(out) if out else hidden_rows.new_zeros(0, dtype=torch.float32)

    def head_precision(self) -> str:
        """The head's part of the fingerprint (api spec §11): the readout (fp32), or the LM head in its mode
        (`spinf.engine.head.head_precision`: f32out on an fp32 model is fp32)."""
        if self.readout is not None:
            return "readout fp32"
        return f"lm_head {head_precision(self.head_mode, self.lm_head.dtype)}"

    def runs_fused(self) -> bool:
        return False  # no fused GPU path on this stack yet

    def pass_graphs(self, device: torch.device, tile_rows: set[int]) -> None:
        """None: no CUDA graphs replay this stack's scoring passes yet (every pass runs eagerly)."""
        return None

    def capture_cost(self):
        """What the decoder holds (`spinf.engine.extraction.budget.CaptureCost`): a prefix row only in the attention
        layers; per prefix, each recurrent layer's fp32 state and its last ``kernel - 1`` rows (the convolution's
        reach); a path row in every layer."""
        from spinf.engine.extraction.budget import CaptureCost

        cfg, size = self.cfg, self.embed.element_size()
        heads, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        attention = 2 * cfg.num_kv_heads * cfg.head_dim * size
        recurrent = (cfg.conv_dim + heads * (dk + dv) + 2 * heads) * 4  # fp32 at most (the rows' dtypes)
        kinds = [layer.is_attention for layer in self.layers]
        tail = cfg.linear_conv_kernel_dim - 1
        per_prefix = kinds.count(False) * (heads * dk * dv * 4 + tail * recurrent)
        return CaptureCost(
            prefix_token=max(1, kinds.count(True) * attention),
            path_token=kinds.count(True) * attention + kinds.count(False) * recurrent,
            per_prefix=per_prefix,
            tail=tail,
        )

    def attention_shape(self) -> tuple[int, int]:
        """The full-attention layers' (head dim, query heads per KV head)."""
        return self.cfg.head_dim, self.cfg.num_heads // self.cfg.num_kv_heads

    def tile_rows(self) -> set[int]:
        """The tree-attention kernel's query rows per program (the scorer's GPU pass plans hold these tables)."""
        from spinf.engine.kernels.attention import tile_rows

        return {tile_rows(*self.attention_shape(), Attention.kernel_config(*self.attention_shape()))}

    def pass_plan(self, layout: PassLayout, attention: AttentionPlan) -> Qwen35Plan:
        """The plan of one pass around the scorer's tree-attention plan ``attention`` (its kernel tables, capture and
        media): the recurrent segments and the convolution's taps, on the model's device."""
        return pass_plan(layout, self.cfg.linear_conv_kernel_dim, self.embed.device, attention=attention)

    def pass_logprobs(self, layout: PassLayout) -> torch.Tensor:
        """The pass's full-vocabulary log-probs at its read rows, [len(layout.read_rows), vocab]."""
        device = self.embed.device
        hidden = self(torch.tensor(layout.token_ids, dtype=torch.long, device=device), self.plan(layout))
        return self.read_logprobs(hidden[torch.tensor(layout.read_rows, dtype=torch.long, device=device)])


def float_linears(take: Callable[[str], torch.Tensor], dtype: torch.dtype | None = None) -> MakeLinear:
    """`MakeLinear` for float checkpoints: the weights concatenated along the output, as `Dense`."""

    def make(names: list[str]) -> nn.Module:
        weight = torch.cat([take(name + ".weight") for name in names])
        return Dense(weight if dtype is None else weight.to(dtype))

    return make


def load_qwen35(
    folder: str | Path,
    dtype: torch.dtype = torch.float32,
    linear: MakeLinear | None = None,
    readout=None,
    raw: Mapping[str, torch.Tensor] | None = None,
    *,
    layers: int = 0,
    lm_head: str = DEFAULT_HEAD,
) -> Qwen35Text:
    """The text model of the Qwen3.5 checkpoint in ``folder``; ``linear`` makes its linears (None: float ones, in
    ``dtype``, as every other tensor is); ``readout`` the decider's head, which replaces the LM head (A.15); ``raw``
    the checkpoint's tensors by full name when the caller has read them already (an int4 ``linear`` reads them).
    ``layers`` (unless 0) keeps only the first that many decoder layers (the ``layers`` setting; the others' weights
    are never read or unpacked); ``lm_head`` is the head's precision mode (`spinf.engine.head`), which a readout
    does not have."""
    folder = Path(folder)
    cfg, prefix = read_qwen35_config(folder)
    if layers:
        if layers > len(cfg.layer_types):
            raise ModelError(
                f"{folder}: the checkpoint has {len(cfg.layer_types)} layers, fewer than the {layers} asked"
            )
        cfg = attrs.evolve(cfg, layer_types=cfg.layer_types[:layers])
    if readout is not None and check_mode(lm_head) != DEFAULT_HEAD:
        raise ModelError(
            f"{folder}: lm_head {lm_head} sets an LM head's precision; the decider's readout runs in fp32"
        )
    raw = read_tensors(folder, "") if raw is None else raw
    if prefix + "embed_tokens.weight" not in raw:
        raise ModelError(f"{folder}: the checkpoint has no {prefix}embed_tokens.weight")
    head = raw.get("lm_head.weight")
    if head is None and readout is None and not cfg.tie_word_embeddings:
        raise ModelError(f"{folder}: the checkpoint has no lm_head.weight and does not tie its embeddings")

    def take(name: str) -> torch.Tensor:
        if name not in raw:
            raise ModelError(f"{folder}: the checkpoint has no tensor {name}")
        if raw[name].dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # its scales would be lost
            raise ModelError(f"{folder}: the tensor {name} is {raw[name].dtype}; this stack reads float or GPTQ int4")
        return raw[name].to(dtype)

    model = Qwen35Text(
        cfg,
        take,
        linear or float_linears(take),
        prefix,
        None if readout is not None else take(prefix + "embed_tokens.weight") if head is None else head.to(dtype),
        readout,
    )
    model.head_mode = check_mode(lm_head)
    return model.requires_grad_(False).eval()
