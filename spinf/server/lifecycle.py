"""The server's owned state: its lifecycle, the facts its boot published, and the calls in flight.

`Lifecycle` is the server's phase (loading, warming, ready, failed, stopping) and the facts each step published.
It changes only through its transition methods, each legal from named phases and raising `IllegalTransition`
otherwise (httpx's ``ClientState`` is the model): the loader moves it to warming or failed, the warm-up to ready or
failed, the drain controller to stopping; the packer may only mark the engine degraded, through `EngineStatus`.
Draining is not a phase: it is the marker file (`spinf.server.drain_marker`). `InFlight` counts the scoring calls
whose callers wait for their answer. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import enum
import math
from collections.abc import Iterator

import attrs
import trio

from spinf.server.served import EngineFacts


@attrs.frozen
class Boot:
    """``boot`` of ``/readyz`` and ``/v0/info`` (api spec §3.1): what the start took, known once warm."""

    import_s: float
    load_s: float
    weights: str
    warmup_s: float | None  # None under --warmup none
    idle_gib: float
    warmup_extract_s: float | None = None  # the extraction call's seconds; None when none ran (or under none)

    def as_dict(self) -> dict:
        body: dict = {"import_s": self.import_s, "load_s": self.load_s, "weights": self.weights}
        if self.warmup_s is not None:
            body["warmup_s"] = self.warmup_s
        if self.warmup_extract_s is not None:
            body["warmup_extract_s"] = self.warmup_extract_s
        return body | {"warm": True, "idle_gib": self.idle_gib}


class Phase(enum.Enum):
    LOADING = "loading"  # /healthz answers; scoring gets 503 warming_up
    WARMING = "warming"  # loaded; the warm-up's passes run
    READY = "ready"  # warm: scoring is admitted, /readyz answers 200 (unless degraded or draining)
    FAILED = "failed"  # the load or the warm-up failed: 503 with the reason, never ready
    STOPPING = "stopping"  # the shutdown began: nothing new is admitted, the calls in flight finish


class IllegalTransition(RuntimeError):
    """A lifecycle move its phase does not allow: a wiring bug, so it crashes the supervisor."""


@attrs.define
class Lifecycle:
    """The server's phase and what its boot published; the probes, ``/v1/models``, ``/metrics`` and the gate read it.

    Legal moves: loading -> warming (`loaded`) -> ready (`warmed`); loading or warming -> failed (`fail`); any
    phase but stopping -> stopping (`stop`). Once stopping, `loaded`, `warmed` and `fail` leave the phase as it is:
    a boot step that ends during a shutdown is expected, not a bug. Every other move raises `IllegalTransition`.
    ``degraded`` is beside the phase, not a phase: a degraded engine still serves until the process exits.
    """

    import_s: float = 0.0
    _phase: Phase = attrs.field(default=Phase.LOADING, init=False)
    _engine: EngineFacts | None = attrs.field(default=None, init=False)
    _load_s: float = attrs.field(default=0.0, init=False)
    _boot: Boot | None = attrs.field(default=None, init=False)
    _error: str | None = attrs.field(default=None, init=False)
    _degraded: str | None = attrs.field(default=None, init=False)
    _degraded_seen: trio.Event = attrs.field(factory=trio.Event, init=False)
    _until_stopping: set[trio.CancelScope] = attrs.field(factory=set, init=False)
    _answer_by: float = attrs.field(default=math.inf, init=False)
    _until_answer_due: set[trio.CancelScope] = attrs.field(factory=set, init=False)

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def engine(self) -> EngineFacts | None:
        """The loaded engine's facts, once loaded."""
        return self._engine

    @property
    def boot(self) -> Boot | None:
        """What the start took, once warm."""
        return self._boot

    @property
    def error(self) -> str | None:
        """Why the load or the warm-up failed (``"<type>: <message>"``)."""
        return self._error

    @property
    def degraded(self) -> str | None:
        """Why the engine is degraded (device memory not freed after an out-of-memory error, api spec §3.2)."""
        return self._degraded

    @property
    def is_warm(self) -> bool:
        """Ready, or stopping after it was: the process serves what it admitted (``/livez``, ``/v1/models``)."""
        return self._boot is not None

    @property
    def is_stopping(self) -> bool:
        return self._phase is Phase.STOPPING

    def loaded(self, facts: EngineFacts, load_s: float) -> None:
        """loading -> warming: the engine is loaded and its warm-up begins."""
        if self._phase is Phase.STOPPING:
            return  # a boot step that ends during a shutdown
        if self._phase is not Phase.LOADING:
            raise IllegalTransition(f"cannot mark the engine loaded: the server is {self._phase.value}, not loading")
        self._phase, self._engine, self._load_s = Phase.WARMING, facts, load_s

    def warmed(self, warmup_s: float | None, idle_gib: float, warmup_extract_s: float | None = None) -> None:
        """warming -> ready: scoring is admitted from now on. ``warmup_extract_s``: the extraction warm-up's
        seconds, when one ran (api spec §3.1)."""
        if self._phase is Phase.STOPPING:
            return  # a boot step that ends during a shutdown
        if self._phase is not Phase.WARMING:
            raise IllegalTransition(f"cannot mark the engine warm: the server is {self._phase.value}, not warming")
        load_s, weights = round(self._load_s, 3), self._engine.weights
        self._boot = Boot(self.import_s, load_s, weights, warmup_s, idle_gib, warmup_extract_s)
        self._phase = Phase.READY

    def fail(self, exc: BaseException) -> None:
        """loading or warming -> failed: the server keeps answering with the reason and never becomes ready."""
        if self._phase is Phase.STOPPING:
            return  # a boot step that ends during a shutdown
        if self._phase not in (Phase.LOADING, Phase.WARMING):
            raise IllegalTransition(f"cannot fail the boot: the server is {self._phase.value}, not loading or warming")
        self._phase, self._error = Phase.FAILED, f"{type(exc).__name__}: {exc}"

    def stop(self, answer_by: float = math.inf) -> None:
        """Any phase but stopping -> stopping; the waits under `until_stopping` end now, those under
        `until_answer_due` at ``answer_by`` (trio time)."""
        if self._phase is Phase.STOPPING:
            raise IllegalTransition("cannot stop: the server is already stopping")
        self._phase, self._answer_by = Phase.STOPPING, answer_by
        for scope in self._until_stopping:
            scope.cancel()
        for scope in self._until_answer_due:
            scope.deadline = answer_by

    def degrade(self, reason: str) -> None:
        """Mark the engine degraded (the first reason stays): probes answer 503, scoring goes on, the drain
        controller ends the process soon (api spec §3.2)."""
        if self._degraded is None:
            self._degraded = reason
            self._degraded_seen.set()

    async def wait_degraded(self) -> str:
        """The degraded reason, once there is one. **Cancellation**: nothing to undo."""
        await self._degraded_seen.wait()
        return self._degraded

    @contextlib.contextmanager
    def until_stopping(self) -> Iterator[trio.CancelScope]:
        """A cancel scope that the shutdown cancels (at once if it began): for waits that must not hold it up."""
        with trio.CancelScope() as scope:
            if self._phase is Phase.STOPPING:
                scope.cancel()
            self._until_stopping.add(scope)
            try:
                yield scope
            finally:
                self._until_stopping.discard(scope)

    @contextlib.contextmanager
    def until_answer_due(self) -> Iterator[trio.CancelScope]:
        """A cancel scope whose deadline, once the shutdown began, is the last moment a call can still be answered
        before the shutdown's deadline cuts it: for a call's wait, which answers 503 when it ends so."""
        with trio.CancelScope(deadline=self._answer_by) as scope:
            self._until_answer_due.add(scope)
            try:
                yield scope
            finally:
                self._until_answer_due.discard(scope)


@attrs.frozen
class EngineStatus:
    """What the packer may change of the server's state: mark the engine degraded. Nothing else."""

    _lifecycle: Lifecycle

    def degrade(self, reason: str) -> None:
        self._lifecycle.degrade(reason)


@attrs.define
class InFlight:
    """The scoring calls whose callers wait for their answer: the web layer counts them (`track`), the drain
    controller waits for none (`wait_none`), ``/metrics`` reads ``count``."""

    count: int = 0
    _none: trio.Event = attrs.field(factory=lambda: _set(trio.Event()))

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        if self.count == 0:
            self._none = trio.Event()
        self.count += 1
        try:
            yield
        finally:
            self.count -= 1
            if self.count == 0:
                self._none.set()

    async def wait_none(self) -> None:
        """Return once no call is in flight. **Cancellation**: nothing to undo."""
        await self._none.wait()


def _set(event: trio.Event) -> trio.Event:
    event.set()
    return event
