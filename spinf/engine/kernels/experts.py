"""The experts' grouped products on a GPU (`spinf.engine.gemma4.moe`): every expert's rows in one launch per
projection.

`expert_plan` turns each row's chosen experts [N, k] into slots: the N·k (row, rank) pairs grouped by expert (within
an expert by row), with each expert's first slot and first tile, all on the device with integer torch operations
(no host sync, so a CUDA graph captures it). `grouped_mm` then runs one program per (tile of ``TILE_ROWS`` slots of
one expert, ``TILE_COLS`` output columns): it gathers its slots' input rows (``gather``) or reads them in slot order,
multiplies them by that expert's weight over the inputs in steps of ``TILE_INPUTS``, always in the same order, and
writes each slot's row. The grid is sized by N alone (``cdiv(N·k, TILE_ROWS) + experts``, the most tiles any
routing needs); programs beyond the routing's tiles do nothing. The column tiles of a row tile are neighbours in the
launch order and an expert's row tiles follow one another, so the programs running at once share one or two
experts' weights through the L2 cache (each expert's weight read from memory about once).

A row's result depends on that row and its expert's weight only: one fixed tile (no autotuning), no split along
the inputs, and each output element one dot per step whose bits do not depend on the tile's other rows (as for the
int4 products of `spinf.engine.kernels.int4`), so neither how many rows an expert got nor where a row sits in its
tile moves a bit. Under fp8s (an `spinf.engine.gemma4.moe.ExpertsFp8`) each program quantizes its rows by its expert's
static input scale (a power of two: the product by its inverse is exact) as `spinf.engine.quant.quantize` does,
multiplies in e4m3, and scales each sum once by the input scale times the weight row's.

Through Triton's interpreter on the CPU (tests/engine/test_experts.py) in fp32; compiled on a GPU in bf16 or e4m3.
"""

from __future__ import annotations

import attrs
import torch
import triton
import triton.language as tl

TILE_ROWS, TILE_COLS, TILE_INPUTS = 64, 128, 64  # slots × output columns per program, inputs per step (fixed)
_COMBINE_COLUMNS = 1024  # columns per program of `combine` (fixed)


@attrs.frozen
class ExpertPlan:
    """Where each (row, rank) goes: ``slot_rows`` int32 [N·k] (the row each slot reads, slots grouped by expert),
    ``slot_of`` int64 [N, k] (each pair's slot), ``offsets`` int32 [experts + 1] (each expert's first slot) and
    ``tile_starts`` int32 [experts + 1] (each expert's first tile), and ``tiles``, the grid's tile bound."""

    slot_rows: torch.Tensor
    slot_of: torch.Tensor
    offsets: torch.Tensor
    tile_starts: torch.Tensor
    tiles: int


def expert_plan(chosen: torch.Tensor, experts: int) -> ExpertPlan:
    """The slots of rows that chose ``chosen`` [N, k] (distinct experts per row) among ``experts``."""
    n, k = chosen.shape
    device = chosen.device
    picked = torch.zeros((n, experts), dtype=torch.int32, device=device).scatter_(1, chosen, 1)
    before = picked.cumsum(0, dtype=torch.int32) - picked  # [N, E]: earlier rows that chose the same expert
    counts = picked.sum(0, dtype=torch.int32)
    zero = torch.zeros(1, dtype=torch.int32, device=device)
    offsets = torch.cat([zero, counts.cumsum(0, dtype=torch.int32)])
    slot_of = (offsets[chosen] + before.gather(1, chosen)).long()
    rows = torch.arange(n, dtype=torch.int32, device=device)[:, None].expand(n, k).reshape(-1)  # no host sync
    slot_rows = torch.empty(n * k, dtype=torch.int32, device=device).scatter_(0, slot_of.reshape(-1), rows)
    tiles = torch.cat([zero, torch.div(counts + TILE_ROWS - 1, TILE_ROWS, rounding_mode="floor").cumsum(0)])
    return ExpertPlan(slot_rows, slot_of, offsets, tiles.to(torch.int32), triton.cdiv(n * k, TILE_ROWS) + experts)


@triton.jit
def _grouped_kernel(
    x_ptr, rows_ptr, w_ptr, out_ptr, offsets_ptr, tiles_ptr, in_scale_ptr, w_scale_ptr, n_out, n_in, experts,
    GATHER: tl.constexpr, FP8: tl.constexpr, EXPERTS: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(1)
    ids = tl.arange(0, EXPERTS)
    ends = tl.load(tiles_ptr + 1 + ids, mask=ids < experts, other=2**30)
    e = tl.sum((ends <= pid).to(tl.int32), axis=0)  # the expert whose tiles hold tile ``pid``
    live_program = e < experts
    e = tl.minimum(e, experts - 1)
    first = tl.load(offsets_ptr + e) + (pid - tl.load(tiles_ptr + e)) * BM
    slots = first + tl.arange(0, BM)
    live = slots < tl.where(live_program, tl.load(offsets_ptr + e + 1), 0)  # none past the routing's tiles
    if GATHER:
        src = tl.load(rows_ptr + slots, mask=live, other=0).to(tl.int64)
    else:
        src = slots.to(tl.int64)
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    col_ok = cols < n_out
    w_base = w_ptr + e.to(tl.int64) * n_out * n_in
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    if FP8:
        inv = 1.0 / tl.load(in_scale_ptr + e)
    for start in range(0, tl.where(live_program, n_in, 0), BK):
        ks = start + tl.arange(0, BK)
        k_ok = ks < n_in
        a = tl.load(x_ptr + src[:, None] * n_in + ks[None, :], mask=live[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(
            w_base + cols[None, :].to(tl.int64) * n_in + ks[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0
        )
        if FP8:
            a = tl.minimum(tl.maximum(a.to(tl.float32) * inv, -448.0), 448.0).to(tl.float8e4nv)
        acc += tl.dot(a, b)
    if FP8:
        row_scales = tl.load(w_scale_ptr + e.to(tl.int64) * n_out + cols, mask=col_ok, other=0.0)
        acc = acc * (tl.load(in_scale_ptr + e) * row_scales)[None, :]
    at = out_ptr + slots[:, None].to(tl.int64) * n_out + cols[None, :]
    tl.store(at, acc.to(out_ptr.dtype.element_ty), mask=live[:, None] & col_ok[None, :])


def grouped_mm(x: torch.Tensor, weight, plan: ExpertPlan, *, gather: bool = False) -> torch.Tensor:
    """Each slot's row times its expert's weight: ``weight`` [experts, out, in] in the model dtype, or an
    `spinf.engine.gemma4.moe.ExpertsFp8`; ``x`` [N, in] read through ``plan.slot_rows`` (``gather``) or [N·k, in] in
    slot order. Returns [N·k, out] in ``x``'s dtype, in slot order."""
    fp8 = not isinstance(weight, torch.Tensor)
    data = weight.data if fp8 else weight
    experts, n_out, n_in = data.shape
    slots = plan.slot_of.numel()
    out = torch.empty((slots, n_out), dtype=x.dtype, device=x.device)
    if slots:
        scales = (weight.input_scales, weight.scale) if fp8 else (x, x)  # any pointers; unread without FP8
        grid = (triton.cdiv(n_out, TILE_COLS), plan.tiles)
        _grouped_kernel[grid](
            x, plan.slot_rows, data, out, plan.offsets, plan.tile_starts, *scales, n_out, n_in, experts,
            GATHER=gather, FP8=fp8, EXPERTS=triton.next_power_of_2(experts),
            BM=TILE_ROWS, BN=TILE_COLS, BK=TILE_INPUTS, num_warps=4, num_stages=3,
        )  # fmt: skip
    return out


@triton.jit
def _combine_kernel(y_ptr, slots_ptr, w_ptr, out_ptr, n, K: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for k in tl.static_range(K):  # rank after rank: the order never depends on the experts
        slot = tl.load(slots_ptr + row * K + k)
        y = tl.load(y_ptr + slot * n + cols, mask=mask, other=0.0).to(tl.float32)
        total += (y * tl.load(w_ptr + row * K + k)).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * n + cols, total.to(out_ptr.dtype.element_ty), mask=mask)


def combine(out: torch.Tensor, plan: ExpertPlan, weights: torch.Tensor) -> torch.Tensor:
    """Each row's expert outputs (``out`` [N·k, hidden] in slot order) times its fp32 ``weights`` [N, k], summed in
    rank order: `spinf.engine.gemma4.moe.MoeBlock.mix`'s arithmetic bit for bit (each term rounded to the model dtype,
    the sum in fp32), in one pass over the outputs instead of a gathered copy and k passes."""
    n, k = plan.slot_of.shape
    mixed = torch.empty((n, out.shape[1]), dtype=out.dtype, device=out.device)
    if n:
        grid = (n, triton.cdiv(out.shape[1], _COMBINE_COLUMNS))
        width = out.shape[1]
        # the product and the sum stay two roundings (fp32: no fused multiply-add), as in `MoeBlock.mix`
        _combine_kernel[grid](
            out, plan.slot_of, weights.contiguous(), mixed, width, K=k, BLOCK=_COMBINE_COLUMNS, enable_fp_fusion=False
        )
    return mixed
