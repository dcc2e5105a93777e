"""Tree attention in one Triton kernel: the content part in key tiles anchored at the job's start, then the
question's own path in root-first order, as one running softmax (engine spec C.1).

The plain torch version is `spinf.engine.attention.tree_attention`; this kernel computes the same attention. A
program takes a tile of ``BM`` query rows of one job and one query head:

1. **Content part.** Keys are the job's prefix, visited in tiles of ``BN`` keys numbered from the job's first row,
   in ascending order. A query row sees key ``i`` when ``i <= pos`` (causal inside the prefix; a branch row's
   position is past the prefix, so it sees all of it) and, on sliding layers, ``pos - i < window``. The tiles a row
   visits, and the keys in each, depend on the content and the row's position alone.
2. **Path part.** Then the row's path (ancestors root first, then itself) one key at a time, gathered through the
   plan's path table, in fp32.

Every step updates the row's running maximum, normaliser and output. A step in which a row sees nothing (a tile
outside its window, a path slot past its depth) leaves all three bit for bit unchanged, so which other rows share
the program, and how deep they go, never changes a row's result. One fixed configuration per head dimension; no
autotuning.
"""

from __future__ import annotations

import attrs
import numpy as np
import torch
import triton
import triton.language as tl

from spinf.engine.layout import PassLayout

NO_WINDOW = 1 << 30
# (M, BN, warps, stages) per head dimension, fixed, never tuned at run time. A program takes M (query row, head)
# pairs: M // group query rows of one job times the group of query heads that share one KV head, so the group
# shares each key and value tile it loads.
# (benchmarks/attention_configs.py, H200, J1's first pass of 16,145 rows: d=256 1.33 ms, d=512 2.44 ms per layer)
CONFIGS = {256: (32, 64, 4, 2), 512: (32, 32, 4, 2)}
SMALL_CONFIG = (32, 32, 4, 1)  # head dims below 256 (test models)


def config_for(head_dim: int) -> tuple[int, int, int, int]:
    return CONFIGS.get(head_dim, SMALL_CONFIG)


def tile_rows(head_dim: int, group: int, config: tuple[int, int, int, int] | None = None) -> int:
    """Query rows per program for a layer kind: the config's M over the heads that share a KV head."""
    m = (config or config_for(head_dim))[0]
    if m % group:
        raise ValueError(f"a tile of {m} (row, head) pairs cannot hold whole groups of {group} heads")
    return m // group


@triton.jit
def _tree_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    pos_ptr,
    path_ptr,
    tiles_ptr,
    q_row,
    k_row,
    v_row,
    o_row,
    path_width,
    window,
    inv_scale,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    M: tl.constexpr,
    BN: tl.constexpr,
    PRECISION: tl.constexpr,
    QUANT: tl.constexpr,
):
    tile = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    first = tl.load(tiles_ptr + tile * 5 + 0)
    end = tl.load(tiles_ptr + tile * 5 + 1)
    job = tl.load(tiles_ptr + tile * 5 + 2).to(tl.int64)
    prefix_len = tl.load(tiles_ptr + tile * 5 + 3)
    depth = tl.load(tiles_ptr + tile * 5 + 4)

    pair = tl.arange(0, M)  # (query row, head) pairs: row-major over the group's heads
    rows = (first + pair // GROUP).to(tl.int64)
    heads = kv_head * GROUP + pair % GROUP
    live = rows < end
    dims = tl.arange(0, D)
    q = tl.load(q_ptr + rows[:, None] * q_row + heads[:, None] * D + dims[None, :], mask=live[:, None], other=0.0)
    q_pos = tl.load(pos_ptr + rows, mask=live, other=0)
    m = tl.full([M], float("-inf"), tl.float32)
    total = tl.zeros([M], tl.float32)
    acc = tl.zeros([M, D], tl.float32)

    # content part: prefix keys in BN-tiles counted from the job's first row
    lo = tl.maximum(tl.min(tl.where(live, q_pos, 1 << 30), axis=0) - window + 1, 0)
    hi = tl.minimum(tl.max(tl.where(live, q_pos, 0), axis=0) + 1, prefix_len)
    for block in range(lo // BN, tl.cdiv(hi, BN)):
        keys = block * BN + tl.arange(0, BN)
        in_prefix = keys < prefix_len
        k = tl.load(
            k_ptr + (job + keys)[:, None] * k_row + kv_head * D + dims[None, :], mask=in_prefix[:, None], other=0.0
        )
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        seen = in_prefix[None, :] & (keys[None, :] <= q_pos[:, None]) & (q_pos[:, None] - keys[None, :] < window)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_use)
        p = tl.exp(s - m_use[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        v = tl.load(
            v_ptr + (job + keys)[:, None] * v_row + kv_head * D + dims[None, :], mask=in_prefix[:, None], other=0.0
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new

    # path part: the row's own path, root first, one key per pair and step. The gathered keys form an [M, D]
    # tile whose row i belongs to pair i, so the wanted scores are the diagonal of q · kᵀ and the weighted
    # values a diagonal p times v: tensor-core products in which each pair sees only its own key. (Fetching two
    # steps ahead was measured slower: 1.44 against 1.33 ms at d=256, and register spills at d=512.)
    diagonal = pair[:, None] == pair[None, :]
    for step in range(0, depth):
        at = tl.load(path_ptr + rows * path_width + step, mask=live, other=-1).to(tl.int64)
        seen = at >= 0
        k_pos = tl.load(pos_ptr + at, mask=seen, other=0)
        seen = seen & (q_pos - k_pos < window)
        k = tl.load(k_ptr + at[:, None] * k_row + kv_head * D + dims[None, :], mask=seen[:, None], other=0.0)
        s = tl.sum(tl.where(diagonal, tl.dot(q, tl.trans(k), input_precision=PRECISION), 0.0), axis=1)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m, s)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_use)
        p = tl.exp(s - m_use)
        total = total * alpha + p
        v = tl.load(v_ptr + at[:, None] * v_row + kv_head * D + dims[None, :], mask=seen[:, None], other=0.0)
        weights = tl.where(diagonal, p[:, None], 0.0).to(v.dtype)
        acc = acc * alpha[:, None] + tl.dot(weights, v, input_precision=PRECISION)
        m = m_new

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
    have no path. ``tiles[bm]`` holds one ``(first row, end row, job start, prefix length, deepest path)`` per
    tile of ``bm`` query rows; tiles never cross a job.
    """

    positions: torch.Tensor  # [N] int32
    paths: torch.Tensor  # [N, depth] int32
    tiles: dict[int, torch.Tensor]  # BM -> [T, 5] int32


def _tiles(spans, depth_of_row: np.ndarray, bm: int) -> np.ndarray:
    out = []
    for start, prefix_len, branches in spans:
        end = start + prefix_len + branches
        for first in range(start, end, bm):
            last = min(first + bm, end)
            out.append((first, last, start, prefix_len, int(depth_of_row[first:last].max(initial=0))))
    return np.asarray(out, dtype=np.int32).reshape(-1, 5)


def kernel_plan(layout: PassLayout, device: torch.device, sizes) -> KernelPlan:
    """The plan of ``layout`` with tile tables for each tile size in ``sizes`` (query rows per program, see
    `tile_rows`), copied to ``device`` without blocking."""
    n = layout.num_tokens
    depth = max((len(p) for p in layout.paths), default=0)
    paths = np.full((n, max(depth, 1)), -1, dtype=np.int32)
    depth_of_row = np.zeros(n, dtype=np.int32)
    for row, path in zip(layout.branch_rows, layout.paths, strict=True):
        paths[row, : len(path)] = path
        depth_of_row[row] = len(path)
    tiles = {bm: _tiles(layout.spans, depth_of_row, bm) for bm in sorted(set(sizes))}
    return KernelPlan(
        positions=to_device(np.asarray(layout.positions, dtype=np.int32), device),
        paths=to_device(paths, device),
        tiles={bm: to_device(t, device) for bm, t in tiles.items()},
    )


def to_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on ``device``; to a GPU through pinned memory without blocking the host."""
    t = torch.from_numpy(a)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def tree_attention_kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: KernelPlan,
    window: int | None,
    config: tuple[int, int, int, int] | None = None,
    out_scale: float | None = None,
) -> torch.Tensor:
    """Attention of every row of a pass (softmax scale 1). q [N, H, D]; k, v [N, Hkv, D] -> [N, H, D] in q's dtype.

    q, k and v may be strided views (rows apart by any stride, heads contiguous). ``config`` (M, BN, warps,
    stages) replaces the fixed one for measurements; the plan must have tiles for its rows per program. With
    ``out_scale`` the output comes quantized to e4m3 (the o projection's fp8s input).
    """
    n, heads, dim = q.shape
    kv_heads = k.shape[1]
    m, bn, warps, stages = config or config_for(dim)
    dtype = torch.float8_e4m3fn if out_scale is not None else q.dtype
    out = torch.empty((n, heads, dim), dtype=dtype, device=q.device)
    tiles = plan.tiles[tile_rows(dim, heads // kv_heads, config)]
    if n == 0 or tiles.shape[0] == 0:
        return out
    for t in (q, k, v):
        if t.stride(2) != 1 or t.stride(1) != dim:
            raise ValueError("tree attention needs heads laid out contiguously within a row")
    _tree_attention_kernel[(tiles.shape[0], kv_heads)](
        q,
        k,
        v,
        out,
        plan.positions,
        plan.paths,
        tiles,
        q.stride(0),
        k.stride(0),
        v.stride(0),
        out.stride(0),
        plan.paths.shape[1],
        NO_WINDOW if window is None else window,
        1.0 if out_scale is None else 1.0 / out_scale,
        GROUP=heads // kv_heads,
        D=dim,
        M=m,
        BN=bn,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # fp32 models get fp32 products, not tf32
        QUANT=out_scale is not None,
        num_warps=warps,
        num_stages=stages,
    )
    return out
