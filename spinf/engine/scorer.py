"""The engine loop's runner: lays out one pass, runs it through the model, reads the wanted log-probs back.

The scorer decides nothing (the loop's scheduler chose the pass); it returns plain Python floats keyed by
``(job, node, token)``, never tensors. `start` launches a pass without waiting for it and `collect` reads it back,
so the loop's host work overlaps the device.
Only the read rows go through the final norm and the LM head, and only the wanted columns leave the log-softmax.
It keeps no buffer between runs (every pass allocates its own tensors), so a run that fails leaves nothing
half-filled behind: once `Scorer.free_failed` has dropped what the failed run held, the next run starts clean.
"""

from __future__ import annotations

import contextlib
import gc
import time
import traceback
from typing import TYPE_CHECKING

import attrs
import numpy as np
import torch

from spinf.engine.attention import AttentionPlan, Capture, attention_plan
from spinf.engine.extraction.decoder import Captured, SlotStart
from spinf.engine.head import HEAD_ROWS
from spinf.engine.layout import PassLayout, build_pass
from spinf.engine.trie import Job

if TYPE_CHECKING:
    from spinf.engine.stack import Embedders, TextStack

# How running out of memory reads when torch raises a plain RuntimeError: the CPU allocator ("DefaultCPUAllocator:
# can't allocate memory"), a CUDA call outside the caching allocator ("CUDA error: out of memory"), cuBLAS.
_OUT_OF_MEMORY = ("out of memory", "can't allocate memory", "CUBLAS_STATUS_ALLOC_FAILED")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says the device or the host ran out of memory: `torch.OutOfMemoryError` (the CUDA caching
    allocator, some CPU paths), `MemoryError` (numpy's host arrays) or a `RuntimeError` that says so."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(marker in str(exc) for marker in _OUT_OF_MEMORY)


@contextlib.contextmanager
def one_cpu_thread(device: torch.device):
    """On the CPU, run a pass on one intra-op thread.

    torch splits an elementwise op across threads at offsets that depend on the tensor's size, and handles each
    piece's last elements with scalar code that can differ in the last bit from the vectorised code (GELU does):
    with several threads a row's result would depend on how many rows share the pass. One thread keeps the only
    scalar tail at the end of each tensor, and the engine's tensor widths are multiples of the vector width.
    """
    if device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class Scorer:
    """Runs jobs on one model; single-threaded by design (the executor owns it)."""

    def __init__(
        self, model: TextStack, device: torch.device, *, graphs: bool = True, embedders: Embedders | None = None
    ):
        """``graphs`` False: every pass runs eagerly, no CUDA graph is captured (the ``compile`` setting);
        ``embedders`` the stack's loaded media embedders (None: no media)."""
        self.model = model
        self.device = device
        self.embedders = embedders
        # the attention kernel's query-tile sizes, one per layer kind (the GPU path's pass plans hold these tables)
        self._tile_rows: set[int] = set()
        self._decode_tiles: dict = {}  # a decode chunk's kernel tile tables, by its groups (`decode_plan`)
        # the prefix rows a recurrent layer keeps for the decoder (`CaptureCost.tail`); 0: every captured row
        self._capture_tail = model.capture_cost().tail
        self.graphs = None  # small passes replay CUDA graphs on a GPU (spinf.engine.graphs), unless not ``graphs``
        if device.type == "cuda":
            self._tile_rows = model.tile_rows()
            self.graphs = model.pass_graphs(device, self._tile_rows) if graphs else None

    def allocated_bytes(self) -> int | None:
        """Device memory held by live tensors; None on the CPU, where it is not measured."""
        if self.device.type != "cuda":
            return None
        return torch.cuda.memory_allocated(self.device)

    def free_failed(self, error: BaseException) -> None:
        """Frees what a run that raised ``error`` held.

        Its passes' tensors (activations, launched picks, pass plans) are held by the frames in the error's
        traceback, which the error keeps alive as long as anyone holds it (an `ApiError` raised from it, the
        packer's log): as locals, and through the closures of the functions those frames ran (the loop's
        in-flight passes), which clearing a frame's locals does not drop. So the error and its causes lose their
        tracebacks (log one first); the cycles the paused collector left (`hostgc.paused`) are collected, and on a
        GPU the caching allocator's free blocks go back to the driver, so the next run does not start from a
        fragmented pool.
        """
        seen: set[int] = set()
        cause: BaseException | None = error
        while cause is not None and id(cause) not in seen:
            seen.add(id(cause))
            traceback.clear_frames(cause.__traceback__)  # for whoever still holds a traceback object
            cause.__traceback__ = None
            cause = cause.__cause__ or cause.__context__
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    @property
    def overlaps(self) -> bool:
        """Whether a launched pass runs while the host goes on (a GPU); on the CPU `start` runs it to the end."""
        return self.device.type == "cuda"

    def start(self, jobs: list[Job]) -> InFlight:
        """Lay out and launch one pass of ``jobs``; on a GPU its picks are copied to pinned host memory behind it,
        with an event to wait on, so the host goes on while the device runs."""
        layout = build_pass(jobs)
        launched = self.launch(layout)
        pending = InFlight(layout, launched, captured=launched.captured)
        if self.device.type == "cuda":
            pending.host = torch.empty(launched.picked.shape, dtype=launched.picked.dtype, pin_memory=True)
            pending.host.copy_(launched.picked, non_blocking=True)
            pending.ready = torch.cuda.Event()
            pending.ready.record()
        return pending

    def collect(self, pending: InFlight) -> tuple[dict[tuple[int, int, int], float], float]:
        """Wait for a launched pass: its values keyed ``(job in the pass, node, token)`` and its busy seconds."""
        if pending.ready is not None:
            pending.ready.synchronize()
            found = pending.host.double().tolist()
            start, end = pending.launched.timing
            busy = start.elapsed_time(end) / 1000
        else:
            found = pending.launched.picked.double().tolist()
            busy = pending.launched.timing
        layout = pending.layout
        offsets = _pick_offsets(layout)
        values = {key: found[offsets[row] + col] for key, (row, col) in layout.read_index.items()}
        return values, busy

    @torch.inference_mode()
    def launch(self, layout: PassLayout) -> Launched:
        """Start one pass; its wanted log-probs, flat in ``layout.read_columns`` order (`_finish` reads them)."""
        flat_rows = [r for r, cols in enumerate(layout.read_columns) for _ in cols]
        flat_cols = [c for cols in layout.read_columns for c in cols]
        starts, capture = capture_plan(layout, self.device, self._capture_tail)
        if self.device.type != "cuda":
            pass_started = time.perf_counter()
            with one_cpu_thread(self.device):
                media = self.embedded(layout)
                plan = attrs.evolve(attention_plan(layout, self.device), capture=capture, media=media)
                plan = self.model.pass_plan(layout, plan)
                token_ids = torch.tensor(layout.token_ids, dtype=torch.long, device=self.device)
                hidden = self.model(token_ids, plan)  # [num_tokens, hidden]
                rows = torch.tensor(layout.read_rows, dtype=torch.long, device=self.device)
                logprobs = self.model.read_logprobs(hidden[rows])  # [read rows, vocab] fp32
                picked = logprobs[torch.tensor(flat_rows, dtype=torch.long), torch.tensor(flat_cols, dtype=torch.long)]
                captured = self._captured(hidden, layout, starts, capture)
            return Launched(picked, time.perf_counter() - pass_started, captured)
        from spinf.engine.kernels.attention import plan_arrays, to_device

        done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        done[0].record()
        arrays = plan_arrays(layout, self._tile_rows)
        token_ids = np.asarray(layout.token_ids, dtype=np.int64)
        # graphs hold the fused path only, and keep no keys and values for slots and no media embeddings
        graphed = self.graphs is not None and self.model.runs_fused() and capture is None and not layout.media
        hidden = self.graphs.run(token_ids, arrays, layout) if graphed else None
        if hidden is None:
            hidden = self._eager(token_ids, arrays, capture, self.embedded(layout), layout)
        rows = to_device(np.asarray(layout.read_rows, dtype=np.int64), self.device)
        pick_rows = np.asarray(flat_rows, dtype=np.int64)
        bounds = np.searchsorted(pick_rows, np.arange(0, len(layout.read_rows) + HEAD_ROWS, HEAD_ROWS)).tolist()
        picked = self.model.option_logprobs(
            hidden[rows],
            to_device(pick_rows, self.device),
            to_device(np.asarray(flat_cols, dtype=np.int64), self.device),
            bounds,
        )
        captured = self._captured(hidden, layout, starts, capture)
        done[1].record()
        return Launched(picked, done, captured)

    def _eager(
        self,
        token_ids: np.ndarray,
        arrays,
        capture: Capture | None = None,
        media=None,
        layout: PassLayout | None = None,
    ) -> torch.Tensor:
        from spinf.engine.kernels.attention import device_plan, to_device

        kernel = device_plan(arrays, self.device)
        empty = torch.zeros((0, 1), dtype=torch.long, device=self.device)
        plan = AttentionPlan(
            kernel.positions, (), empty[:, 0], empty, empty.bool(), kernel=kernel, capture=capture, media=media
        )
        if layout is not None:  # the model's own plan of the pass around it (the Qwen stack's recurrent segments)
            plan = self.model.pass_plan(layout, plan)
        return self.model(to_device(token_ids, self.device), plan)

    def embedded(self, layout: PassLayout) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The pass's media embeddings (`AttentionPlan.media`): every distinct item embedded once (a split input
        re-sends its items in each job), its rows placed at each of its placeholders."""
        if not layout.media:
            return None
        if self.embedders is None:
            raise RuntimeError("a pass with media reached a scorer without media embedders")
        distinct: dict[int, int] = {}
        items = []
        for _, item in layout.media:
            if id(item) not in distinct:
                distinct[id(item)] = len(items)
                items.append(item)
        embedded = self.embedders.embed(items)
        rows = np.concatenate([np.arange(row, row + item.num_tokens) for row, item in layout.media])
        parts = [embedded[distinct[id(item)]] for _, item in layout.media]
        return torch.from_numpy(rows).to(self.device), torch.cat(parts)

    def decode_plan(self, positions: torch.Tensor, kv) -> object:
        """The Triton kernel's plan of a decode step (`spinf.engine.attention.DecodeKV`), built on the device.

        Query rows are the step's rows; the keys are the decoder's buffers. A tile holds rows of one group (one
        prefix, at buffer rows ``[start, start + prefix_len)``) and every row is a segment of its own whose path is
        its row of ``kv.path_index``, so the kernel computes for each row exactly what it computes for a branch row
        with that path in a scoring pass. The tile tables depend on the groups alone and are kept per chunk.
        """
        from spinf.engine.kernels.attention import KernelPlan

        tables = self._decode_tiles.get(kv.groups)
        if tables is None:
            tables = {}
            for bm in self._tile_rows:
                tiles = [
                    (t, min(t + bm, first + count), start, prefix_len, t, min(t + bm, first + count) - t)
                    for first, count, start, prefix_len in kv.groups
                    for t in range(first, first + count, bm)
                ]
                tables[bm] = torch.tensor(tiles, dtype=torch.int32).to(self.device)
            self._decode_tiles = {kv.groups: tables}  # one chunk at a time: the last one's tables
        rows = torch.arange(positions.shape[0], dtype=torch.int32, device=self.device)
        segments = torch.stack([rows, rows + 1, rows, kv.path_len.to(torch.int32)], dim=1)
        return KernelPlan(
            positions=positions.to(torch.int32),
            paths=kv.path_index.to(torch.int32),
            tiles=tables,
            segments={bm: segments for bm in tables},
        )

    def _captured(
        self, hidden: torch.Tensor, layout: PassLayout, starts: list[SlotStart], capture: Capture | None
    ) -> Captured | None:
        """What the pass kept for its extraction slots: the captured keys and values and the full-vocabulary
        log-probs at each slot's start (A.12.1: step 0 of the decoder)."""
        if capture is None:
            return None
        rows = torch.tensor(layout.end_rows, dtype=torch.long, device=self.device)
        captured = Captured(capture.keys, capture.values, self.model.full_logprobs(hidden[rows]), starts)
        if any(state is not None for state in capture.states):  # the recurrent layers' prefix states (Qwen3.5)
            captured.states = capture.states
            captured.state_index = {first: i for i, (first, _) in enumerate(capture.prefixes)}
            captured.compact = capture.compact
        return captured


@attrs.frozen
class Launched:
    """A launched pass: its picked log-probs (on the device until collected) and its timing (seconds on the CPU;
    a pair of CUDA events on a GPU)."""

    picked: torch.Tensor
    timing: object
    captured: Captured | None = None


@attrs.define(eq=False)
class InFlight:
    """A pass launched by `Scorer.start` and not yet collected."""

    layout: PassLayout
    launched: Launched
    captured: Captured | None = None  # what the pass kept for its extraction slots
    host: torch.Tensor | None = None  # pinned copy of the picks (GPU)
    ready: torch.cuda.Event | None = None  # recorded after that copy

    @property
    def num_tokens(self) -> int:
        return self.layout.num_tokens


def _pick_offsets(layout: PassLayout) -> list[int]:
    """Where each read row's picks start in the flat order of ``layout.read_columns``."""
    offsets, at = [], 0
    for cols in layout.read_columns:
        offsets.append(at)
        at += len(cols)
    return offsets


def capture_plan(layout: PassLayout, device: torch.device, tail: int = 0) -> tuple[list[SlotStart], Capture | None]:
    """Which rows a pass with extraction slots keeps: the prefix of every job with a slot, then the paths of its
    slots' starts (each row once); and where each slot starts in them, in ``layout.end_rows`` order. With ``tail``
    (a model with recurrent layers, `CaptureCost.tail`), those layers keep of each prefix its last ``tail`` rows
    only (`Capture.compact`)."""
    if not layout.end_rows:
        return [], None
    parent_of = dict(zip(layout.branch_rows, layout.parents, strict=True))
    job_of_end = {e: j for (j, _), e in layout.end_index.items()}
    rows: list[int] = []
    at: dict[int, int] = {}  # stream row -> capture row
    prefix_end: dict[int, int] = {}  # a prefix's stream row -> the row after its prefix
    prefix_at: dict[int, int] = {}  # job -> its prefix's first capture row
    shift_of: dict[int, int] = {}  # job -> how far its prefix's images move later rotary positions back (Qwen)
    starts = []
    for e, end_row in enumerate(layout.end_rows):
        j = job_of_end[e]
        start, prefix_len, _ = layout.spans[j]
        if j not in prefix_at:
            prefix_at[j] = len(rows)
            shift_of[j] = sum(item.rope_shift for row, item in layout.media if start <= row < start + prefix_len)
            for r in range(start, start + prefix_len):
                at[r] = len(rows)
                rows.append(r)
                prefix_end[r] = start + prefix_len
        path = []
        row = end_row
        while row >= start + prefix_len:  # a branch row: walk up to the prefix
            path.append(row)
            row = parent_of[row]
            if row < 0:
                break
        for r in path:
            if r not in at:
                at[r] = len(rows)
                rows.append(r)
        starts.append(SlotStart((prefix_at[j], prefix_len), tuple(at[r] for r in reversed(path)), e, shift_of[j]))
    prefixes = tuple(
        (first, layout.spans[j][0] + layout.spans[j][1] - 1 if layout.spans[j][1] else -1)
        for j, first in prefix_at.items()
    )
    capture = Capture(torch.tensor(rows, dtype=torch.long, device=device), prefixes=prefixes)
    if tail:  # a prefix row more than ``tail`` rows before its prefix's end is not kept
        kept = [k for k, row in enumerate(rows) if row not in prefix_end or prefix_end[row] - row <= tail]
        compact = [-1] * len(rows)
        for place, k in enumerate(kept):
            compact[k] = place
        capture.compact = tuple(compact)
        capture.compact_rows = torch.tensor([rows[k] for k in kept], dtype=torch.long, device=device)
    return starts, capture
