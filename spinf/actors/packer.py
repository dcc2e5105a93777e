"""The packer: compiles admitted calls off the event loop and runs their jobs in shared passes.

Each call is compiled in a worker thread (tokenization is CPU work that must not block the event loop), then waits
for the executor. Whatever has compiled by the time the executor is free goes into one run, so concurrent calls
share passes when the scheme is batch-invariant (api spec §3.8, D6); otherwise each call runs alone. A failure in a
shared run is retried call by call, so one call's error never fails another. A call whose caller went away is
dropped at the next step it reaches (before compiling, before its run, before its response is built), and its
admission slot freed only then: the slot counts work the server still holds, not callers still waiting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

import attrs
import outcome
import trio

from spinf.errors import ApiError
from spinf.serving import ExecJob, ScoreWork, ServerState, run_on_executor

log = logging.getLogger(__name__)


@attrs.frozen
class PackerStats:
    compiling: int
    waiting: int
    runs: int
    passes: int
    tokens: int


@attrs.define(eq=False)
class _Ready:
    work: ScoreWork
    prepared: Any


@attrs.define
class Packer:
    """**Inbox**: `ScoreWork` (admitted by the web layer). **Outbox**: each work's ``reply`` (the response dict or
    the error) and `ExecJob`s to the executor; ``state.degraded`` when the engine reports device memory not freed
    after an out-of-memory error. **Ends**: when the inbox closes; calls still compiling or waiting are answered
    first. **Cancellation**: a call whose caller went away (``abandoned``) is dropped at its next step; a run in
    progress completes in the executor and the answers of abandoned calls are not built.
    """

    inbox: trio.MemoryReceiveChannel[ScoreWork]
    executor: trio.MemorySendChannel[ExecJob]
    state: ServerState
    max_waiting: int
    # compiling is CPU work kept off the event loop; tests swap in an inline version for exact orderings
    offload: ClassVar[Callable] = staticmethod(trio.to_thread.run_sync)
    _compiling: int = 0
    _runs: int = 0
    _passes: int = 0
    _tokens: int = 0
    on_run: Callable[[Any], None] = lambda stats: None  # metrics hook: called with each run's RunStats
    _ready_send: Any = None
    _ready_recv: Any = None

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        # bounded by admission: at most queue + 1 calls exist at once (the web layer's semaphore)
        self._ready_send, self._ready_recv = trio.open_memory_channel(self.max_waiting)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._run_batches)
            task_status.started()
            async with self._ready_send:
                async with trio.open_nursery() as compiling:
                    async for work in self.inbox:
                        compiling.start_soon(self._compile, work)

    async def _compile(self, work: ScoreWork) -> None:
        engine = self.state.engine
        if work.abandoned:
            work.drop()
            return
        self._compiling += 1
        try:
            prepared = await self.offload(
                lambda: engine.prepare(work.body, chat=work.chat, trusted=work.trusted, request_id=work.request_id)
            )
        except Exception as exc:  # a refusal, or an engine bug in one call: that call's answer only
            if not isinstance(exc, ApiError):
                log.exception("compiling %s failed", work.request_id)
            work.finish(outcome.Error(exc))
            return
        finally:
            self._compiling -= 1
        await self._ready_send.send(_Ready(work, prepared))

    async def _run_batches(self) -> None:
        async for first in self._ready_recv:
            batch = [first]
            if getattr(self.state.engine, "batch_invariant", False):
                while True:
                    try:
                        batch.append(self._ready_recv.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
            for ready in batch:
                if ready.work.abandoned:
                    ready.work.drop()
            batch = [r for r in batch if not r.work.abandoned]
            if batch:
                await self._run(batch)

    async def _run(self, batch: list[_Ready]) -> None:
        engine = self.state.engine
        now = trio.current_time()
        for ready in batch:
            ready.prepared.queue_s = max(0.0, now - ready.work.admitted_at - ready.prepared.compile_s)
        try:
            values, stats = await run_on_executor(
                self.executor, lambda: engine.run([r.prepared.compiled.jobs for r in batch])
            )
        except Exception as exc:
            self._check_degraded(engine)
            if len(batch) > 1:
                log.warning("a shared run failed (%s); running its %d calls one by one", exc, len(batch))
                for ready in batch:
                    await self._run([ready])
                return
            if not isinstance(exc, ApiError):
                log.exception("scoring %s failed", batch[0].work.request_id)
            batch[0].work.finish(outcome.Error(exc))
            return
        self._check_degraded(engine)
        self._runs += 1
        self._passes += stats.passes
        self._tokens += stats.packed_tokens
        self.on_run(stats)
        for ready, value in zip(batch, values, strict=True):
            if ready.work.abandoned:
                ready.work.drop()
                continue
            # a big call's results take a while to build (about 0.5 s for 27,000 questions): off the event loop
            response = await self.offload(
                lambda r=ready, v=value: outcome.capture(
                    engine.respond, r.prepared, v, stats, internals=r.work.internals
                )
            )
            ready.work.finish(response)

    def _check_degraded(self, engine) -> None:
        if engine.degraded:
            self.state.degrade(engine.degraded)

    def statistics(self) -> PackerStats:
        waiting = self._ready_recv.statistics().current_buffer_used if self._ready_recv else 0
        return PackerStats(self._compiling, waiting, self._runs, self._passes, self._tokens)
