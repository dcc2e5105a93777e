"""The packer: feeds admitted calls into the engine loop and drives it, one step at a time, on the executor thread.

The engine arrives once it is warm (from the warm-up actor). From then on every admitted call (`ScoreWork`) becomes
a `Call` of the engine loop (`spinf.engine.loop`), which parses, compiles, packs and runs the calls of every caller
in one scheduling loop: calls that arrive while a pass runs join the next one (when the engine is batch-invariant),
floors are read once per key, and a call is answered as soon as its own last pass is read back. Between two steps
the packer takes what has arrived, marks the calls whose caller went away (the loop drops them at its next step) and
answers what the last step finished. Each call is parsed with the pack catalog snapshot of the moment it is taken
(``packs``, the pack syncer's), so a reload never changes a call in flight. The loop is touched by one thread at a
time: the executor's during a step, the event loop's between steps.

A call with media parts is parsed and its media decoded (`Engine.prepare`) in a worker thread first, up to
``decoders`` at a time, so decoding images and audio never holds the event loop or the GPU thread; the loop takes it
once decoded, while it runs the passes of the others.
"""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import outcome
import trio

from spinf.errors import ApiError
from spinf.protocol.request import body_has_media
from spinf.server.messages import ExecJob, ScoreWork, run_on_executor

log = logging.getLogger(__name__)


class Status(Protocol):
    def degrade(self, reason: str) -> None: ...


@attrs.frozen
class PackerStats:
    waiting: int  # calls taken and not yet answered (in the loop or being decoded)
    steps: int


@attrs.frozen
class PassRun:
    """What the metrics hook gets after each step: the passes it read back (tokens, busy seconds each) and the
    floor cache's counts so far (`spinf.engine.loop.LoopStats`)."""

    passes: tuple[tuple[int, float], ...]
    floor_hits: int = 0
    floor_misses: int = 0
    floor_entries: int = 0
    device_bytes: int | None = None  # device memory the engine holds after the step; None on the CPU


@attrs.define
class Packer:
    """**Inbox**: the warm engine, once, on ``warmed``; then `ScoreWork` (admitted by the web layer) on ``inbox``;
    the pack catalog snapshot, read through ``packs`` as each call is taken (the pack syncer swaps it).
    **Outbox**: each work's ``reply`` (the response dict or the error); `ExecJob`s (one loop step each) to the
    executor; ``status.degrade`` when the engine reports device memory not freed after an out-of-memory error.
    **Ends**: when ``warmed`` closes without an engine, or when the inbox closes and every call taken has been
    answered; it closes its clone of the executor's inbox as it ends. **Cancellation**: a step in progress
    completes in the executor; the calls in the loop are not answered (their callers are being cancelled too).
    """

    inbox: trio.MemoryReceiveChannel[ScoreWork]
    executor: trio.MemorySendChannel[ExecJob]
    warmed: trio.MemoryReceiveChannel[Any]
    status: Status
    on_run: Callable[[PassRun], None] = lambda run: None  # metrics hook
    packs: Callable[[], object] = lambda: None  # the pack catalog snapshot now (the syncer's); None: packs off
    decoders: int = max(1, (os.cpu_count() or 2) // 2)  # worker threads decoding media at once
    _taken: dict = attrs.field(factory=dict)  # engine-loop call -> its ScoreWork, until answered or dropped
    _preparing: int = 0  # calls with media in a worker thread
    _prepared: collections.deque = attrs.field(factory=collections.deque)  # (work, call, parsed), not yet taken
    _idle: trio.CancelScope | None = None  # the wait for work, while there is nothing to run
    _steps: int = 0

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        with self.executor:  # its own clone of the executor's inbox: closed when the packer ends
            await self._serve()

    async def _serve(self) -> None:
        with self.warmed:
            try:
                engine = await self.warmed.receive()
            except trio.EndOfChannel:
                return
        loop = engine.loop
        limiter = trio.CapacityLimiter(self.decoders)
        async with trio.open_nursery() as nursery:
            with self.inbox:
                open_ = True
                while open_ or loop.has_work or self._preparing or self._prepared:
                    if not loop.has_work and not self._prepared:
                        open_ = await self._wait(engine, nursery, limiter, open_)
                    if open_:
                        open_ = self._take_arrived(engine, nursery, limiter)
                    while self._prepared:
                        self._take(loop, *self._prepared.popleft())
                    if not loop.has_work:  # what arrived was abandoned, or is still being decoded
                        continue
                    for call, work in self._taken.items():
                        if work.abandoned:
                            call.abandoned = True
                    done = await run_on_executor(self.executor, loop.step)
                    self._answer(done)
                    self._after_step(engine)

    async def _wait(self, engine, nursery, limiter, open_: bool) -> bool:
        """Wait, with nothing to run, for a call to arrive or for a decoded one to be handed back (which cancels the
        wait: a cancelled ``receive`` takes nothing). Returns whether the inbox is still open."""
        with trio.CancelScope() as self._idle:
            try:
                if open_:
                    self._arrive(engine, nursery, limiter, await self.inbox.receive())
                else:
                    await trio.sleep_forever()
            except trio.EndOfChannel:
                return False
            finally:
                self._idle = None
        return open_

    def _take_arrived(self, engine, nursery, limiter) -> bool:
        """Take every call already in the inbox; False once the inbox has closed."""
        while True:
            try:
                self._arrive(engine, nursery, limiter, self.inbox.receive_nowait())
            except trio.WouldBlock:
                return True
            except trio.EndOfChannel:
                return False

    def _arrive(self, engine, nursery, limiter, work: ScoreWork) -> None:
        """A call without media goes straight into the loop, taken from the inbox with no task switch between (under
        a flood of refused connections, every hop through the scheduler waits behind all of them); a call with media
        goes to a worker thread to be parsed and decoded first (`Engine.prepare`)."""
        if not work.take():
            return
        call = self._call(engine.loop, work)
        if body_has_media(work.body):
            self._preparing += 1
            nursery.start_soon(self._prepare, engine, work, call, limiter)
        else:
            self._take(engine.loop, work, call)

    async def _prepare(self, engine, work: ScoreWork, call, limiter) -> None:
        parsed = None  # the request or its refusal (`Engine.prepare`), for the loop
        try:
            if not work.abandoned:
                parsed = await trio.to_thread.run_sync(engine.prepare, call, limiter=limiter)
        finally:
            self._preparing -= 1
            self._prepared.append((work, call, parsed))
            if self._idle is not None:
                self._idle.cancel()

    def _call(self, loop, work: ScoreWork):
        from_admission = max(0.0, trio.current_time() - work.admitted_at)
        return loop.new_call(
            work.body,
            work.request_id,
            chat=work.chat,
            trusted=work.trusted,
            internals=work.internals,
            queued_s=from_admission,
            packs=self.packs(),  # read once, when the call is taken: a reload later does not change this call
        )

    def _take(self, loop, work: ScoreWork, call, parsed=None) -> None:
        if work.abandoned:
            work.drop()
            return
        self._taken[call] = work
        loop.add(call, parsed)

    def _answer(self, done: list) -> None:
        for call in done:
            work = self._taken.pop(call, None)
            if work is None:
                continue
            if call.abandoned or work.abandoned:
                work.drop()
            elif call.error is not None:
                if not isinstance(call.error, ApiError):  # an engine bug in one call: that call's answer only
                    log.error("scoring %s failed", work.request_id, exc_info=call.error)
                work.finish(outcome.Error(call.error))
            else:
                work.finish(outcome.Value(call.response))

    def _after_step(self, engine) -> None:
        self._steps += 1
        passes, engine.loop.pass_log[:] = tuple(engine.loop.pass_log), []
        if passes:
            loop = engine.loop.statistics()
            self.on_run(PassRun(passes, loop.floor_hits, loop.floor_misses, loop.floor_entries, loop.device_bytes))
        if engine.degraded:
            self.status.degrade(engine.degraded)

    def statistics(self) -> PackerStats:
        return PackerStats(len(self._taken) + self._preparing + len(self._prepared), self._steps)
