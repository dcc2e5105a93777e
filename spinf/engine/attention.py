"""Tree attention over a packed pass, split so that every question's numbers depend on its own path only.

A pass holds jobs back to back. A job is a **prefix** (BOS and the content) followed by **branch** tokens: the
nodes of a token trie whose root hangs off the prefix's end. A branch token attends to the prefix and to its own
path (its ancestors and itself); a prefix token attends causally within its prefix. Sliding-window layers add
``pos[q] - pos[k] < window``.

The attention of a branch token is computed as two partial softmaxes merged by log-sum-exp (engine spec C.1):

* the **content part** over the prefix keys of its own job, which depend on the content alone;
* the **path part** over the keys of its own path, gathered root first into a fixed-width row.

Neither part reads anything from another question, another job or the token's place in the stream, which is what
makes a question's scores independent of whatever else shares the pass. This module is the plain torch version
(CPU and reference); the GPU kernels must compute the same thing. `attention_plan` turns a pass layout into the
plan both stacks' layers read; `apply_rope` is the rotate-half rope of the Gemma decoder and of the vision towers.
"""

from __future__ import annotations

import attrs
import torch

from spinf.engine.layout import PassLayout, vision_groups

NEG_INF = float("-inf")


@attrs.frozen
class JobSpan:
    """One job's rows in the pass: the prefix ``[start, start + prefix_len)`` and its branch rows after it."""

    start: int
    prefix_len: int
    num_branch: int


@attrs.frozen
class AttentionPlan:
    """What tree attention needs about a pass, as tensors on the model's device.

    ``path_index[r]`` lists the stream rows of branch row ``r``'s path, root first, ending with the row itself,
    then padding (``path_mask`` false). Branch rows are numbered job by job in stream order.
    """

    positions: torch.Tensor  # [num_tokens] int64
    jobs: tuple[JobSpan, ...]
    branch_rows: torch.Tensor  # [num_branch] int64, stream rows of the branch tokens
    path_index: torch.Tensor  # [num_branch, max_depth] int64
    path_mask: torch.Tensor  # [num_branch, max_depth] bool
    # per row, the positions ``[start, end)`` of its image's placeholders (``(0, 0)`` for every other row): the
    # rows a placeholder also sees under bidirectional image attention (engine spec A.14.6); None: no images
    groups: torch.Tensor | None = None  # [num_tokens, 2] int64
    kernel: object | None = None  # on a GPU, the `spinf.engine.kernels.KernelPlan` of the same pass
    capture: Capture | None = None  # keys and values every layer keeps for the decoder (a pass with slots)
    # the media embeddings of the pass: the stream rows of the placeholders and their rows [R, hidden], which
    # replace those rows' token embeddings (engine spec A.14.1); None: no media
    media: tuple[torch.Tensor, torch.Tensor] | None = None
    decode: DecodeKV | None = None  # a decode step: the rows are new tokens that attend to a decoder's buffers

    @classmethod
    def for_sequence(cls, num_tokens: int) -> AttentionPlan:
        """One plain causal sequence: a single job that is all prefix (what a plain forward pass computes)."""
        empty = torch.zeros(0, 1, dtype=torch.long)
        return cls(
            positions=torch.arange(num_tokens),
            jobs=(JobSpan(0, num_tokens, 0),),
            branch_rows=torch.zeros(0, dtype=torch.long),
            path_index=empty,
            path_mask=empty.bool(),
        )


def attention_plan(layout: PassLayout, device: torch.device) -> AttentionPlan:
    """Tensors of a pass layout; paths padded to the deepest branch token of the pass."""
    depth = max((len(p) for p in layout.paths), default=1)
    index = [p + [0] * (depth - len(p)) for p in layout.paths]
    mask = [[True] * len(p) + [False] * (depth - len(p)) for p in layout.paths]

    def as_tensor(data, dtype, shape=None):
        t = torch.tensor(data, dtype=dtype)
        return (t.reshape(shape) if shape else t).to(device)

    groups = vision_groups(layout)
    return AttentionPlan(
        positions=as_tensor(layout.positions, torch.long),
        jobs=tuple(JobSpan(*span) for span in layout.spans),
        branch_rows=as_tensor(layout.branch_rows, torch.long),
        path_index=as_tensor(index, torch.long, (len(index), depth)),
        path_mask=as_tensor(mask, torch.bool, (len(mask), depth)),
        groups=None if groups is None else torch.from_numpy(groups).to(device),
    )


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rope. x [N, heads, d]; cos, sin [N, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


@attrs.define(eq=False)
class Capture:
    """The keys and values of some stream rows of a pass, kept by every layer (engine spec B.13: the prefixes and
    template paths that extraction slots decode from). ``keys[i]`` / ``values[i]``: layer ``i``'s [R, Hkv, d]."""

    rows: torch.Tensor  # [R] int64 stream rows
    keys: list[torch.Tensor] = attrs.field(factory=list)
    values: list[torch.Tensor] = attrs.field(factory=list)
    # each captured prefix: (its first captured row, the stream row of its last token or -1 when it is empty); a
    # recurrent layer keeps its state after that row (the Qwen3.5 stack), in this order
    prefixes: tuple[tuple[int, int], ...] = ()
    states: list[torch.Tensor | None] = attrs.field(factory=list)  # per layer [P, ...], None for an attention layer
    # the captured rows a recurrent layer keeps (each prefix's last few, every path row): per captured row its
    # place among them, -1 for one it does not keep; None: it keeps every captured row
    compact: tuple[int, ...] | None = None
    compact_rows: torch.Tensor | None = None  # [R'] int64 stream rows of the kept ones

    def keep(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.keys.append(k.index_select(0, self.rows))
        self.values.append(v.index_select(0, self.rows))

    def keep_recurrent(self, a: torch.Tensor, b: torch.Tensor) -> None:
        """A recurrent layer's rows: those of ``compact`` alone."""
        rows = self.rows if self.compact_rows is None else self.compact_rows
        self.keys.append(a.index_select(0, rows))
        self.values.append(b.index_select(0, rows))


@attrs.define(eq=False)
class DecodeKV:
    """A decode step's view of its decoder's buffers (`spinf.engine.extraction.decoder`).

    The step's rows are new tokens, grouped by the prefix they decode from. Every layer writes its rows' keys and
    values at ``write`` in its buffers, then attends: the **content part** over the group's prefix (buffer rows
    ``[start, start + prefix_len)``, positions ``0 … prefix_len - 1``) and the **path part** over ``path_index[r,
    : path_len[r]]`` (the template's rows, the tokens generated so far, the row itself), path step ``s`` at position
    ``prefix_len + s``: exactly what a branch row of a scoring pass attends to, so a decoded token gets the bits it
    would get as a branch of its input's trie.
    """

    keys: list[torch.Tensor]  # per layer [B, Hkv, d]
    values: list[torch.Tensor]
    write: torch.Tensor  # [n] int64 buffer rows of this step's keys and values
    path_index: torch.Tensor  # [n, W] int64 buffer rows of each row's path, root first
    path_len: torch.Tensor  # [n] int64
    groups: tuple[tuple[int, int, int, int], ...]  # (first row, row count, prefix start, prefix length)
    # per layer, each group's prefix state [G, ...] (a recurrent layer of the Qwen3.5 stack), else None
    states: list[torch.Tensor | None] | None = None
    # a recurrent layer's buffers hold only its rows (`Capture.compact`): per buffer row its row there, -1 for none
    compact: torch.Tensor | None = None  # [B] int64
    # each row's group, that group's prefix start and its prefix length ([3, n] int64, each a contiguous row; made
    # once per chunk)
    row_groups: torch.Tensor | None = None
    # what a model derives from this step once for all its layers of a kind (the recurrent layers' rows and taps)
    derived: dict = attrs.field(factory=dict)

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this step's keys and values into layer ``layer``'s buffers; the buffers."""
        keys, values = self.keys[layer], self.values[layer]
        keys.index_copy_(0, self.write, k.to(keys.dtype))
        values.index_copy_(0, self.write, v.to(values.dtype))
        return keys, values


ROW_CHUNK = 64  # branch rows are processed in chunks of exactly this many rows (padded), see `tree_attention`


def _merge(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Combine two partial softmaxes (max, sum, unnormalised output) in a fixed order: content, then path."""
    (m1, l1, o1), (m2, l2, o2) = a, b
    m = torch.maximum(m1, m2)
    w1, w2 = torch.exp(m1 - m), torch.exp(m2 - m)
    return (w1 * o1 + w2 * o2) / (w1 * l1 + w2 * l2)


def _finite_max(scores: torch.Tensor) -> torch.Tensor:
    m = scores.amax(dim=-1, keepdim=True)
    return torch.where(torch.isinf(m), torch.zeros_like(m), m)


BIDIRECTIONAL_NONE, BIDIRECTIONAL_OR, BIDIRECTIONAL_IN_WINDOW = 0, 1, 2  # a layer's image attention (A.14.6)


def prefix_visible(pos, window: int | None, groups=None, mode: int = BIDIRECTIONAL_NONE) -> torch.Tensor:
    """Which keys each row of a prefix sees, [P, P]: causal and within the window; an image's placeholders also
    see their whole image, beyond the window too (`BIDIRECTIONAL_OR`, the unified 12B on every layer) or only
    within it (`BIDIRECTIONAL_IN_WINDOW`, the 31B's sliding layers)."""
    diff = pos[:, None] - pos[None, :]
    causal = diff >= 0
    near = diff < window if window is not None else torch.ones_like(causal)
    if groups is None or mode == BIDIRECTIONAL_NONE:
        return causal & near
    same = (pos[None, :] >= groups[:, 0:1]) & (pos[None, :] < groups[:, 1:2])
    if mode == BIDIRECTIONAL_OR:
        return (causal & near) | same
    return (causal | same) & near


def _prefix_attention(q, k, v, pos, window: int | None, groups=None, mode: int = BIDIRECTIONAL_NONE) -> torch.Tensor:
    """Attention within one prefix (shapes set by the content alone). q [P, Hkv, G, d] -> same."""
    scores = torch.einsum("qhgd,khd->hgqk", q, k)
    visible = prefix_visible(pos, window, groups, mode)
    probs = torch.softmax(scores.masked_fill(~visible, NEG_INF), dim=-1)
    return torch.einsum("hgqk,khd->qhgd", probs, v)


def _content_part(q, k, v, q_pos, k_pos, window: int | None) -> tuple[torch.Tensor, ...]:
    """Partial softmax of a chunk of branch rows over one prefix. q [C, Hkv, G, d]; k, v [P, Hkv, d].

    Every call has the shape ``[ROW_CHUNK, …, P]``: the GEMMs and reductions a row goes through are fixed by
    the content alone, whatever the other rows of the chunk are.
    """
    chunk, num_kv, group, dim = q.shape
    if k.shape[0] == 0:  # no prefix (a model without BOS, empty content): nothing to attend to here
        empty = q.new_zeros((chunk, num_kv, group, 1))
        return torch.full_like(empty, NEG_INF), empty, torch.zeros_like(q)
    qh = q.permute(1, 0, 2, 3).reshape(num_kv, chunk * group, dim)
    scores = torch.bmm(qh, k.permute(1, 2, 0)).view(num_kv, chunk, group, -1).permute(1, 0, 2, 3)
    if window is not None:
        far = (q_pos[:, None] - k_pos[None, :]) >= window
        scores = scores.masked_fill(far[:, None, None, :], NEG_INF)
    m = _finite_max(scores)
    p = torch.exp(scores - m)
    ph = p.permute(1, 0, 2, 3).reshape(num_kv, chunk * group, -1)
    o = torch.bmm(ph, v.permute(1, 0, 2)).view(num_kv, chunk, group, dim).permute(1, 0, 2, 3)
    return m, p.sum(dim=-1, keepdim=True), o


def _path_part(q, k_path, v_path, visible) -> tuple[torch.Tensor, ...]:
    """Partial softmax of a chunk of rows over their own paths. q [C, Hkv, G, d]; k/v_path [C, D, Hkv, d].

    Sums over the path run as sequential scans (cumulative sums, root first), so the padding that a deeper
    neighbour forces on a row adds exact zeros after its own terms and never changes its result.
    """
    scores = (q[:, None] * k_path[:, :, :, None, :]).sum(-1).permute(0, 2, 3, 1)  # [C, Hkv, G, D]
    scores = scores.masked_fill(~visible[:, None, None, :], NEG_INF)
    m = _finite_max(scores)
    p = torch.exp(scores - m)
    total = torch.cumsum(p, dim=-1)[..., -1:]
    weighted = p[:, :, :, None, :] * v_path.permute(0, 2, 3, 1)[:, :, None, :, :]  # [C, Hkv, G, d, D]
    return m, total, torch.cumsum(weighted, dim=-1)[..., -1]


def _chunks(total: int):
    """Row ranges of ``ROW_CHUNK`` rows and how many rows of each are padding."""
    for start in range(0, total, ROW_CHUNK):
        yield start, min(ROW_CHUNK, total - start)


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_zeros((rows - t.shape[0], *t.shape[1:]))])


def tree_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: AttentionPlan,
    window: int | None,
    bidirectional: int = BIDIRECTIONAL_NONE,
) -> torch.Tensor:
    """Attention of every row of a pass. q [N, H, d]; k, v [N, Hkv, d] -> [N, H, d] (softmax scale 1).

    Branch rows go through in chunks of exactly ``ROW_CHUNK`` rows (the last one padded), so no GEMM or
    reduction shape depends on how many other questions share the job or the pass. ``bidirectional`` is the
    layer's image attention (`prefix_visible`), over ``plan.groups``.
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv = k.shape[1]
    qf = q.float().view(num_tokens, num_kv, num_heads // num_kv, head_dim)
    kf, vf = k.float(), v.float()
    out = torch.zeros_like(qf)
    pos = plan.positions
    first_branch = 0  # index into plan.branch_rows of the current job's first branch row
    for job in plan.jobs:
        prefix = slice(job.start, job.start + job.prefix_len)
        if job.prefix_len:
            groups = None if plan.groups is None else plan.groups[prefix]
            out[prefix] = _prefix_attention(
                qf[prefix], kf[prefix], vf[prefix], pos[prefix], window, groups, bidirectional
            )
        for offset, count in _chunks(job.num_branch):
            at = slice(first_branch + offset, first_branch + offset + count)
            rows = plan.branch_rows[at]
            idx, visible = plan.path_index[at], plan.path_mask[at]
            if window is not None:
                visible = visible & ((pos[rows][:, None] - pos[idx]) < window)
            q_rows = _pad_rows(qf[rows], ROW_CHUNK)
            content = _content_part(
                q_rows, kf[prefix], vf[prefix], _pad_rows(pos[rows], ROW_CHUNK), pos[prefix], window
            )
            path = _path_part(
                q_rows, _pad_rows(kf[idx], ROW_CHUNK), _pad_rows(vf[idx], ROW_CHUNK), _pad_rows(visible, ROW_CHUNK)
            )
            out[rows] = _merge(content, path)[:count]
        first_branch += job.num_branch
    return out.view(num_tokens, num_heads, head_dim).to(q.dtype)


def decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, plan: AttentionPlan, window: int | None
) -> torch.Tensor:
    """Attention of a decode step's rows over their decoder's buffers (`DecodeKV`). q [n, H, d] -> [n, H, d].

    The same two parts as `tree_attention`, in the same chunks of ``ROW_CHUNK`` rows and the same shapes (the
    content part over the whole prefix, the path part over the row's own path), so a decoded token's attention is
    bit for bit what it would be in a scoring pass.
    """
    kv = plan.decode
    n, num_heads, head_dim = q.shape
    num_kv = keys.shape[1]
    qf = q.float().view(n, num_kv, num_heads // num_kv, head_dim)
    out = torch.zeros_like(qf)
    pos = plan.positions
    steps = torch.arange(kv.path_index.shape[1], device=q.device)
    for first, count, start, prefix_len in kv.groups:
        k_prefix = keys[start : start + prefix_len].float()
        v_prefix = values[start : start + prefix_len].float()
        k_pos = torch.arange(prefix_len, device=q.device)
        for offset, size in _chunks(count):
            at = slice(first + offset, first + offset + size)
            depth = int(kv.path_len[at].max())  # the chunk's deepest path: padding past it adds exact zeros only
            idx = kv.path_index[at, :depth]
            visible = steps[None, :depth] < kv.path_len[at, None]
            if window is not None:
                visible = visible & ((pos[at][:, None] - (prefix_len + steps[None, :depth])) < window)
            q_rows = _pad_rows(qf[at], ROW_CHUNK)
            content = _content_part(q_rows, k_prefix, v_prefix, _pad_rows(pos[at], ROW_CHUNK), k_pos, window)
            path = _path_part(
                q_rows,
                _pad_rows(keys[idx].float(), ROW_CHUNK),
                _pad_rows(values[idx].float(), ROW_CHUNK),
                _pad_rows(visible, ROW_CHUNK),
            )
            out[at] = _merge(content, path)[:size]
    return out.view(n, num_heads, head_dim).to(q.dtype)
