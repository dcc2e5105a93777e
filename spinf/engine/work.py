"""The work the engine loop carries (`spinf.engine.loop`): what each kind holds on its way and what leaves it.

A `Call` is a ``/v1/score`` (or chat) body and leaves as its response; `RawJobs` are jobs a caller built (parity's
whole prompts) and leave as their values; a `FloorRead` is the loop's own read of floor keys for every call that
waits on them. Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from spinf.engine.compiler import CompiledRequest, CompileStream, Prompt
from spinf.engine.results import Floor, FloorKey
from spinf.engine.trie import Job
from spinf.protocol.types import ScoreRequest

Values = dict[tuple[int, int, int], float]


@attrs.define(eq=False)
class Work:
    """What every kind of work in the loop has: its jobs, the values read for them, what it cost."""

    jobs: list[Job] = attrs.field(factory=list, kw_only=True)
    values: Values = attrs.field(factory=dict, kw_only=True)
    error: BaseException | None = attrs.field(default=None, kw_only=True)
    finished: bool = attrs.field(default=False, kw_only=True)
    abandoned: bool = attrs.field(default=False, kw_only=True)  # set by the owner; dropped at the next step
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


@attrs.define(eq=False)
class Call(Work):
    """One ``/v1/score`` (or chat) body; its answer is ``response`` (api spec §5.1)."""

    body: object
    request_id: str
    chat: bool = False
    trusted: bool = False
    internals: bool = False  # the trusted/--debug counters and engine block (api spec §5.7)
    queued_s: float = 0.0  # waited before the loop got it (the server's admission queue)
    packs: object = None  # the pack catalog (`spinf.packs.catalog.Catalog`) the call is parsed with; None: packs off
    response: dict | None = None
    request: ScoreRequest | None = None  # the parsed body with its media decoded (`Engine.prepare`); None: not yet
    refused: BaseException | None = None  # what `Engine.prepare` refused the body with; the loop fails the call
    # the loop's own state for the call
    stream: CompileStream | None = None
    steps: Iterable | None = None
    compiled: CompiledRequest | None = None
    compile_s: float = 0.0
    input_of: dict[int, int] = attrs.field(factory=dict)  # job index -> its input
    left: dict[int, int] = attrs.field(factory=dict)  # input -> its jobs not yet read back
    entries: dict[int, tuple[dict, list[dict]]] = attrs.field(factory=dict)
    deferred: list = attrs.field(factory=list)  # floor fields to fill (`results.fill_floors`)
    floors: dict[FloorKey, Floor] = attrs.field(factory=dict)
    floors_waiting: int = 0
    reads: list[FloorRead] = attrs.field(factory=list)  # the floor reads it waits on, once per key
    # extraction: its slots by (job, end node), those whose pass has run and wait for the decoder (prompt, captured
    # pass, where the slot starts), and the outcomes by prompt id
    slot_prompts: dict[tuple[int, int], list[Prompt]] = attrs.field(factory=dict)
    held: list[tuple] = attrs.field(factory=list)
    decoded: dict[int, object] = attrs.field(factory=dict)
    decode_s: float = 0.0
    decoding: bool = False  # queued for the decoder at the end of this step

    def result(self):
        return self.response


@attrs.define(eq=False)
class RawJobs(Work):
    """Jobs built by the caller (parity's whole prompts); its result is the values, keyed ``(job, node, token)``."""


@attrs.define(eq=False)
class FloorRead(Work):
    """Floor prompts the loop reads for every call waiting on their keys (batch-invariant engines only)."""

    payer: Call
    prompts: list[Prompt] = attrs.field(factory=list)
    waiters: dict[FloorKey, list[Call]] = attrs.field(factory=dict)
    live: int = 0  # waits of calls still in the loop; none left: the read is dropped


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


@attrs.frozen
class LoopStats:
    passes: int
    packed_tokens: int
    busy_s: float
    floor_hits: int  # floor keys served from the cache or from a read already under way
    floor_misses: int  # floor keys read in passes
    floor_entries: int
