"""The gated delta rule of Qwen3.5's GDN layers on the GPU, by segment index (engine spec B.14.2, C.1).

A pass's recurrence is cut into segments (`spinf.engine.qwen35.plan.pass_plan`): runs of stream rows, each the
path successor of the one before, that start from the final state of their source segment (or from zeros). The
segments come grouped into **levels** (a segment's level is its source's plus one) and each level is one launch of
`_recurrent_kernel`, so every initial state it reads was written by an earlier launch.

One program takes one (segment, value head, block of ``BV`` value columns). It keeps that block of the state in
registers in fp32, as ``[BV, dk]`` (value columns by key dims, so both products with a key-sized vector reduce along
the tile's fast dimension), loads its initial state by slot from the kept-states buffer, and walks the
segment's tokens one by one, indexing the stream tensors directly:
``S ← decay·S;  S ← S + beta·(v − Sk) ⊗ k;  o = Sq``. A kept segment writes its final state to its slot, and a
captured one (the end of a prefix that extraction slots decode from) to its place in the captured-states buffer.

A decode step (`decode_delta_rule`, extraction and generation, engine spec B.14.4) runs the same step body: one
program per (row, value head, block of value columns) loads its group's prefix state, replays the row's path (the
template and the tokens generated so far) from the decoder's buffer of recurrence inputs, then steps on the row's own
token, so a decoded token gets the bits it gets as a branch of a scoring pass. Its bounds come from device memory: a
step reads nothing from the host, so it can be captured in a CUDA graph.

Every token of every segment goes through the same instructions (one loop body; the next token's inputs are loaded
one step ahead), and a state passes between launches as its exact fp32 bits, so cutting a segment in two gives the
bits of not cutting it: a path's outputs depend on its own tokens alone, never on where its trie forks or on what
else shares the pass. No autotuning: one configuration per shape.

Kept states live in a buffer ``[slots, Hv, dk, dv]`` fp32 allocated per call, ``dk · dv · 4`` bytes per head and
slot (3 MiB per slot at the 27B's 48 heads of 128 × 128). Slots alternate between even and odd levels (a level
reads only its parent level's states), so a call needs the most kept segments of any even level plus those of any
odd level, not one slot per kept segment.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

BV = 16  # value columns per program (the state block a program holds: BV × dk fp32; one warp at the 27B's dk)
# first row, end row, source slot (-1: zero state), own slot (-1: not kept), level, captured index (-1: none)
TABLE_COLUMNS = 6


@triton.jit
def _load_token(
    t, live, q_ptr, k_ptr, v_ptr, decay_ptr, beta_ptr, head, dims, cols,
    q_row, q_head, k_row, k_head, v_row, v_head, decay_row, beta_row, DK: tl.constexpr, DV: tl.constexpr,
):  # fmt: skip
    """Token ``t``'s inputs for one head, in fp32; for ``live`` false the values of a step that changes nothing
    (the bounds carry ``live``, not a scalar mask: Triton's interpreter refuses a broadcast scalar mask)."""
    dim_ok = dims < tl.where(live, DK, 0)
    col_ok = cols < tl.where(live, DV, 0)
    q = tl.load(q_ptr + t * q_row + head * q_head + dims, mask=dim_ok, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + t * k_row + head * k_head + dims, mask=dim_ok, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + t * v_row + head * v_head + cols, mask=col_ok, other=0.0).to(tl.float32)
    decay = tl.load(decay_ptr + t * decay_row + head, mask=live, other=1.0).to(tl.float32)
    beta = tl.load(beta_ptr + t * beta_row + head, mask=live, other=0.0).to(tl.float32)
    return q, k, v, decay, beta


@triton.jit
def _step(state, k, v, decay, beta):
    """One token of the delta rule on a state tile Sᵀ [BV, BK]: both kernels step through this one body."""
    state = state * decay
    delta = (v - tl.sum(state * k[None, :], axis=1)) * beta  # [BV]
    return state + delta[:, None] * k[None, :]


@triton.jit
def _recurrent_kernel(
    q_ptr, k_ptr, v_ptr, decay_ptr, beta_ptr, o_ptr, states_ptr, captured_ptr, table_ptr, level_start,
    q_row, q_head, k_row, k_head, v_row, v_head, decay_row, beta_row, o_row, o_head,
    HEADS: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    COLUMNS: tl.constexpr,
):  # fmt: skip
    seg = (level_start + tl.program_id(0)).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(2) * BV + tl.arange(0, BV)  # this program's value columns: the state tile's rows
    dims = tl.arange(0, BK)
    col_ok, dim_ok = cols < DV, dims < DK
    first = tl.load(table_ptr + seg * COLUMNS + 0).to(tl.int64)
    end = tl.load(table_ptr + seg * COLUMNS + 1).to(tl.int64)
    source = tl.load(table_ptr + seg * COLUMNS + 2).to(tl.int64)
    slot = tl.load(table_ptr + seg * COLUMNS + 3).to(tl.int64)
    captured = tl.load(table_ptr + seg * COLUMNS + 5).to(tl.int64)

    # S[key dim, value column] of a slot sits at [slot, head, key dim, value column]; the tile holds Sᵀ
    tile = head * DK * DV + dims[None, :] * DV + cols[:, None]
    tile_ok = col_ok[:, None] & dim_ok[None, :]
    from_source = (cols < tl.where(source >= 0, DV, 0))[:, None] & dim_ok[None, :]
    state = tl.load(states_ptr + source * HEADS * DK * DV + tile, mask=from_source, other=0.0)

    nq, nk, nv, na, nb = _load_token(
        first, first < end, q_ptr, k_ptr, v_ptr, decay_ptr, beta_ptr, head, dims, cols,
        q_row, q_head, k_row, k_head, v_row, v_head, decay_row, beta_row, DK, DV,
    )  # fmt: skip
    for t in range(first, end):
        q, k, v, decay, beta = nq, nk, nv, na, nb
        nq, nk, nv, na, nb = _load_token(
            t + 1, t + 1 < end, q_ptr, k_ptr, v_ptr, decay_ptr, beta_ptr, head, dims, cols,
            q_row, q_head, k_row, k_head, v_row, v_head, decay_row, beta_row, DK, DV,
        )  # fmt: skip
        state = _step(state, k, v, decay, beta)
        o = tl.sum(state * q[None, :], axis=1)
        tl.store(o_ptr + t * o_row + head * o_head + cols, o.to(o_ptr.dtype.element_ty), mask=col_ok)
    if slot >= 0:
        tl.store(states_ptr + slot * HEADS * DK * DV + tile, state, mask=tile_ok)
    if captured >= 0:
        tl.store(captured_ptr + captured * HEADS * DK * DV + tile, state, mask=tile_ok)


@triton.jit
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, decay_ptr, beta_ptr, o_ptr, states_ptr, group_ptr, rows_ptr, path_ptr, len_ptr,
    q_row, q_head, k_row, k_head, v_row, v_head, decay_row, beta_row, o_row, o_head, rows_row, path_row,
    HEADS: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(2) * BV + tl.arange(0, BV)
    dims = tl.arange(0, BK)
    col_ok, dim_ok = cols < DV, dims < DK
    tile = head * DK * DV + dims[None, :] * DV + cols[:, None]
    tile_ok = col_ok[:, None] & dim_ok[None, :]
    group = tl.load(group_ptr + row).to(tl.int64)
    state = tl.load(states_ptr + group * HEADS * DK * DV + tile, mask=tile_ok, other=0.0)
    # a buffer row of recurrence inputs: k [HEADS·DK], v [HEADS·DV], decay [HEADS], beta [HEADS]
    v_at, decay_at, beta_at = HEADS * DK, HEADS * (DK + DV), HEADS * (DK + DV + 1)
    length = tl.load(len_ptr + row).to(tl.int64) - 1  # the path before the row (its last entry is the row)
    for s in range(0, length):
        at = rows_ptr + tl.load(path_ptr + row * path_row + s).to(tl.int64) * rows_row
        k = tl.load(at + head * DK + dims, mask=dim_ok, other=0.0).to(tl.float32)
        v = tl.load(at + v_at + head * DV + cols, mask=col_ok, other=0.0).to(tl.float32)
        decay = tl.load(at + decay_at + head).to(tl.float32)
        beta = tl.load(at + beta_at + head).to(tl.float32)
        state = _step(state, k, v, decay, beta)
    q, k, v, decay, beta = _load_token(
        row, row >= 0, q_ptr, k_ptr, v_ptr, decay_ptr, beta_ptr, head, dims, cols,
        q_row, q_head, k_row, k_head, v_row, v_head, decay_row, beta_row, DK, DV,
    )  # fmt: skip
    state = _step(state, k, v, decay, beta)
    o = tl.sum(state * q[None, :], axis=1)
    tl.store(o_ptr + row * o_row + head * o_head + cols, o.to(o_ptr.dtype.element_ty), mask=col_ok)


def segment_table(
    segments: tuple[tuple[int, int, int], ...],
    kept: frozenset[int],
    captured: tuple[int, ...] = (),
    chunked: frozenset[int] = frozenset(),
) -> tuple[np.ndarray, tuple[int, ...], int]:
    """The kernel's table of a pass's segments (``(first row, end row, source segment)`` in stream order, sources
    first; ``kept``: the segments others start from; ``captured``: stream rows whose state is wanted, each the last
    row of a segment; ``chunked``: level-0 segments the chunked kernel runs), its level bounds and its number of
    slots, on the host. The chunked segments come first, in stream order, and level 0's launch starts after them
    (``levels[0]`` is their count): the table gives them their slots, and `recurrent_delta_rule` writes their final
    states there (its ``seeds``).

    The table [S, `TABLE_COLUMNS`] int32 has one row per segment, sorted by level (stable: stream order within a
    level): first row, end row, the source's slot (-1: zero state), its own slot (-1: not kept), level, and the
    place in ``captured`` of the row it ends with (-1: not captured). Level ``l``
    is rows ``levels[l]:levels[l + 1]``. A kept segment of an even level takes slot ``rank``, of an odd level
    ``max_even + rank`` (``rank``: its place among its level's kept segments), so a launch never writes a slot that
    it reads, and overwrites only states of the level before its parent, which no later level reads."""
    seg = np.asarray(segments, dtype=np.int64).reshape(-1, 3)
    source = seg[:, 2]
    level = np.where(source < 0, 0, -1)
    while (level < 0).any():  # sources come first, so each round settles the segments one level deeper
        ready = (level < 0) & (level[np.maximum(source, 0)] >= 0)
        level[ready] = level[source[ready]] + 1
    is_kept = np.zeros(len(seg), dtype=bool)
    is_kept[sorted(kept)] = True
    is_chunked = np.zeros(len(seg), dtype=bool)
    is_chunked[sorted(chunked)] = True
    if (level[is_chunked] != 0).any():
        raise ValueError("a chunked segment starts from another segment's state")
    order = np.argsort(2 * level + ~is_chunked, kind="stable")  # level 0's chunked segments first
    by_level, kept_sorted = level[order], is_kept[order]
    num_levels = int(by_level[-1]) + 1 if len(seg) else 0
    bounds = np.searchsorted(by_level, np.arange(num_levels + 1))
    before = np.cumsum(kept_sorted) - kept_sorted  # kept segments ahead of each one in level order
    rank = before - before[bounds[by_level]]  # ... within its own level
    per_level = np.bincount(by_level[kept_sorted], minlength=num_levels)
    even, odd = int(per_level[0::2].max(initial=0)), int(per_level[1::2].max(initial=0))
    slot = np.full(len(seg), -1, dtype=np.int64)
    slot[order] = np.where(kept_sorted, np.where(by_level % 2 == 1, even + rank, rank), -1)
    source_slot = np.where(source >= 0, slot[np.maximum(source, 0)], -1)
    capture = np.full(len(seg), -1, dtype=np.int64)
    ends = {int(end) - 1: s for s, end in enumerate(seg[:, 1])}
    for place, row in enumerate(captured):
        if row not in ends:
            raise ValueError(f"captured row {row} does not end a segment (pass_plan cuts the segments after it)")
        capture[ends[row]] = place
    table = np.stack([seg[:, 0], seg[:, 1], source_slot, slot, level, capture], axis=1)[order].astype(np.int32)
    bounds[0] = len(chunked)
    return table.reshape(-1, TABLE_COLUMNS), tuple(bounds.tolist()), even + odd


def _check_rows(name: str, t: torch.Tensor) -> None:
    if t.stride(-1) != 1:
        raise ValueError(f"the delta rule's {name} needs contiguous last-dimension elements")


def recurrent_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
    table: torch.Tensor,
    levels: tuple[int, ...],
    num_slots: int,
    config: tuple[int, int] | None = None,
    captured: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    seeds: list[tuple[int, int, torch.Tensor]] = (),
) -> torch.Tensor:
    """The gated delta rule along each segment, token by token (`spinf.engine.qwen35.gdn.delta_rule`).

    q, k [N, Hv, dk]; v [N, Hv, dv]; decay (``exp(g)``), beta [N, Hv] (any row strides) -> o [N, Hv, dv] in v's
    dtype. ``table`` [S, `TABLE_COLUMNS`] int32 on the device, sorted by level; level ``l`` is its rows
    ``levels[l]:levels[l + 1]``; ``num_slots`` the kept-states slots the table's slot numbers use. ``config``
    (value columns per program, warps) replaces the fixed one for measurements. ``captured`` [P, Hv, dk, dv] fp32
    gets the final state of each segment whose table row names a captured place (needed when one does). ``out``
    (the outputs, [N, Hv, dv]) may come with the chunked segments' rows written; ``seeds`` are their final states
    [Hv, dk, dv] fp32, each with its slot and captured place (-1: none), from the table's first ``levels[0]`` rows.
    """
    n, heads, dk = k.shape
    dv = v.shape[-1]
    if out is None:
        out = torch.empty((n, heads, dv), dtype=v.dtype, device=v.device)
    if n == 0 or len(levels) < 2:
        return out
    for name, t in (("q", q), ("k", k), ("v", v), ("decay", decay), ("beta", beta)):
        _check_rows(name, t)
    states = torch.empty((max(num_slots, 1), heads, dk, dv), dtype=torch.float32, device=v.device)
    if captured is None:
        captured = states  # never written: no table row names a captured place
    elif captured.dtype != torch.float32 or captured.shape[1:] != (heads, dk, dv) or not captured.is_contiguous():
        raise ValueError(f"the captured states need a contiguous fp32 [P, {heads}, {dk}, {dv}] buffer")
    if captured is states and any(place >= 0 for _, place, _ in seeds):
        raise ValueError("a seed names a captured place: pass the captured states' buffer")
    for slot, place, state in seeds:
        if slot >= 0:
            states[slot].copy_(state)
        if place >= 0:
            captured[place].copy_(state)
    bk, bv, warps = _tile(dk, dv, config)
    for start, stop in zip(levels[:-1], levels[1:], strict=True):
        if stop == start:  # level 0 when every zero-state segment ran chunked
            continue
        _recurrent_kernel[(stop - start, heads, triton.cdiv(dv, bv))](
            q, k, v, decay, beta, out, states, captured, table, start,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            decay.stride(0), beta.stride(0), out.stride(0), out.stride(1),
            HEADS=heads, DK=dk, DV=dv, BK=bk, BV=bv, COLUMNS=TABLE_COLUMNS, num_warps=warps, num_stages=1,
        )  # fmt: skip
    return out


def _tile(dk: int, dv: int, config: tuple[int, int] | None) -> tuple[int, int, int]:
    """Key dims, value columns and warps of a program: the same for a scoring pass and a decode step, so that their
    reductions group the same terms."""
    bk, bv = triton.next_power_of_2(dk), min(BV, triton.next_power_of_2(dv))
    # one warp per 2,048 state elements: the 27B's 16 × 128 tile in one warp ran 1.3-1.7x faster than 32 × 128 in
    # four on an H100 (benchmarks/RESULTS.md: `python -m tests.engine.qwen35.test_gpu_gdn`)
    warps = min(8, max(1, bk * bv // 2048))
    if config is not None:
        bv, warps = config
    return bk, bv, warps


def decode_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
    states: torch.Tensor,
    group_of: torch.Tensor,
    rows: torch.Tensor,
    path_index: torch.Tensor,
    path_len: torch.Tensor,
) -> torch.Tensor:
    """A decode step's delta rule: each row from its group's prefix state over its path, then its own token.

    q, k [n, Hv, dk]; v [n, Hv, dv]; decay, beta [n, Hv]: the step's rows. ``states`` [G, Hv, dk, dv] fp32 the
    groups' prefix states; ``group_of`` [n] each row's group; ``rows`` [B, Hv·dk + Hv·dv + 2·Hv] the decoder's
    buffer of recurrence inputs (k, v, decay, beta side by side, as `spinf.engine.qwen35.model` keeps them);
    ``path_index`` [n, W] each row's buffer rows, root first, and ``path_len`` [n] how many (the last: the row
    itself, replaced by its own inputs). -> o [n, Hv, dv] in v's dtype."""
    n, heads, dk = k.shape
    dv = v.shape[-1]
    out = torch.empty((n, heads, dv), dtype=v.dtype, device=v.device)
    if n == 0:
        return out
    for name, t in (("q", q), ("k", k), ("v", v), ("decay", decay), ("beta", beta), ("rows", rows)):
        _check_rows(name, t)
    # a dimension of one has no step to take: its stride is whatever the view left (a one-row decode's group row
    # of a [3, 1] table has stride 3), so contiguity is asked as torch asks it
    if states.dtype != torch.float32 or not states.is_contiguous() or not path_index[:1].is_contiguous():
        raise ValueError("the decode step needs contiguous fp32 prefix states and contiguous path rows")
    if not (group_of.is_contiguous() and path_len.is_contiguous()):
        raise ValueError("the decode step reads each row's group and path length by row: they must be contiguous")
    bk, bv, warps = _tile(dk, dv, None)
    _decode_kernel[(n, heads, triton.cdiv(dv, bv))](
        q, k, v, decay, beta, out, states, group_of, rows, path_index, path_len,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        decay.stride(0), beta.stride(0), out.stride(0), out.stride(1), rows.stride(0), path_index.stride(0),
        HEADS=heads, DK=dk, DV=dv, BK=bk, BV=bv, num_warps=warps, num_stages=1,
    )  # fmt: skip
    return out
