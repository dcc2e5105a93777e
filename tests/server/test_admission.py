"""Admission slots and paced refusals (spinf.server.admission), under the mock clock: exact turns, hand-offs in arrival
order, shares by caller, cancels."""

from __future__ import annotations

import trio
import trio.testing

from spinf.server.admission import COST_BYTES, GRACE_S, PATIENCE_S, Admission


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


async def waiting_in_turn(admission: Admission, callers: list[str], record: list, nursery) -> None:
    """Start one admit per entry of ``callers``, each once the one before is waiting; ``record`` gets (name, slot)
    as each comes back, names numbered in arrival order (``polite1``)."""

    async def wait(name, caller):
        record.append((name, await admission.admit(caller=caller)))

    for k, caller in enumerate(callers):
        nursery.start_soon(wait, f"{caller}{k}", caller)
        await trio.testing.wait_all_tasks_blocked()


async def test_a_freed_slot_goes_to_the_oldest_waiter(autojump_clock):
    admission = Admission(2, rate=1000.0)  # no flood: the waiters below wait as callers under their share
    x, c = admission.try_admit("x"), admission.try_admit("c")
    record = []
    async with trio.open_nursery() as nursery:
        await waiting_in_turn(admission, ["d", "d", "d"], record, nursery)
        x.release()
        await trio.testing.wait_all_tasks_blocked()
        c.release()
    assert [(name, slot is not None) for name, slot in record] == [("d0", True), ("d1", True), ("d2", False)]
    assert trio.current_time() == PATIENCE_S and admission.held("d") == 2


async def test_during_a_flood_a_callers_newest_waiter_is_served(autojump_clock):
    admission = Admission(1, rate=1.0)
    held = admission.try_admit("c")
    await admission.admit(caller="c")  # spends the burst: later refusals wait a second a turn, a flood
    record = []
    async with trio.open_nursery() as nursery:
        await waiting_in_turn(admission, ["c", "c", "c"], record, nursery)
        held.release()
    assert [name for name, _ in record] == ["c2", "c0", "c1"]
    assert record[0][1] is not None and record[1][1] is None and record[2][1] is None
    assert admission.in_use == 1 and admission.held("c") == 1


async def test_freed_slots_go_first_to_the_caller_holding_fewest(autojump_clock):
    admission = Admission(4, rate=1.0)
    flood = [admission.try_admit("flood") for _ in range(3)]
    polite = admission.try_admit("polite")
    await admission.admit(caller="flood")  # spends the burst
    record = []
    async with trio.open_nursery() as nursery:
        # the flood's waiters came first, but it holds 3 slots to polite's 1
        await waiting_in_turn(admission, ["flood", "flood", "polite", "polite"], record, nursery)
        flood[0].release()  # polite (1 held) before flood (2 held): polite's newest, refusals being paced
        await trio.testing.wait_all_tasks_blocked()
        assert [name for name, _ in record] == ["polite3"]
        flood[1].release()  # polite 2, flood 1: the flood's
        await trio.testing.wait_all_tasks_blocked()
        assert [name for name, _ in record] == ["polite3", "flood1"]
        polite.release()  # polite 1, flood 2: polite's
        await trio.testing.wait_all_tasks_blocked()
        assert [name for name, _ in record] == ["polite3", "flood1", "polite2"]
        assert (admission.held("polite"), admission.held("flood")) == (2, 2)
    assert [slot is None for _, slot in record] == [False, False, False, True]  # flood0 is refused in its turn
    assert admission.waiting == 0 and admission.in_use == 4


async def test_among_callers_holding_as_many_the_earliest_waiter_goes_first(autojump_clock):
    admission = Admission(2, rate=1.0)
    a, b = admission.try_admit("a"), admission.try_admit("b")
    await admission.admit(caller="a")  # spends the burst
    record = []
    async with trio.open_nursery() as nursery:
        await waiting_in_turn(admission, ["b", "a"], record, nursery)
        a.release()  # a 0, b 1: a's waiter, although b's came first
        await trio.testing.wait_all_tasks_blocked()
        b.release()  # a 1, b 0: b's
        await trio.testing.wait_all_tasks_blocked()
    assert [(name, slot is not None) for name, slot in record] == [("a1", True), ("b0", True)]


async def test_a_flood_from_one_caller_leaves_a_polite_caller_its_turn(autojump_clock):
    """Many waiters of one caller and one of another: the next freed slot goes to the other, however late."""
    admission = Admission(2, rate=10.0)
    held = [admission.try_admit("flood"), admission.try_admit("flood")]
    await admission.admit(caller="flood")  # spends the burst
    record = []
    async with trio.open_nursery() as nursery:
        await waiting_in_turn(admission, ["flood"] * 20 + ["polite"], record, nursery)
        await trio.sleep(0.45)  # four flood waiters refused in their turns meanwhile (one each 0.1 s)
        assert [(name, slot) for name, slot in record] == [(f"flood{k}", None) for k in range(4)]
        held[0].release()
        await trio.testing.wait_all_tasks_blocked()
        name, slot = record[-1]
        assert name == "polite20" and slot is not None
        held[1].release()
        await trio.testing.wait_all_tasks_blocked()
        name, slot = record[-1]
        assert name == "flood19" and slot is not None  # then the flood's newest, refusals being paced
    assert len([slot for _, slot in record if slot is None]) == 21 - 2


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
        nursery.start_soon(cancelled)  # the newest waiter: during a flood the freed slot goes to it first
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


async def test_a_caller_under_its_share_waits_for_a_slot_where_others_are_refused_at_once(autojump_clock):
    admission = Admission(2, rate=200.0)  # no flood: refusals are not paced
    held = [admission.try_admit("flood"), admission.try_admit("flood")]
    assert await admission.admit(caller="flood") is None and trio.current_time() == 0.0  # at its share: at once
    record = []

    async def polite(name):
        record.append((name, await admission.admit(caller="polite"), trio.current_time()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(polite, "first")
        await trio.sleep(0.5)
        held[0].release()  # to the waiting polite call, not to a free slot the flood would take
        await trio.testing.wait_all_tasks_blocked()
        assert admission.try_admit("flood") is None
        nursery.start_soon(polite, "second")  # polite holds 1 of its 1: at its share, refused at once
    assert [(name, slot is not None, t) for name, slot, t in record] == [("first", True, 0.5), ("second", False, 0.5)]
    lone = Admission(1, rate=200.0)
    lone.try_admit("a")
    assert await lone.admit(caller="b") is None and trio.current_time() == 0.5 + 2.0  # no slot freed: PATIENCE_S


async def test_a_slot_given_back_under_its_share_is_kept_from_a_caller_over_its_share_for_a_while(autojump_clock):
    admission = Admission(3, rate=1.0)
    assert admission.try_admit("flood") and admission.try_admit("flood")
    polite = admission.try_admit("polite")
    await admission.admit(caller="flood")  # spends the burst
    record, started = [], trio.current_time()
    async with trio.open_nursery() as nursery:
        await waiting_in_turn(admission, ["flood"], record, nursery)  # 2 of 3 slots: over its share of 1.5
        polite.release()  # kept for polite's next call, not handed to the flood's waiter
        await trio.testing.wait_all_tasks_blocked()
        assert record == [] and admission.in_use == 2 and admission.try_admit("flood") is None
        polite = admission.try_admit("polite")
        assert polite is not None and admission.in_use == 3
        polite.release()
        await trio.sleep(GRACE_S / 2)
        assert record == [] and admission.try_admit("flood") is None  # still kept
        await trio.sleep(GRACE_S / 2)
        assert admission.try_admit("flood") is None  # the kept slot's time is up: to the flood's waiter
        await trio.testing.wait_all_tasks_blocked()
        assert [(name, slot is not None) for name, slot in record] == [("flood0", True)]
        assert trio.current_time() == started + GRACE_S
    assert admission.held("flood") == 3 and admission.held("polite") == 0


async def test_a_caller_over_its_share_is_paced_at_its_share_of_the_rate(autojump_clock):
    admission = Admission(2, rate=10.0)
    assert admission.try_admit("polite") and admission.try_admit("flood")  # one each: both at their share
    record = await refuse_all_of(admission, "flood", 3)
    assert [round(t, 6) for t in record] == [0.1, 0.3, 0.5]  # two callers: two turns each, the burst one turn
    alone = Admission(1, rate=10.0)
    assert alone.try_admit("flood")
    assert [round(t, 6) for t in await refuse_all_of(alone, "flood", 3)] == [0.0, 0.1, 0.2]


async def refuse_all_of(admission: Admission, caller: str, count: int) -> list[float]:
    """``count`` refused admits of ``caller`` started at once; when each came back (each must be refused)."""
    started, record = trio.current_time(), []

    async def one():
        assert await admission.admit(caller=caller) is None
        record.append(trio.current_time() - started)

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)
    return sorted(record)
