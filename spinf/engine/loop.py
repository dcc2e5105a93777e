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

Floors are read once per key. Under a batch-invariant engine (``share_passes``) the loop owns them: a floor key is
served from an LRU cache (`FloorCache`), or from a read already on its way for another call, or read in a floor job
of the loop's own, whose numbers go to every call waiting on the key and into the cache. A floor's numbers depend
only on its key and the engine (engine spec C.2), so a warm cache gives the bits a cold one gives. Otherwise each
call reads its own floors, in passes that hold its jobs alone, and nothing is reused across calls (api spec §5.10).

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
from spinf.engine.compiler import CompileCache, CompileStream, EngineShape, lay_out_floors
from spinf.engine.lru import LRU
from spinf.engine.results import FloorKey, fill_floors, floor_numbers, input_result
from spinf.engine.scheduler import MAX_IN_FLIGHT, Scheduler, Waiting
from spinf.engine.tokenizer import TextTokenizer
from spinf.engine.work import Call, FloorRead, LoopStats, RawJobs, Scored, Work

__all__ = ["Call", "EngineLoop", "FloorCache", "LoopStats", "RawJobs", "Scored"]

if TYPE_CHECKING:
    from spinf.engine.extractor import Extractor
    from spinf.engine.scorer import InFlight, Scorer

log = logging.getLogger(__name__)


class FloorCache(LRU):
    """Floor numbers by key, the least recently used dropped beyond ``size`` (0: nothing is kept)."""


@attrs.define(eq=False)
class _Pass:
    members: list[Waiting]
    pending: InFlight


class EngineLoop:
    """Admitted work in (`add`), one step at a time (`step`), finished work out.

    ``parse(call)`` checks a call's body (`ApiError` on a bad one); ``respond(scored)`` builds its response;
    ``on_failure(exc)`` turns a pass's exception into the error a call that failed alone gets.
    """

    def __init__(
        self,
        scorer: Scorer,
        tokenizer: TextTokenizer,
        shape: EngineShape,
        *,
        parse: Callable,
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
        self.floor_cache = FloorCache(floor_cache if share_passes else 0)
        self.compile_cache = CompileCache()  # content-free, so shared by every call whatever the scheme
        self._works: dict[Work, None] = {}  # added and not finished, in arrival order
        self._compiling: collections.deque[Call] = collections.deque()
        self._in_flight: collections.deque[_Pass] = collections.deque()
        self._done: list[Work] = []
        self._floor_reads: dict[FloorKey, FloorRead] = {}  # keys being read, and by which read
        self._to_decode: list[Call] = []  # calls whose passes are in and whose slots decode at the end of the step
        self.pass_log: list[tuple[int, float]] = []  # (tokens, busy seconds) per pass, for the server's metrics
        self._passes = self._tokens = self._floor_hits = self._floor_misses = 0
        self._busy_s = 0.0

    @property
    def has_work(self) -> bool:
        return bool(self._works or self._in_flight or self._done)

    @staticmethod
    def new_call(
        body: object,
        request_id: str,
        *,
        chat: bool = False,
        trusted: bool = False,
        internals: bool = False,
        queued_s: float = 0.0,
        packs: object = None,
    ) -> Call:
        """A call for `add` (the server's packer makes its calls here, without importing the engine). ``packs``: the
        pack catalog snapshot the call is parsed with (None: packs off), fixed when the call is taken."""
        return Call(body, request_id, chat=chat, trusted=trusted, internals=internals, queued_s=queued_s, packs=packs)

    def add(self, work: Work) -> None:
        work.added_at = time.perf_counter()
        self._works[work] = None
        if isinstance(work, Call):
            self._compiling.append(work)
        else:
            work.started_at = work.added_at
            self._schedule(work, range(len(work.jobs)))
            self._maybe_finish(work)

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
            bounded = any(isinstance(work, Call) for work in self._works)  # calls' passes keep to max_pass_s
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
        return LoopStats(
            self._passes,
            self._tokens,
            self._busy_s,
            self._floor_hits,
            self._floor_misses,
            len(self.floor_cache),
        )

    # host work: parsing and compiling

    def _compile_until(self, target: int) -> None:
        """Compile one input of each waiting call in turn, so that a call of many inputs holds no other back."""
        while self._compiling and self.scheduler.waiting_tokens < target:
            call = self._compiling[0]
            more = self._advance(call)
            if self._compiling and self._compiling[0] is call:  # a call that failed or finished has left already
                if more:
                    self._compiling.rotate(-1)
                else:
                    self._compiling.popleft()

    def _advance(self, call: Call) -> bool:
        """Compile one more input of ``call``; False once it is compiled (or failed)."""
        began = time.perf_counter()
        try:
            if call.stream is None:
                call.started_at = began
                call.queued_s += began - call.added_at
                if call.refused is not None:
                    raise call.refused
                call.stream = CompileStream(self._parse(call), self.tokenizer, self.shape, self.compile_cache)
                call.jobs, call.steps = call.stream.jobs, iter(call.stream)
            step = next(call.steps, None)
            if step is None:
                call.compiled = call.stream.result()
        except Exception as exc:  # a refusal (ApiError), or a bug that fails this call only
            self._fail(call, exc)
            return False
        finally:
            call.compile_s += time.perf_counter() - began
        if step is None:
            self._claim_floors(call)
            self._maybe_finish(call)
            return False
        i, indices = step
        if i is not None:
            for per_query in call.stream.inputs[i].prompts:
                for prompt in per_query:
                    if prompt.extracts:
                        call.slot_prompts.setdefault(prompt.end, []).append(prompt)
        if i is None:
            if not self.share_passes:  # the call reads its own floors; otherwise the loop reads them
                self._schedule(call, indices)
            return True
        for j in indices:
            call.input_of[j] = i
        call.left[i] = len(indices)
        self._schedule(call, indices)
        return True

    def _schedule(self, work: Work, indices: Iterable[int]) -> None:
        for j in indices:
            job = work.jobs[j]
            capture = self.extractor.capture_units(job) if job.ends and self.extractor else 0
            self.scheduler.add(work, j, job.num_tokens, capture)
            work.outstanding += 1

    def _claim_floors(self, call: Call) -> None:
        """Each floor key of a compiled call: from the cache, from a read under way, or read anew by the loop."""
        if not self.share_passes:
            return
        fresh = FloorRead(payer=call)
        for key, prompt in call.compiled.floors.items():
            cached = self.floor_cache.get(key)
            if cached is not None:
                call.floors[key] = cached
                self._floor_hits += 1
                continue
            read = self._floor_reads.get(key)
            if read is None:
                read = self._floor_reads[key] = fresh
                fresh.prompts.append(attrs.evolve(prompt, reads=[]))
                self._floor_misses += 1
            else:
                self._floor_hits += 1
            read.waiters.setdefault(key, []).append(call)
            read.live += 1
            call.reads.append(read)
            call.floors_waiting += 1
        if fresh.prompts:
            lay_out_floors(self.tokenizer.bos, fresh.prompts, self.shape, fresh.jobs, self.compile_cache)
            fresh.added_at = fresh.started_at = time.perf_counter()
            self._works[fresh] = None
            self._schedule(fresh, range(len(fresh.jobs)))

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

    # extraction: slots wait with what their pass captured, then decode together

    def _hold(self, members: list[Waiting], end_index: dict, captured) -> None:
        """Each slot of the pass waits for the decoder with what the pass captured; when what waits holds more
        than the decode budget, every waiting slot is decoded now (the budget's early flush)."""
        for (k, node), e in end_index.items():
            w = members[k]
            if isinstance(w.owner, Call) and not w.owner.finished:
                for prompt in w.owner.slot_prompts.get((w.index, node), ()):
                    w.owner.held.append((prompt, captured, captured.starts[e]))
        held = {id(c): c for call in self._works if isinstance(call, Call) for _, c, _ in call.held}
        if sum(c.nbytes for c in held.values()) > self.extractor.decode_budget:
            self._decode([call for call in self._works if isinstance(call, Call) and call.held])

    def _decode_ready(self) -> None:
        ready, self._to_decode = self._to_decode, []
        for call in ready:
            call.decoding = False
        ready = [call for call in ready if not call.finished]
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
                if any(captured.released for _, captured, _ in call.held):  # its keys and values are gone
                    self._fail(call, self._on_failure(exc))
                else:
                    self._decode_together([call])

    def _decode_together(self, calls: list[Call]) -> None:
        """One decode of every waiting slot of ``calls``; with one call, a failure fails that call, else it
        raises."""
        held = [(call, item) for call in calls for item in call.held]
        try:
            tasks = [self.extractor.task(prompt, captured, start) for _, (prompt, captured, start) in held]
            outcomes, seconds = self.extractor.decode(tasks)
        except Exception as exc:
            if len(calls) > 1:
                raise
            self._fail(calls[0], self._on_failure(exc))
            return
        for (call, (prompt, _, _)), outcome in zip(held, outcomes, strict=True):
            call.decoded[id(prompt)] = outcome
        for call in calls:
            call.held = []
            call.decode_s += seconds

    def _job_read(self, work: Work, index: int, num_tokens: int) -> None:
        if work.finished:  # failed or dropped meanwhile
            return
        work.outstanding -= 1
        work.ran_tokens += num_tokens
        if isinstance(work, Call):
            i = work.input_of.get(index)
            if i is not None:
                work.left[i] -= 1
                ci = work.stream.inputs[i]
                if not work.left[i] and not any(cq.extracts for cq in ci.queries):  # slots: after decoding
                    work.entries[i] = input_result(ci, work.values, work.deferred)
        self._maybe_finish(work)

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

    # finishing

    def _maybe_finish(self, work: Work) -> None:
        if work.finished or work.outstanding:
            return
        if isinstance(work, Call):
            if work.compiled is None or work.floors_waiting:
                return
            if work.held:  # its slots decode at the end of the step, with those of other calls ready then
                if not work.decoding:
                    work.decoding = True
                    self._to_decode.append(work)
                return
            try:
                work.response = self._respond(self._scored(work))
            except Exception as exc:  # a bug in building one answer fails that call only
                self._fail(work, exc)
                return
        elif isinstance(work, FloorRead):
            self._end(work)  # first: the calls it finishes below must see it ended, not count it still waited on
            self._floors_read(work)
            return
        self._end(work)

    def _scored(self, call: Call) -> Scored:
        compiled = call.compiled
        for i, ci in enumerate(compiled.inputs):  # inputs with slots, or with no jobs of their own (nothing to read)
            if i not in call.entries:
                call.entries[i] = input_result(ci, call.values, call.deferred, self._slot_entry(call))
        for key, prompt in compiled.floors.items():  # read among the call's own jobs (not batch-invariant)
            if key not in call.floors:
                call.floors[key] = floor_numbers(prompt, call.values)
        fill_floors(call.deferred, call.floors)
        entries = [call.entries[i] for i in range(len(compiled.inputs))]
        return Scored(
            call,
            compiled,
            [entry for entry, _ in entries],
            [w for _, found in entries for w in found],
            call.decoded,
            call.decode_s,
            call.ran_tokens,
            time.perf_counter() - call.started_at,
            call.busy_s,
        )

    def _slot_entry(self, call: Call):
        """How ``input_result`` builds the entry of an extraction query of ``call``."""
        if self.extractor is None:
            return None
        return lambda ci, qi: self.extractor.query_entry(ci, qi, call.decoded)

    def _floors_read(self, read: FloorRead) -> None:
        if not read.payer.finished:
            read.payer.ran_tokens += read.ran_tokens
        for prompt in read.prompts:
            numbers = floor_numbers(prompt, read.values)
            self.floor_cache.put(prompt.key, numbers)
            for call in read.waiters.get(prompt.key, []):
                if not call.finished:
                    call.floors[prompt.key] = numbers
                    call.floors_waiting -= 1
                    self._maybe_finish(call)

    def _fail(self, work: Work, error: BaseException) -> None:
        if work.finished:
            return
        work.error = error
        self._end(work)
        if isinstance(work, FloorRead):
            for waiting in work.waiters.values():
                for call in waiting:
                    self._fail(call, error)

    def _drop_abandoned(self) -> None:
        for work in [w for w in self._works if w.abandoned]:
            self._end(work)

    def _end(self, work: Work) -> None:
        """Take ``work`` out of the loop and hand it back; what it held for the device is let go."""
        work.finished = True
        self.scheduler.drop(work)
        self._works.pop(work, None)
        if isinstance(work, FloorRead):
            for prompt in work.prompts:
                if self._floor_reads.get(prompt.key) is work:
                    del self._floor_reads[prompt.key]
            return
        self._done.append(work)
        if isinstance(work, Call):
            if work in self._compiling:
                self._compiling.remove(work)
            for read in work.reads:  # a read nobody waits for any more is not run
                if not read.finished:
                    read.live -= 1
                    if not read.live:
                        self._end(read)
            work.stream = work.steps = work.compiled = None
            work.values, work.entries, work.deferred, work.reads = {}, {}, [], []
            work.held, work.slot_prompts = [], {}
