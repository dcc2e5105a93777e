"""The chunked part of the recurrence (engine spec B.14.2, C.1): each job's fixed prefix in 64-token chunks.

A job's first `spinf.engine.trie.Job.fixed` rows (its BOS and content up to where a join cut could fall) are the same
tokens whatever questions share the pass, so the pass runs them with the chunked delta rule, as one segment that
starts from the zero state, with chunks counted from the BOS: the segment's outputs and its final state depend on
the content alone. Every later token (the rest of the prefix, every branch) runs token by token from that state, as
before, so no fork and no neighbour moves a chunk boundary. Prefixes shorter than `CHUNKED_MIN` stay token by token.

A prefix longer than `PIECE_TOKENS` runs in pieces of that many tokens (cut at multiples of it, counted from the
BOS), each starting from the exact fp32 state the last one ended with; one call takes pieces of one round (the
first pieces of every prefix, then the second ones...) up to `PIECE_TOKENS` in all, which bounds the chunked
kernel's per-chunk state snapshots (1.5 MiB per 64 tokens at the 27B's 48 heads of 128 × 128, in bf16).

On a GPU the calls run fla's kernels (`spinf.engine.kernels.chunked`); on the CPU `reference_chunked` computes the
same chunked form in fp32 torch, so the CPU tests cover the planning and the state hand-over.
"""

from __future__ import annotations

import attrs
import numpy as np
import torch

from spinf.engine.kernels.attention import to_device
from spinf.engine.kernels.chunked import CHUNK

CHUNKED_MIN = CHUNK  # a fixed prefix shorter than this runs token by token
PIECE_TOKENS = 8192  # tokens per chunked call, and the pieces a longer prefix is cut into


@attrs.frozen(eq=False)
class ChunkedCall:
    """One call: the pieces ``pieces`` (each ``(segment, round)``), their stream rows ``rows`` packed in order and
    the sequence bounds over them, on the pass's device (``cu_host`` and ``indices`` for fla, made once per pass)."""

    pieces: tuple[tuple[int, int], ...]
    rows: torch.Tensor  # [T] int64
    span: tuple[int, int] | None  # the rows as one range [first, end) when they are contiguous (slices, no gather)
    cu_seqlens: torch.Tensor  # [N + 1] int64
    cu_host: torch.Tensor
    indices: torch.Tensor | None  # fla's (sequence, chunk) table; None on the CPU


def fixed_spans(layout) -> set[tuple[int, int]]:
    """The stream rows ``[first, end)`` of each job's fixed prefix of at least `CHUNKED_MIN` rows."""
    starts = [start for start, _, _ in layout.spans]
    return {(a, a + f) for a, f in zip(starts, layout.fixed, strict=True) if f >= CHUNKED_MIN}


def fixed_segments(layout, segments: tuple[tuple[int, int, int], ...]) -> frozenset[int]:
    """The segments of a pass (`spinf.engine.qwen35.plan.segments`, cut after each job's fixed prefix, `cut_rows`)
    that are a job's whole fixed prefix."""
    wanted = fixed_spans(layout)
    return frozenset(i for i, (first, end, source) in enumerate(segments) if source < 0 and (first, end) in wanted)


def cut_rows(layout) -> frozenset[int]:
    """The rows after which the fixed prefixes end (the segments are cut there)."""
    return frozenset(end - 1 for _, end in fixed_spans(layout))


def plan_calls(
    segments: tuple[tuple[int, int, int], ...], chunked: frozenset[int], device: torch.device
) -> tuple[ChunkedCall, ...]:
    """The calls that run the ``chunked`` segments: round by round, each round's pieces in stream order, a new call
    when the next piece would take the call past `PIECE_TOKENS`."""
    calls: list[ChunkedCall] = []
    order = sorted(chunked)
    rounds = max((-(-(segments[s][1] - segments[s][0]) // PIECE_TOKENS) for s in order), default=0)
    for r in range(rounds):
        batch: list[tuple[int, int, int, int]] = []  # (segment, round, first row, end row)
        for s in order:
            first, end, _ = segments[s]
            a, b = first + r * PIECE_TOKENS, min(end, first + (r + 1) * PIECE_TOKENS)
            if a >= b:
                continue
            if batch and sum(e - f for _, _, f, e in batch) + (b - a) > PIECE_TOKENS:
                calls.append(_call(batch, device))
                batch = []
            batch.append((s, r, a, b))
        if batch:
            calls.append(_call(batch, device))
    return tuple(calls)


def _call(batch: list[tuple[int, int, int, int]], device: torch.device) -> ChunkedCall:
    lengths = [b - a for _, _, a, b in batch]
    rows = np.concatenate([np.arange(a, b, dtype=np.int64) for _, _, a, b in batch])
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    indices = None
    if device.type == "cuda":  # fla's table of (sequence, chunk within it), made here so no layer makes it again
        indices = to_device(np.asarray([(n, c) for n, m in enumerate(lengths) for c in range(-(-m // CHUNK))]), device)
    contiguous = bool(len(rows)) and int(rows[-1]) - int(rows[0]) + 1 == len(rows)
    return ChunkedCall(
        pieces=tuple((s, r) for s, r, _, _ in batch),
        rows=to_device(rows, device),  # through pinned memory: a pageable copy would wait for the GPU
        span=(int(rows[0]), int(rows[-1]) + 1) if contiguous else None,
        cu_seqlens=to_device(cu, device),
        cu_host=torch.from_numpy(cu),
        indices=indices,
    )


def run_chunked(
    calls: tuple[ChunkedCall, ...],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    out: torch.Tensor,
) -> dict[int, torch.Tensor]:
    """Runs ``calls`` over the stream's q, k [N, Hv, dk], v [N, Hv, dv], g, beta [N, Hv], writing the outputs of
    their rows into ``out``; returns each chunked segment's final state [Hv, dk, dv] fp32."""
    heads, dk, dv = k.shape[1], k.shape[2], v.shape[2]
    state: dict[int, torch.Tensor] = {}
    for call in calls:  # a call's pieces are of one round: all from zero states, or all from the round before
        if call.pieces[0][1]:
            initial = torch.stack([state[s] for s, _ in call.pieces])
        else:
            initial = v.new_zeros((len(call.pieces), heads, dk, dv), dtype=torch.float32)
        rows = call.rows
        if call.span is not None:  # one range of rows (a single content): views, and one copy back
            picked = [t[call.span[0] : call.span[1]].contiguous() for t in (q, k, v, g, beta)]
        else:
            picked = [t.index_select(0, rows) for t in (q, k, v, g, beta)]
        if q.is_cuda:
            from spinf.engine.kernels.chunked import chunked_delta_rule

            o, final = chunked_delta_rule(*picked, initial, call.cu_seqlens, call.cu_host, call.indices)
        else:
            o, final = reference_chunked(*picked, initial, call.cu_host)
        if call.span is not None:
            out[call.span[0] : call.span[1]].copy_(o)
        else:
            out.index_copy_(0, rows, o.to(out.dtype))
        for place, (s, _) in enumerate(call.pieces):
            state[s] = final[place]
    return state


def reference_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial: torch.Tensor,
    cu_host: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked delta rule in fp32 torch, with `chunked_delta_rule`'s arguments and results (CPU tests).

    Within a chunk of C tokens from state S₀ (per head, ``Γᵢ = exp(Σ_{j≤i} g_j)``): the deltas solve
    ``(I + A) δ = β ⊙ (V − Γ K S₀)`` with ``A_ij = β_i (Γᵢ/Γⱼ) kᵢ·kⱼ`` below the diagonal, then
    ``oᵢ = Γᵢ S₀ᵀqᵢ + Σ_{j≤i} (Γᵢ/Γⱼ)(kⱼ·qᵢ) δⱼ`` and ``S_C = Γ_C S₀ + Σⱼ (Γ_C/Γⱼ) kⱼ δⱼᵀ`` — the token-by-token
    rule's algebra regrouped per chunk."""
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    out = torch.empty_like(v)
    finals = []
    bounds = cu_host.tolist()
    for n in range(len(bounds) - 1):
        state = initial[n].float()  # [Hv, dk, dv]
        for a in range(bounds[n], bounds[n + 1], CHUNK):
            b = min(a + CHUNK, bounds[n + 1])
            qc, kc, vc = q[a:b].transpose(0, 1), k[a:b].transpose(0, 1), v[a:b].transpose(0, 1)  # [Hv, C, d]
            gc, bc = g[a:b].transpose(0, 1).cumsum(-1), beta[a:b].transpose(0, 1)  # [Hv, C]
            size = b - a
            lower = torch.tril(torch.ones(size, size, dtype=torch.bool), diagonal=-1)
            causal = torch.tril(torch.ones(size, size, dtype=torch.bool))
            ratio = torch.exp(torch.where(causal, gc[:, :, None] - gc[:, None, :], float("-inf")))  # Γᵢ/Γⱼ
            A = torch.where(lower, bc[:, :, None] * ratio * (kc @ kc.transpose(1, 2)), 0.0)
            eye = torch.eye(size).expand_as(A)
            rhs = bc[:, :, None] * (vc - torch.exp(gc)[:, :, None] * (kc @ state))
            delta = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
            o = torch.exp(gc)[:, :, None] * (qc @ state) + (ratio * (qc @ kc.transpose(1, 2))) @ delta
            out[a:b] = o.transpose(0, 1)
            last = gc[:, -1:]  # log Γ_C
            state = (
                torch.exp(last)[:, :, None] * state + (kc * torch.exp(last - gc)[:, :, None]).transpose(1, 2) @ delta
            )
        finals.append(state)
    return out, torch.stack(finals) if finals else initial.new_zeros((0, *initial.shape[1:]))
