"""The scheduling policy of the engine loop: which waiting jobs go into the next pass (pure Python, no torch).

Jobs wait in arrival order, each with its owner (a call, or the loop's own floor reads) and its size. When the loop
asks and one owner waits, its jobs are packed first-fit-decreasing (`spinf.engine.packing.pack`) and the fullest pass
is taken; the rest wait for the next one, with whatever arrives meanwhile. When several owners wait, they share the
pass first: owner by owner, oldest first, each takes its oldest jobs up to an equal share of the pass (its oldest job
at least, while it fits), and only the room left is packed first-fit-decreasing from everything else. So a small call
rides the next pass beside a call of 45,000 inputs instead of waiting for all of them. The loop launches a pass once a
pass's worth is waiting (two passes' worth while one is already on the device, so that the one it takes is full), or
once nothing more is coming; it never has more than `MAX_IN_FLIGHT` passes launched and unread, since a GPU queues
about one pass of kernels and a third launch would only block the host.

A pass also has a time bound (``max_pass_s``, for calls: warm-up and benchmarks run the full budget): its tokens are
cut to what the last passes ran in that many seconds, at the slowest of their paces (seconds per token). A small call
then waits for the pass under way and its own (on a GPU, one more: a pass is read back once the next is queued),
however many tokens the calls around it bring.

Owners share passes only when the engine is batch-invariant (``share_passes``): a question's numbers then do not
depend on what else is in its pass. Otherwise, and for an owner marked ``solo`` (one whose shared pass failed, so
that one call's failure never fails another), a pass holds the jobs of one owner, the oldest waiting.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable

import attrs

from spinf.engine.packing import pack

MAX_IN_FLIGHT = 2
PACES = 8  # a bounded pass is cut at the slowest pace of this many last passes


@attrs.frozen
class Waiting:
    """One job waiting for a pass: its owner, its index in the owner's jobs, its tokens."""

    owner: Hashable
    index: int
    num_tokens: int
    capture: int = 0  # tokens whose keys and values the pass keeps for the job's extraction slots


class Scheduler:
    """Check/action pairs for the loop: `can_schedule` / `schedule`; `add` and `drop` change what waits."""

    def __init__(self, token_budget: int, *, share_passes: bool, capture_budget: int = 0, max_pass_s: float = 0.0):
        """``capture_budget``: the most tokens of keys and values one pass may keep for extraction slots (0: no
        bound); a pass that would keep more leaves its later slot jobs for the next pass. ``max_pass_s``: the
        seconds a bounded pass should take (0: no bound but the tokens)."""
        self.token_budget = token_budget
        self.max_pass_s = max_pass_s
        self._paces: collections.deque[float] = collections.deque(maxlen=PACES)  # seconds per token, last passes
        self.capture_budget = capture_budget
        self.share_passes = share_passes
        self._waiting: list[Waiting] = []
        self._solo: set = set()
        self.waiting_tokens = 0

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def add(self, owner: Hashable, index: int, num_tokens: int, capture: int = 0) -> None:
        self._waiting.append(Waiting(owner, index, num_tokens, capture))
        self.waiting_tokens += num_tokens

    def mark_solo(self, owner: Hashable) -> None:
        """From now on ``owner``'s jobs run in passes of their own."""
        self._solo.add(owner)

    def drop(self, owner: Hashable) -> None:
        """Forget ``owner``'s waiting jobs (a call that failed or whose caller went away)."""
        self._waiting = [w for w in self._waiting if w.owner != owner]
        self.waiting_tokens = sum(w.num_tokens for w in self._waiting)
        self._solo.discard(owner)

    def ran(self, num_tokens: int, busy_s: float) -> None:
        """A pass of ``num_tokens`` tokens took ``busy_s`` seconds (the pace bounded passes are cut to)."""
        if num_tokens and busy_s > 0:
            self._paces.append(busy_s / num_tokens)

    def pass_budget(self, *, bounded: bool = True) -> int:
        """The tokens the next pass may hold: the token budget, cut to ``max_pass_s`` at the slowest pace of the
        last `PACES` passes when ``bounded`` (at least one token: a job over it runs alone, as one over the token
        budget does). The slowest, since a token of a short job costs more than one of a long job: a pass of one
        small call's jobs must not set the pace of the next pass of one-word inputs."""
        if not (bounded and self.max_pass_s and self._paces):
            return self.token_budget
        return max(1, min(self.token_budget, int(self.max_pass_s / max(self._paces))))

    def target_tokens(self, in_flight: int, *, bounded: bool = True) -> int:
        """How many tokens should wait before a launch: a pass's worth, two while one is on the device."""
        return self.pass_budget(bounded=bounded) * (1 + min(in_flight, 1))

    def can_schedule(self, *, in_flight: int, more_coming: bool, bounded: bool = True) -> bool:
        if not self._waiting or in_flight >= MAX_IN_FLIGHT:
            return False
        return not more_coming or self.waiting_tokens >= self.target_tokens(in_flight, bounded=bounded)

    def schedule(self, *, bounded: bool = True) -> list[Waiting]:
        """Take the next pass (module docstring): the owners' shares, then the fullest packing of the room left;
        ``bounded``: within `pass_budget`'s time bound, else within the token budget."""
        budget = self.pass_budget(bounded=bounded)
        candidates = self._candidates()
        chosen = self._shares(candidates, budget)
        if chosen:
            shared, room = {id(w) for w in chosen}, budget - sum(w.num_tokens for w in chosen)
            rest = [w for w in candidates if id(w) not in shared and w.num_tokens <= room]
            chosen += self._fullest(rest, room) if rest else []
        else:
            chosen = self._fullest(candidates, budget)
        chosen = self._within_capture(chosen)
        taken = {id(w) for w in chosen}
        self._waiting = [w for w in self._waiting if id(w) not in taken]
        self.waiting_tokens -= sum(w.num_tokens for w in chosen)
        return chosen

    @staticmethod
    def _fullest(candidates: list[Waiting], budget: int) -> list[Waiting]:
        """The fullest pass of the first-fit-decreasing packing of ``candidates`` (the earliest among equals)."""
        passes = pack([w.num_tokens for w in candidates], budget)
        sizes = [sum(candidates[k].num_tokens for k in members) for members in passes]
        fullest = max(range(len(passes)), key=lambda p: (sizes[p], -p))
        return [candidates[k] for k in passes[fullest]]

    @staticmethod
    def _shares(candidates: list[Waiting], budget: int) -> list[Waiting]:
        """Each owner's share of a pass of ``budget`` tokens when several wait: owners in the order of their oldest
        job, each its oldest jobs while they fit in ``budget / owners`` tokens (its oldest one while it fits in the
        room left). None when one owner waits; the oldest job alone when it is over the budget."""
        by_owner: dict = {}
        for w in candidates:
            by_owner.setdefault(w.owner, []).append(w)
        if len(by_owner) < 2:
            return []
        if candidates[0].num_tokens > budget:
            return [candidates[0]]
        share, room, chosen = budget // len(by_owner), budget, []
        for jobs in by_owner.values():
            used = 0
            for w in jobs:
                if w.num_tokens > room or (used and used + w.num_tokens > share):
                    break
                chosen.append(w)
                used += w.num_tokens
                room -= w.num_tokens
        return chosen

    def _within_capture(self, chosen: list[Waiting]) -> list[Waiting]:
        """The pass without the slot jobs that would take its kept keys and values past the capture budget (the
        first job always stays); those wait for a later pass."""
        if not self.capture_budget:
            return chosen
        kept, held = [], 0
        for w in chosen:
            if w.capture and kept and held + w.capture > self.capture_budget:
                continue
            held += w.capture
            kept.append(w)
        return kept

    def _candidates(self) -> list[Waiting]:
        """The jobs the next pass may hold: all of them, or one owner's when passes are not shared."""
        first = self._waiting[0].owner
        if self.share_passes and first not in self._solo:
            return [w for w in self._waiting if w.owner not in self._solo]
        return [w for w in self._waiting if w.owner == first]
