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
(CPU and reference); the GPU kernels must compute the same thing.
"""

from __future__ import annotations

import attrs
import torch

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


def _partial(scores: torch.Tensor, values: torch.Tensor, eq: str) -> tuple[torch.Tensor, ...]:
    """Unnormalised softmax pieces (max, sum, weighted values) of masked scores ``-inf`` where hidden."""
    m = scores.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(scores - m)
    return m, p.sum(dim=-1, keepdim=True), torch.einsum(eq, p, values)


def _merge(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Combine two partial softmaxes in a fixed order (content first, then path)."""
    (m1, l1, o1), (m2, l2, o2) = a, b
    m = torch.maximum(m1, m2)
    w1, w2 = torch.exp(m1 - m), torch.exp(m2 - m)
    return (w1 * o1 + w2 * o2) / (w1 * l1 + w2 * l2)


def _prefix_attention(q, k, v, pos, window: int | None) -> torch.Tensor:
    """Causal attention within one prefix. q [P, Hkv, G, d]; k, v [P, Hkv, d] -> [P, Hkv, G, d]."""
    scores = torch.einsum("qhgd,khd->hgqk", q, k)
    diff = pos[:, None] - pos[None, :]
    visible = diff >= 0
    if window is not None:
        visible &= diff < window
    scores = scores.masked_fill(~visible, NEG_INF)
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hgqk,khd->qhgd", probs, v)


def tree_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: AttentionPlan, window: int | None
) -> torch.Tensor:
    """Attention of every row of a pass. q [N, H, d]; k, v [N, Hkv, d] -> [N, H, d] (softmax scale 1)."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv = k.shape[1]
    qf = q.float().view(num_tokens, num_kv, num_heads // num_kv, head_dim)
    kf, vf = k.float(), v.float()
    out = torch.zeros_like(qf)
    pos = plan.positions

    content_parts = []
    for job in plan.jobs:
        prefix = slice(job.start, job.start + job.prefix_len)
        if job.prefix_len:
            out[prefix] = _prefix_attention(qf[prefix], kf[prefix], vf[prefix], pos[prefix], window)
        rows = slice(job.start + job.prefix_len, job.start + job.prefix_len + job.num_branch)
        # content part: [B, Hkv, G, P] scores of this job's branch rows against its prefix keys
        scores = torch.einsum("bhgd,khd->bhgk", qf[rows], kf[prefix])
        if window is not None:
            far = (pos[rows][:, None] - pos[prefix][None, :]) >= window
            scores = scores.masked_fill(far[:, None, None, :], NEG_INF)
        content_parts.append(_partial(scores, vf[prefix], "bhgk,khd->bhgd"))
    if not content_parts or plan.branch_rows.numel() == 0:
        return out.view(num_tokens, num_heads, head_dim).to(q.dtype)

    content = tuple(torch.cat(parts) for parts in zip(*content_parts, strict=True))
    idx = plan.path_index
    visible = plan.path_mask
    if window is not None:
        visible = visible & ((pos[plan.branch_rows][:, None] - pos[idx]) < window)
    # path part: [B, Hkv, G, D] scores against the keys of each row's own path, root first
    scores = torch.einsum("bhgd,bjhd->bhgj", qf[plan.branch_rows], kf[idx])
    scores = scores.masked_fill(~visible[:, None, None, :], NEG_INF)
    path = _partial(scores, vf[idx], "bhgj,bjhd->bhgd")
    out[plan.branch_rows] = _merge(content, path)
    return out.view(num_tokens, num_heads, head_dim).to(q.dtype)
