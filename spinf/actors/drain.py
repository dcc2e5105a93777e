"""The drain controller: graceful shutdown on SIGTERM or SIGINT (api spec §3.4; STYLE.md "Actors").

Draining (``POST /v0/drain``) only takes the server out of rotation and is a marker file the web layer writes.
Shutdown is this actor's: on the first signal it stops admitting (scoring calls get 503 with ``Retry-After``),
lets the calls in flight finish under a deadline, then sets ``shutdown`` so the HTTP server closes.
"""

from __future__ import annotations

import logging
import signal

import attrs
import trio

from spinf.serving import ServerState

log = logging.getLogger(__name__)


@attrs.frozen
class DrainStats:
    stopping: bool
    in_flight: int


@attrs.define
class DrainController:
    """**Inbox**: process signals (SIGTERM, SIGINT), or a call to `stop`. **Outbox**: ``shutdown`` (an Event).
    **Ends**: once ``shutdown`` is set. **Cancellation**: nothing is left behind; the HTTP server is then cancelled
    by its nursery as well.
    """

    state: ServerState
    shutdown: trio.Event
    deadline_s: float = 30.0
    poll_s: float = 0.05
    _requested: trio.Event = attrs.field(factory=trio.Event)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            task_status.started()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_signals, signals)
                await self._requested.wait()
                nursery.cancel_scope.cancel()
        await self._finish()

    async def _watch_signals(self, signals) -> None:
        async for signum in signals:
            log.info("received %s: stopping", signal.Signals(signum).name)
            self.stop()
            return

    def stop(self) -> None:
        """Begin the shutdown (idempotent)."""
        self.state.stopping = True
        self._requested.set()

    async def _finish(self) -> None:
        with trio.move_on_after(self.deadline_s) as scope:
            while self.state.in_flight:
                await trio.sleep(self.poll_s)
        if scope.cancelled_caught:
            log.warning("%d calls still in flight after %.0f s; closing anyway", self.state.in_flight, self.deadline_s)
        self.shutdown.set()

    def statistics(self) -> DrainStats:
        return DrainStats(self.state.stopping, self.state.in_flight)
