"""The server's owned state (spinf.server.lifecycle): the lifecycle's legal and illegal moves, the waits a shutdown
ends, the calls in flight, and the frozen facts and narrow status the actors hand the web layer and the packer."""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing

from spinf.server.lifecycle import EngineStatus, IllegalTransition, InFlight, Lifecycle, Phase
from spinf.server.served import EngineFacts
from tests.server.fakes import FakeEngine

FACTS = EngineFacts({"engine": "fake"}, batch_invariant=True, weights="generated")


def boot(lifecycle: Lifecycle, *moves: str) -> Lifecycle:
    for move in moves:
        {
            "loaded": lambda: lifecycle.loaded(FACTS, 1.23456),
            "warmed": lambda: lifecycle.warmed(0.5, 0.0),
            "fail": lambda: lifecycle.fail(OSError("no such checkpoint")),
            "stop": lifecycle.stop,
        }[move]()
    return lifecycle


def test_the_boot_goes_loading_warming_ready_and_publishes_what_it_took():
    lifecycle = Lifecycle(import_s=0.25)
    assert (lifecycle.phase, lifecycle.engine, lifecycle.boot, lifecycle.is_warm) == (Phase.LOADING, None, None, False)
    lifecycle.loaded(FACTS, 1.23456)
    assert (lifecycle.phase, lifecycle.engine, lifecycle.is_warm) == (Phase.WARMING, FACTS, False)
    lifecycle.warmed(0.5, 0.0)
    assert lifecycle.phase is Phase.READY and lifecycle.is_warm
    assert lifecycle.boot.as_dict() == {
        "import_s": 0.25,
        "load_s": 1.235,
        "weights": "generated",
        "warmup_s": 0.5,
        "warm": True,
        "idle_gib": 0.0,
    }


def test_without_a_warm_up_boot_has_no_warmup_s():
    lifecycle = boot(Lifecycle(), "loaded")
    lifecycle.warmed(None, 1.5)
    assert "warmup_s" not in lifecycle.boot.as_dict() and lifecycle.boot.as_dict()["idle_gib"] == 1.5


@pytest.mark.parametrize(
    ("before", "move", "message"),
    [
        ((), "warmed", r"^cannot mark the engine warm: the server is loading, not warming$"),
        (("loaded",), "loaded", r"^cannot mark the engine loaded: the server is warming, not loading$"),
        (("loaded", "warmed"), "warmed", r"^cannot mark the engine warm: the server is ready, not warming$"),
        (("loaded", "warmed"), "fail", r"^cannot fail the boot: the server is ready, not loading or warming$"),
        (("fail",), "loaded", r"^cannot mark the engine loaded: the server is failed, not loading$"),
        (("fail",), "fail", r"^cannot fail the boot: the server is failed, not loading or warming$"),
        (("stop",), "stop", r"^cannot stop: the server is already stopping$"),
    ],
)
def test_each_illegal_move_raises_its_own_error_and_leaves_the_phase(before, move, message):
    lifecycle = boot(Lifecycle(), *before)
    phase = lifecycle.phase
    with pytest.raises(IllegalTransition, match=message):
        boot(lifecycle, move)
    assert lifecycle.phase is phase


@pytest.mark.parametrize("before", [(), ("loaded",), ("loaded", "warmed"), ("fail",)])
def test_every_phase_but_stopping_may_stop(before):
    assert boot(Lifecycle(), *before, "stop").phase is Phase.STOPPING


@pytest.mark.parametrize("move", ["loaded", "warmed", "fail"])
def test_a_boot_step_that_ends_during_a_shutdown_leaves_it_stopping(move):
    lifecycle = boot(Lifecycle(), "stop", move)
    assert (lifecycle.phase, lifecycle.engine, lifecycle.boot, lifecycle.error) == (Phase.STOPPING, None, None, None)


def test_a_failure_keeps_its_reason_through_the_shutdown():
    lifecycle = boot(Lifecycle(), "loaded", "fail", "stop")
    assert lifecycle.error == "OSError: no such checkpoint" and not lifecycle.is_warm


def test_a_server_stopping_after_it_was_ready_is_still_warm():
    lifecycle = boot(Lifecycle(), "loaded", "warmed", "stop")
    assert lifecycle.is_stopping and lifecycle.is_warm


async def test_the_shutdown_ends_the_waits_under_until_stopping_and_any_begun_after(autojump_clock):
    lifecycle, record = Lifecycle(), []

    async def wait(name):
        with lifecycle.until_stopping() as scope:
            await trio.sleep(100)
        record.append((name, scope.cancelled_caught, trio.current_time()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, "before")
        await trio.sleep(1)
        lifecycle.stop()
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(wait, "after")
    assert record == [("before", True, 1.0), ("after", True, 1.0)]


async def test_degrade_keeps_the_first_reason_and_wakes_its_waiter(autojump_clock):
    lifecycle, seen = Lifecycle(), []

    async def wait():
        seen.append((await lifecycle.wait_degraded(), trio.current_time()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.sleep(3)
        lifecycle.degrade("3.00 GiB still held")
        lifecycle.degrade("another reason")
    assert seen == [("3.00 GiB still held", 3.0)] and lifecycle.degraded == "3.00 GiB still held"


async def test_wait_none_returns_when_the_last_call_in_flight_ends(autojump_clock):
    in_flight, record = InFlight(), []
    await in_flight.wait_none()  # none yet: at once

    async def call(seconds):
        with in_flight.track():
            await trio.sleep(seconds)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, 2)
        nursery.start_soon(call, 5)
        await trio.testing.wait_all_tasks_blocked()
        assert in_flight.count == 2
        await in_flight.wait_none()
        record.append(trio.current_time())
    assert record == [5.0] and in_flight.count == 0


def test_engine_facts_are_a_frozen_snapshot_of_the_engine():
    engine = FakeEngine(batch_invariant=False, weights="downloaded")
    facts = EngineFacts.of(engine)
    assert (dict(facts.info), facts.batch_invariant, facts.weights) == ({"engine": "fake"}, False, "downloaded")
    with pytest.raises(TypeError):
        facts.info["engine"] = "changed"
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        facts.weights = "changed"


def test_the_packers_status_offers_degrade_and_nothing_else():
    lifecycle = Lifecycle()
    status = EngineStatus(lifecycle)
    assert [name for name in dir(status) if not name.startswith("_")] == ["degrade"]
    status.degrade("leaked")
    assert lifecycle.degraded == "leaked"
