"""The drain controller: graceful shutdown on SIGTERM or SIGINT, and the exit of a degraded engine (api spec §3).

Draining (``POST /v0/drain``) only takes the server out of rotation and is a marker file the web layer writes.
Shutdown is this actor's, under **one deadline** (``shutdown_s``) from the first signal, put on one cancel scope
(``deadline``) that the supervisor runs the actors and the HTTP server in, as Hypercorn's ``trio/run.py`` does: it
moves the lifecycle to stopping (scoring calls get 503 with ``Retry-After``, ``/readyz`` answers 503, every answer
closes its connection, a request body still arriving is answered at once), answers the refusals still waiting their
turn (``on_stop``), waits until no call is in flight, then sets ``shutdown`` so the HTTP server closes its listener
and its idle connections (`spinf.server.http11.serve`). No wait here has a timer of its own: a call still waiting
`answer_s` before the deadline is answered 503 (`Lifecycle.until_answer_due`), so it gets an answer rather than
nothing, and when the deadline passes the scope cancels whatever is left.

A degraded engine (device memory not freed after an out-of-memory error) keeps serving; about 2 s later the
process shuts down the same way and exits with status 70, unless ``SPINF_EXIT_ON_LEAK=0``.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable

import attrs
import trio

from spinf.server.lifecycle import InFlight, Lifecycle

log = logging.getLogger(__name__)
EXIT_DEGRADED = 70
DEGRADED_GRACE_S = 2.0
ANSWER_S = 0.5  # before the deadline, the calls still waiting are answered 503: time to write them (a tenth at most)


def answer_s(deadline_s: float) -> float:
    """How long before the shutdown's deadline the calls still waiting are answered: `ANSWER_S`, or a tenth of a
    shorter deadline."""
    return min(ANSWER_S, deadline_s / 10)


@attrs.define
class DrainController:
    """**Inbox**: process signals (SIGTERM, SIGINT), a call to `stop`, or the lifecycle's `wait_degraded`.
    **Outbox**: the lifecycle's stopping, the ``deadline`` scope's deadline, ``shutdown`` (an Event) and
    ``exit_code``. **Ends**: once ``shutdown`` is set. **Cancellation**: nothing is left behind; the deadline
    passing cancels it with the HTTP server and the other actors.
    """

    lifecycle: Lifecycle
    in_flight: InFlight
    shutdown: trio.Event
    deadline: trio.CancelScope  # the one shutdown deadline; the supervisor enters it, `stop` sets it
    deadline_s: float  # the settings' shutdown_s
    exit_on_leak: bool = True
    on_stop: Callable[[], None] = lambda: None
    exit_code: int = 0
    _requested: trio.Event = attrs.field(factory=trio.Event)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            task_status.started()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_signals, signals)
                nursery.start_soon(self._watch_degraded)
                await self._requested.wait()
                nursery.cancel_scope.cancel()
        await self.in_flight.wait_none()  # bounded by the deadline, like everything after `stop`
        self.shutdown.set()

    async def _watch_signals(self, signals) -> None:
        async for signum in signals:
            log.info("received %s: stopping", signal.Signals(signum).name)
            self.stop()
            return

    async def _watch_degraded(self) -> None:
        reason = await self.lifecycle.wait_degraded()
        if not self.exit_on_leak:
            log.error("the engine is degraded (%s); serving on, as SPINF_EXIT_ON_LEAK=0 asks", reason)
            return
        log.error("the engine is degraded (%s): exiting with status %d", reason, EXIT_DEGRADED)
        await trio.sleep(DEGRADED_GRACE_S)
        self.exit_code = EXIT_DEGRADED
        self.stop()

    def stop(self) -> None:
        """Begin the shutdown (idempotent): the one deadline starts now; the calls still waiting then are answered
        503 a moment before it (`answer_s`), so the answers are written before the deadline cuts what is left."""
        if not self.lifecycle.is_stopping:
            cut_at = trio.current_time() + self.deadline_s
            self.lifecycle.stop(answer_by=cut_at - answer_s(self.deadline_s))
            self.deadline.deadline = cut_at
        self.on_stop()
        self._requested.set()

    @property
    def cut(self) -> bool:
        """The shutdown's deadline has passed: what was still running then was cancelled (read once it is over)."""
        return trio.current_time() >= self.deadline.deadline
