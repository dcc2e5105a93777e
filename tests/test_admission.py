"""Admission slots and paced refusals (spinf.admission), under the mock clock: exact turns, hand-offs, cancels."""

from __future__ import annotations

import trio
import trio.testing

from spinf.admission import COST_BYTES, Admission


async def refuse_all(admission: Admission, count: int, body_bytes: int = 0) -> list[tuple[int, float, object]]:
    """Start ``count`` admits at once; (index, time answered, slot or None) in the order they came back."""
    record = []

    async def one(k):
        slot = await admission.admit(body_bytes)
        record.append((k, trio.current_time(), slot))

    async with trio.open_nursery() as nursery:
        for k in range(count):
            nursery.start_soon(one, k)
    return record


async def test_refusals_beyond_the_burst_wait_their_turn(autojump_clock):
    admission = Admission(0, rate=10.0)  # no slot at all: every call is refused; the burst is one refusal
    record = await refuse_all(admission, 5)
    assert [round(t, 6) for _, t, _ in record] == [0.0, 0.1, 0.2, 0.3, 0.4]
    assert {slot for _, _, slot in record} == {None}


async def test_a_large_body_costs_a_turn_per_64_kib(autojump_clock):
    admission = Admission(0, rate=10.0)
    assert await admission.admit(3 * COST_BYTES) is None  # four turns, one of them the burst
    assert round(trio.current_time(), 6) == 0.3
    assert await admission.admit(COST_BYTES - 1) is None  # under 64 KiB: one turn
    assert round(trio.current_time(), 6) == 0.4


async def test_without_a_flood_a_refusal_is_answered_at_once(autojump_clock):
    admission = Admission(1, rate=200.0)
    slot = admission.try_admit()
    record = await refuse_all(admission, 20)  # within the burst (a tenth of a second's worth)
    assert {t for _, t, _ in record} == {0.0} and slot is not None


async def test_a_freed_slot_goes_to_the_newest_waiter(autojump_clock):
    admission = Admission(1, rate=1.0)
    held = admission.try_admit()
    await admission.admit()  # spends the burst: later refusals wait a second a turn
    record = []

    async def wait(name):
        record.append((name, await admission.admit()))

    async with trio.open_nursery() as nursery:
        for name in ("old", "middle", "new"):
            nursery.start_soon(wait, name)
            await trio.testing.wait_all_tasks_blocked()
        held.release()
    assert [name for name, _ in record] == ["new", "old", "middle"]
    assert record[0][1] is not None and record[1][1] is None and record[2][1] is None
    assert admission.in_use == 1


async def test_a_cancelled_waiter_passes_a_slot_it_was_handed_on(autojump_clock):
    admission = Admission(1, rate=1.0)
    held = admission.try_admit()
    await admission.admit()  # spends the burst
    got, doomed = [], trio.CancelScope()

    async def patient():
        got.append(await admission.admit())

    async def cancelled():
        with doomed:
            await admission.admit()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(patient)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(cancelled)  # the newest waiter: the freed slot goes to it first
        await trio.testing.wait_all_tasks_blocked()
        doomed.cancel()
        held.release()  # no checkpoint between: the slot is handed to a waiter whose wait was cancelled
    assert got[0] is not None and trio.current_time() < 1.9  # passed on to the patient waiter before its turn
    got[0].release()
    assert admission.in_use == 0


async def test_release_all_answers_every_waiter_and_paces_no_more(autojump_clock):
    admission = Admission(0, rate=1.0)
    await admission.admit()  # spends the burst
    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(admission.admit)
        await trio.testing.wait_all_tasks_blocked()
        admission.release_all()
    assert trio.current_time() == started and admission.waiting == 0
    assert await admission.admit() is None and trio.current_time() == started


async def test_a_server_that_cannot_admit_paces_its_refusals_and_hands_no_slot(autojump_clock):
    admission = Admission(1, rate=10.0)
    record = []

    async def closed():
        slot = await admission.admit(can_admit=False)
        record.append((trio.current_time(), slot))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(closed)
    assert [(round(t, 6), slot) for t, slot in record] == [(0.0, None), (0.1, None), (0.2, None)]
    assert admission.in_use == 0
