"""The decoder: extraction and generated slots decoded from what the scoring pass kept (engine spec B.13, C.4).

A scoring pass with slots keeps, for every job with a slot, the keys and values of its prefix and of each slot's
template path in every layer, and the full-vocabulary log-probs at each slot's start (`Captured`; the scorer makes it).
The content is never read again: `decode` copies what its slots need into one buffer per layer, with room for every
token the slots may generate, and runs decode steps over all the slots at once. A step is a pass of the model whose
rows are the slots' newest tokens (a searched slot's ``BEAM`` beams, a generated slot's ``n`` sequences): each layer
writes the rows' keys and values into its buffer and attends exactly as a branch row of a scoring pass does (the
content part over the prefix, the path part over the template and the tokens generated so far,
`spinf.engine.attention.DecodeKV`), so a decoded token gets the bits it would get as a branch of its input's trie,
whatever else decodes with it. The beam (`search`) and the sampler (`sampling`) choose on the device; a row's path
follows its parent's by a gather of indices, so no key or value is copied when beams are reordered.

Slots are decoded in chunks whose working set (buffers and full-vocabulary log-probs) stays under the decoder
budget (`spinf.engine.extraction.budget`); a slot that cannot fit alone is a 413 ``request_too_large``. A step runs
only while a row is alive, and a chooser reads the vocabulary only for its slots' rows.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import attrs
import torch

from spinf.engine.attention import AttentionPlan, DecodeKV
from spinf.engine.extraction.budget import chunks
from spinf.engine.extraction.sampling import GenerateSlot, Generation, stack_generate
from spinf.engine.extraction.search import BEAM, MIN_P, REL_P, BeamSearch, SearchSlot, stack_slots


@attrs.frozen
class SlotStart:
    """Where one slot starts in its pass's `Captured`: its job's prefix (first captured row, length), the captured
    rows of its template path (root first) and its row of ``Captured.logprobs``."""

    prefix: tuple[int, int]
    path: tuple[int, ...]
    row: int
    shift: int = 0  # how far the prefix's images move later rotary positions back (the Qwen stack, A.14.3)

    @property
    def position(self) -> int:
        """The position of the slot's first generated token."""
        return self.prefix[1] + len(self.path) - self.shift


@attrs.define(eq=False)
class Captured:
    """What one scoring pass kept for its slots: per layer the keys and values [R, Hkv, d] of its captured rows,
    the step-0 log-probs [E, V] and each slot's `SlotStart` (in the pass layout's ``end_rows`` order)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    logprobs: torch.Tensor
    starts: list[SlotStart]
    # a recurrent layer's state after each captured prefix (the Qwen3.5 stack: `Capture.states`), by the prefix's
    # first captured row (``state_index``); empty for a model of attention layers only
    states: list[torch.Tensor | None] = attrs.field(factory=list)
    state_index: dict[int, int] = attrs.field(factory=dict)
    # per captured row its row in a recurrent layer's tensors (`spinf.engine.attention.Capture.compact`), -1 for
    # a prefix row it does not keep; None: a recurrent layer keeps every captured row (or there is none)
    compact: tuple[int, ...] | None = None

    @property
    def nbytes(self) -> int:
        tensors = [*self.keys, *self.values, self.logprobs, *self.states]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    released: bool = False

    def let_go(self, name: str, layer: int) -> None:
        """Let go of one layer's keys or values (``name``), copied by the decoder chunk that reads them last."""
        self.released = True
        getattr(self, name)[layer] = None

    def release(self) -> None:
        """Let go of the keys, values and states (the decoder has copied what it needs); the step-0 log-probs
        stay."""
        self.keys, self.values, self.states, self.released = [], [], [], True


@attrs.frozen
class SlotTask:
    """One slot to decode: where it starts and what to do there (a searched slot or a generated one)."""

    captured: Captured
    start: SlotStart
    search: SearchSlot | None = None
    generate: GenerateSlot | None = None

    @property
    def steps(self) -> int:
        return (self.search or self.generate).max_tokens

    @property
    def rows(self) -> int:
        """The decoder rows the slot holds: its ``BEAM`` beams, or its ``n`` sequences."""
        return BEAM if self.search is not None else self.generate.n


@attrs.frozen
class Decoded:
    """A slot's outcome: a searched slot's answers ``(tokens, log-prob)`` in recording order and the decode steps
    in which it had a live beam (``steps``), or a generated slot's sequences ``(tokens, finish)``."""

    answers: list[tuple[tuple[int, ...], float]] | None = None
    sequences: list[tuple[tuple[int, ...], str]] | None = None
    steps: int = 0


@attrs.define
class DecodeTally:
    """What decodes ran, summed over them (what benchmarks/extraction.py counts): decodes, chunks, model steps,
    the rows those steps ran (every row of the chunk) and of those the rows of a live beam or sequence, and the
    rows whose full-vocabulary log-probs the choosers masked and ranked (``ranked``, every choice)."""

    decodes: int = 0
    chunks: int = 0
    steps: int = 0
    rows: int = 0
    live_rows: int = 0
    ranked: int = 0

    def count(self, steps: int, rows: int, live_rows: int, ranked: int) -> None:
        """One chunk: its model steps of ``rows`` rows each, the live rows they fed and the rows ranked."""
        self.chunks, self.steps, self.rows = self.chunks + 1, self.steps + steps, self.rows + steps * rows
        self.live_rows, self.ranked = self.live_rows + live_rows, self.ranked + ranked


def decode(
    model,
    tasks: list[SlotTask],
    vocabulary,
    *,
    budget: int,
    kernel_plan: Callable | None = None,
    context: Callable | None = None,
    min_p: float = MIN_P,
    rel_p: float = REL_P,
    graphs: bool = False,
    tally: DecodeTally | None = None,
) -> tuple[list[Decoded], float]:
    """Decode every task; their outcomes in order and the seconds it took.

    ``vocabulary`` (`spinf.engine.extraction.vocab.Vocabulary`) gives number slots their grammar; ``kernel_plan``
    (GPU) builds a step's attention plan for the Triton kernel; ``context`` wraps each step (the CPU's one
    thread); ``graphs`` replays every decode step after the first two from a CUDA graph (a GPU); ``tally`` counts
    what ran."""
    began = time.perf_counter()
    if not tasks:
        return [], 0.0
    tally = DecodeTally() if tally is None else tally
    tally.decodes += 1
    cost = model.capture_cost()
    vocab = tasks[0].captured.logprobs.shape[1]
    out: list[Decoded | None] = [None] * len(tasks)
    planned = chunks(tasks, cost, vocab, budget)
    last = {id(tasks[i].captured): c for c, indices in enumerate(planned) for i in indices}
    for c, indices in enumerate(planned):
        # a pass's keys and values are let go as the last chunk that reads them copies them, layer by layer
        lets_go = {id(tasks[i].captured) for i in indices if last[id(tasks[i].captured)] == c}
        chunk = _Chunk(model, [tasks[i] for i in indices], vocabulary, kernel_plan, (min_p, rel_p), lets_go)
        for i in indices:
            if id(tasks[i].captured) in lets_go:
                tasks[i].captured.release()
        found = chunk.run(context, graphs, tally)
        for i, decoded in zip(indices, found, strict=True):
            out[i] = decoded
    return out, time.perf_counter() - began


class _Chunk:
    """The slots of one chunk: their buffers, paths and the two choosers (beam and sampler)."""

    def __init__(self, model, tasks: list[SlotTask], vocabulary, kernel_plan: Callable | None, pruning, lets_go):
        self.model, self.tasks, self.kernel_plan, self.lets_go = model, tasks, kernel_plan, lets_go
        device = tasks[0].captured.logprobs.device
        self.device = device
        self.searched = [s for s, t in enumerate(tasks) if t.search is not None]
        self.generated = [s for s, t in enumerate(tasks) if t.generate is not None]
        generate = [tasks[s].generate for s in self.generated]
        vocab = tasks[0].captured.logprobs.shape[1]
        numbers = any(tasks[s].search.is_number for s in self.searched)
        self.search = (
            BeamSearch(
                stack_slots(
                    [tasks[s].search for s in self.searched],
                    vocab,
                    vocabulary.number_table if numbers else None,
                    device=device,
                    min_p=pruning[0],
                    rel_p=pruning[1],
                )
            )
            if self.searched
            else None
        )
        self.generation = (
            Generation(stack_generate(generate, device=device, width=max(g.n for g in generate)))
            if self.generated
            else None
        )
        self._lay_out_buffers()

    def _lay_out_buffers(self) -> None:
        """One buffer per layer: each group's prefix (contiguous), each slot's template path, then room for every
        row × the chunk's steps of generated tokens; each row's path starts as its slot's template.

        A searched slot holds ``BEAM`` rows (its beams), a generated slot ``n`` (its sequences): a model step runs
        no row a slot cannot use."""
        tasks, device = self.tasks, self.device
        sources: dict[int, tuple[Captured, list[int]]] = {}  # per captured pass: the rows it gives, in buffer order
        groups: dict[tuple[int, tuple[int, int]], int] = {}  # (pass, prefix) -> its first buffer row
        at = 0
        slot_paths = []
        for task in tasks:
            key = (id(task.captured), task.start.prefix)
            rows = sources.setdefault(id(task.captured), (task.captured, []))[1]
            if key not in groups:
                groups[key] = at
                first, length = task.start.prefix
                rows.extend(range(first, first + length))
                at += length
            rows.extend(task.start.path)
            slot_paths.append(list(range(at, at + len(task.start.path))))
            at += len(task.start.path)
        order = [s for key in groups for s, t in enumerate(tasks) if (id(t.captured), t.start.prefix) == key]
        width_of = [t.rows for t in tasks]
        offset = {}  # slot -> its first row
        row_slot = []  # per row: its slot
        for s in order:
            offset[s] = len(row_slot)
            row_slot.extend([s] * width_of[s])
        num_rows = len(row_slot)
        self.num_rows, self.steps, self.gen_base = num_rows, max(t.steps for t in tasks), at
        self.keys, self.values = [], []
        picks = [
            (captured, torch.tensor(rows, dtype=torch.long, device=device)) for captured, rows in sources.values()
        ]
        generated = num_rows * self.steps
        # a recurrent layer keeps fewer rows (`Captured.compact`): its own picks, and per buffer row its row there
        self.compact, compact_picks = None, picks
        if tasks[0].captured.compact is not None:
            lut, compact_picks, kept = [], [], 0
            for captured, rows in sources.values():
                mine = []
                for place in (captured.compact[pos] for pos in rows):
                    lut.append(kept + len(mine) if place >= 0 else -1)
                    if place >= 0:
                        mine.append(place)
                compact_picks.append((captured, torch.tensor(mine, dtype=torch.long, device=device)))
                kept += len(mine)
            self.compact = torch.tensor(lut + list(range(kept, kept + generated)), dtype=torch.long, device=device)
        for layer in range(len(self.model.layers)):
            recurrent = bool(tasks[0].captured.states) and tasks[0].captured.states[layer] is not None
            layer_picks = compact_picks if recurrent else picks
            for name, out in (("keys", self.keys), ("values", self.values)):
                source = getattr(layer_picks[0][0], name)[layer]
                held = sum(len(rows) for _, rows in layer_picks)
                buffer = source.new_empty((held + generated, *source.shape[1:]))
                filled = 0
                for captured, rows in layer_picks:  # each pass's rows straight into place: one copy, no concatenation
                    torch.index_select(
                        getattr(captured, name)[layer], 0, rows, out=buffer[filled : filled + len(rows)]
                    )
                    filled += len(rows)
                buffer[filled:].zero_()
                out.append(buffer)
                for captured, _ in layer_picks:
                    if id(captured) in self.lets_go:
                        captured.let_go(name, layer)
        width = max(len(p) for p in slot_paths) + self.steps
        paths = torch.zeros((num_rows, width), dtype=torch.long)
        for s in order:
            if slot_paths[s]:
                paths[offset[s] : offset[s] + width_of[s], : len(slot_paths[s])] = torch.tensor(slot_paths[s])
        # a recurrent layer's prefix state per group, in group order (the Qwen3.5 stack; none on Gemma)
        self.states = None
        if tasks[0].captured.states:
            self.states = []
            for layer in range(len(self.model.layers)):
                if tasks[0].captured.states[layer] is None:
                    self.states.append(None)
                    continue
                by_group = []
                for captured_id, prefix in groups:
                    captured = sources[captured_id][0]
                    by_group.append(captured.states[layer][captured.state_index[prefix[0]]])
                self.states.append(torch.stack(by_group))
        groups_out, k = [], 0
        for key, start in groups.items():
            count = sum(width_of[s] for s in order if (id(tasks[s].captured), tasks[s].start.prefix) == key)
            groups_out.append((k, count, start, key[1][1]))
            k += count
        self.groups = tuple(groups_out)
        # each row's group, prefix start and prefix length, as three contiguous rows (read by every recurrent layer
        # in every step; the decode kernel reads the groups by row)
        per_row = [(g, start, length) for g, (_, count, start, length) in enumerate(groups_out) for _ in range(count)]
        self.row_groups = torch.tensor(per_row, dtype=torch.long).reshape(-1, 3).t().contiguous().to(device)
        self.paths = paths.to(device)
        self.lengths = torch.tensor([len(slot_paths[s]) for s in row_slot], dtype=torch.long, device=device)
        self.first_positions = torch.tensor(
            [tasks[s].start.position for s in row_slot], dtype=torch.long, device=device
        )
        self.row_slot = row_slot
        # per chooser, made once (a step copies nothing from the host): ``gather`` [slots, width] the row each of
        # its rows reads (``BEAM`` beams; a generated slot's rows past its n, up to the chunk's largest n, read its
        # last sequence's and are ignored), ``real`` the chooser's flat [slots × width] places that are rows, and
        # ``rows`` those rows
        self.gather, self.real, self.rows = {}, {}, {}
        for kind, slots in (("search", self.searched), ("generate", self.generated)):
            width = max((width_of[s] for s in slots), default=1) if kind == "generate" else BEAM
            gather = [[offset[s] + min(b, width_of[s] - 1) for b in range(width)] for s in slots]
            real = [k * width + b for k, s in enumerate(slots) for b in range(width_of[s])]
            self.gather[kind] = torch.tensor(gather, dtype=torch.long, device=device).reshape(-1, width)
            self.real[kind] = torch.tensor(real, dtype=torch.long, device=device)
            self.rows[kind] = torch.tensor(
                [offset[s] + b for s in slots for b in range(width_of[s])], dtype=torch.long, device=device
            )
        self.first_rows = torch.tensor(row_slot, dtype=torch.long, device=device)  # per row: its slot

    def _slot_logprobs(self, lp: torch.Tensor, kind: str) -> torch.Tensor:
        """One chooser's view of a step's [rows, V] log-probs: [slots, width, V]."""
        g = self.gather[kind]
        return lp.index_select(0, g.reshape(-1)).view(*g.shape, -1)

    def run(self, context: Callable | None, graphs: bool, tally: DecodeTally) -> list[Decoded]:
        """Decode the chunk: a choice on the step-0 log-probs, then bodies (feed the last choices, read the next
        log-probs, choose on them) while any row is alive, ``total`` at most. Whether one is alive is read on the host
        before every body, so no model step runs after every beam was pruned and every sequence ended (on a GPU
        the read waits for the step before, a few microseconds against the step's milliseconds). With ``graphs`` (a
        GPU) the first body runs eagerly (kernels compile, tile tables are made), the second is captured in a CUDA
        graph and every later one replays it: the state lives in tensors updated in place, the step counter
        included, so a replay needs nothing from the host."""
        tasks, device = self.tasks, self.device
        first = torch.stack([t.captured.logprobs[t.start.row] for t in tasks])  # [slots, V]
        self.lp = first.index_select(0, self.first_rows)  # every row starts from its slot's step 0
        self.u = torch.zeros((), dtype=torch.long, device=device)  # bodies run so far: the read chosen on
        self.parent = torch.arange(self.num_rows, device=device)  # the last choice: each row's parent and token
        self.tokens = torch.zeros_like(self.parent)
        searched = self.search.num_steps - 1 if self.search else 0
        generated = self.generation.num_steps - 1 if self.generation else 0
        self.searched_steps = searched
        # per searched slot, the decode steps in which it still had a live beam (usage's decode_tokens)
        self.live = torch.zeros(len(self.searched), dtype=torch.long, device=device)
        self.fed = torch.zeros((), dtype=torch.long, device=device)  # live rows fed, summed over the steps
        with context() if context else contextlib.nullcontext():
            self._choose()
        graph, bodies = None, 0
        for u in range(max(searched, generated)):
            if not self._alive(u):
                break  # nothing is alive after the last choice: no later step records or proposes anything
            bodies += 1
            if graphs and u == 1:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    self._body()
            if graph is not None:
                graph.replay()
                continue
            with context() if context else contextlib.nullcontext():
                self._body()
        steps = self.live.tolist()
        tally.count(bodies, self.num_rows, int(self.fed), sum(g.numel() for g in self.gather.values()) * (1 + bodies))
        answers = self.search.answers() if self.search else []
        sequences = self.generation.sequences() if self.generation else []
        out: list[Decoded] = []
        for s in range(len(tasks)):
            if s in self.searched:
                k = self.searched.index(s)
                out.append(Decoded(answers=answers[k], steps=steps[k]))
            else:
                out.append(Decoded(sequences=sequences[self.generated.index(s)]))
        return out

    def _alive(self, u: int) -> bool:
        """Whether any row still decodes after the choice on read ``u`` (a host read)."""
        alive = []
        if self.search is not None and u < self.search.num_steps - 1:
            alive.append(self.search.alive.any())
        if self.generation is not None and u < self.generation.num_steps - 1:
            alive.append(self.generation.alive.any())
        return bool(torch.stack(alive).any()) if alive else False

    def _body(self) -> None:
        """One model step and one choice, all in place: what a CUDA graph holds."""
        for chooser in (self.search, self.generation):
            if chooser is not None:
                self.fed += chooser.alive.sum()
        self._feed(self.parent, self.tokens)
        self.u += 1
        self._choose()

    def _choose(self) -> None:
        """Both choosers on the current log-probs (read ``u``), their state updated in place, and each row's parent
        row and new token (global rows) into ``parent`` and ``tokens``. A chooser past its own steps changes nothing
        (its rows are dead and record nothing)."""
        rows = torch.arange(self.num_rows, device=self.device)
        parent, tokens = rows, torch.zeros_like(rows)
        if self.search is not None:
            p, tok = self.search.step(self._slot_logprobs(self.lp, "search"))
            first_row = self.gather["search"][:, :1]  # a searched slot's BEAM rows are consecutive
            parent = parent.index_put((self.rows["search"],), (first_row + p).reshape(-1))
            tokens = tokens.index_put((self.rows["search"],), tok.reshape(-1))
            self.live += self.search.alive.any(-1) & (self.u < self.searched_steps)
        if self.generation is not None:
            tok = self.generation.step(self._slot_logprobs(self.lp, "generate"))
            tokens = tokens.index_put((self.rows["generate"],), tok.reshape(-1).index_select(0, self.real["generate"]))
        self.parent.copy_(parent)
        self.tokens.copy_(tokens)

    def _feed(self, parent: torch.Tensor, tokens: torch.Tensor) -> None:
        """Feed every row its next token (its path follows its parent's) and read the next log-probs into
        ``self.lp``."""
        num_rows = parent.shape[0]
        self.paths.copy_(self.paths.index_select(0, parent))
        self.lengths.copy_(self.lengths.index_select(0, parent))
        write = self.gen_base + self.u * num_rows + torch.arange(num_rows, device=self.device)
        self.paths.scatter_(1, self.lengths[:, None], write[:, None])
        self.lengths += 1
        positions = self.first_positions + self.u
        kv = DecodeKV(
            self.keys,
            self.values,
            write,
            self.paths,
            self.lengths,
            self.groups,
            self.states,
            self.compact,
            self.row_groups,
        )
        kernel = self.kernel_plan(positions, kv) if self.kernel_plan else None
        empty = torch.zeros((0, 1), dtype=torch.long, device=self.device)
        plan = AttentionPlan(positions, (), empty[:, 0], empty, empty.bool(), kernel=kernel, decode=kv)
        hidden = self.model(tokens, plan)
        self.lp.copy_(self.model.full_logprobs(hidden))
