"""Tree attention in one Triton kernel: the content part in key tiles anchored at the job's start, then the
question's own path in tiles anchored at the path's root, as one running softmax (engine spec C.1).

The plain torch version is `spinf.engine.attention.tree_attention`; this kernel computes the same attention. A
program takes a tile of query rows of one job and the query heads (all, or a fixed set) of one KV head:

1. **Content part.** Keys are the job's prefix, visited in tiles of ``BN`` keys numbered from the job's first row,
   in ascending order. A query row sees key ``i`` when ``i <= pos`` (causal inside the prefix; a branch row's
   position is past the prefix, so it sees all of it) and, on sliding layers, ``pos - i < window``. An image's
   placeholders also see their whole image (engine spec A.14.6, ``BIDIR``): beyond the window too
   (`BIDIRECTIONAL_OR`), or within it (`BIDIRECTIONAL_IN_WINDOW`), from a table of each row's image span. The
   tiles a row visits, and the keys in each, depend on the content and the row's position alone.
2. **Path part.** A branch row's path (its ancestors root first, then itself) in tiles of ``BP`` path steps numbered
   from the root: step ``s`` is the path's node at depth ``s``, so the steps a tile holds, and where, depend on the
   row's own path alone. The tile's branch rows come in *segments*: runs of rows each the child of the one before
   (a question's tokens), so every row of a segment has a prefix of the segment's last row's path. A segment's path
   tiles are loaded once and serve all its rows, each row masking the steps deeper than itself.

Every tile updates each row's running maximum, normaliser and output. A tile in which a row sees nothing (outside
its window, past its depth, another segment's path) leaves all three bit for bit unchanged, so which other rows share
the program, and how deep they go, never changes a row's result. One fixed configuration per head dimension; no
autotuning.
"""

from __future__ import annotations

import attrs
import numpy as np
import torch
import triton
import triton.language as tl

from spinf.engine.attention import BIDIRECTIONAL_NONE
from spinf.engine.layout import PassLayout, vision_groups

NO_WINDOW = 1 << 30
# (M, HG, BN, BP, warps, stages) per head dimension, fixed, never tuned at run time. A program takes M (query row,
# head) pairs: M // HG query rows of one job times HG of the query heads that share one KV head (0: all of them),
# so those heads share each key and value tile it loads. BN keys per content tile, BP steps per path tile.
CONFIGS = {256: (64, 0, 32, 16, 4, 2), 512: (32, 0, 32, 32, 4, 2)}
SMALL_CONFIG = (32, 0, 32, 16, 4, 1)  # head dims below 256 (test models)
TILE_COLUMNS = 6  # first row, end row, job start, prefix length, first segment, segment count
SEGMENT_COLUMNS = 4  # first row, end row, last row, that row's path length


def config_for(head_dim: int) -> tuple[int, int, int, int, int, int]:
    return CONFIGS.get(head_dim, SMALL_CONFIG)


def heads_per_program(group: int, config: tuple[int, ...]) -> int:
    """The query heads a program takes: the config's HG, or the whole group of a KV head."""
    hg = config[1] or group
    if group % hg:
        raise ValueError(f"{hg} heads per program do not divide a group of {group} heads")
    return hg


def tile_rows(head_dim: int, group: int, config: tuple[int, ...] | None = None) -> int:
    """Query rows per program for a layer kind: the config's M over the heads a program takes."""
    config = config or config_for(head_dim)
    hg = heads_per_program(group, config)
    if config[0] % hg:
        raise ValueError(f"a tile of {config[0]} (row, head) pairs cannot hold whole sets of {hg} heads")
    return config[0] // hg


@triton.jit
def _softmax_step(q, k, v, seen, m, total, acc, PRECISION: tl.constexpr):
    """One key tile into the running softmax; a row that sees none of it keeps its state bit for bit."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    s = tl.where(seen, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m - m_use)
    p = tl.exp(s - m_use[:, None])
    total = total * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, total, acc


@triton.jit
def _tree_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    pos_ptr,
    path_ptr,
    tiles_ptr,
    segs_ptr,
    groups_ptr,
    q_row,
    k_row,
    v_row,
    o_row,
    path_width,
    window,
    inv_scale,
    GROUP: tl.constexpr,
    HG: tl.constexpr,
    D: tl.constexpr,
    M: tl.constexpr,
    BN: tl.constexpr,
    BP: tl.constexpr,
    PRECISION: tl.constexpr,
    QUANT: tl.constexpr,
    BIDIR: tl.constexpr,
):
    tile = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1) // (GROUP // HG)
    head_set = tl.program_id(1) % (GROUP // HG)
    first = tl.load(tiles_ptr + tile * 6 + 0)
    end = tl.load(tiles_ptr + tile * 6 + 1)
    job = tl.load(tiles_ptr + tile * 6 + 2).to(tl.int64)
    prefix_len = tl.load(tiles_ptr + tile * 6 + 3)
    seg_first = tl.load(tiles_ptr + tile * 6 + 4)
    seg_count = tl.load(tiles_ptr + tile * 6 + 5)

    pair = tl.arange(0, M)  # (query row, head) pairs: row-major over the program's heads
    rows = (first + pair // HG).to(tl.int64)
    heads = kv_head * GROUP + head_set * HG + pair % HG
    live = rows < end
    dims = tl.arange(0, D)
    q = tl.load(q_ptr + rows[:, None] * q_row + heads[:, None] * D + dims[None, :], mask=live[:, None], other=0.0)
    q_pos = tl.load(pos_ptr + rows, mask=live, other=0)
    m = tl.full([M], float("-inf"), tl.float32)
    total = tl.zeros([M], tl.float32)
    acc = tl.zeros([M, D], tl.float32)

    # content part: prefix keys in BN-tiles counted from the job's first row
    first_key = q_pos - window + 1
    last_key = q_pos + 1  # one past
    if BIDIR != 0:  # an image's placeholders: its span [g_lo, g_hi) of key positions; (0, 0) for any other row
        g_lo = tl.load(groups_ptr + rows * 2, mask=live, other=0)
        g_hi = tl.load(groups_ptr + rows * 2 + 1, mask=live, other=0)
        last_key = tl.maximum(last_key, g_hi)
        if BIDIR == 1:  # BIDIRECTIONAL_OR: beyond the window too
            first_key = tl.where(g_hi > g_lo, tl.minimum(first_key, g_lo), first_key)
    lo = tl.maximum(tl.min(tl.where(live, first_key, 1 << 30), axis=0), 0)
    hi = tl.minimum(tl.max(tl.where(live, last_key, 0), axis=0), prefix_len)
    for block in range(lo // BN, tl.cdiv(hi, BN)):
        keys = block * BN + tl.arange(0, BN)
        in_prefix = keys < prefix_len
        k = tl.load(
            k_ptr + (job + keys)[:, None] * k_row + kv_head * D + dims[None, :], mask=in_prefix[:, None], other=0.0
        )
        v = tl.load(
            v_ptr + (job + keys)[:, None] * v_row + kv_head * D + dims[None, :], mask=in_prefix[:, None], other=0.0
        )
        near = q_pos[:, None] - keys[None, :] < window
        if BIDIR == 1:
            same = (keys[None, :] >= g_lo[:, None]) & (keys[None, :] < g_hi[:, None])
            seen = in_prefix[None, :] & (((keys[None, :] <= q_pos[:, None]) & near) | same)
        elif BIDIR == 2:
            seen = in_prefix[None, :] & (keys[None, :] < last_key[:, None]) & near
        else:
            seen = in_prefix[None, :] & (keys[None, :] <= q_pos[:, None]) & near
        m, total, acc = _softmax_step(q, k, v, seen, m, total, acc, PRECISION)

    # path part: per segment, its last row's path in BP-step tiles counted from the root; a row sees the steps up
    # to its own depth (its position past the prefix). Step s sits at position prefix_len + s.
    depth = q_pos - prefix_len
    for g in range(seg_first, seg_first + seg_count):
        seg_start = tl.load(segs_ptr + g * 4 + 0)
        seg_end = tl.load(segs_ptr + g * 4 + 1)
        last = tl.load(segs_ptr + g * 4 + 2).to(tl.int64)
        path_len = tl.load(segs_ptr + g * 4 + 3)
        member = live & (rows >= seg_start) & (rows < seg_end)
        for block in range(0, tl.cdiv(path_len, BP)):
            steps = block * BP + tl.arange(0, BP)
            on_path = steps < path_len
            at = tl.load(path_ptr + last * path_width + steps, mask=on_path, other=0).to(tl.int64)
            k = tl.load(k_ptr + at[:, None] * k_row + kv_head * D + dims[None, :], mask=on_path[:, None], other=0.0)
            v = tl.load(v_ptr + at[:, None] * v_row + kv_head * D + dims[None, :], mask=on_path[:, None], other=0.0)
            seen = (
                member[:, None]
                & on_path[None, :]
                & (steps[None, :] <= depth[:, None])
                & (q_pos[:, None] - prefix_len - steps[None, :] < window)
            )
            m, total, acc = _softmax_step(q, k, v, seen, m, total, acc, PRECISION)

    out = acc / total[:, None]
    if QUANT:  # the fp8s quantizer of the o projection's input, applied to the rounded output
        out = tl.minimum(tl.maximum(out.to(tl.bfloat16).to(tl.float32) * inv_scale, -448.0), 448.0)
    tl.store(
        o_ptr + rows[:, None] * o_row + heads[:, None] * D + dims[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=live[:, None],
    )


@attrs.frozen
class KernelPlan:
    """What the kernel reads about a pass, on the device.

    ``paths[r]`` lists row ``r``'s path as stream rows (root first, the row itself last), then -1; prefix rows
    have no path. ``tiles[bm]`` holds one row of `TILE_COLUMNS` per tile of ``bm`` query rows (tiles never cross a
    job) and ``segments[bm]`` the tiles' segments, one row of `SEGMENT_COLUMNS` each: a run of branch rows, each the
    child of the one before, inside one tile.
    """

    positions: torch.Tensor  # [N] int32
    paths: torch.Tensor  # [N, depth] int32
    tiles: dict[int, torch.Tensor]  # BM -> [T, 6] int32
    segments: dict[int, torch.Tensor]  # BM -> [S, 4] int32
    groups: torch.Tensor | None = None  # [N, 2] int32, each row's image span (`AttentionPlan.groups`); None: none


def _tiles(
    spans: np.ndarray, row_job: np.ndarray, parent: np.ndarray, path_len: np.ndarray, bm: int
) -> tuple[np.ndarray, np.ndarray]:
    """The tile and segment tables for tiles of ``bm`` rows. ``spans`` [jobs, 3] as in `PassLayout`; per row, its
    job (``row_job``), its parent row (-1 for prefix rows and children of the prefix) and its path length."""
    start, prefix_len, branches = spans[:, 0], spans[:, 1], spans[:, 2]
    length = prefix_len + branches
    count = -(-length // bm)  # tiles per job
    offset = np.cumsum(count) - count  # each job's first tile
    job = np.repeat(np.arange(len(spans)), count)
    first = start[job] + (np.arange(count.sum()) - offset[job]) * bm
    end = np.minimum(first + bm, (start + length)[job])
    # a segment opens at a tile's first branch row and wherever a branch row is not the child of the row before
    rows = np.arange(len(parent))
    in_job = rows - start[row_job]
    branch = in_job >= prefix_len[row_job]
    opens = np.flatnonzero(branch & ((parent != rows - 1) | (in_job % bm == 0) | (in_job == prefix_len[row_job])))
    seg_tile = offset[row_job[opens]] + in_job[opens] // bm
    seg_end = np.minimum(np.append(opens[1:], len(parent)), end[seg_tile])
    segments = np.stack([opens, seg_end, seg_end - 1, path_len[seg_end - 1]], axis=1)
    tile_ids = np.arange(len(first))
    seg_first = np.searchsorted(seg_tile, tile_ids, side="left")
    seg_count = np.searchsorted(seg_tile, tile_ids, side="right") - seg_first
    tiles = np.stack([first, end, start[job], prefix_len[job], seg_first, seg_count], axis=1)
    if not len(segments):
        segments = np.zeros((1, SEGMENT_COLUMNS), dtype=np.int64)  # no tile refers to it; the kernel gets a pointer
    return tiles.astype(np.int32).reshape(-1, TILE_COLUMNS), segments.astype(np.int32)


@attrs.frozen
class PlanArrays:
    """A `KernelPlan` still on the host (numpy): what `kernel_plan` copies to the device, or `PassGraphs` into
    a captured graph's buffers."""

    positions: np.ndarray  # [N] int32
    paths: np.ndarray  # [N, depth] int32
    tables: dict[int, tuple[np.ndarray, np.ndarray]]  # BM -> (tiles [T, 6], segments [S, 4]) int32
    groups: np.ndarray | None = None  # [N, 2] int32 image spans; None: a pass without images


def plan_arrays(layout: PassLayout, sizes) -> PlanArrays:
    """The plan of ``layout`` with tile tables for each tile size in ``sizes`` (query rows per program, see
    `tile_rows`), on the host."""
    n = layout.num_tokens
    spans = np.asarray(layout.spans, dtype=np.int64).reshape(-1, 3)
    positions = np.asarray(layout.positions, dtype=np.int64)
    branch = np.asarray(layout.branch_rows, dtype=np.int64)
    parent = np.full(n, -1, dtype=np.int64)
    parent[branch] = layout.parents
    # a branch row's depth is its position past its job's prefix; its path has depth + 1 rows
    row_job = np.repeat(np.arange(len(spans)), spans[:, 1] + spans[:, 2])
    path_len = np.zeros(n, dtype=np.int64)
    depth = positions[branch] - spans[row_job[branch], 1]
    path_len[branch] = depth + 1
    width = int(path_len.max(initial=0))
    paths = np.full((n, max(width, 1)), -1, dtype=np.int32)
    for level in range(width):  # level by level: a row's path is its parent's, then itself
        at = branch[depth == level]
        if level:
            paths[at, :level] = paths[parent[at], :level]
        paths[at, level] = at
    tables = {bm: _tiles(spans, row_job, parent, path_len, bm) for bm in sorted(set(sizes))}
    groups = vision_groups(layout)
    return PlanArrays(positions.astype(np.int32), paths, tables, None if groups is None else groups.astype(np.int32))


def kernel_plan(layout: PassLayout, device: torch.device, sizes) -> KernelPlan:
    """The plan of ``layout`` (`plan_arrays`), copied to ``device`` without blocking."""
    return device_plan(plan_arrays(layout, sizes), device)


def device_plan(arrays: PlanArrays, device: torch.device) -> KernelPlan:
    """``arrays`` copied to ``device`` without blocking."""
    return KernelPlan(
        positions=to_device(arrays.positions, device),
        paths=to_device(arrays.paths, device),
        tiles={bm: to_device(t, device) for bm, (t, _) in arrays.tables.items()},
        segments={bm: to_device(s, device) for bm, (_, s) in arrays.tables.items()},
        groups=None if arrays.groups is None else to_device(arrays.groups, device),
    )


def to_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on ``device``; to a GPU through reused pinned memory without blocking the host
    (`spinf.engine.pinned`)."""
    if device.type == "cuda":
        from spinf.engine.pinned import stager

        return stager(device).to_device(a)
    return torch.from_numpy(a).to(device)


def tree_attention_kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: KernelPlan,
    window: int | None,
    config: tuple[int, ...] | None = None,
    out_scale: float | None = None,
    bidirectional: int = BIDIRECTIONAL_NONE,
) -> torch.Tensor:
    """Attention of every row of a pass (softmax scale 1). q [N, H, D]; k, v [N, Hkv, D] -> [N, H, D] in q's dtype.

    q, k and v may be strided views (rows apart by any stride, heads contiguous). ``config`` (M, HG, BN, BP,
    warps, stages) replaces the fixed one for measurements; the plan must have tiles for its rows per program. With
    ``out_scale`` the output comes quantized to e4m3 (the o projection's fp8s input). ``bidirectional`` is the
    layer's image attention, over ``plan.groups`` (nothing without them).
    """
    n, heads, dim = q.shape
    kv_heads = k.shape[1]
    config = config or config_for(dim)
    m, _, bn, bp, warps, stages = config
    hg = heads_per_program(heads // kv_heads, config)
    dtype = torch.float8_e4m3fn if out_scale is not None else q.dtype
    # zeros, not empty: a CUDA graph's pad rows belong to no tile and are never written, and fp8's dynamic scale
    # (the amax of the whole input of the o projection and after) must not read what the memory held before
    out = torch.zeros((n, heads, dim), dtype=dtype, device=q.device)
    bm = tile_rows(dim, heads // kv_heads, config)
    tiles = plan.tiles[bm]
    if n == 0 or tiles.shape[0] == 0:
        return out
    for t in (q, k, v):
        if t.stride(2) != 1 or t.stride(1) != dim:
            raise ValueError("tree attention needs heads laid out contiguously within a row")
    _tree_attention_kernel[(tiles.shape[0], heads // hg)](
        q,
        k,
        v,
        out,
        plan.positions,
        plan.paths,
        tiles,
        plan.segments[bm],
        plan.positions if plan.groups is None else plan.groups,  # not read without BIDIR
        q.stride(0),
        k.stride(0),
        v.stride(0),
        out.stride(0),
        plan.paths.shape[1],
        NO_WINDOW if window is None else window,
        1.0 if out_scale is None else 1.0 / out_scale,
        GROUP=heads // kv_heads,
        HG=hg,
        D=dim,
        M=m,
        BN=bn,
        BP=bp,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # fp32 models get fp32 products, not tf32
        QUANT=out_scale is not None,
        BIDIR=BIDIRECTIONAL_NONE if plan.groups is None else bidirectional,
        num_warps=warps,
        num_stages=stages,
    )
    return out
