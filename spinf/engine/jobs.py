"""Laying compiled prompts into jobs (engine spec A.11.1): one job per input; when too large, one per query group
(ungrouped first), then halves of contiguous runs, each job re-sending the prefix with its media.

A `Prompt` is one read of a compiled request (`spinf.engine.compiler`); laying it out points its ``reads`` (and an
extraction prompt's ``end``) at the job that holds it. A trie built once for a list of branches and spellings is
reused from the compile cache's ``tries`` (a trie and its reads are never changed once built). Pure Python.
"""

from __future__ import annotations

import attrs

from spinf.engine.lru import LRU
from spinf.engine.query_tokens import CompiledQuery
from spinf.engine.trie import Job, add_prompt, end_node
from spinf.errors import ApiError


@attrs.define(eq=False)
class Prompt:
    """One read: a branch after a prefix and the spellings read at its end; ``reads`` filled once laid out."""

    branch: tuple[int, ...]
    query: CompiledQuery
    spellings: tuple[tuple[tuple[int, ...], ...], ...]  # per option: the token strings read for it
    group: str = ""
    key: tuple = ()  # a floor's key (filled template text, options, case rule); () for a content prompt
    reads: list[list[tuple[int, int, int]]] = attrs.field(factory=list)  # per spelling: (job, node, token)
    end: tuple[int, int] | None = None  # an extraction prompt's (job, end node), filled once laid out

    @property
    def flat_spellings(self) -> list[tuple[int, ...]]:
        return [s for per_option in self.spellings for s in per_option]

    @property
    def extracts(self) -> bool:
        return self.query.extracts


@attrs.frozen
class Room:
    """Where prompts are laid: after ``prefix`` (re-sent with its ``media``; its first ``fixed`` rows are the same
    whatever the queries), in jobs of at most ``limit`` tokens, none over ``engine_max``; tries from ``tries``."""

    prefix: tuple[int, ...]
    limit: int
    engine_max: int
    tries: LRU
    media: tuple = ()
    fixed: int = 0


def lay_out_input(room: Room, prompts: list[Prompt], jobs: list[Job]) -> None:
    """One job of an input's ``prompts``; when over the room's limit, one per query group (ungrouped first), each
    halved as `lay_out` does."""
    ordered = sorted(prompts, key=lambda p: (p.group != "", p.group))
    job, reads = _build(room, ordered)
    if job.num_tokens <= room.limit:
        _keep(job, ordered, reads, jobs)
        return
    for group in sorted({p.group for p in ordered}, key=lambda g: (g != "", g)):
        lay_out(room, [p for p in ordered if p.group == group], jobs)


def lay_out(room: Room, prompts: list[Prompt], jobs: list[Job]) -> None:
    """Put ``prompts`` into jobs within the room's limit by recursive halving of contiguous runs; a prompt over the
    engine maximum alone is 413."""
    if not prompts:
        return
    job, reads = _build(room, prompts)
    if job.num_tokens > room.limit and len(prompts) > 1:
        half = len(prompts) // 2
        lay_out(room, prompts[:half], jobs)
        lay_out(room, prompts[half:], jobs)
        return
    if job.num_tokens > room.engine_max:
        raise ApiError(
            413,
            "request_too_large",
            None,
            f"one prompt needs {job.num_tokens} tokens; the engine maximum is {room.engine_max}",
        )
    _keep(job, prompts, reads, jobs)


def _build(room: Room, prompts: list[Prompt]) -> tuple[Job, list]:
    """A job of ``prompts`` after the room's prefix, and each prompt's reads; the trie comes from the room's tries
    when the same branches and spellings were laid out before (a trie and its reads are never changed once built)."""
    key = tuple((p.branch, p.spellings, p.extracts) for p in prompts)
    found = room.tries.get(key)
    if found is None:
        job = Job(())
        reads = [add_prompt(job, p.branch, p.flat_spellings, extracts=p.extracts) for p in prompts]
        reads = [(r, end_node(job, p.branch) if p.extracts else None) for p, r in zip(prompts, reads, strict=True)]
        found = (job.trie, job.reads, job.ends, reads)
        room.tries.put(key, found)
    trie, job_reads, ends, reads = found
    return Job(room.prefix, trie, job_reads, ends, room.media, min(room.fixed, len(room.prefix))), reads


def _keep(job: Job, prompts: list[Prompt], reads: list, jobs: list[Job]) -> None:
    """Append ``job`` and point each prompt's reads at it."""
    index = len(jobs)
    jobs.append(job)
    for p, (per_spelling, end) in zip(prompts, reads, strict=True):
        p.reads = [[(index, node, token) for node, token in r] for r in per_spelling]
        p.end = None if end is None else (index, end)
