"""The GPU executor: the one OS thread that runs every torch call for the life of the process.

CUDA's current device and stream and torch's CUDA-graph state are per thread, and ``trio.to_thread.run_sync`` per
call does not promise the same thread, so one long-lived thread takes `ExecJob`s from a channel with
``trio.from_thread.run`` and replies through each job's own channel. Jobs are engine functions that return CPU data.
"""

from __future__ import annotations

import logging
import time

import attrs
import outcome
import trio

from spinf.server.messages import ExecJob

log = logging.getLogger(__name__)


@attrs.frozen
class ExecutorStats:
    """What the engine thread has run: jobs, and the seconds it spent in them (``/metrics``: how busy the GPU's
    one thread is)."""

    jobs: int
    busy_s: float


@attrs.define
class Executor:
    """Runs `ExecJob`s one at a time in its dedicated thread.

    **Inbox**: `ExecJob` (loading, warm-up, passes). **Outbox**: each job's ``reply`` (an `outcome.Outcome`).
    **Ends**: when the inbox's send side is closed (the thread's loop sees ``EndOfChannel``).
    **Cancellation**: a cancel abandons the thread (``abandon_on_cancel=True``): its job in flight runs to its end
    and nobody waits for it; the loop then ends (``Cancelled`` or ``RunFinishedError`` from the channel receive).
    Only the supervisor cancels it, once the shutdown's deadline has passed and every actor is gone, so the process
    exits at the deadline rather than after a pass that may take seconds; never while the process goes on.
    """

    inbox: trio.MemoryReceiveChannel[ExecJob]
    _jobs: int = 0  # written by the thread only, read by `statistics`
    _busy_s: float = 0.0

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.to_thread.run_sync(self._loop, abandon_on_cancel=True)

    def _loop(self) -> None:
        while True:
            try:
                job = trio.from_thread.run(self.inbox.receive)
            except (trio.EndOfChannel, trio.Cancelled, trio.RunFinishedError):
                return
            started = time.perf_counter()
            result = outcome.capture(job.fn)
            self._busy_s += time.perf_counter() - started
            self._jobs += 1
            try:
                trio.from_thread.run_sync(job.reply.send_nowait, result)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.RunFinishedError):
                log.debug("a job's caller went away before its reply")

    def statistics(self) -> ExecutorStats:
        return ExecutorStats(self._jobs, self._busy_s)
