"""Admission and load shedding: who gets scored, and what a refusal may cost (api spec §2.6 step 4, §3.8).

`Admission` holds the ``queue + 1`` slots. A `Slot` travels with its call into the packer and is released when the
call is answered or dropped, not when its caller goes away: a client that disconnects mid-call still holds its slot
until the packer lets go of its work, so the calls inside the server never exceed the slots and the packer's inbox
(sized to the slots) can never be full.

Refusing must cost almost nothing, or a flood of retries starves the engine: the event loop shares the GIL with
the engine thread, and every refusal it answers is Python work the engine waits behind. So a call that finds every
slot taken is not answered at once when refusals come faster than ``rate`` per second (a short burst aside): it
waits for its turn (a generic cell rate algorithm; a large body costs one more turn per 64 KiB, since reading and
parsing it is the expensive part), and a client that retries at once without honouring ``Retry-After`` is slowed
to its share of that rate. While it waits, a slot that frees is handed to the **newest** waiter (last in, first
out), so slots refill at once under a flood and the call admitted is one that has barely waited; the others get
their 429 in their turn. With no flood the burst is never spent and a refusal is answered at once, as the spec
describes. Nothing here imports torch.
"""

from __future__ import annotations

import attrs
import trio

COST_BYTES = 65_536  # a refused body costs one more turn per this many bytes
BURST_S = 0.1  # refusals answered at once before pacing starts: a tenth of a second's worth


@attrs.define(eq=False)
class Slot:
    """One admission slot; `release` is idempotent, so every path that may end a call can call it. ``handed`` is
    set once the call went to the packer, which then owns the slot (until then its taker releases it)."""

    admission: Admission
    released: bool = False
    handed: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.admission.hand_on()


@attrs.define(eq=False)
class _Waiter:
    can_admit: bool
    woken: trio.Event = attrs.field(factory=trio.Event)
    slot: Slot | None = None


@attrs.define
class Admission:
    """``capacity`` slots, refusals paced at ``rate`` per second.

    ``_due`` is when the pacer is next free; a refusal that finds it in the future waits until its own turn.
    """

    capacity: int
    rate: float = 200.0
    _free: int = attrs.field(init=False)
    # waiting refusals, oldest first (a dict: insertion-ordered, and a waiter leaves it in O(1) under a flood);
    # a freed slot goes to the newest that may be admitted, and a waiter is taken out the moment it is woken
    _waiters: dict[_Waiter, None] = attrs.field(factory=dict)
    _due: float = -float("inf")
    _released: bool = False

    def __attrs_post_init__(self) -> None:
        self._free = self.capacity

    def try_admit(self) -> Slot | None:
        """A slot, or None when all are taken."""
        if self._free == 0:
            return None
        self._free -= 1
        return Slot(self)

    async def admit(self, body_bytes: int = 0, *, can_admit: bool = True) -> Slot | None:
        """A slot, free now or freed before this call's turn to be refused; None when refused. A server that is
        not ready or is stopping passes ``can_admit=False``: nothing is admitted, refusals are paced all the same.

        **Cancellation**: a cancelled wait takes no slot (one handed to it is passed on) and keeps its booked
        turn, which only errs on the side of answering later.
        """
        if can_admit and (slot := self.try_admit()) is not None:
            return slot
        delay = self._book(trio.current_time(), body_bytes)
        if delay <= 0 or self._released:
            return None
        waiter = _Waiter(can_admit)
        self._waiters[waiter] = None
        try:
            with trio.move_on_after(delay):
                await waiter.woken.wait()
        except BaseException:
            if waiter.slot is not None:
                waiter.slot.release()
            raise
        finally:
            self._waiters.pop(waiter, None)
        return waiter.slot

    def _book(self, now: float, body_bytes: int) -> float:
        """Book one refusal of a ``body_bytes`` body at ``now``; the seconds it must wait before its answer."""
        cost = (1 + body_bytes // COST_BYTES) / self.rate
        self._due = max(self._due, now) + cost
        delay = self._due - now - BURST_S
        return delay if delay > 1e-6 else 0.0  # a microsecond is rounding, not a turn

    def hand_on(self) -> None:
        """A slot came back: it goes to the newest waiter that may be admitted, else it is free."""
        waiter = next((waiter for waiter in reversed(self._waiters) if waiter.can_admit), None)
        if waiter is None:
            self._free += 1
            return
        del self._waiters[waiter]
        waiter.slot = Slot(self)
        waiter.woken.set()

    def release_all(self) -> None:
        """End every wait now and pace no more: a stopping server answers everyone waiting, then closes."""
        self._released = True
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters:
            waiter.woken.set()

    @property
    def in_use(self) -> int:
        return self.capacity - self._free

    @property
    def waiting(self) -> int:
        return len(self._waiters)
