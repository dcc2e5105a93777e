"""What the server's actors and the web layer share: the messages on their channels and the server's lifecycle.

Messages hand ownership to the receiver. A request carries a one-shot reply channel (buffer 1) and its admission
slot (`spinf.admission.Slot`), released by whoever ends the call. The engine itself is never shared: it travels
over channels (loader -> warm-up -> packer) and only the executor thread runs its torch work. The web layer knows
it through `EngineFacts`, a frozen snapshot the loader takes in the executor thread.

`Lifecycle` is the server's phase (loading, warming, ready, failed, stopping) and the facts each step published.
It changes only through its transition methods, each legal from named phases and raising `IllegalTransition`
otherwise (httpx's ``ClientState`` is the model): the loader moves it to warming or failed, the warm-up to ready or
failed, the drain controller to stopping; the packer may only mark the engine degraded, through `EngineStatus`.
Draining is not a phase: it is the marker file (api spec §3.4), which outlives the process and only makes
``/readyz`` answer 503 while every phase's work goes on. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import enum
import math
import os
import tempfile
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import attrs
import outcome
import trio

from spinf.admission import Slot


class WarmupStep(Protocol):
    """One warm-up step (`spinf.engine.warm.Step`): call it to run it; ``part`` is the ``boot`` field its seconds
    count in (``warmup_s`` or ``warmup_extract_s``)."""

    part: str

    def __call__(self) -> object: ...


class ServedEngine(Protocol):
    """What the server's loader and warm-up use of `spinf.engine.Engine` (this module never imports the engine)."""

    batch_invariant: bool
    degraded: str | None  # device memory not freed after an out-of-memory error (api spec §3.2)
    weights: str

    def info(self) -> dict: ...

    def idle_gib(self) -> float: ...

    def settle(self) -> None: ...  # once warm: the collector stops traversing the model (spinf.engine.hostgc)

    loop: Any  # the engine loop: the warm-up takes the passes it ran off its ``pass_log``, as the packer does

    def warmup_steps(self, mode: str) -> list[WarmupStep]: ...

    def score(self, body: object) -> dict: ...


@attrs.frozen(eq=False)
class ExecJob:
    """Work for the GPU thread: ``fn`` runs there and returns CPU data; the outcome goes back on ``reply``."""

    fn: Callable[[], object]
    reply: trio.MemorySendChannel[outcome.Outcome]


@attrs.define(eq=False)
class ScoreWork:
    """One admitted scoring call on its way through the packer; ``abandoned`` is set when its caller went away.

    The packer owns it, and its ``slot``, once received (`take`): `finish` answers it and frees the slot, `drop`
    frees the slot of a call nobody waits for any more. A caller that goes away (`abandon`) frees the slot at once
    when the packer has taken the call: the packer's inbox holds only calls not yet taken, so it still never holds
    more calls than there are slots; a call still in the inbox frees its slot when the packer takes it.
    """

    body: object
    request_id: str
    chat: bool
    trusted: bool
    internals: bool
    reply: trio.MemorySendChannel[outcome.Outcome]
    slot: Slot
    admitted_at: float = 0.0
    abandoned: bool = False
    taken: bool = False

    def take(self) -> bool:
        """The packer takes the call from its inbox: False (its slot freed) when its caller went away already."""
        self.taken = True
        if self.abandoned:
            self.slot.release()
        return not self.abandoned

    def abandon(self) -> None:
        """The caller went away: the packer drops the call before its next step; its slot is free now if the
        packer has taken it (else when it does)."""
        self.abandoned = True
        if self.taken:
            self.slot.release()

    def finish(self, result: outcome.Outcome) -> None:
        try:
            self.reply.send_nowait(result)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the caller went away; nothing is waiting for this answer
        self.slot.release()

    def drop(self) -> None:
        self.slot.release()


@attrs.frozen(eq=False)
class PackReload:
    """A request to re-read the pack sources (``POST /v0/packs/reload`` or SIGHUP): ``by`` names who asked;
    ``reply`` (buffer 1, None for a signal) gets the `Reloaded` of the reload that served it; ``refresh``: resolve
    the GitHub tags again rather than use the cached commits (``?refresh=true``)."""

    by: str
    reply: trio.MemorySendChannel[Reloaded] | None = None
    refresh: bool = False

    def answer(self, reloaded: Reloaded) -> None:
        if self.reply is None:
            return
        with self.reply:
            try:
                self.reply.send_nowait(reloaded)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the caller went away


@attrs.frozen
class Reloaded:
    """What one reload did (the body of ``POST /v0/packs/reload``): whether the new catalog was swapped in, why
    not (``reason``: ``no_source``, ``catalog_errors`` or ``official_lost``; None when applied), the problems
    found (the catalog errors, or the official source's failure that would have dropped it), the official error
    of what was read, and the source labels and counts of the catalog in use after it (the old one when not
    applied). ``requests``: how many waiting requests this one reload answered."""

    applied: bool
    reason: str | None
    errors: tuple[str, ...]
    official_error: str | None
    sources: tuple[str, ...]
    packs: int
    versions: int
    skipped: int
    requests: int = 1

    def as_dict(self) -> dict:
        body = attrs.asdict(self, recurse=False)
        return {**body, "errors": list(self.errors), "sources": list(self.sources)}


@attrs.frozen
class EngineFacts:
    """What the web layer knows of the loaded engine: ``/v0/info``'s engine object (api spec §3.6), whether it is
    batch-invariant (``/v1/models``) and where its weights came from (``boot.weights``)."""

    info: Mapping[str, object] = attrs.field(converter=lambda info: types.MappingProxyType(dict(info)))
    batch_invariant: bool
    weights: str
    media: frozenset[str] | None = None  # the media kinds it reads (its embedders, --media); None: not said
    # whether its extraction and generation are on (the switches and what its stack runs); None: not said
    extraction: bool | None = None
    generation: bool | None = None

    @classmethod
    def of(cls, engine: ServedEngine) -> EngineFacts:
        """The facts of ``engine``; call it in the executor thread (``engine.info()`` reads torch)."""
        features = getattr(engine, "features", None)
        media = frozenset(features.media) if features is not None else None
        extraction = features.extraction if features is not None else None
        generation = features.generation if features is not None else None
        weights = getattr(engine, "weights", "config")
        return cls(engine.info(), bool(engine.batch_invariant), weights, media, extraction, generation)


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


class ModelsEntry(Protocol):
    """What the web layer reads of the served model (`spinf.supervisor.ModelEntry`): the ``/v1/models`` entry of api
    spec §7 for the lifecycle now, and OpenAI's entry beside it, which ``GET /v1/models/{id}`` answers for a name
    the model ``answers_to`` (its id or an alias, case-insensitively, as requests name it: §9.6)."""

    def __call__(self, lifecycle: Lifecycle) -> dict: ...

    def openai(self) -> dict: ...

    def answers_to(self, name: str) -> bool: ...


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


async def run_on_executor(executor: trio.MemorySendChannel[ExecJob], fn: Callable[[], object]) -> object:
    """Run ``fn`` on the executor thread and return its value (or raise its exception).

    **Cancellation**: cancelling the caller abandons the reply; a job already handed over still runs.
    """
    reply_send, reply_recv = trio.open_memory_channel(1)  # one-shot reply
    with reply_recv:
        await executor.send(ExecJob(fn, reply_send))
        result = await reply_recv.receive()
    return result.unwrap()


def drain_file() -> Path:
    """The drain marker (api spec §3.4): ``SPINF_DRAIN_FILE``, else ``spinf-drain`` in the temporary folder."""
    return Path(os.environ.get("SPINF_DRAIN_FILE") or Path(tempfile.gettempdir()) / "spinf-drain")


def is_draining() -> bool:
    return drain_file().exists()


def set_draining(on: bool) -> None:
    """Create (empty) or remove the drain marker; the state outlives the request and the process."""
    path = drain_file()
    if on:
        path.write_bytes(b"")
    else:
        path.unlink(missing_ok=True)
