"""The drain controller: graceful shutdown on SIGTERM or SIGINT, and the exit of a degraded engine (api spec §3).

Draining (``POST /v0/drain``) only takes the server out of rotation and is a marker file the web layer writes.
Shutdown is this actor's, under **one deadline** (``shutdown_s``) from the first signal: it stops admitting
(scoring calls get 503 with ``Retry-After``, ``/readyz`` answers 503, every answer closes its connection), answers
the refusals still waiting their turn (``on_stop``), lets the calls in flight finish, then sets ``shutdown`` so
the HTTP server closes its idle connections in what is left of the same deadline (`spinf.supervisor.serve`).

A degraded engine (device memory not freed after an out-of-memory error) keeps serving; about 2 s later the
process shuts down the same way and exits with status 70, unless ``SPINF_EXIT_ON_LEAK=0``.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable

import attrs
import trio

from spinf.serving import ServerState

log = logging.getLogger(__name__)
EXIT_DEGRADED = 70
DEGRADED_GRACE_S = 2.0


@attrs.frozen
class DrainStats:
    stopping: bool
    in_flight: int


@attrs.define
class DrainController:
    """**Inbox**: process signals (SIGTERM, SIGINT), a call to `stop`, or ``state.degraded_seen``.
    **Outbox**: ``shutdown`` (an Event), and ``exit_code``. **Ends**: once ``shutdown`` is set.
    **Cancellation**: nothing is left behind; the HTTP server is then cancelled by its nursery as well.
    """

    state: ServerState
    shutdown: trio.Event
    deadline_s: float = 30.0
    poll_s: float = 0.05
    exit_on_leak: bool = True
    on_stop: Callable[[], None] = lambda: None
    exit_code: int = 0
    deadline: float = float("inf")  # trio time by which the whole shutdown ends, once it has begun
    _requested: trio.Event = attrs.field(factory=trio.Event)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            task_status.started()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_signals, signals)
                nursery.start_soon(self._watch_degraded)
                await self._requested.wait()
                nursery.cancel_scope.cancel()
        await self._finish()

    async def _watch_signals(self, signals) -> None:
        async for signum in signals:
            log.info("received %s: stopping", signal.Signals(signum).name)
            self.stop()
            return

    async def _watch_degraded(self) -> None:
        await self.state.degraded_seen.wait()
        if not self.exit_on_leak:
            log.error("the engine is degraded (%s); serving on, as SPINF_EXIT_ON_LEAK=0 asks", self.state.degraded)
            return
        log.error("the engine is degraded (%s): exiting with status %d", self.state.degraded, EXIT_DEGRADED)
        await trio.sleep(DEGRADED_GRACE_S)
        self.exit_code = EXIT_DEGRADED
        self.stop()

    def stop(self) -> None:
        """Begin the shutdown (idempotent): the one deadline starts now."""
        if not self.state.stopping:
            self.deadline = trio.current_time() + self.deadline_s
        self.state.stopping = True
        self.on_stop()
        self._requested.set()

    async def _finish(self) -> None:
        with trio.move_on_at(self.deadline) as scope:
            while self.state.in_flight:
                await trio.sleep(self.poll_s)
        if scope.cancelled_caught:
            log.warning("%d calls still in flight after %.0f s; closing anyway", self.state.in_flight, self.deadline_s)
        self.shutdown.set()

    def statistics(self) -> DrainStats:
        return DrainStats(self.state.stopping, self.state.in_flight)
