"""The work the engine loop carries (`spinf.engine.loop`): its closed set of kinds, and each piece with one writer.

Three kinds (`Kind`): a `Call` is a ``/v1/score`` (or chat) body and leaves as its response; `RawJobs` are jobs a
caller built (parity's whole prompts) and leave as their values; a floor read (`spinf.engine.floors.FloorRead`) is
the loop's own read of floor keys for every call that waits on them. A work object is the caller's handle: the
caller writes ``abandoned`` (and the jobs of `RawJobs`, before adding them), the loop the rest.

A call's state is split by writer. `Sent` is what the caller sent (frozen, made with the call). `Parsed` is what
the parser made of it, the request or its refusal (frozen: made once, by `Engine.prepare` in a worker thread or by
the loop's own parse). `CallState` is what the loop tracks while the call is in it (the compile stream, jobs by
input, the entries), with the call's floors (`CallFloors`) and its held extraction slots (`HeldSlots`) in objects
of their own; the loop drops it whole when the call ends. Pure Python, no torch.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterator
from typing import ClassVar

import attrs

from spinf.engine.compiler import CompiledRequest, CompileStream
from spinf.engine.jobs import Prompt
from spinf.engine.results import Floor, FloorKey, fill_floors, floor_numbers, input_result
from spinf.engine.trie import Job
from spinf.protocol.types import ScoreRequest

Values = dict[tuple[int, int, int], float]


class Kind(enum.Enum):
    """The kinds of work the loop tells apart (`EngineLoop` keeps one set of hooks per kind)."""

    CALL = "call"
    RAW_JOBS = "raw jobs"
    FLOOR_READ = "floor read"


@attrs.define(eq=False)
class Work:
    """What every kind of work in the loop has: its jobs, the values read for them, what it cost, how it ended."""

    kind: ClassVar[Kind]
    jobs: list[Job] = attrs.field(factory=list, kw_only=True)
    abandoned: bool = attrs.field(default=False, kw_only=True)  # set by the owner; dropped at the next step
    # the loop's, from here on
    values: Values = attrs.field(factory=dict, kw_only=True)
    error: BaseException | None = attrs.field(default=None, kw_only=True)
    finished: bool = attrs.field(default=False, kw_only=True)
    outstanding: int = attrs.field(default=0, kw_only=True)  # jobs scheduled and not yet read back
    ran_tokens: int = attrs.field(default=0, kw_only=True)  # tokens of its jobs that ran (its share of passes)
    passes: int = attrs.field(default=0, kw_only=True)
    busy_s: float = attrs.field(default=0.0, kw_only=True)  # device time of the passes it was in
    added_at: float = attrs.field(default=0.0, kw_only=True)
    started_at: float = attrs.field(default=0.0, kw_only=True)

    def unwrap(self):
        if not self.finished:
            raise RuntimeError("the work is not finished")
        if self.error is not None:
            raise self.error
        return self.result()

    def result(self):
        return self.values


@attrs.frozen
class Sent:
    """What the caller sent: the body and how it is to be read."""

    body: object
    request_id: str
    chat: bool = False
    trusted: bool = False
    internals: bool = False  # the trusted/--debug counters and engine block (api spec §5.7)
    queued_s: float = 0.0  # waited before the loop got it (the server's admission queue)
    packs: object = None  # the pack catalog (`spinf.packs.catalog.Catalog`) the call is parsed with; None: packs off


@attrs.frozen
class Parsed:
    """What the parser made of a body: the request with its media decoded, or what refused it (the loop fails the
    call with it); ``seconds`` it took, counted as compile time."""

    request: ScoreRequest | None
    refused: BaseException | None = None
    seconds: float = 0.0

    def unwrap(self) -> ScoreRequest:
        if self.refused is not None:
            raise self.refused
        return self.request


@attrs.define(eq=False, init=False)
class Call(Work):
    """One ``/v1/score`` (or chat) body; its answer is ``response`` (api spec §5.1), written by the loop."""

    kind: ClassVar[Kind] = Kind.CALL
    sent: Sent
    response: dict | None = None

    def __init__(self, body: object, request_id: str, **flags) -> None:
        """``flags``: the rest of `Sent` (``chat``, ``trusted``, ``internals``, ``queued_s``, ``packs``)."""
        self.__attrs_init__(Sent(body, request_id, **flags))

    @property
    def body(self) -> object:
        return self.sent.body

    @property
    def request_id(self) -> str:
        return self.sent.request_id

    def result(self):
        return self.response


@attrs.define(eq=False)
class RawJobs(Work):
    """Jobs built by the caller (parity's whole prompts); its result is the values, keyed ``(job, node, token)``."""

    kind: ClassVar[Kind] = Kind.RAW_JOBS


@attrs.define(eq=False)
class CallFloors:
    """A call's floor numbers by key, and the loop's reads it still waits on (`spinf.engine.floors.FloorRead`)."""

    numbers: dict[FloorKey, Floor] = attrs.field(factory=dict)
    waiting: int = 0
    reads: list = attrs.field(factory=list)  # the floor reads it waits on, once per key


@attrs.define(eq=False)
class HeldSlots:
    """A call's extraction slots: the prompts by (job, end node); those whose pass has run, waiting for the decoder
    with what the pass captured (prompt, captured pass, where the slot starts); the outcomes by prompt id."""

    prompts: dict[tuple[int, int], list[Prompt]] = attrs.field(factory=dict)
    held: list[tuple] = attrs.field(factory=list)
    decoded: dict[int, object] = attrs.field(factory=dict)
    decode_s: float = 0.0
    queued: bool = False  # queued for the decoder at the end of this step

    def add(self, prompts) -> None:
        """Note the extraction prompts among ``prompts`` (an input's, once laid out)."""
        for prompt in prompts:
            if prompt.extracts:
                self.prompts.setdefault(prompt.end, []).append(prompt)

    def hold(self, job: int, node: int, captured, start) -> None:
        """The slots ending at ``node`` of ``job`` wait for the decoder with what their pass ``captured``."""
        for prompt in self.prompts.get((job, node), ()):
            self.held.append((prompt, captured, start))


@attrs.define(eq=False)
class CallState:
    """What the loop tracks of a call while it is in the loop."""

    parsed: Parsed | None  # made before the loop took the call; None: the loop parses it
    queued_s: float  # the admission queue's wait, then the loop's until it took the call up
    compile_s: float = 0.0
    stream: CompileStream | None = None
    steps: Iterator | None = None
    compiled: CompiledRequest | None = None
    input_of: dict[int, int] = attrs.field(factory=dict)  # job index -> its input
    left: dict[int, int] = attrs.field(factory=dict)  # input -> its jobs not yet read back
    entries: dict[int, tuple[dict, list[dict]]] = attrs.field(factory=dict)
    deferred: list = attrs.field(factory=list)  # floor fields to fill (`results.fill_floors`)
    floors: CallFloors = attrs.field(factory=CallFloors)
    slots: HeldSlots = attrs.field(factory=HeldSlots)

    def scored(self, call: Call, slot_entry: Callable | None) -> Scored:
        """What ``call``'s response is made of, once its jobs, floors and slots are in; ``slot_entry`` builds the
        entry of an extraction query (`input_result`)."""
        compiled, floors = self.compiled, self.floors.numbers
        for i, ci in enumerate(compiled.inputs):  # inputs with slots, or with no jobs of their own (nothing to read)
            if i not in self.entries:
                self.entries[i] = input_result(ci, call.values, self.deferred, slot_entry)
        for key, prompt in compiled.floors.items():  # read among the call's own jobs (not batch-invariant)
            if key not in floors:
                floors[key] = floor_numbers(prompt, call.values)
        fill_floors(self.deferred, floors)
        entries = [self.entries[i] for i in range(len(compiled.inputs))]
        return Scored(
            call,
            compiled,
            [entry for entry, _ in entries],
            [w for _, found in entries for w in found],
            self.slots.decoded,
            self.slots.decode_s,
            call.ran_tokens,
            time.perf_counter() - call.started_at,
            call.busy_s,
            self.queued_s,
            self.compile_s,
        )


@attrs.frozen
class Scored:
    """What a finished call's response is made of (`EngineLoop` hands it to ``respond``)."""

    call: Call
    compiled: CompiledRequest
    results: list[dict]
    warnings: list[dict]  # the low_option_mass warnings, in input order
    decoded: dict[int, object]  # each extraction prompt's outcome (`spinf.engine.extraction.decoder.Decoded`)
    decode_s: float
    ran_tokens: int
    wall_s: float
    busy_s: float
    queued_s: float
    compile_s: float


@attrs.frozen
class LoopStats:
    passes: int
    packed_tokens: int
    busy_s: float
    floor_hits: int  # floor keys served from the cache or from a read already under way
    floor_misses: int  # floor keys read in passes
    floor_entries: int
    device_bytes: int | None = None  # device memory the engine holds now; None on the CPU, where it is not measured
