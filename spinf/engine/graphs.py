"""CUDA graphs for small passes (engine spec C.3): the decoder stack replayed, so the host no longer bounds them.

A small pass is launch-bound: the fused 12B stack is about ten kernels a layer, 48 layers, and launching them from
Python takes longer than a 700-token pass takes on the GPU. `PassGraphs` captures the embedding and every fused
layer once per token-count bucket (`BUCKETS`), on buffers of the bucket's size, and replays the graph for any pass
that fits: the pass's tokens and kernel plan are copied into the buffers (pad rows get token 0, position 0 and no
tile; pad tiles have ``first == end``, which the tree-attention kernel masks to nothing), the graph replays, and
the pass's rows are the first rows of its output. The LM head stays eager: its chunking follows the read rows.

Bits: a real row goes through the same kernels as in the eager pass, with only the row count of each launch
changed (the bucket's instead of the pass's), and every kernel and the fp8 products give a row the same bits
whatever the row count (spinf.engine.kernels; ``_scaled_mm``, measured). tests/engine/test_gpu_invariance.py
compares graphed passes with eager ones bit for bit.

Graphs are captured lazily, in the thread that runs the passes (the executor's), the first time a bucket is
needed; a change of the model's weights (a scheme applied after loading) drops them. A pass that does not fit a
bucket (more tokens, more jobs than `MAX_JOBS`, paths deeper than `MAX_DEPTH`) runs eagerly, and so does every pass
once a capture has failed (logged once). `all_buckets` and `bucket_of` are the bucket rule alone, torch-free in
use, so the warm-up (`spinf.engine.warm`) can capture every graph a request could otherwise pay for, and a CPU test
can check that it does.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

import attrs
import numpy as np
import torch

from spinf.engine.attention import AttentionPlan

if TYPE_CHECKING:  # Triton is imported when a graph is captured, never on the CPU
    from spinf.engine.kernels.attention import KernelPlan, PlanArrays
    from spinf.engine.layout import PassLayout

log = logging.getLogger(__name__)
BUCKETS = tuple(range(128, 1025, 128))  # token counts a graph is captured for (rows padded up to the next)
MAX_JOBS = 64  # jobs per pass a bucket's tile tables hold beside its full tiles
MAX_DEPTH = 64  # path steps per row


def all_buckets() -> tuple[int, ...]:
    """Every token count a graph is captured for: one capture each, whatever the jobs and depths of the pass
    (the tile tables and paths are sized for `MAX_JOBS` and `MAX_DEPTH`)."""
    return BUCKETS


def bucket_of(num_tokens: int) -> int | None:
    """The bucket a pass of ``num_tokens`` tokens replays (None: larger than every bucket, so eager), given that its
    jobs and depth fit (`PassGraphs` checks the tables too)."""
    return next((b for b in BUCKETS if b >= num_tokens), None)


@attrs.define(eq=False)
class _Graph:
    tokens: torch.Tensor  # [B] int64
    plan: KernelPlan  # buffers of the bucket's size
    graph: torch.cuda.CUDAGraph
    out: torch.Tensor  # [B, hidden]


class Graphed(Protocol):
    """A model whose fused passes a graph holds (the Gemma stack's)."""

    def __call__(self, token_ids: torch.Tensor, plan: AttentionPlan) -> torch.Tensor: ...

    def weights_key(self) -> tuple:
        """What identifies the weights a graph reads: a new key drops the graphs captured on the old weights."""
        ...


class PassGraphs:
    """One captured stack per bucket; `run` replays one for a pass, or returns None (run it eagerly)."""

    def __init__(self, model: Graphed, device: torch.device, tile_sizes):
        self.model, self.device, self.tile_sizes = model, device, sorted(set(tile_sizes))
        self._graphs: dict[int, _Graph] = {}
        self._pool = None
        self._signature = None
        self.failed = False
        self.replays = 0

    @property
    def captured(self) -> tuple[int, ...]:
        """The buckets whose graph is captured, ascending."""
        return tuple(sorted(self._graphs))

    def run(self, token_ids: np.ndarray, arrays: PlanArrays, layout: PassLayout | None = None) -> torch.Tensor | None:
        """The pass's hidden states [n, hidden] from a replay (a view of the graph's output, valid until the next
        replay of that bucket, which the stream orders after this pass's readers), or None. ``layout``: the pass
        (a stack whose graphs need more of it than the attention plan's arrays reads it)."""
        graph = self._ready(len(token_ids), arrays)
        if graph is None:
            return None
        self._fill(graph, token_ids, arrays)
        graph.graph.replay()
        self.replays += 1
        return graph.out[: len(token_ids)]

    def _ready(self, n: int, arrays: PlanArrays):
        """The captured graph of the bucket a pass of ``n`` tokens with ``arrays`` fits, captured now if it is not
        yet; None: the pass runs eagerly."""
        bucket = self._bucket(n, arrays)
        if bucket is None or self.failed:
            return None
        signature = self._weights()
        if signature != self._signature:  # new weights: the graphs read the old ones
            self._graphs, self._pool, self._signature = {}, None, signature
        graph = self._graphs.get(bucket)
        if graph is None:
            try:
                graph = self._graphs[bucket] = self._capture(bucket)
            except RuntimeError:  # a capture the driver refuses: eager passes from now on
                log.exception("capturing the %d-token CUDA graph failed; small passes run eagerly", bucket)
                self.failed = True
                return None
        return graph

    def _bucket(self, n: int, arrays: PlanArrays) -> int | None:
        bucket = bucket_of(n)
        if bucket is None or arrays.paths.shape[1] > MAX_DEPTH:
            return None
        for bm, (tiles, segments) in arrays.tables.items():
            if len(tiles) > _num_tiles(bucket, bm) or len(segments) > bucket + 1:
                return None
        return bucket

    def _weights(self) -> tuple:
        """What identifies the weights a graph reads (the model's `Graphed.weights_key`)."""
        return self.model.weights_key()

    def _static(self, bucket: int) -> tuple[torch.Tensor, KernelPlan, AttentionPlan]:
        """A bucket's buffers: its tokens, its kernel plan's tables (sized for `MAX_JOBS` and `MAX_DEPTH`) and the
        attention plan around them."""
        from spinf.engine.kernels.attention import KernelPlan

        device = self.device
        tokens = torch.zeros(bucket, dtype=torch.long, device=device)
        plan = KernelPlan(
            positions=torch.zeros(bucket, dtype=torch.int32, device=device),
            paths=torch.full((bucket, MAX_DEPTH), -1, dtype=torch.int32, device=device),
            tiles={
                bm: torch.zeros((_num_tiles(bucket, bm), 6), dtype=torch.int32, device=device)
                for bm in self.tile_sizes
            },
            segments={bm: torch.zeros((bucket + 1, 4), dtype=torch.int32, device=device) for bm in self.tile_sizes},
        )
        empty = torch.zeros((0, 1), dtype=torch.long, device=device)
        return tokens, plan, AttentionPlan(plan.positions, (), empty[:, 0], empty, empty.bool(), kernel=plan)

    def _capture(self, bucket: int) -> _Graph:
        device = self.device
        tokens, plan, attention = self._static(bucket)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # once eagerly first: Triton compiles, the layers' constants are made
            self.model(tokens, attention)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self.model(tokens, attention)
        self._pool = graph.pool()
        log.info("captured the CUDA graph of %d-token passes", bucket)
        return _Graph(tokens, plan, graph, out)

    def _fill(self, graph, token_ids: np.ndarray, arrays: PlanArrays) -> None:
        """The pass into the graph's buffers, padded, through pinned memory without blocking."""
        n, bucket = len(token_ids), graph.tokens.shape[0]
        fill_padded(graph.tokens, token_ids.astype(np.int64))
        fill_padded(graph.plan.positions, arrays.positions)
        paths = np.full((bucket, MAX_DEPTH), -1, dtype=np.int32)
        paths[:n, : arrays.paths.shape[1]] = arrays.paths
        _copy(graph.plan.paths, paths)
        for bm, (tiles, segments) in arrays.tables.items():
            fill_padded(graph.plan.tiles[bm], tiles)
            fill_padded(graph.plan.segments[bm], segments)


def _num_tiles(bucket: int, bm: int) -> int:
    return -(-bucket // bm) + MAX_JOBS


def fill_padded(target: torch.Tensor, a: np.ndarray) -> None:
    """A graph's buffer ``target`` holds ``a`` in its first places and zeros past them (copied without blocking)."""
    out = np.zeros(tuple(target.shape), dtype=a.dtype)
    out[tuple(slice(0, k) for k in a.shape)] = a
    _copy(target, out)


def _copy(target: torch.Tensor, a: np.ndarray) -> None:
    """``a`` into the device buffer ``target`` through reused pinned memory, not blocking (`spinf.engine.pinned`)."""
    from spinf.engine.pinned import stager

    stager(target.device).copy_into(target, a)
