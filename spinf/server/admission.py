"""Admission and load shedding: who gets scored, and what a refusal may cost (api spec §2.6 step 4, §3.8).

`Admission` holds the ``queue + 1`` slots. A `Slot` travels with its call into the packer and is released when the
call is answered or dropped, or when its caller goes away once the packer has taken the call (`ScoreWork.abandon`):
a call still in the packer's inbox keeps its slot until taken, so the inbox (sized to the slots) can never be full.

Refusing must cost almost nothing, or a flood of retries starves the engine: the event loop shares the GIL with
the engine thread, and every refusal it answers is Python work the engine waits behind. So a call that finds every
slot taken is not answered at once when refusals come faster than ``rate`` per second (a short burst aside): it
waits for its turn (a generic cell rate algorithm; a large body costs one more turn per 64 KiB, since reading and
parsing it is the expensive part), and a client that retries at once without honouring ``Retry-After`` is slowed
to its share of that rate. With no flood the burst is never spent and a refusal is answered at once, as the spec
describes.

Slots are shared by caller (the gate names the caller: the peer's address). While calls wait, a slot that frees goes to
the caller that holds the fewest slots at that moment (among equals, the one whose oldest waiting call came first), and
within a caller to its oldest waiting call, so waiters are served in arrival order; a caller that holds as many as
``capacity / callers`` slots gets none until the others have caught up. Within a caller one exception: while refusals
wait for their turns (a flood), its newest waiter is served, since its oldest are about to get their paced 429 anyway
and a call admitted then has not waited out the whole backlog (issue 10's target for the latency of admitted calls; it
changes no caller's chance of a slot). A caller under its share that finds every slot taken is not refused at once even
without a flood: it waits for the next freed slot up to `PATIENCE_S`, the ``Retry-After`` its 429 would give. And a
slot that a caller under its share gives back during a flood is kept from callers over theirs for `GRACE_S`, as its
caller's next call is on its way: otherwise a flood's waiters would take it first (the keeping ends as calls arrive,
which during a flood is often). A caller over its share is also paced at its share of ``rate`` (each of its refusals
takes as many turns as there are callers), so a flood beside other callers costs the event loop less. So a flood from
one address is what gets refused while polite callers are admitted, and a caller alone may hold every slot (and is
paced at the whole rate). Nothing here imports torch.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Hashable

import attrs
import trio

COST_BYTES = 65_536  # a refused body costs one more turn per this many bytes
BURST_S = 0.1  # refusals answered at once before pacing starts: a tenth of a second's worth
PATIENCE_S = 2.0  # how long a caller under its share waits for a slot: the Retry-After of its 429 (spinf.server.gate)
GRACE_S = 0.5  # how long a slot freed by a caller under its share is kept from callers over theirs
_NOBODY = object()  # no caller waits (None is a caller: a peer without an address)


@attrs.define(eq=False)
class Slot:
    """One admission slot of ``caller``; `release` is idempotent, so every path that may end a call can call it.
    ``handed`` is set once the call went to the packer, which then owns the slot (until then its taker releases
    it)."""

    admission: Admission
    caller: Hashable = None
    released: bool = False
    handed: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.admission.hand_on(self.caller)


@attrs.define(eq=False)
class _Waiter:
    caller: Hashable
    can_admit: bool
    arrived: int  # arrival order, across callers
    woken: trio.Event = attrs.field(factory=trio.Event)
    slot: Slot | None = None


@attrs.define
class Admission:
    """``capacity`` slots shared by caller, refusals paced at ``rate`` per second.

    ``_due`` is when the pacer is next free; a refusal that finds it in the future waits until its own turn.
    """

    capacity: int
    rate: float  # refusals per second at most: the settings' reject_rate
    _free: int = attrs.field(init=False)
    _held: collections.Counter = attrs.field(factory=collections.Counter)  # caller -> slots it holds (never 0)
    # every waiting refusal, and per caller the ones that may be admitted, oldest first (dicts: insertion-ordered,
    # and a waiter leaves them in O(1) under a flood); a waiter is taken out the moment it is woken
    _waiters: dict[_Waiter, None] = attrs.field(factory=dict)
    _queues: dict[Hashable, dict[_Waiter, None]] = attrs.field(factory=dict)
    _arrivals: itertools.count = attrs.field(factory=itertools.count)
    # slots kept from callers over their share: (when the keeping ends, the caller that gave it back), oldest first
    _kept: collections.deque[tuple[float, Hashable]] = attrs.field(factory=collections.deque)
    _due: float = -float("inf")
    _released: bool = False

    def __attrs_post_init__(self) -> None:
        self._free = self.capacity

    def try_admit(self, caller: Hashable = None) -> Slot | None:
        """A slot for ``caller``: a free one, or a kept one for a caller under its share; None when all are taken."""
        self._expire()
        if self._free:
            self._free -= 1
        elif self._kept and self._under_share(caller):
            self._kept.popleft()
        else:
            return None
        return self._slot(caller)

    async def admit(self, body_bytes: int = 0, *, caller: Hashable = None, can_admit: bool = True) -> Slot | None:
        """A slot for ``caller``, free now or handed to it before its turn to be refused; None when refused. A
        caller under its share (`_under_share`) waits at least `PATIENCE_S` for a slot before its refusal. A
        server that is not ready or is stopping passes ``can_admit=False``: nothing is admitted, refusals are paced
        all the same.

        **Cancellation**: a cancelled wait takes no slot (one handed to it is passed on) and keeps its booked
        turn, which only errs on the side of answering later.
        """
        if can_admit and (slot := self.try_admit(caller)) is not None:
            return slot
        under = can_admit and self._under_share(caller)
        turns = 1 if under or not can_admit else self._callers(caller)  # over its share: its share of the rate
        delay = self._book(trio.current_time(), body_bytes, turns)
        if under:
            delay = max(delay, PATIENCE_S)
        if delay <= 0 or self._released:
            return None
        waiter = _Waiter(caller, can_admit, next(self._arrivals))
        self._waiters[waiter] = None
        if can_admit:
            self._queues.setdefault(caller, {})[waiter] = None
        try:
            with trio.move_on_after(delay):
                await waiter.woken.wait()
        except BaseException:
            if waiter.slot is not None:
                waiter.slot.release()
            raise
        finally:
            self._leave(waiter)
        return waiter.slot

    def _book(self, now: float, body_bytes: int, turns: int = 1) -> float:
        """Book one refusal of a ``body_bytes`` body at ``now``, ``turns`` times over; the seconds it must wait
        before its answer."""
        cost = turns * (1 + body_bytes // COST_BYTES) / self.rate
        self._due = max(self._due, now) + cost
        delay = self._due - now - BURST_S
        return delay if delay > 1e-6 else 0.0  # a microsecond is rounding, not a turn

    def _callers(self, *these: Hashable) -> int:
        """How many callers hold, wait for or gave back a kept slot, ``these`` included."""
        return len(self._held.keys() | self._queues.keys() | {giver for _, giver in self._kept} | set(these))

    def _under_share(self, caller: Hashable, *also: Hashable) -> bool:
        """Whether ``caller`` holds fewer than ``capacity / callers`` slots (`_callers`, itself and ``also``)."""
        return self._held[caller] * self._callers(caller, *also) < self.capacity

    def hand_on(self, caller: Hashable = None) -> None:
        """``caller`` gave a slot back (`_place`; kept during a flood when ``caller`` is under its share after it)."""
        self._held[caller] -= 1
        if self._held[caller] <= 0:
            del self._held[caller]
        self._place(caller, keep=self._paced() and self._under_share(caller))

    def _place(self, giver: Hashable, *, keep: bool) -> None:
        """A slot ``giver`` gave back: to the oldest waiter (the newest while `_paced`) of the caller holding the
        fewest slots (among equals, the caller whose oldest waiter came first); but when ``keep`` and that caller
        is over its share (counting ``giver``), or nobody waits, it is kept for `GRACE_S` from callers over their
        share (the giver's next call comes back at once), else it is free."""
        fewest = min(self._queues, key=lambda c: (self._held[c], next(iter(self._queues[c])).arrived), default=_NOBODY)
        if fewest is not _NOBODY and not (keep and not self._under_share(fewest, giver)):
            queue = self._queues[fewest]
            waiter = next(reversed(queue)) if self._paced() else next(iter(queue))
            self._leave(waiter)
            waiter.slot = self._slot(fewest)
            waiter.woken.set()
        elif keep:
            self._kept.append((trio.current_time() + GRACE_S, giver))
        else:
            self._free += 1

    def _paced(self) -> bool:
        """Whether refusals wait for their turns now (a flood): the pacer is booked past its burst."""
        return self._due - trio.current_time() > BURST_S

    def _expire(self) -> None:
        """Kept slots whose time is up are placed as any other (checked as calls arrive, which under a flood is
        often)."""
        now = trio.current_time()
        while self._kept and self._kept[0][0] <= now:
            _, giver = self._kept.popleft()
            self._place(giver, keep=False)

    def _slot(self, caller: Hashable) -> Slot:
        self._held[caller] += 1
        return Slot(self, caller)

    def _leave(self, waiter: _Waiter) -> None:
        self._waiters.pop(waiter, None)
        queue = self._queues.get(waiter.caller)
        if queue is not None and waiter in queue:
            del queue[waiter]
            if not queue:
                del self._queues[waiter.caller]

    def release_all(self) -> None:
        """End every wait now and pace no more: a stopping server answers everyone waiting, then closes."""
        self._released = True
        waiters, self._waiters, self._queues = self._waiters, {}, {}
        for waiter in waiters:
            waiter.woken.set()

    def held(self, caller: Hashable) -> int:
        """The slots ``caller`` holds now."""
        return self._held[caller]

    @property
    def in_use(self) -> int:
        return self.capacity - self._free - len(self._kept)

    @property
    def waiting(self) -> int:
        return len(self._waiters)
