"""Warm-up: runs every shape a request could pay through the executor before ``/readyz`` turns 200.

``--warmup full|short|none``; the engine says what covers its shapes (`Engine.warmup_steps`: scoring calls, and
under ``full`` passes built for each CUDA-graph bucket and for the whole token budget, `spinf.engine.warm`). Each
step is one executor job, so a shutdown during warm-up is seen between shapes. Each step's seconds count in the
``boot`` field the step names (``part``: ``warmup_s`` by default; ``warmup_extract_s`` for the extraction call an
engine that can extract runs last, api spec §3.1); ``warmup_s`` is reported unless the mode is ``none``,
``warmup_extract_s`` only when such a step ran. The passes the steps ran are the
warm-up's: they are counted here (``spinf_warmup_passes``) and taken off the engine loop's pass log, so the
serving metrics see served passes only. Once warm, the engine settles its heap (`Engine.settle`: the collector stops
traversing the model), and the warm-up hands the engine on to the packer (``warmed``) and moves the lifecycle to
ready, in that order: a call admitted once ready finds the engine already in the packer's hands.
"""

from __future__ import annotations

import logging

import attrs
import trio

from spinf.server.lifecycle import Lifecycle
from spinf.server.messages import ExecJob, run_on_executor
from spinf.server.served import ServedEngine
from spinf.settings import SETTING

log = logging.getLogger(__name__)


@attrs.frozen
class WarmupStats:
    warm: bool
    shapes_done: int  # steps run: scoring calls and built passes
    passes: int  # forward passes those steps ran


@attrs.define
class Warmup:
    """**Inbox**: the loaded engine, once, on ``loaded``. **Outbox**: warm-up jobs to the executor; the warm engine,
    once, on ``warmed``; ready (or failed, or degraded) to the lifecycle. **Ends**: after warming or failing, or
    when the loader closes ``loaded`` without an engine; it closes its executor clone and ``warmed`` either way, so
    the packer learns whether an engine will come. **Cancellation**: stops between shapes; nothing is sent and the
    lifecycle stays where it was.
    """

    executor: trio.MemorySendChannel[ExecJob]
    loaded: trio.MemoryReceiveChannel[ServedEngine]
    warmed: trio.MemorySendChannel[ServedEngine]
    lifecycle: Lifecycle
    mode: str = SETTING["warmup"].default
    _done: int = 0
    _passes: int = 0
    _warm: bool = False

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        with self.executor, self.warmed:
            with self.loaded:
                try:
                    engine = await self.loaded.receive()
                except trio.EndOfChannel:
                    return
            started = trio.current_time()
            seconds: dict[str, float] = {}  # per boot field, the seconds of the steps counted in it
            try:
                for step in engine.warmup_steps(self.mode):
                    begun = trio.current_time()
                    await run_on_executor(self.executor, step)
                    part = step.part
                    seconds[part] = seconds.get(part, 0.0) + trio.current_time() - begun
                    self._done += 1
                    self._passes += self._take_passes(engine)
                idle_gib = await run_on_executor(self.executor, engine.idle_gib)  # reads the device's memory
            except Exception as exc:  # a failed warm-up is a failed boot (api spec §3.1)
                log.error("warm-up failed: %s: %s", type(exc).__name__, exc)
                self.lifecycle.fail(exc)
                return
            if engine.degraded:  # an out-of-memory error in warm-up that left memory held
                self.lifecycle.degrade(engine.degraded)
            warmup_s = round(seconds.get("warmup_s", 0.0), 3) if self.mode != "none" else None
            extract_s = seconds.get("warmup_extract_s")
            warmup_extract_s = round(extract_s, 3) if extract_s is not None else None
            engine.settle()  # the model and libraries leave the collector's scans (no torch: the event loop's thread)
            self.warmed.send_nowait(engine)  # buffer 1, sent once: never full
            self.lifecycle.warmed(warmup_s, idle_gib, warmup_extract_s)
            self._warm = True
            log.info("warm-up (%s) done in %.1f s: ready", self.mode, trio.current_time() - started)

    @staticmethod
    def _take_passes(engine: ServedEngine) -> int:
        """The passes logged since the last step, taken off the loop's log (between steps no thread runs it)."""
        taken = len(engine.loop.pass_log)
        del engine.loop.pass_log[:]
        return taken

    def statistics(self) -> WarmupStats:
        return WarmupStats(self._warm, self._done, self._passes)
