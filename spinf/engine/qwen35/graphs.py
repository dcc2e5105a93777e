"""CUDA graphs for the Qwen3.5 stack's scoring passes (engine spec C.3), in pieces around the recurrences.

A small Qwen pass is launch-bound as a small Gemma pass is: the 27B's 64 layers launch about 2,700 kernels and copies
for a 300-token call, and the host takes longer to launch them than the GPU takes to run them. One graph cannot hold
a whole pass, though: the recurrence of a GDN layer is shaped by the pass's tries (a launch per level of segments,
as many levels as the tries are deep) and by its fixed prefixes (fla's chunked calls, with tables made on the host).
Everything else in a layer is row-wise, or reads the tree-attention plan's tables, which a bucket's buffers hold as
the Gemma stack's graphs do (`spinf.engine.graphs`).

So a pass of a bucket runs as pieces, each one CUDA graph, with the recurrences between them (the pass's own graph,
`PassRecurrence`: captured at the first GDN layer, replayed at each):

* piece 0: the embedding, the rotary angles, every layer before the first GDN layer, and that layer's part before
  its recurrence (`DecoderLayer.mixer_inputs`: the norm, the input projections, the convolution, the recurrence's
  inputs);
* piece j: GDN layer ``j - 1``'s part after its recurrence (`DecoderLayer.mixer_finish`: the gated norm, out_proj,
  the residual and the MLP), the full-attention layers after it, and the next GDN layer's part before its recurrence;
  the last piece ends with the last layer.

A piece's results go to buffers (`Static`) that the recurrence reads and the next piece reads, one set of the largest
bucket's rows shared by every bucket (a view of its first rows each), since one pass runs at a time. On a GPU the
kernels write them there themselves (the input projection with z, the recurrence's inputs, the last layer's rows):
only piece 0 copies (the rotary angles, and the embedded rows when the first layer is a GDN layer). The 27B makes 49
graphs a bucket, and each recurrence between them is a few launches, so the host launches a tenth of what it did.

Bits: a row goes through the same kernels as in the eager pass, each on the bucket's rows instead of the pass's (the
kernels and products give a row the same bits whatever the row count, as for the Gemma graphs); the recurrence runs
the pass's own plan over the same inputs (in buffers, so with other strides, which change no arithmetic), and its
graph holds the kernels an eager recurrence launches, with the same arguments. Pad rows get
token 0, position 0, no tile, and convolution taps on the zero row; no segment names them, so the recurrence leaves
their outputs as they were (finite: zeros, or an earlier pass's). tests/engine/qwen35/test_gpu_qwen35_graphs.py
compares graphed passes with eager ones bit for bit; the CPU test runs the pieces eagerly against the forward.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import numpy as np
import torch

from spinf.engine.graphs import BUCKETS, PassGraphs
from spinf.engine.qwen35.gdn import delta_rule
from spinf.engine.qwen35.plan import Qwen35Plan

log = logging.getLogger(__name__)
INPUTS = ("q", "k", "v", "g", "beta", "decay")  # a recurrence's inputs, as `GatedDeltaNet.recurrence_inputs` gives


@attrs.define(eq=False)
class Static:
    """What the pieces of one bucket read and write: its token ids and plan (buffers of the bucket's rows), and the
    pieces' results, as views of the first ``rows`` rows of buffers of ``capacity`` rows (``arena``, shared by every
    bucket), made on first use (outside any capture: a graph's first eager run)."""

    rows: int
    tokens: torch.Tensor
    plan: Qwen35Plan
    arena: dict[str, torch.Tensor]
    capacity: int

    def keep(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """``value`` [rows, ...] under ``name``: copied into its buffer, or, where a kernel wrote it into a buffer
        already (`place`: ``value`` lies in one), that buffer's view under this name too, with no copy."""
        if self._placed(value):
            self.arena[name] = value.as_strided((self.capacity, *value.shape[1:]), value.stride())
            return self[name]
        view = self.buffer(name, value)
        view.copy_(value)
        return view

    def buffer(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """The view of buffer ``name``, made (zeros) shaped and typed as ``like`` on first use."""
        return self.place(name, tuple(like.shape), like.dtype, like.device)

    def place(
        self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | None = None
    ) -> torch.Tensor:
        """The view of buffer ``name`` [rows, ...], made (zeros of ``capacity`` rows) on first use: where a kernel
        writes a result the next eager step reads (`spinf.engine.kernels.qwen_rows.gdn_inputs`'s ``empty``)."""
        if shape[0] != self.rows:
            raise ValueError(f"buffer {name} of {shape[0]} rows in a bucket of {self.rows}")
        if name not in self.arena:
            device = self.tokens.device if device is None else device
            self.arena[name] = torch.zeros((self.capacity, *shape[1:]), dtype=dtype, device=device)
        view = self.arena[name][: self.rows]
        if view.shape[1:] != shape[1:] or view.dtype != dtype:
            raise ValueError(f"buffer {name} is {tuple(view.shape)} {view.dtype}, asked for {shape} {dtype}")
        return view

    def _placed(self, value: torch.Tensor) -> bool:
        """Whether ``value`` lies in one of the buffers (a view of one's first rows)."""
        storage = value.untyped_storage().data_ptr()
        return any(buffer.untyped_storage().data_ptr() == storage for buffer in self.arena.values())

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.arena[name][: self.rows]


def recurrent_layers(model) -> tuple[int, ...]:
    """The GDN layers' indices: where the pieces are cut."""
    return tuple(i for i, layer in enumerate(model.layers) if not layer.is_attention)


def run_piece(model, cores: tuple[int, ...], j: int, static: Static) -> None:
    """Piece ``j`` of a pass (see the module's text) over ``static``'s rows."""
    layers = model.layers
    last = cores[j] if j < len(cores) else len(layers)
    if j == 0:
        h = torch.nn.functional.embedding(static.tokens, model.embed)
        cos, sin = model.rope(static.plan)
        rope = static.keep("cos", cos), static.keep("sin", sin)
        run = layers[:last]
    else:
        rope = static["cos"], static["sin"]
        run = layers[cores[j - 1] + 1 : last]
        # the piece's last layer writes its rows into buffer "h" (the GDN layer's part here reads it before that)
        h = layers[cores[j - 1]].mixer_finish(static["h"], static["o"], static["z"], None if run else static["h"])
    for i, layer in enumerate(run):
        h = layer(h, rope, static.plan, static.buffer("h", h) if i == len(run) - 1 else None)
    if j < len(cores):
        z, inputs = layers[cores[j]].mixer_inputs(h, static.plan, static.place)
        static.keep("z", z)
        for name, value in zip(INPUTS, inputs, strict=True):
            static.keep(name, value)  # on a GPU, in the buffers the kernels wrote: no copies
        static.buffer("o", inputs[2])  # the recurrence's outputs, shaped as v
    static.keep("h", h)


def run_recurrence(static: Static, plan: Qwen35Plan) -> None:
    """The recurrence after a piece, eager: the pass's own ``plan`` over the inputs the piece kept, its outputs into
    the buffer the next piece reads."""
    q, k, v, g, beta, decay = (static[name] for name in INPUTS)
    delta_rule(q, k, v, g, beta, plan, None, decay, out=static["o"])


def run_pieces(
    model,
    static: Static,
    plan: Qwen35Plan,
    graphs: list[torch.cuda.CUDAGraph] | None = None,
    recurrence: Callable[[], None] | None = None,
) -> torch.Tensor:
    """A whole pass through the pieces, each replayed from ``graphs`` or, without them, run eagerly (the CPU tests
    compare that with the forward), a recurrence after each but the last (``recurrence()`` when given, else
    `run_recurrence`): its hidden states [rows, hidden]."""
    cores = recurrent_layers(model)
    for j in range(len(cores) + 1):
        if graphs is None:
            run_piece(model, cores, j, static)
        else:
            graphs[j].replay()
        if j < len(cores):
            if recurrence is None:
                run_recurrence(static, plan)
            else:
                recurrence()
    return static["h"]


class PassRecurrence:
    """A pass's recurrence as one CUDA graph, captured at its first GDN layer and replayed at every layer.

    Launching a recurrence eagerly costs the host about 1.5 ms (fla's chunked call, a Python wrapper around six
    Triton launches, and a launch per trie level), about what the GPU takes for a layer's piece of a short pass,
    so the host barely kept ahead of the GPU (an H100's J3: 71 ms a call, 69 with this graph and the pinned
    staging). Every GDN layer of a pass runs the same recurrence (the pass's plan, the same buffers: each layer's
    inputs and outputs are the same views of `Static`'s buffers), so the launches are recorded once and replayed:
    the same kernels with the same arguments, so the same bits.

    The capture runs on a side stream (a capture cannot use the legacy default stream), without `torch.cuda.graph`'s
    synchronize, collection and cache emptying, in ``pool`` (one pool for every pass: a pass's graph replaces the
    last one's, and their replays are ordered on the pass's stream). If the driver refuses the capture, the pass's
    recurrences run eagerly and ``failed`` says so."""

    def __init__(self, static: Static, plan: Qwen35Plan, pool, side: torch.cuda.Stream):
        self.static, self.plan, self.pool, self.side = static, plan, pool, side
        self.graph: torch.cuda.CUDAGraph | None = None
        self.failed = False

    def __call__(self) -> None:
        if self.graph is None and not self.failed:
            self.graph = self._capture()
        if self.graph is None:
            run_recurrence(self.static, self.plan)
        else:
            self.graph.replay()

    def _capture(self) -> torch.cuda.CUDAGraph | None:
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream(self.side.device)
        self.side.wait_stream(current)
        try:
            with torch.cuda.stream(self.side):
                graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
                try:
                    run_recurrence(self.static, self.plan)
                finally:
                    graph.capture_end()
        except RuntimeError:
            log.exception("capturing a pass's recurrence failed; its recurrences run eagerly")
            self.failed = True
            return None
        current.wait_stream(self.side)
        return graph


@attrs.define(eq=False)
class _Pieces:
    tokens: torch.Tensor  # [B] int64
    plan: object  # the bucket's `KernelPlan` (`PassGraphs._fill` fills it)
    static: Static
    graphs: list[torch.cuda.CUDAGraph]


class QwenPassGraphs(PassGraphs):
    """The pieces of each bucket, captured lazily in the executor's thread; `run` replays them around the pass's
    eager recurrences, or returns None (the pass runs eagerly)."""

    def __init__(self, model, device: torch.device, tile_sizes):
        super().__init__(model, device, tile_sizes)
        self.cores = recurrent_layers(model)
        self._arena: dict[str, torch.Tensor] = {}
        # each pass's recurrence as one graph (`PassRecurrence`), in a pool of their own, captured on a side stream
        self._recurrence_pool = None
        self._side: torch.cuda.Stream | None = None
        self._recurrence: PassRecurrence | None = None  # the last pass's (after a failed capture, no new ones)

    @property
    def recurrence_failed(self) -> bool:
        """Whether a pass's recurrence capture was refused (the recurrences run eagerly from then on)."""
        return self._recurrence is not None and self._recurrence.failed

    def run(self, token_ids: np.ndarray, arrays, layout=None) -> torch.Tensor | None:
        if layout is None or layout.media:  # the recurrence needs the pass's layout; images move rotary positions
            return None
        graph = self._ready(len(token_ids), arrays)
        if graph is None:
            return None
        self._fill(graph, token_ids, arrays)
        static = graph.static
        plan = self.model.pass_plan(layout, static.plan.attention, taps=static.plan.taps)
        recurrence = None
        if not self.recurrence_failed:
            if self._recurrence_pool is None:
                self._recurrence_pool = torch.cuda.graph_pool_handle()
                self._side = torch.cuda.Stream(self.device)
            recurrence = PassRecurrence(static, plan, self._recurrence_pool, self._side)
        hidden = run_pieces(self.model, static, plan, graph.graphs, recurrence)
        if recurrence is not None:
            # the last pass's graph goes only now: the pool must have a live graph when this pass's capture begins
            # (the stream orders the last pass's replays before this pass's, so their shared blocks never clash)
            self._recurrence = recurrence
        self.replays += 1
        return hidden[: len(token_ids)]

    def _capture(self, bucket: int) -> _Pieces:
        device = self.device
        tokens, kernel_plan, attention = self._static(bucket)
        taps = torch.zeros((bucket, self.model.cfg.linear_conv_kernel_dim), dtype=torch.long, device=device)
        plan = Qwen35Plan(attention=attention, taps=taps, segments=(), kept=frozenset())
        static = Static(bucket, tokens, plan, self._arena, BUCKETS[-1])
        count = len(self.cores) + 1
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # once eagerly first: Triton compiles, the buffers and constants are made
            for j in range(count):
                run_piece(self.model, self.cores, j, static)
        torch.cuda.current_stream(device).wait_stream(side)
        graphs = []
        for j in range(count):  # one pool: the pieces replay in the order they were captured
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                run_piece(self.model, self.cores, j, static)
            self._pool = graph.pool()
            graphs.append(graph)
        log.info("captured the %d CUDA graphs of %d-token passes", count, bucket)
        return _Pieces(tokens, kernel_plan, static, graphs)
