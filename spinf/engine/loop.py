"""The engine loop: the one path by which every job reaches the device.

The server's packer, `Engine.score`, warm-up, ``spinf-serve score``, parity and the benchmarks all add work here
and call `EngineLoop.step` until it is done. One step, in the order that keeps the device busy:

1. drop the calls whose caller went away;
2. host work while the device runs the pass launched last: parse and compile waiting calls, one input of each in
   turn, until the next pass's worth of jobs waits (`Scheduler.target_tokens`) or nothing is left to compile;
3. the scheduler (pure policy) picks the next pass and the runner (`Scorer`, which decides nothing) launches it;
   while calls are in the loop a pass keeps to ``max_pass_s`` (`Scheduler.pass_budget`), so none waits long behind
   another's;
4. the oldest pass is read back once another is queued behind it (or when nothing else can go; at once where the
   runner does not overlap the host, as on the CPU, whose passes are done when launched), and its values
   are routed to their calls; an input whose jobs are all read gets its ``results`` entry at once, and a call whose
   last job and floors are in is answered in this step, not when the others end.

Floors are read once per key. Under a batch-invariant engine (``share_passes``) the loop's `Floors` own them
(`spinf.engine.floors`: an LRU cache, reads under way, floor reads of the loop's own). Otherwise each call reads its
own floors, in passes that hold its jobs alone, and nothing is reused across calls (api spec §5.10).

The loop tells its kinds of work apart (`spinf.engine.work.Kind`: calls, caller-built jobs, floor reads) by one
table of hooks per kind (`_Hooks`), and keeps what it tracks of each call in a `CallState` of its own.

A pass that fails is retried with each of its calls alone, so one call's failure never fails another; a call that
fails alone gets the error (`on_failure` maps running out of memory to 413). The loop is synchronous and owned by
one thread at a time (the executor's in the server).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import attrs

from spinf.engine import hostgc
from spinf.engine.compiler import CompileCache, CompileStream, EngineShape
from spinf.engine.floors import FloorRead, Floors
from spinf.engine.results import input_result
from spinf.engine.scheduler import MAX_IN_FLIGHT, Scheduler, Waiting
from spinf.engine.tokenizer import TextTokenizer
from spinf.engine.work import Call, CallState, HeldSlots, Kind, LoopStats, Parsed, RawJobs, Scored, Sent, Work

__all__ = ["Call", "EngineLoop", "LoopStats", "RawJobs", "Scored"]

if TYPE_CHECKING:
    from spinf.engine.extractor import Extractor
    from spinf.engine.scorer import InFlight, Scorer
    from spinf.protocol.types import ScoreRequest

log = logging.getLogger(__name__)


@attrs.define(eq=False)
class _Pass:
    members: list[Waiting]
    pending: InFlight


@attrs.frozen
class _Hooks:
    """What the loop does with one kind of work: when it is added (with a call's body parsed already, if it was),
    when one of its jobs is read back, once all of them are, and when it leaves the loop."""

    start: Callable[[Work, Parsed | None], None]
    job_read: Callable[[Work, int], None]
    finish: Callable[[Work], None]
    end: Callable[[Work], None]


class EngineLoop:
    """Admitted work in (`add`), one step at a time (`step`), finished work out.

    ``parse(sent)`` checks a call's body (`ApiError` on a bad one); ``respond(scored)`` builds its response;
    ``on_failure(exc)`` turns a pass's exception into the error a call that failed alone gets.
    """

    def __init__(
        self,
        scorer: Scorer,
        tokenizer: TextTokenizer,
        shape: EngineShape,
        *,
        parse: Callable[[Sent], ScoreRequest],
        respond: Callable[[Scored], dict],
        on_failure: Callable[[BaseException], BaseException],
        share_passes: bool,
        floor_cache: int = 0,
        extractor: Extractor | None = None,
        max_pass_s: float = 0.0,
    ):
        self.scorer, self.tokenizer, self.shape = scorer, tokenizer, shape
        self.extractor = extractor  # decodes extraction slots (`spinf.engine.extractor`); None: none come
        self._parse, self._respond, self._on_failure = parse, respond, on_failure
        self.share_passes = share_passes
        self.scheduler = Scheduler(
            shape.token_budget,
            share_passes=share_passes,
            capture_budget=shape.capture_tokens if extractor else 0,
            max_pass_s=max_pass_s,
        )
        self.floors = Floors(floor_cache if share_passes else 0)
        self.compile_cache = CompileCache()  # content-free, so shared by every call whatever the scheme
        self._works: dict[Work, None] = {}  # added and not finished, in arrival order
        self._calls: dict[Call, CallState] = {}  # the calls among them, with what the loop tracks of each
        self._compiling: collections.deque[Call] = collections.deque()
        self._in_flight: collections.deque[_Pass] = collections.deque()
        self._done: list[Work] = []
        self._to_decode: list[Call] = []  # calls whose passes are in and whose slots decode at the end of the step
        self.pass_log: list[tuple[int, float]] = []  # (tokens, busy seconds) per pass, for the server's metrics
        self._passes = self._tokens = 0
        self._busy_s = 0.0
        jobs_only = {"start": self._start_jobs, "job_read": lambda work, index: None}
        self._hooks = {
            Kind.CALL: _Hooks(self._start_call, self._call_job_read, self._finish_call, self._end_call),
            Kind.RAW_JOBS: _Hooks(**jobs_only, finish=self._end, end=self._done.append),
            Kind.FLOOR_READ: _Hooks(**jobs_only, finish=self._floors_read, end=self._end_floor_read),
        }

    @property
    def has_work(self) -> bool:
        return bool(self._works or self._in_flight or self._done)

    @staticmethod
    def new_call(body: object, request_id: str, **flags) -> Call:
        """A call for `add` (the server's packer makes its calls here, without importing the engine); ``flags``:
        the rest of `Sent`, ``packs`` the pack catalog snapshot of the moment the call is taken."""
        return Call(body, request_id, **flags)

    def add(self, work: Work, parsed: Parsed | None = None) -> None:
        """Take ``work`` in; ``parsed``: a call's body parsed already (`Engine.prepare`), else the loop parses it."""
        work.added_at = time.perf_counter()
        self._works[work] = None
        self._hooks[work.kind].start(work, parsed)

    def run(self, works: list[Work]) -> None:
        """Add ``works`` and step until every one is finished (the in-process callers' way in)."""
        if self.has_work:
            raise RuntimeError("the engine loop is serving other work; one caller drives it at a time")
        for work in works:
            self.add(work)
        while self.has_work:
            self.step()

    def step(self) -> list[Work]:
        """One step (module docstring); the works finished in it, failed and dropped ones included."""
        with hostgc.paused():
            self._drop_abandoned()
            bounded = bool(self._calls)  # calls' passes keep to max_pass_s
            self._compile_until(self.scheduler.target_tokens(len(self._in_flight), bounded=bounded))
            launched = False
            more_coming = bool(self._compiling)
            if self.scheduler.can_schedule(in_flight=len(self._in_flight), more_coming=more_coming, bounded=bounded):
                launched = self._launch(self.scheduler.schedule(bounded=bounded))
            overlapped = MAX_IN_FLIGHT if self.scorer.overlaps else 1
            if len(self._in_flight) >= overlapped or (self._in_flight and not launched):
                self._collect(self._in_flight.popleft())
            self._decode_ready()
            done, self._done = self._done, []
            return done

    def statistics(self) -> LoopStats:
        floors, held = self.floors, self.scorer.allocated_bytes()
        return LoopStats(self._passes, self._tokens, self._busy_s, floors.hits, floors.misses, len(floors), held)

    # adding: a call waits to be compiled; other work's jobs wait for a pass at once

    def _start_call(self, call: Call, parsed: Parsed | None) -> None:
        queued_s = call.sent.queued_s
        self._calls[call] = CallState(parsed, queued_s, compile_s=parsed.seconds if parsed is not None else 0.0)
        self._compiling.append(call)

    def _start_jobs(self, work: Work, parsed: None) -> None:
        work.started_at = work.added_at
        self._schedule(work, range(len(work.jobs)))
        self._maybe_finish(work)

    # host work: parsing and compiling

    def _compile_until(self, target: int) -> None:
        """Compile one input of each waiting call in turn, so that a call of many inputs holds no other back."""
        while self._compiling and self.scheduler.waiting_tokens < target:
            call = self._compiling[0]
            more = self._advance(call, self._calls[call])
            if self._compiling and self._compiling[0] is call:  # a call that failed or finished has left already
                if more:
                    self._compiling.rotate(-1)
                else:
                    self._compiling.popleft()

    def _advance(self, call: Call, state: CallState) -> bool:
        """Compile one more input of ``call``; False once it is compiled (or failed)."""
        began = time.perf_counter()
        try:
            if state.stream is None:
                call.started_at = began
                state.queued_s += began - call.added_at
                request = state.parsed.unwrap() if state.parsed is not None else self._parse(call.sent)
                state.stream = CompileStream(request, self.tokenizer, self.shape, self.compile_cache)
                call.jobs, state.steps = state.stream.jobs, iter(state.stream)
            step = next(state.steps, None)
            if step is None:
                state.compiled = state.stream.result()
        except Exception as exc:  # a refusal (ApiError), or a bug that fails this call only
            self._fail(call, exc)
            return False
        finally:
            state.compile_s += time.perf_counter() - began
        if step is None:
            self._claim_floors(call, state)
            self._maybe_finish(call)
            return False
        i, indices = step
        if i is None:
            if not self.share_passes:  # the call reads its own floors; otherwise the loop reads them
                self._schedule(call, indices)
            return True
        for per_query in state.stream.inputs[i].prompts:
            state.slots.add(per_query)
        for j in indices:
            state.input_of[j] = i
        state.left[i] = len(indices)
        self._schedule(call, indices)
        return True

    def _schedule(self, work: Work, indices: Iterable[int]) -> None:
        for j in indices:
            job = work.jobs[j]
            capture = self.extractor.capture_units(job) if job.ends and self.extractor else 0
            self.scheduler.add(work, j, job.num_tokens, capture)
            work.outstanding += 1

    def _claim_floors(self, call: Call, state: CallState) -> None:
        """Each floor key of a compiled call, through the loop's `Floors` (when passes are shared)."""
        if not self.share_passes:
            return
        wanted, bos = state.compiled.floors, self.tokenizer.bos
        fresh = self.floors.claim(call, state.floors, wanted, bos, self.shape, self.compile_cache)
        if fresh is not None:
            self.add(fresh)

    # the device: launching and reading back

    def _launch(self, members: list[Waiting]) -> bool:
        try:
            pending = self.scorer.start([w.owner.jobs[w.index] for w in members])
        except Exception as exc:
            self._pass_failed(members, exc)
            return False
        self._in_flight.append(_Pass(members, pending))
        return True

    def _collect(self, done: _Pass) -> None:
        try:
            values, busy = self.scorer.collect(done.pending)
        except Exception as exc:
            self._pass_failed(done.members, exc)
            return
        self._passes += 1
        self._tokens += done.pending.num_tokens
        self._busy_s += busy
        self.pass_log.append((done.pending.num_tokens, busy))
        self.scheduler.ran(done.pending.num_tokens, busy)
        members = done.members
        for (k, node, token), value in values.items():
            w = members[k]
            if not w.owner.finished:
                w.owner.values[(w.index, node, token)] = value
        for owner in dict.fromkeys(w.owner for w in members):
            owner.passes += 1
            owner.busy_s += busy
        captured = done.pending.captured
        if captured is not None:
            self._hold(members, done.pending.layout.end_index, captured)
        for w in members:
            self._job_read(w.owner, w.index, w.num_tokens)

    def _job_read(self, work: Work, index: int, num_tokens: int) -> None:
        if work.finished:  # failed or dropped meanwhile
            return
        work.outstanding -= 1
        work.ran_tokens += num_tokens
        self._hooks[work.kind].job_read(work, index)
        self._maybe_finish(work)

    def _call_job_read(self, call: Call, index: int) -> None:
        """An input whose jobs are all read gets its entry now (one with extraction slots once they decode)."""
        state = self._calls[call]
        i = state.input_of.get(index)
        if i is not None:
            state.left[i] -= 1
            ci = state.stream.inputs[i]
            if not state.left[i] and not any(cq.extracts for cq in ci.queries):
                state.entries[i] = input_result(ci, call.values, state.deferred)

    def _pass_failed(self, members: list[Waiting], exc: BaseException) -> None:
        """Retry a shared pass's works each alone; a work that failed alone gets the error."""
        while self._in_flight:  # read what is on the device first: the engine measures memory once it is idle
            self._collect(self._in_flight.popleft())
        error = self._on_failure(exc)
        owners = list(dict.fromkeys(w.owner for w in members))
        if len(owners) == 1:
            self._fail(owners[0], error)
            return
        log.warning("a pass shared by %d works failed (%s); running each alone", len(owners), error)
        # a work that finished meanwhile (a call refused after this pass launched) is not queued again
        for owner in owners:
            if not owner.finished:
                self.scheduler.mark_solo(owner)
        for w in members:
            if not w.owner.finished:
                self.scheduler.add(w.owner, w.index, w.num_tokens, w.capture)

    # extraction: slots wait with what their pass captured, then decode together

    def _hold(self, members: list[Waiting], end_index: dict, captured) -> None:
        """Each slot of the pass waits for the decoder with what the pass captured; when what waits holds more
        than the decode budget, every waiting slot is decoded now (the budget's early flush)."""
        for (k, node), e in end_index.items():
            w = members[k]
            state = self._calls.get(w.owner)  # None: not a call, or one that left
            if state is not None:
                state.slots.hold(w.index, node, captured, captured.starts[e])
        held = {id(c): c for state in self._calls.values() for _, c, _ in state.slots.held}
        if sum(c.nbytes for c in held.values()) > self.extractor.decode_budget:
            self._decode([call for call, state in self._calls.items() if state.slots.held])

    def _decode_ready(self) -> None:
        ready, self._to_decode = self._to_decode, []
        ready = [call for call in ready if call in self._calls]  # not finished meanwhile
        for call in ready:
            self._calls[call].slots.queued = False
        if ready:
            self._decode(ready)
            for call in ready:
                self._maybe_finish(call)

    def _decode(self, calls: list[Call]) -> None:
        """Decode the waiting slots of ``calls``: together when passes are shared, else one call at a time; a
        shared decode that fails is retried call by call, and a call that fails alone gets the error."""
        if not (self.share_passes and len(calls) > 1):
            for call in calls:
                self._decode_together([call])
            return
        try:
            self._decode_together(calls)
        except Exception as exc:
            log.warning("a decode shared by %d calls failed (%s); decoding each alone", len(calls), exc)
            for call in calls:
                if any(captured.released for _, captured, _ in self._calls[call].slots.held):  # its keys are gone
                    self._fail(call, self._on_failure(exc))
                else:
                    self._decode_together([call])

    def _decode_together(self, calls: list[Call]) -> None:
        """One decode of every waiting slot of ``calls``; with one call, a failure fails that call, else it
        raises."""
        slots = [self._calls[call].slots for call in calls]
        held = [(of, item) for of in slots for item in of.held]
        try:
            tasks = [self.extractor.task(prompt, captured, start) for _, (prompt, captured, start) in held]
            outcomes, seconds = self.extractor.decode(tasks)
        except Exception as exc:
            if len(calls) > 1:
                raise
            self._fail(calls[0], self._on_failure(exc))
            return
        for (of, (prompt, _, _)), outcome in zip(held, outcomes, strict=True):
            of.decoded[id(prompt)] = outcome
        for of in slots:
            of.held = []
            of.decode_s += seconds

    # finishing

    def _maybe_finish(self, work: Work) -> None:
        if work.finished or work.outstanding:
            return
        self._hooks[work.kind].finish(work)

    def _finish_call(self, call: Call) -> None:
        state = self._calls[call]
        if state.compiled is None or state.floors.waiting:
            return
        if state.slots.held:  # its slots decode at the end of the step, with those of other calls ready then
            if not state.slots.queued:
                state.slots.queued = True
                self._to_decode.append(call)
            return
        try:
            call.response = self._respond(state.scored(call, self._slot_entry(state.slots)))
        except Exception as exc:  # a bug in building one answer fails that call only
            self._fail(call, exc)
            return
        self._end(call)

    def _slot_entry(self, slots: HeldSlots):
        """How ``input_result`` builds the entry of an extraction query of a call with ``slots``."""
        if self.extractor is None:
            return None
        return lambda ci, qi: self.extractor.query_entry(ci, qi, slots.decoded)

    def _floors_read(self, read: FloorRead) -> None:
        self._end(read)  # first: the calls it finishes below must see it ended, not count it still waited on
        if not read.payer.finished:
            read.payer.ran_tokens += read.ran_tokens
        self.floors.read(read, self._maybe_finish)

    def _fail(self, work: Work, error: BaseException) -> None:
        if work.finished:
            return
        work.error = error
        self._end(work)

    def _drop_abandoned(self) -> None:
        for work in [w for w in self._works if w.abandoned]:
            self._end(work)

    def _end(self, work: Work) -> None:
        """Take ``work`` out of the loop and hand it back; what it held for the device is let go."""
        work.finished = True
        self.scheduler.drop(work)
        self._works.pop(work, None)
        self._hooks[work.kind].end(work)

    def _end_call(self, call: Call) -> None:
        self._done.append(call)
        state = self._calls.pop(call)
        if call in self._compiling:
            self._compiling.remove(call)
        for read in state.floors.reads:  # a read nobody waits for any more is not run
            if not read.finished and self.floors.left(read):
                self._end(read)
        call.values = {}  # what its passes read leaves with its state

    def _end_floor_read(self, read: FloorRead) -> None:
        """A read ended: its keys are no longer under way; a failed read fails every call waiting on it."""
        self.floors.forget(read)
        if read.error is not None:
            for waiting in read.waiters.values():
                for call, _ in waiting:
                    self._fail(call, read.error)
