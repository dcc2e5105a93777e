"""Row-stable GEMMs on the CPU: a row's product never depends on how many rows share the call.

CPU BLAS picks kernels and thread splits by the row count (MKL's rows differ in the last bits below 16 rows, and at
17 rows with 16 threads), so every product runs on blocks of exactly ``GEMM_ROWS`` rows, the last one padded.
"""

from __future__ import annotations

import torch

GEMM_ROWS = 128  # every CPU GEMM runs on blocks of exactly this many rows (the last one padded)


def row_stable_mm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` whose rows do not depend on how many rows ``x`` has or where a row sits.

    CPU BLAS picks kernels and thread splits by the row count (MKL's rows differ in the last bits below 16 rows,
    and at 17 rows with 16 threads). Fixed-size blocks give every row the same kernel and the same split.
    """
    rows = x.shape[0]
    padded = -(-rows // GEMM_ROWS) * GEMM_ROWS
    if padded != rows:
        x = torch.cat([x, x.new_zeros((padded - rows, x.shape[1]))])
    out = torch.cat([block @ weight.t() for block in x.split(GEMM_ROWS)]) if padded else x @ weight.t()
    return out[:rows]


# On the H200, bf16 products change a row's bits with the row count below 385 rows (down projection, measured in
# benchmarks/gpu_probe.py) and not above: shorter inputs are padded to this many rows.
GPU_BF16_MIN_ROWS = 512


def gpu_mm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` in bf16 on a GPU, padded to at least ``GPU_BF16_MIN_ROWS`` rows so cuBLAS keeps one kernel
    family for every row count (a measured property of the card; benchmarks/gpu_probe.py re-checks it)."""
    rows = x.shape[0]
    if rows >= GPU_BF16_MIN_ROWS:
        return x @ weight.t()
    padded = torch.cat([x, x.new_zeros((GPU_BF16_MIN_ROWS - rows, x.shape[1]))])
    return (padded @ weight.t())[:rows]


# The media embedders' products (spinf.engine.gemma4.embedders) run on blocks of exactly this many rows on a GPU: one
# shape per weight, so no row's bits depend on how many items a pass embeds (their shapes were not among those
# measured).
GPU_BLOCK_ROWS = 1024


def stable_mm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` in blocks of a fixed row count, the last one padded: `row_stable_mm` on the CPU, blocks of
    ``GPU_BLOCK_ROWS`` on a GPU."""
    if x.device.type != "cuda":
        return row_stable_mm(x, weight)
    return in_row_blocks(x, lambda block: block @ weight.t())


def in_row_blocks(x: torch.Tensor, product, rows: int = GPU_BLOCK_ROWS) -> torch.Tensor:
    """``product`` (a row-wise function of a 2-D tensor, a GEMM say) on blocks of exactly ``rows`` rows of ``x``,
    the last one padded with zero rows: every call of ``product`` has the same shape (and a contiguous block)
    whatever ``x``'s row count. Only the last block's rows are copied; the whole blocks are ``x``'s own rows."""
    count = x.shape[0]
    whole = count - count % rows
    parts = [product(x[start : start + rows].contiguous()) for start in range(0, whole, rows)]
    if whole != count or not parts:
        last = x.new_zeros((rows, x.shape[1]))
        last[: count - whole] = x[whole:]
        parts.append(product(last)[: count - whole])
    return parts[0] if len(parts) == 1 else torch.cat(parts)


__all__ = ["GEMM_ROWS", "GPU_BF16_MIN_ROWS", "GPU_BLOCK_ROWS", "gpu_mm", "in_row_blocks", "row_stable_mm", "stable_mm"]
