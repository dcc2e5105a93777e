"""Running jobs through the model: pack them into passes, run each pass, read the wanted log-probs.

The scorer decides nothing about the request; it returns plain Python floats keyed by ``(job, node, token)``.
Only the read rows go through the final norm and the LM head, and only the wanted columns leave the log-softmax.
It keeps no buffer between runs (every pass allocates its own tensors), so a run that fails leaves nothing
half-filled behind: once `Scorer.free_failed` has dropped what the failed run held, the next run starts clean.
"""

from __future__ import annotations

import contextlib
import gc
import time
import traceback

import attrs
import numpy as np
import torch

from spinf.engine.attention import AttentionPlan, JobSpan
from spinf.engine.layout import PassLayout, build_pass
from spinf.engine.model import HEAD_ROWS, Gemma4Text
from spinf.engine.packing import pack
from spinf.engine.trie import Job

# How running out of memory reads when torch raises a plain RuntimeError: the CPU allocator ("DefaultCPUAllocator:
# can't allocate memory"), a CUDA call outside the caching allocator ("CUDA error: out of memory"), cuBLAS.
_OUT_OF_MEMORY = ("out of memory", "can't allocate memory", "CUBLAS_STATUS_ALLOC_FAILED")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says the device or the host ran out of memory: `torch.OutOfMemoryError` (the CUDA caching
    allocator, some CPU paths), `MemoryError` (numpy's host arrays) or a `RuntimeError` that says so."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(marker in str(exc) for marker in _OUT_OF_MEMORY)


@attrs.frozen
class RunStats:
    passes: int
    packed_tokens: int
    busy_s: float  # time inside the passes
    wall_s: float  # the whole run, host work included


def attention_plan(layout: PassLayout, device: torch.device) -> AttentionPlan:
    """Tensors of a pass layout; paths padded to the deepest branch token of the pass."""
    depth = max((len(p) for p in layout.paths), default=1)
    index = [p + [0] * (depth - len(p)) for p in layout.paths]
    mask = [[True] * len(p) + [False] * (depth - len(p)) for p in layout.paths]

    def as_tensor(data, dtype, shape=None):
        t = torch.tensor(data, dtype=dtype)
        return (t.reshape(shape) if shape else t).to(device)

    return AttentionPlan(
        positions=as_tensor(layout.positions, torch.long),
        jobs=tuple(JobSpan(*span) for span in layout.spans),
        branch_rows=as_tensor(layout.branch_rows, torch.long),
        path_index=as_tensor(index, torch.long, (len(index), depth)),
        path_mask=as_tensor(mask, torch.bool, (len(mask), depth)),
    )


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

    def __init__(self, model: Gemma4Text, device: torch.device, token_budget: int):
        self.model = model
        self.device = device
        self.token_budget = token_budget
        # the attention kernel's query-tile sizes, one per layer kind (the GPU path's pass plans hold these tables)
        heads = model.cfg.num_heads
        self._tile_sizes = {(layer.spec.head_dim, heads // layer.spec.num_kv_heads) for layer in model.layers}

    def allocated_bytes(self) -> int | None:
        """Device memory held by live tensors; None on the CPU, where it is not measured."""
        if self.device.type != "cuda":
            return None
        return torch.cuda.memory_allocated(self.device)

    def free_failed(self, error: BaseException) -> None:
        """Frees what a run that raised ``error`` held.

        Its passes' tensors (activations, launched picks, pass plans) are held by the frames in the error's
        traceback, which the error keeps alive as long as anyone holds it (an `ApiError` raised from it, the
        packer's log): as locals, and through the closures of the functions those frames ran (`stream`'s
        ``in_flight``), which clearing a frame's locals does not drop. So the error and its causes lose their
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

    def run_many(self, job_lists: list[list[Job]]) -> tuple[list[dict[tuple[int, int, int], float]], RunStats]:
        """Run several requests' jobs in shared passes; each request gets its values keyed by its own job indices.

        On a GPU every pass is launched before any result is read: the host lays out pass ``i + 1`` while the GPU
        runs pass ``i``, and all picked log-probs come back in one copy at the end.
        """
        started = time.perf_counter()
        owners = [(r, j) for r, jobs in enumerate(job_lists) for j in range(len(jobs))]
        jobs = [job for jobs in job_lists for job in jobs]
        group = self._launch_group(jobs, self._pack(jobs, range(len(jobs))))
        found, busy = self._finish(group)
        values: list[dict[tuple[int, int, int], float]] = [{} for _ in job_lists]
        for (j, node, token), value in found.items():
            request, local = owners[j]
            values[request][(local, node, token)] = value
        return values, attrs.evolve(group.stats(busy), wall_s=time.perf_counter() - started)

    def stream(self, jobs: list[Job], arrivals, stats: list[RunStats] | None = None):
        """Run jobs as they arrive, keeping the device busy while the caller makes more and reads what finished.

        ``arrivals`` yields lists of indices into ``jobs`` (which may grow meanwhile). Jobs wait until a pass's
        worth has arrived (two passes' worth after the first launch); then they are packed, the fullest pass is
        launched and the rest wait. Launching one pass at a time lets the caller's work overlap the device: a GPU
        queues about one pass of kernels, and launching a second one blocks the host until the first nearly ends.
        Each pass is read back once the next one is launched; when arrivals end, the rest is packed and launched
        pass by pass the same way. Yields ``(finished job indices, values keyed (job, node, token))``; appends one
        `RunStats` per pass to ``stats``. Packing never changes a score (tree attention), so the values are those
        `run_many` gives.
        """
        waiting: list[int] = []
        waiting_tokens = 0
        in_flight: list[_Group] = []

        def launch(members: list[int]):
            in_flight.append(self._launch_group(jobs, [members]))
            while len(in_flight) > 1:  # the pass before the one just launched
                yield self._finished(in_flight.pop(0), stats)

        for indices in arrivals:
            waiting.extend(indices)
            waiting_tokens += sum(jobs[i].num_tokens for i in indices)
            if waiting_tokens < (2 if in_flight else 1) * self.token_budget:
                continue
            passes = self._pack(jobs, waiting)
            sizes = [sum(jobs[i].num_tokens for i in members) for members in passes]
            fullest = max(range(len(passes)), key=lambda p: (sizes[p], -p))
            chosen = passes.pop(fullest)
            waiting = [i for members in passes for i in members]
            waiting_tokens -= sizes[fullest]
            yield from launch(chosen)
        for members in self._pack(jobs, waiting):
            yield from launch(members)
        while in_flight:
            yield self._finished(in_flight.pop(0), stats)

    def _pack(self, jobs: list[Job], indices) -> list[list[int]]:
        """The passes (lists of indices into ``jobs``) that ``indices`` pack into."""
        indices = list(indices)
        return [
            [indices[k] for k in members] for members in pack([jobs[i].num_tokens for i in indices], self.token_budget)
        ]

    def _finished(self, group: _Group, stats: list[RunStats] | None):
        found, busy = self._finish(group)
        if stats is not None:
            stats.append(group.stats(busy))
        return [i for members in group.members for i in members], found

    def _launch_group(self, jobs: list[Job], passes: list[list[int]]) -> _Group:
        """Lay out and launch ``passes`` (lists of indices into ``jobs``); on a GPU their picks are copied to pinned
        host memory behind them, with an event to wait on."""
        layouts = [build_pass([jobs[i] for i in members]) for members in passes]
        launched = [self.launch(layout) for layout in layouts]
        group = _Group(passes, layouts, launched)
        if self.device.type == "cuda" and launched:
            flat = torch.cat([item.picked for item in launched])
            group.host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            group.host.copy_(flat, non_blocking=True)
            group.ready = torch.cuda.Event()
            group.ready.record()
        return group

    def _finish(self, group: _Group) -> tuple[dict[tuple[int, int, int], float], float]:
        """Wait for a launched group; its values keyed ``(index into jobs, node, token)`` and its busy seconds."""
        if group.ready is not None:
            group.ready.synchronize()
            flat = group.host.double().tolist()
            busy = sum(start.elapsed_time(end) for start, end in (item.timing for item in group.launched)) / 1000
            picks, at = [], 0
            for item in group.launched:
                picks.append(flat[at : at + item.picked.numel()])
                at += item.picked.numel()
        else:
            picks = [item.picked.double().tolist() for item in group.launched]
            busy = sum(item.timing for item in group.launched)
        values: dict[tuple[int, int, int], float] = {}
        for members, layout, found in zip(group.members, group.layouts, picks, strict=True):
            offsets = _pick_offsets(layout)
            for (j, node, token), (row, col) in layout.read_index.items():
                values[(members[j], node, token)] = found[offsets[row] + col]
        return values, busy

    @torch.inference_mode()
    def launch(self, layout: PassLayout) -> Launched:
        """Start one pass; its wanted log-probs, flat in ``layout.read_columns`` order (`_finish` reads them)."""
        flat_rows = [r for r, cols in enumerate(layout.read_columns) for _ in cols]
        flat_cols = [c for cols in layout.read_columns for c in cols]
        if self.device.type != "cuda":
            pass_started = time.perf_counter()
            with one_cpu_thread(self.device):
                plan = attention_plan(layout, self.device)
                token_ids = torch.tensor(layout.token_ids, dtype=torch.long, device=self.device)
                hidden = self.model(token_ids, plan)  # [num_tokens, hidden]
                rows = torch.tensor(layout.read_rows, dtype=torch.long, device=self.device)
                logprobs = self.model.read_logprobs(hidden[rows])  # [read rows, vocab] fp32
                picked = logprobs[torch.tensor(flat_rows), torch.tensor(flat_cols)]
            return Launched(picked, time.perf_counter() - pass_started)
        from spinf.engine.kernels import kernel_plan, tile_rows, to_device

        done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        done[0].record()
        kernel = kernel_plan(layout, self.device, {tile_rows(dim, group) for dim, group in self._tile_sizes})
        empty = torch.zeros((0, 1), dtype=torch.long, device=self.device)
        plan = AttentionPlan(kernel.positions, (), empty[:, 0], empty, empty.bool(), kernel=kernel)
        token_ids = to_device(np.asarray(layout.token_ids, dtype=np.int64), self.device)
        hidden = self.model(token_ids, plan)
        rows = to_device(np.asarray(layout.read_rows, dtype=np.int64), self.device)
        pick_rows = np.asarray(flat_rows, dtype=np.int64)
        bounds = np.searchsorted(pick_rows, np.arange(0, len(layout.read_rows) + HEAD_ROWS, HEAD_ROWS)).tolist()
        picked = self.model.option_logprobs(
            hidden[rows],
            to_device(pick_rows, self.device),
            to_device(np.asarray(flat_cols, dtype=np.int64), self.device),
            bounds,
        )
        done[1].record()
        return Launched(picked, done)


@attrs.frozen
class Launched:
    """A launched pass: its picked log-probs (on the device until collected) and its timing (seconds on the CPU;
    a pair of CUDA events on a GPU)."""

    picked: torch.Tensor
    timing: object


@attrs.define
class _Group:
    """Passes launched together (`Scorer._launch_group`)."""

    members: list[list[int]]  # per pass, the indices of its jobs
    layouts: list[PassLayout]
    launched: list[Launched]
    host: torch.Tensor | None = None  # pinned copy of every pass's picks (GPU)
    ready: torch.cuda.Event | None = None  # recorded after that copy

    def stats(self, busy: float) -> RunStats:
        return RunStats(len(self.layouts), sum(layout.num_tokens for layout in self.layouts), busy, 0.0)


def _pick_offsets(layout: PassLayout) -> list[int]:
    """Where each read row's picks start in the flat order of ``layout.read_columns``."""
    offsets, at = [], 0
    for cols in layout.read_columns:
        offsets.append(at)
        at += len(cols)
    return offsets
