"""The best-first beam of engine spec A.12.3, vectorised over every searched slot of a decode chunk.

A slot owns ``BEAM`` rows. `BeamSearch.step` takes the log-probabilities at every row's current position and does
one step of A.12.3 for all slots at once, on whatever device the tensors live (CPU and GPU run the same code): record
the answers the live beams end in, propose the top ``TOPK`` continuations of each beam, prune below
``log(max(min_p, rel_p × best))`` and keep the best ``BEAM`` proposals of each slot. It returns each new row's parent
row and new token, which is all a decoder needs: copy the parent's generated K/V into the row, feed the token.

Nothing in a step reads a tensor's value on the host: shapes are static (``[S, BEAM]`` scores, ``[S, BEAM, T]``
tokens, ``[S, T + 1, BEAM]`` answer and history buffers, ``T`` the chunk's largest ``max_tokens``), the step counter
is a device tensor and every decision is a mask, so a step can be captured in a CUDA graph and runs under
``torch.compile(fullgraph=True)`` (the tests check that). Answers are read back once, at the end
(`BeamSearch.answers`).

**Ties** are broken the same way everywhere: a larger log-prob first, then the lower index, where a beam's proposals
are indexed by token id (text) or candidate column (number) and a slot's gathered proposals by (parent row, the
proposal's rank within its row). Rows are kept in that order, so row 0 is always the best beam.

Number slots follow a grammar given as plain tables (`NumberGrammar`); the extraction vocabulary builds them.

**Memory.** The deterministic top-k (`top`) builds 8-byte sort keys over the whole ``[S, BEAM, V]`` input, twice the
fp32 log-probs: at Gemma's 262,144-token vocabulary that is 12 MiB per slot, so a decoder caps the slots of a chunk
or feeds the selection from a fused top-k of the LM head. A chunk holding both kinds computes both paths for every
slot. Only CPU runs have checked it so far; GPU reductions may choose other strategies by shape, which the GPU
invariance test of issue 14 must cover.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import attrs
import torch

BEAM = 6  # rows per slot (A.12.1)
TOPK = 6  # proposals per beam (A.12.1)
MIN_P = 0.002  # A.12.3 pruning floor
REL_P = 0.02  # A.12.3 pruning, relative to the best answer so far

_NEG_INF = float("-inf")


@attrs.frozen
class NumberGrammar:
    """The number grammar of A.12.4 as tables over the candidate tokens of A.12.3.

    ``candidates`` [C] token ids (the number-alphabet tokens and scale words); ``next_state`` [Q, C] the state a
    candidate drives each state to, or -1 where it is not a valid extension; ``complete`` [Q] whether a state ends a
    number. Several grammars (``{n}`` and ``{$}``) can share one table, each slot naming its start state. The
    extraction vocabulary's `NumberTable` has the same three tables.
    """

    candidates: torch.Tensor  # [C] int64
    next_state: torch.Tensor  # [Q, C] int64
    complete: torch.Tensor  # [Q] bool


@attrs.frozen
class SearchSlot:
    """One searched slot: a text slot has ``stop`` and ``forbidden`` masks [V], a number slot a ``start`` state."""

    max_tokens: int
    stop: torch.Tensor | None = None  # [V] bool: the stop set of A.12.2
    forbidden: torch.Tensor | None = None  # [V] bool: masked from continuations (A.12.2), stop tokens included
    start: int | None = None  # the grammar's start state: set for number slots only

    @property
    def is_number(self) -> bool:
        return self.start is not None


@attrs.frozen
class SearchSlots:
    """The per-slot constants of a chunk, stacked. ``has_text`` / ``has_number`` are host facts fixed at build."""

    max_tokens: torch.Tensor  # [S] int64
    is_number: torch.Tensor  # [S] bool
    stop: torch.Tensor  # [S, V] bool
    forbidden: torch.Tensor  # [S, V] bool
    start: torch.Tensor  # [S] int64
    grammar: NumberGrammar
    has_text: bool
    has_number: bool
    steps: int  # T: the largest max_tokens
    min_p: float
    rel_p: float


class SearchBuffers(NamedTuple):
    """The search state after ``t`` steps; answers recorded at step u sit in column u of ``answer_lp``.

    A NamedTuple rather than attrs: TorchDynamo traces its construction, so a step built on it compiles whole.
    """

    t: torch.Tensor  # [] int64: tokens in every live beam
    score: torch.Tensor  # [S, BEAM] float32: summed log-probs, -inf for dead rows
    alive: torch.Tensor  # [S, BEAM] bool
    state: torch.Tensor  # [S, BEAM] int64: grammar state (number slots)
    tokens: torch.Tensor  # [S, BEAM, T] int64: each live beam's tokens
    best: torch.Tensor  # [S] float32: the best answer log-prob so far, -inf before any
    answer_lp: torch.Tensor  # [S, T + 1, BEAM] float32: -inf where nothing was recorded
    parent: torch.Tensor  # [S, T + 1, BEAM] int64: column u is the parent row of each row at step u
    token: torch.Tensor  # [S, T + 1, BEAM] int64: column u is the token each row took at step u


def stack_slots(
    slots: list[SearchSlot],
    vocab_size: int,
    grammar: NumberGrammar | None = None,
    *,
    device: torch.device | str = "cpu",
    min_p: float = MIN_P,
    rel_p: float = REL_P,
) -> SearchSlots:
    """The constants of a chunk of slots; ``grammar`` is required when a slot is a number slot.

    Any object with the three tables serves as ``grammar``, such as `spinf.engine.extraction.vocab.NumberTable`.
    """
    has_number = any(slot.is_number for slot in slots)
    if has_number and grammar is None:
        raise ValueError("number slots need a grammar")
    if grammar is None:  # one state, one candidate that never extends it: the number path is never read
        grammar = NumberGrammar(
            candidates=torch.zeros(1, dtype=torch.int64),
            next_state=torch.full((1, 1), -1, dtype=torch.int64),
            complete=torch.zeros(1, dtype=torch.bool),
        )
    no_tokens = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    return SearchSlots(
        max_tokens=torch.tensor([slot.max_tokens for slot in slots], dtype=torch.int64, device=device),
        is_number=torch.tensor([slot.is_number for slot in slots], dtype=torch.bool, device=device),
        stop=torch.stack([no_tokens if slot.stop is None else slot.stop for slot in slots]).to(device),
        forbidden=torch.stack([no_tokens if slot.forbidden is None else slot.forbidden for slot in slots]).to(device),
        start=torch.tensor([slot.start or 0 for slot in slots], dtype=torch.int64, device=device),
        grammar=NumberGrammar(
            candidates=grammar.candidates.to(device),
            next_state=grammar.next_state.to(device),
            complete=grammar.complete.to(device),
        ),
        has_text=not all(slot.is_number for slot in slots),
        has_number=has_number,
        steps=max(slot.max_tokens for slot in slots),
        min_p=min_p,
        rel_p=rel_p,
    )


def initial_buffers(slots: SearchSlots) -> SearchBuffers:
    """Step 0: one live beam per slot (row 0, no tokens, the start state)."""
    num_slots, steps = slots.max_tokens.shape[0], slots.steps
    device = slots.max_tokens.device
    rows = torch.arange(BEAM, device=device)
    alive = (rows == 0).expand(num_slots, BEAM).clone()
    return SearchBuffers(
        t=torch.zeros((), dtype=torch.int64, device=device),
        score=torch.where(alive, 0.0, _NEG_INF).to(torch.float32),
        alive=alive,
        state=slots.start[:, None].expand(num_slots, BEAM).clone(),
        tokens=torch.zeros(num_slots, BEAM, steps, dtype=torch.int64, device=device),
        best=torch.full((num_slots,), _NEG_INF, dtype=torch.float32, device=device),
        answer_lp=torch.full((num_slots, steps + 1, BEAM), _NEG_INF, dtype=torch.float32, device=device),
        parent=rows.expand(num_slots, steps + 1, BEAM).clone(),
        token=torch.zeros(num_slots, steps + 1, BEAM, dtype=torch.int64, device=device),
    )


def top(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest of float32 ``values`` along the last dim, larger first, ties to the lower index.

    ``torch.topk`` leaves the order of equal values open (and CPU and GPU differ), so the selection runs on int64 keys
    that order by value, then by lower index, and are all distinct. With fewer than ``k`` values the missing ones come
    back as -inf at the last index.
    """
    n = values.shape[-1]
    if n < k:
        values = torch.nn.functional.pad(values, (0, k - n), value=_NEG_INF)
    bits = (values + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into +0.0
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)  # monotone in the float's value
    index = torch.arange(values.shape[-1], device=values.device)
    _, pos = torch.topk(ordered * (1 << 32) + (0x7FFFFFFF - index), k, dim=-1)
    return values.gather(-1, pos), pos.clamp(max=n - 1)


def masked_logsumexp(logprobs: torch.Tensor, mask: torch.Tensor, keep: bool) -> torch.Tensor:
    """Per row of ``logprobs`` [S, BEAM, V], the log-sum-exp over the tokens where ``mask`` is ``keep``; ``mask`` is
    per slot [S, V] or per row [S, BEAM, V]. On a GPU one Triton program per row (`spinf.engine.kernels`), so a row's
    sum does not depend on how many rows the chunk has; on the CPU torch's reduction, which is per row already."""
    num_slots, beam, vocab = logprobs.shape
    if logprobs.is_cuda:
        from spinf.engine.kernels.rows import masked_logsumexp as kernel

        rows = torch.arange(num_slots * beam, device=logprobs.device)
        which = rows // beam if mask.dim() == 2 else rows
        flat = kernel(logprobs.reshape(-1, vocab), mask.reshape(-1, vocab), which, keep)
        return flat.view(num_slots, beam)
    hide = ~mask if keep else mask
    return torch.logsumexp(logprobs.masked_fill(hide[:, None, :] if mask.dim() == 2 else hide, _NEG_INF), dim=-1)


def end_logprob(logprobs: torch.Tensor, stop: torch.Tensor) -> torch.Tensor:
    """log P(end) of every row (A.12.2): the log-sum-exp of its stop tokens' log-probs. logprobs [S, BEAM, V], stop
    [S, V] -> [S, BEAM]."""
    return masked_logsumexp(logprobs, stop, keep=True)


def _text_rows(slots: SearchSlots, logprobs: torch.Tensor):
    """Per row, text rules: log P(end) and the top proposals after masking. logprobs [S, BEAM, V]."""
    end_lp = end_logprob(logprobs, slots.stop)  # [S, BEAM]
    lp, tok = top(logprobs.masked_fill(slots.forbidden[:, None, :], _NEG_INF), TOPK)  # [S, BEAM, TOPK]
    return end_lp, lp, tok, torch.zeros_like(tok)


def _number_rows(slots: SearchSlots, state: torch.Tensor, logprobs: torch.Tensor):
    """Per row, number rules: log P(end) where the state is complete, and the top valid extensions.

    P(end) = 1 − Σ valid P is summed over the tokens that do not extend the number (A.12.3: they all end it), which
    keeps its precision when the valid tokens hold nearly all the mass; with no valid token it is exactly 1.
    """
    grammar = slots.grammar
    nxt = grammar.next_state[state]  # [S, BEAM, C]
    valid = nxt >= 0
    lp = logprobs[..., grammar.candidates].masked_fill(~valid, _NEG_INF)  # [S, BEAM, C]
    extends = torch.zeros_like(logprobs, dtype=torch.bool).scatter(-1, grammar.candidates.expand_as(valid), valid)
    ends = masked_logsumexp(logprobs, extends, keep=False)
    end_lp = torch.where(grammar.complete[state], torch.where(valid.any(-1), ends, 0.0), _NEG_INF)
    prop_lp, col = top(lp, TOPK)
    return end_lp, prop_lp, grammar.candidates[col], nxt.gather(-1, col)


def search_step(slots: SearchSlots, buf: SearchBuffers, logprobs: torch.Tensor):
    """One step of A.12.3 for every slot: the new buffers, each new row's parent row and token ([S, BEAM] each).

    ``logprobs`` [S, BEAM, V] float32: the full-vocabulary log-softmax at each row's current position (dead rows are
    read but ignored). A dead new row has itself as parent and token 0.
    """
    num_slots, steps = buf.score.shape[0], slots.steps
    device = logprobs.device
    if slots.has_text:
        text = _text_rows(slots, logprobs)
    if slots.has_number:
        number = _number_rows(slots, buf.state, logprobs)
    if not slots.has_number:
        end_lp, prop_lp, prop_tok, prop_state = text
    elif not slots.has_text:
        end_lp, prop_lp, prop_tok, prop_state = number
    else:
        kind = slots.is_number[:, None]
        end_lp, prop_lp, prop_tok, prop_state = (
            torch.where(kind if a.dim() == 2 else kind[..., None], b, a) for a, b in zip(text, number, strict=True)
        )
    # Record: a text beam needs a token, a number beam a complete state (end_lp is -inf otherwise).
    has_token = slots.is_number[:, None] | (buf.t > 0)
    recorded = torch.where(buf.alive & has_token, buf.score + end_lp, _NEG_INF)  # [S, BEAM]
    at_t = torch.arange(steps + 1, device=device) == buf.t
    answer_lp = torch.where(at_t[None, :, None], recorded[:, None, :], buf.answer_lp)
    best = torch.maximum(buf.best, recorded.amax(-1))
    # Propose, prune, keep the best BEAM of each slot.
    floor = torch.clamp(best + _log(slots.rel_p), min=_log(slots.min_p))  # log(max(min_p, rel_p × best))
    cand = buf.score[:, :, None] + prop_lp  # [S, BEAM, TOPK]
    keep = buf.alive[:, :, None] & (buf.t < slots.max_tokens)[:, None, None] & (cand >= floor[:, None, None])
    cand = torch.where(keep & (cand > _NEG_INF), cand, _NEG_INF).reshape(num_slots, BEAM * TOPK)
    score, pick = top(cand, BEAM)  # [S, BEAM]
    alive = score > _NEG_INF
    rows = torch.arange(BEAM, device=device).expand(num_slots, BEAM)
    parent = torch.where(alive, pick // TOPK, rows)
    token = torch.where(alive, prop_tok.reshape(num_slots, -1).gather(1, pick), 0)
    state = torch.where(alive, prop_state.reshape(num_slots, -1).gather(1, pick), 0)
    tokens = buf.tokens.gather(1, parent[:, :, None].expand(-1, -1, steps))
    tokens = torch.where(torch.arange(steps, device=device) == buf.t, token[:, :, None], tokens)
    at_next = (torch.arange(steps + 1, device=device) == buf.t + 1)[None, :, None]
    new = SearchBuffers(
        t=buf.t + 1,
        score=score,
        alive=alive,
        state=state,
        tokens=tokens,
        best=best,
        answer_lp=answer_lp,
        parent=torch.where(at_next, parent[:, None, :], buf.parent),
        token=torch.where(at_next, token[:, None, :], buf.token),
    )
    return new, parent, token


def commit(state: tuple, fresh: tuple) -> None:
    """Copy a step's new state into the old state's tensors, in place."""
    for old, new in zip(state, fresh, strict=True):
        old.copy_(new)


def _log(p: float) -> float:
    return math.log(p) if p > 0 else _NEG_INF


class BeamSearch:
    """The search of a chunk of slots: `step` as long as `num_steps` says, then `answers`.

    A decoder keeps ``BEAM`` rows per slot. Before the first step it puts the prompt's last log-probs in row 0 of
    each slot (the other rows are dead). After each step, for every row: copy the generated K/V of ``parent[s, j]``
    into row j, then feed ``token[s, j]`` at position ``t`` to get the next log-probs. Dead rows (``alive`` False)
    may run but are ignored.
    """

    def __init__(self, slots: SearchSlots) -> None:
        self.slots = slots
        self.buffers = initial_buffers(slots)

    @property
    def num_steps(self) -> int:
        """Steps to run: every slot is finished after it (``max_tokens + 1`` reads of its longest slot)."""
        return self.slots.steps + 1

    @property
    def alive(self) -> torch.Tensor:
        return self.buffers.alive

    def step(self, logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step; the state is updated in place (its tensors keep their memory, as a CUDA graph needs)."""
        fresh, parent, token = search_step(self.slots, self.buffers, logprobs)
        commit(self.buffers, fresh)
        return parent, token

    def answers(self) -> list[list[tuple[tuple[int, ...], float]]]:
        """Per slot, ``(tokens, log-prob)`` of every answer in recording order: by step, then by row."""
        buf = self.buffers
        answer_lp, parent, token = (x.cpu().tolist() for x in (buf.answer_lp, buf.parent, buf.token))
        found = []
        for lp_s, parent_s, token_s in zip(answer_lp, parent, token, strict=True):
            slot = []
            for t, row_lps in enumerate(lp_s):
                for row, lp in enumerate(row_lps):
                    if lp > _NEG_INF:
                        slot.append((_backtrack(parent_s, token_s, t, row), lp))
            found.append(slot)
        return found


def _backtrack(parent: list[list[int]], token: list[list[int]], t: int, row: int) -> tuple[int, ...]:
    """The tokens of ``row`` at step ``t``: column u holds the token taken and the parent row at step u."""
    out = []
    for u in range(t, 0, -1):
        out.append(token[u][row])
        row = parent[u][row]
    return tuple(reversed(out))
