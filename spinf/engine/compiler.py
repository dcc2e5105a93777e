"""Compiling a parsed request into jobs: content read once, every question a branch of its input's trie.

Per input, in the order of api spec §4.9: the content's tokens and their limit, the choice of queries, each query
compiled with running prompt counts, the engine-maximum check, then the content/template join check and the cut
(engine spec A.5). Every prompt becomes a `Prompt`; prompts are laid into `Job`s (one per input, split by query
group and then by halving when it exceeds its limit, A.11.1; `spinf.engine.jobs`), plus floor jobs for the distinct
floor reads (A.9).
"""

from __future__ import annotations

import attrs

from spinf.engine.jobs import Prompt, Room, lay_out, lay_out_input
from spinf.engine.lru import LRU
from spinf.engine.query_tokens import (
    ENDING_CHARS,
    CompiledQuery,
    check_answer_codes,
    compile_query,
    spell_options,
)
from spinf.engine.tokenizer import TextTokenizer
from spinf.engine.trie import Job
from spinf.errors import ApiError, bad_request
from spinf.media.items import AudioItem, content_pieces
from spinf.protocol.queries import choose_queries
from spinf.protocol.types import InputSpec, MediaPart, ScoreRequest

TAIL_CHARS = 256  # the join check reads the content's last 256 characters
DEFAULT_SLOT_TOKENS = 16  # an extraction slot's max_tokens when the query sends none (api spec §4.5)
SLOT_ROWS = 6  # rows an extraction slot holds in the decoder, counted in processed tokens (§4.9)
MIN_CUT_TAIL = 32
CUT_CANDIDATES = 64


def slot_tokens(cq: CompiledQuery) -> int:
    """An extraction slot's ``max_tokens``: the query's, or the default 16."""
    return cq.spec.max_tokens or DEFAULT_SLOT_TOKENS


@attrs.define
class CompiledInput:
    spec: InputSpec
    content_tokens: tuple[int, ...]
    prefix: tuple[int, ...]
    queries: list[CompiledQuery]
    prompts: list[list[Prompt]]  # per chosen query, per combination
    floors: list[list[Prompt | None]]  # the same shape; None where the floor is off
    # the content's media items (`spinf.media.items`), each with the prefix row of its first placeholder
    media: tuple[tuple[int, object], ...] = ()
    fixed: int = 0  # the prefix's rows no choice of queries changes (`Job.fixed`)


@attrs.define
class CompiledRequest:
    request: ScoreRequest
    inputs: list[CompiledInput]
    floors: dict[tuple, Prompt]
    jobs: list[Job]
    warnings: list[dict]

    @property
    def processed_tokens(self) -> int:
        """The cost measure of api spec §4.9: the jobs' tokens plus 6 × ``max_tokens`` per extraction slot."""
        return sum(job.num_tokens for job in self.jobs) + sum(map(decode_tokens, self.inputs))


def decode_tokens(ci: CompiledInput) -> int:
    """An input's share of processed tokens for its extraction slots: 6 rows × ``max_tokens`` each (§4.9)."""
    return sum(SLOT_ROWS * slot_tokens(cq) * len(cq.combos) for cq in ci.queries if cq.extracts)


@attrs.frozen
class EngineShape:
    """The engine constants a compilation needs."""

    token_budget: int
    max_tokens: int
    capture_tokens: int = 0  # the most prefix rows' worth one input's extraction slots may keep (0: no bound)
    capture_cost: object = None  # the decoder's `CaptureCost` (what a row and a prefix hold); None: rows alike
    media_tokens: object = None  # the checkpoint's `spinf.engine.stack.MediaTokens`; None: it reads no media
    media_kinds: frozenset[str] = frozenset()  # the kinds whose embedders are loaded
    answer_codes: frozenset[int] | None = None  # a decision model's answer codes (A.15); None: any option

    @property
    def engine_max(self) -> int:
        return max(self.token_budget, self.max_tokens)


class CompileCache:
    """What a compile reuses from earlier requests on the same tokenizer: compiled queries, the spellings of floor
    reads and the tries of branch lists.

    Each is a function of its key alone, so a request compiles exactly as it would with an empty cache: a query by
    its spec as sent, the limits and the case rule (`compile_query`); a floor's spellings by its floor key; a trie
    by the branches and spellings laid into it, in order (a job's prefix is not part of its trie). Many calls with
    the same questions, one input each, then tokenize each template once and build each trie once.
    """

    def __init__(self, size: int = 4096):
        self.queries, self.floor_spellings, self.tries = LRU(size), LRU(size), LRU(size and max(1, size // 16))

    def query(self, q, tk: TextTokenizer, limits, case_insensitive: bool) -> CompiledQuery:
        key = (repr(q), limits, case_insensitive)
        found = self.queries.get(key)
        if found is None:
            found = compile_query(q, tk, limits, case_insensitive=case_insensitive)
            self.queries.put(key, found)
        return found


NO_CACHE = CompileCache(0)


def compile_request(
    req: ScoreRequest, tk: TextTokenizer, shape: EngineShape, cache: CompileCache = NO_CACHE
) -> CompiledRequest:
    stream = CompileStream(req, tk, shape, cache)
    for _ in stream:
        pass
    return stream.result()


class CompileStream:
    """`compile_request` one input at a time, so a runner can start on an input's jobs while later inputs compile.

    Iterating yields ``(input index, job indices)`` as each input is compiled and laid out, then ``(None, job
    indices)`` for the floor jobs; ``jobs`` grows as it goes. `result` gives the `CompiledRequest` (or raises what
    `compile_request` raises). Errors come in the same per-input order. Once the jobs pass the request's processed-
    token limit nothing more is yielded (the rest is still compiled, so the 413 names the full count).
    """

    def __init__(self, req: ScoreRequest, tk: TextTokenizer, shape: EngineShape, cache: CompileCache = NO_CACHE):
        check_built(req, shape)
        self.req, self.tk, self.shape, self.cache = req, tk, shape, cache
        self.inputs: list[CompiledInput] = []
        self.jobs: list[Job] = []
        self.floors: dict[tuple, Prompt] = {}
        self.warnings: list[dict] = list(req.warnings)  # the parser's (ignored trusted keys) come first
        self.queries: dict[str, CompiledQuery] = {}  # by query path: each compiled once per request
        self._done = False

    def __iter__(self):
        req, shape, jobs = self.req, self.shape, self.jobs
        tokens = 0
        for i in range(len(req.inputs)):
            ci = _compile_input(self, i)
            self.inputs.append(ci)
            start = len(jobs)
            _lay_out_input(ci, shape, jobs, self.cache)
            tokens += sum(job.num_tokens for job in jobs[start:]) + decode_tokens(ci)
            if tokens <= req.limits.max_processed_tokens:
                yield i, range(start, len(jobs))
        start = len(jobs)
        lay_out_floors(self.tk.bos, list(self.floors.values()), shape, jobs, self.cache)
        tokens += sum(job.num_tokens for job in jobs[start:])
        self._done = True
        if tokens <= req.limits.max_processed_tokens:
            yield None, range(start, len(jobs))

    def result(self) -> CompiledRequest:
        if not self._done:
            raise RuntimeError("the compile stream was not run to its end")
        compiled = CompiledRequest(self.req, self.inputs, self.floors, self.jobs, self.warnings)
        if compiled.processed_tokens > self.req.limits.max_processed_tokens:
            raise ApiError(
                413,
                "request_too_large",
                None,
                f"the request needs {compiled.processed_tokens} processed tokens; the limit is "
                f"{self.req.limits.max_processed_tokens}",
            )
        return compiled


def check_built(req: ScoreRequest, shape: EngineShape) -> None:
    """Refuses media the request's features let through but this engine loaded no embedder for (api spec §4.3:
    ``unsupported_content``), and media parts not decoded yet (`spinf.media.items.decode_media` runs first)."""
    for i, inp in enumerate(req.inputs):
        for seg in inp.segments:
            if not isinstance(seg, MediaPart):
                continue
            if seg.kind not in shape.media_kinds:
                raise bad_request("unsupported_content", f"inputs.{i}", f"this engine loaded no {seg.kind} embedder")
            if seg.decoded is None:
                raise ValueError(f"{seg.path}: the media part reached the compiler undecoded")


def content_tokens(inp: InputSpec, tk: TextTokenizer, shape: EngineShape):
    """The content's tokens (engine spec A.2, A.14), its media items each with the content row of its first
    placeholder, and its last text run with the row where that run starts (None when the content ends with media,
    which needs no join check). Text runs are tokenized one by one; an item is its start marker, one placeholder
    per token and its end marker."""
    if not any(isinstance(s, MediaPart) for s in inp.segments):
        text = inp.text
        return tk.tok(text), (), (0, text)
    marks = shape.media_tokens
    tokens: list[int] = []
    media: list[tuple[int, object]] = []
    last: tuple[int, str] | None = None
    for piece in content_pieces(inp):
        if isinstance(piece, str):
            last = (len(tokens), piece)
            tokens.extend(tk.tok(piece))
            continue
        if isinstance(piece, AudioItem):
            start, placeholder, end = marks.boa, marks.audio, marks.eoa
        else:
            start, placeholder, end = marks.boi, marks.image if piece.kind == "image" else marks.video, marks.eoi
        tokens.append(start)
        media.append((len(tokens), piece))
        tokens.extend([placeholder] * piece.num_tokens)
        tokens.append(end)
        last = None
    return tuple(tokens), tuple(media), last


def _compile_input(stream: CompileStream, i: int) -> CompiledInput:
    req, tk, shape, floors, warnings = stream.req, stream.tk, stream.shape, stream.floors, stream.warnings
    inp = req.inputs[i]
    content, media, last = content_tokens(inp, tk, shape)
    if len(content) > req.limits.max_content_tokens:
        raise bad_request(
            "content_too_long",
            f"inputs.{i}",
            f"the content has {len(content)} tokens; the limit is {req.limits.max_content_tokens}",
        )
    queries = _chosen_queries(stream, i)
    _check_fits(req, i, tk, shape, content, queries)
    cut, tail, merged = None, "", True
    if last is not None:  # content that ends with media needs no join check (api spec §4.8)
        cut, tail, merged = _join(last[1], content[last[0] :], queries, tk)
        cut = None if cut is None else last[0] + cut
    if not merged:
        warnings.append(
            {
                "code": "join_not_merged",
                "message": "the content's end merges with a template when tokenized and no clean cut exists; the "
                "content and the templates were tokenized separately",
                "param": f"inputs.{i}",
            }
        )
    prefix = tuple(tk.bos) + (content if cut is None else content[:cut])
    _check_capture(req, i, shape, prefix, cut, tail, queries, tk)
    prompts, input_floors = [], []
    for cq in queries:
        branches = cq.filled_tokens if cut is None else tuple(tk.tok_many([tail + f for f in cq.filled]))
        prompts.append([Prompt(branch, cq, cq.spellings, cq.spec.group or "") for branch in branches])
        on = _floor_on(req, cq)
        input_floors.append([_floor(floors, cq, k, tk, stream.cache) if on else None for k in range(len(cq.combos))])
    media = tuple((len(tk.bos) + row, item) for row, item in media)
    fixed = len(tk.bos) + fixed_content(content, last)
    return CompiledInput(inp, content, prefix, queries, prompts, input_floors, media, fixed)


def fixed_content(content: tuple[int, ...], last: tuple[int, str] | None) -> int:
    """The content's first tokens that stay in the prefix whatever the queries: `_join` cuts, when some query's
    template merges with the content's end, at one of the last `CUT_CANDIDATES` tokens of the last text run, or at
    that run's start when the run is at most `TAIL_CHARS` long; content that ends with media is never cut."""
    if last is None:
        return len(content)
    start, text = last
    if len(text) <= TAIL_CHARS:
        return start
    return max(start, len(content) - CUT_CANDIDATES)


def _chosen_queries(stream: CompileStream, i: int) -> list[CompiledQuery]:
    """The input's queries, each compiled once per request (or taken from the compile cache), with the running
    extraction-slot and prompt counts (api spec §4.9)."""
    req, tk = stream.req, stream.tk
    queries, prompts_seen, slots_seen, compiled = [], 0, 0, stream.queries
    for q in choose_queries(req, i):
        if q.path not in compiled:
            compiled[q.path] = stream.cache.query(q, tk, req.limits, req.case_insensitive)
            if stream.shape.answer_codes is not None:
                check_answer_codes(compiled[q.path], tk, stream.shape.answer_codes)
        cq = compiled[q.path]
        slots_seen += len(cq.combos) if cq.extracts else 0
        if slots_seen > req.limits.max_extractions_per_input:
            raise bad_request(
                "too_many_extractions",
                f"inputs.{i}",
                f"the input has more than {req.limits.max_extractions_per_input} extraction slots (combinations of "
                "its extraction queries)",
            )
        prompts_seen += len(cq.combos)
        if prompts_seen > req.limits.max_prompts_per_input:
            raise bad_request(
                "too_many_prompts",
                f"inputs.{i}",
                f"the input has more than {req.limits.max_prompts_per_input} prompts (combinations of its queries)",
            )
        queries.append(cq)
    return queries


def _check_fits(req, i, tk, shape, content, queries) -> None:
    """Each query's longest prompt (and an extraction slot's tokens) fits the engine maximum; without BOS, every read
    has something before it."""
    for cq in queries:
        after = slot_tokens(cq) if cq.extracts else req.limits.max_option_tokens
        longest = len(tk.bos) + len(content) + max(map(len, cq.filled_tokens)) + after
        if longest > shape.engine_max:
            raise bad_request(
                "content_too_long",
                f"inputs.{i}",
                f"content plus query {cq.spec.id!r} needs {longest} tokens; the engine maximum is {shape.engine_max}",
            )
    if not tk.bos and not content and any(cq.extracts for cq in queries):
        raise bad_request(
            "unsupported_content",
            f"inputs.{i}",
            "this model has no <bos> token, so an extraction slot needs content to condition on",
        )
    for cq in queries:
        if not tk.bos and not all(cq.filled_tokens) and (not content or _floor_on(req, cq)):
            raise bad_request(
                "invalid_field",
                f"{cq.spec.path}.template",
                "this model has no <bos> token, so an empty template read on empty content has nothing to "
                "condition on",
            )


def _check_capture(req, i, shape, prefix, cut, tail, queries, tk) -> None:
    """The keys and values an input's slots keep for decoding (its prefix and their templates) fit the decode
    budget (api spec §4.9: 413 ``request_too_large`` rather than running out of memory)."""
    slots = [cq for cq in queries if cq.extracts]
    if not slots or not shape.capture_tokens:
        return
    template = sum(map(len, (t for cq in slots for t in cq.filled_tokens))) + (len(tk.tok(tail)) if cut else 0)
    cost = shape.capture_cost
    needed = cost.units(len(prefix), template) if cost is not None else len(prefix) + template
    if needed > shape.capture_tokens:
        raise ApiError(
            413,
            "request_too_large",
            None,
            f"input {i} keeps {needed} tokens' worth of keys and values (and recurrent state) for its extraction "
            f"slots; the decode budget holds {shape.capture_tokens}",
        )


def _floor_on(req: ScoreRequest, cq: CompiledQuery) -> bool:
    if cq.extracts:  # extraction has no floor
        return False
    return cq.spec.empty_floor if cq.spec.empty_floor is not None else req.empty_floor


def _floor(floors: dict[tuple, Prompt], cq: CompiledQuery, k: int, tk: TextTokenizer, cache: CompileCache) -> Prompt:
    """The floor read of combination ``k``, shared by key (filled text, options, case rule) (engine spec A.9).

    Its spellings follow the boundary rule on its own filled text alone, so a floor is a function of its key and
    not of the other combinations of whichever query asked for it first.
    """
    text = cq.filled[k]
    key = (text, cq.spec.options, cq.case_insensitive)
    if key not in floors:
        spellings = cache.floor_spellings.get(key)
        if spellings is None:
            ending = text[-ENDING_CHARS:]
            spellings = spell_options(
                tk, cq.spec.options, cq.option_tokens, [(ending, tk.tok(ending))], cq.case_insensitive
            )
            cache.floor_spellings.put(key, spellings)
        floors[key] = Prompt(cq.filled_tokens[k], cq, spellings, key=key)
    return floors[key]


def lay_out_floors(
    bos: tuple[int, ...], floors: list[Prompt], shape: EngineShape, jobs: list[Job], cache: CompileCache = NO_CACHE
) -> None:
    """Append the jobs that read ``floors`` (each ``<bos>`` + a filled template) to ``jobs``."""
    lay_out(Room(tuple(bos), shape.token_budget, shape.engine_max, cache.tries), floors, jobs)


def _needs_cut(text: str, content: tuple[int, ...], queries: list[CompiledQuery], tk: TextTokenizer) -> bool:
    """The join check: does the content's tail merge with any query's first filled template?

    An extraction slot with no template text before it is not cut for (engine spec A.5 item 2 cuts for it): it
    branches at the content's last token, which gives the same tokens, and no other question of the input leaves
    the content part of its attention, so their bits do not depend on such a slot (C.1)."""
    if not content:
        return False
    tail = text[-TAIL_CHARS:]
    tail_tokens = tk.tok(tail)
    return any(tk.tok(tail + cq.filled[0]) != tail_tokens + cq.filled_tokens[0] for cq in queries)


def _join(text, content, queries, tk) -> tuple[int | None, str, bool]:
    """Where to cut the content (a token index) and the tail re-tokenized with each template; False: no clean cut."""
    if not _needs_cut(text, content, queries, tk):
        return None, "", True
    starts = tk.boundaries(text)
    for index in sorted(range(max(0, len(starts) - CUT_CANDIDATES), len(starts)), reverse=True):
        at = starts[index]
        if len(text) - at < MIN_CUT_TAIL or (index and starts[index - 1] == at):
            continue  # a tail too short, or a token that starts where the one before it does (a character split
            # into several byte tokens): a cut there would keep the character's first tokens and re-read it whole
        if tk.tok(text[:at]) + tk.tok(text[at:]) == content:
            return index, text[at:], True
    if len(text) <= TAIL_CHARS:
        return 0, text, True
    return None, "", False


def _lay_out_input(ci: CompiledInput, shape: EngineShape, jobs: list[Job], cache: CompileCache) -> None:
    """The jobs of one input (`spinf.engine.jobs.lay_out_input`). Content longer than half the budget is not
    re-sent into budget-sized pieces: its job may grow up to the engine maximum and runs alone."""
    limit = shape.max_tokens if len(ci.content_tokens) > shape.token_budget // 2 else shape.token_budget
    room = Room(ci.prefix, limit, shape.engine_max, cache.tries, ci.media, ci.fixed)
    lay_out_input(room, [p for per_query in ci.prompts for p in per_query], jobs)
