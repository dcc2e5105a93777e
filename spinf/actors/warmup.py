"""Warm-up: runs every shape a request could pay through the executor before ``/readyz`` turns 200.

``--warmup full|short|none``; the engine says which request bodies cover its shapes (`Engine.warmup_bodies`).
Each body is one executor job, so a shutdown during warm-up is seen between shapes.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import attrs
import trio

from spinf.engine import hostgc
from spinf.serving import ExecJob, ServerState, run_on_executor

log = logging.getLogger(__name__)


@attrs.frozen
class WarmupStats:
    warm: bool
    shapes_done: int


@attrs.define
class Warmup:
    """**Inbox**: the loaded engine (one message on ``loaded``). **Outbox**: none; it sets ``state.warm``.
    **Ends**: after warming, or when the loader closes ``loaded`` without an engine.
    **Cancellation**: stops between shapes; the state stays not warm.
    """

    executor: trio.MemorySendChannel[ExecJob]
    loaded: trio.MemoryReceiveChannel[Any]
    state: ServerState
    mode: str = "full"
    _done: int = 0

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        with self.loaded:
            try:
                engine = await self.loaded.receive()
            except trio.EndOfChannel:
                return
        started = trio.current_time()
        try:
            for body in engine.warmup_bodies(self.mode):
                await run_on_executor(self.executor, functools.partial(engine.score, body))
                self._done += 1
        except Exception as exc:  # a failed warm-up is a failed boot (api spec §3.1)
            log.error("warm-up failed: %s: %s", type(exc).__name__, exc)
            self.state.fail(exc)
            return
        if engine.degraded:  # an out-of-memory error in warm-up that left memory held
            self.state.degrade(engine.degraded)
        if self.mode != "none":
            self.state.boot["warmup_s"] = round(trio.current_time() - started, 3)
        self.state.boot.update(warm=True, idle_gib=engine.idle_gib())
        hostgc.settle()  # the model and libraries leave the collector's scans (spinf.engine.hostgc)
        self.state.warm = True
        log.info("warm-up (%s) done in %.1f s: ready", self.mode, trio.current_time() - started)

    def statistics(self) -> WarmupStats:
        return WarmupStats(self.state.warm, self._done)
