"""Generation for ``{*}`` slots with ``generate`` (engine spec A.13), vectorised over every generated slot of a chunk.

A slot owns W rows, as many as the chunk's largest ``n`` (``BEAM`` at most), sequence b in row b and the rows past its
``n`` dead; rows never change places, so a decoder feeds each live row its own new token. `generate_step` does one step
for all slots at once: greedy where the temperature is 0 (stop when ``P(end)`` is at least the best token's
probability, else the best token, ties to the lower id), seeded sampling otherwise (the end event and the ``top_k``
most probable tokens, log-probs divided by the temperature, renormalised, the smallest nucleus covering ``top_p``, one
draw). A sequence finishes ``"stop"`` when the end event is chosen and ``"length"`` when it holds ``max_tokens`` tokens
(its last log-probs are not read).

**Seeding.** Sequence b of a slot draws from NumPy's default generator seeded with ``[seed, b]``, the reference
engine's construction (A.13), so texts agree with it draw for draw. A step consumes exactly one uniform of that
stream (``Generator.choice`` with ``p`` reads one ``random()`` and searches the cumulative sum), so the whole stream
is drawn on the host when the chunk is built and uploaded once; a step reads column ``t`` and draws on the device the
way ``choice`` does. No step syncs with the host, and a sequence's draws depend on nothing else in the chunk.
"""

from __future__ import annotations

from typing import NamedTuple

import attrs
import numpy as np
import torch

from spinf.engine.extraction.search import BEAM, commit, end_logprob, top

MAX_TOP_K = 100  # the largest generate.top_k (api spec §4.5)
STOP = 1  # finish codes in GenerateBuffers.finish; 0 while running
LENGTH = 2
FINISH_REASONS = {STOP: "stop", LENGTH: "length"}

_NEG_INF = float("-inf")


@attrs.frozen
class GenerateSlot:
    """One generated slot (A.13 parameters); ``stop`` and ``forbidden`` are the [V] masks of A.12.2."""

    max_tokens: int
    stop: torch.Tensor
    forbidden: torch.Tensor
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int | None = None  # default: 40 when sampling, 1 when greedy
    seed: int = 0
    n: int = 1

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.n <= BEAM:
            raise ValueError(f"n must be 1 to {BEAM}, got {self.n}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError("temperature must be >= 0 and top_p in (0, 1]")

    @property
    def num_candidates(self) -> int:
        if self.top_k is not None:
            return self.top_k
        return 40 if self.temperature > 0 else 1


@attrs.frozen
class GenerateSlots:
    """The per-slot constants of a chunk, stacked, W rows per slot; ``max_k`` and ``steps`` are host facts fixed at
    build."""

    max_tokens: torch.Tensor  # [S] int64
    temperature: torch.Tensor  # [S] float64, 1 for greedy slots (never divided by 0)
    is_greedy: torch.Tensor  # [S] bool
    top_p: torch.Tensor  # [S] float64
    top_k: torch.Tensor  # [S] int64
    stop: torch.Tensor  # [S, V] bool
    forbidden: torch.Tensor  # [S, V] bool
    uniforms: torch.Tensor  # [S, W, T] float64: the draw of each sequence at each step
    rows: torch.Tensor  # [S, W] bool: the slot's n sequences
    max_k: int
    steps: int  # T: the largest max_tokens


class GenerateBuffers(NamedTuple):
    """The generation state after ``t`` steps (a NamedTuple so that a step compiles whole)."""

    t: torch.Tensor  # [] int64
    alive: torch.Tensor  # [S, W] bool: still generating
    tokens: torch.Tensor  # [S, W, T] int64
    length: torch.Tensor  # [S, W] int64
    finish: torch.Tensor  # [S, W] int64: 0 running, STOP or LENGTH


def sequence_uniforms(seed: int, sequence: int, steps: int) -> np.ndarray:
    """The uniforms sequence ``sequence`` of a slot seeded ``seed`` draws with, one per step."""
    return np.random.default_rng([seed, sequence]).random(steps)


def stack_generate(
    slots: list[GenerateSlot], *, device: torch.device | str = "cpu", width: int = BEAM
) -> GenerateSlots:
    """The chunk's constants, ``width`` rows per slot (at least every slot's ``n``): a decoder gives its chunk's
    largest ``n``, so a step reads and ranks the vocabulary for no row that no slot uses."""
    if width < max(slot.n for slot in slots):
        raise ValueError(f"width {width} is under a slot's n")
    steps = max(slot.max_tokens for slot in slots)
    uniforms = np.zeros((len(slots), width, steps))
    for s, slot in enumerate(slots):
        if slot.temperature > 0:
            for b in range(slot.n):
                uniforms[s, b, : slot.max_tokens] = sequence_uniforms(slot.seed, b, slot.max_tokens)

    def column(values, dtype):
        return torch.tensor(values, dtype=dtype, device=device)

    return GenerateSlots(
        max_tokens=column([slot.max_tokens for slot in slots], torch.int64),
        temperature=column([slot.temperature or 1.0 for slot in slots], torch.float64),
        is_greedy=column([slot.temperature == 0 for slot in slots], torch.bool),
        top_p=column([slot.top_p for slot in slots], torch.float64),
        top_k=column([slot.num_candidates for slot in slots], torch.int64),
        stop=torch.stack([slot.stop for slot in slots]).to(device),
        forbidden=torch.stack([slot.forbidden for slot in slots]).to(device),
        uniforms=torch.from_numpy(uniforms).to(device),
        rows=column([[b < slot.n for b in range(width)] for slot in slots], torch.bool),
        # every sampled slot draws among MAX_TOP_K + 1 events (the rest -inf), so its softmax has one width whatever
        # shares the chunk; greedy slots read only the best token, so a greedy chunk needs just that one
        max_k=MAX_TOP_K if any(slot.temperature > 0 for slot in slots) else max(s.num_candidates for s in slots),
        steps=steps,
    )


def initial_generate(slots: GenerateSlots) -> GenerateBuffers:
    """Every sequence running with no tokens (a slot of ``max_tokens`` 0 finishes ``"length"`` at once)."""
    empty = slots.max_tokens[:, None] == 0
    return GenerateBuffers(
        t=torch.zeros((), dtype=torch.int64, device=slots.rows.device),
        alive=slots.rows & ~empty,
        tokens=torch.zeros(*slots.rows.shape, slots.steps, dtype=torch.int64, device=slots.rows.device),
        length=torch.zeros(slots.rows.shape, dtype=torch.int64, device=slots.rows.device),
        finish=torch.where(slots.rows & empty, LENGTH, 0),
    )


def _draw(slots: GenerateSlots, events: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The event each row draws: events [S, W, K + 1] log-probs (-inf: not a candidate), u [S, W] uniforms.

    Events are sorted by probability (stable, so the end event, first, wins ties), the nucleus is every event whose
    predecessors hold less than ``top_p``, and the draw searches its normalised cumulative sum as ``choice`` does.
    """
    p = torch.softmax(events.double() / slots.temperature[:, None, None], dim=-1)
    p, order = torch.sort(p, dim=-1, descending=True, stable=True)
    before = torch.cumsum(p, dim=-1) - p
    p = torch.where(before < slots.top_p[:, None, None], p, 0.0)
    cdf = torch.cumsum(p / p.sum(-1, keepdim=True), dim=-1)
    cdf = cdf / cdf[..., -1:]
    pick = torch.searchsorted(cdf, u[..., None], right=True).clamp(max=events.shape[-1] - 1)
    return order.gather(-1, pick)[..., 0]


def generate_step(slots: GenerateSlots, buf: GenerateBuffers, logprobs: torch.Tensor):
    """One step of A.13 for every slot: the new buffers and each row's new token ([S, W], 0 where none).

    ``logprobs`` [S, W, V] float32 at each row's current position (rows that are not alive are ignored).
    """
    steps = slots.steps
    end_lp = end_logprob(logprobs, slots.stop)  # [S, W]
    cand_lp, cand_tok = top(logprobs.masked_fill(slots.forbidden[:, None, :], _NEG_INF), slots.max_k)
    ranked = torch.arange(slots.max_k, device=logprobs.device) < slots.top_k[:, None, None]
    events = torch.cat([end_lp[..., None], cand_lp.masked_fill(~ranked, _NEG_INF)], dim=-1)  # [S, W, K + 1]
    u = slots.uniforms.index_select(2, buf.t.clamp(max=steps - 1).view(1))[..., 0]
    greedy = torch.where(end_lp >= cand_lp[..., 0], 0, 1)  # the end event wins ties
    event = torch.where(slots.is_greedy[:, None], greedy, _draw(slots, events, u))
    ends = buf.alive & (event == 0)
    grows = buf.alive & (event > 0)
    token = torch.where(grows, cand_tok.gather(-1, (event - 1).clamp(min=0)[..., None])[..., 0], 0)
    at_t = torch.arange(steps, device=logprobs.device) == buf.t
    length = buf.length + grows.long()
    full = grows & (length >= slots.max_tokens[:, None])
    new = GenerateBuffers(
        t=buf.t + 1,
        alive=grows & ~full,
        tokens=torch.where(at_t & grows[..., None], token[..., None], buf.tokens),
        length=length,
        finish=torch.where(ends, STOP, torch.where(full, LENGTH, buf.finish)),
    )
    return new, token


class Generation:
    """The generated slots of a chunk: `step` up to `num_steps` times (or until nothing is alive), then `sequences`.

    Before the first step a decoder puts the prompt's last log-probs in every row of the slot's ``n`` sequences;
    after each step it feeds each live row its own ``token`` (rows keep their places: the parent of row j is j).
    """

    def __init__(self, slots: GenerateSlots) -> None:
        self.slots = slots
        self.buffers = initial_generate(slots)

    @property
    def num_steps(self) -> int:
        return self.slots.steps

    @property
    def alive(self) -> torch.Tensor:
        return self.buffers.alive

    def step(self, logprobs: torch.Tensor) -> torch.Tensor:
        """One step; the state is updated in place (its tensors keep their memory, as a CUDA graph needs)."""
        fresh, token = generate_step(self.slots, self.buffers, logprobs)
        commit(self.buffers, fresh)
        return token

    def sequences(self) -> list[list[tuple[tuple[int, ...], str]]]:
        """Per slot, its ``n`` sequences in order: ``(tokens, finish)`` with finish ``"stop"`` or ``"length"``."""
        tokens, length, finish, rows = (x.cpu().tolist() for x in (*self.buffers[2:], self.slots.rows))
        return [
            [(tuple(tok[:n]), FINISH_REASONS[f]) for tok, n, f, row in zip(*per_slot, strict=True) if row]
            for per_slot in zip(tokens, length, finish, rows, strict=True)
        ]
