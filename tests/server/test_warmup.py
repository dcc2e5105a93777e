"""The warm-up actor (spinf.server.actors.warmup) with a fake engine and executor under the mock clock: each step's
seconds count in the ``boot`` field it names (api spec §3.1), and the lifecycle turns ready only after the last
step, the extraction call included. tests/server/test_warmup_modes.py runs the real steps in a real server."""

from __future__ import annotations

import attrs
import trio

from spinf.engine.warm import Step
from spinf.server.actors.warmup import Warmup
from spinf.server.lifecycle import Lifecycle, Phase
from spinf.server.served import EngineFacts
from tests.server.fakes import FakeEngine, FakeExecutor

FACTS = EngineFacts({"engine": "fake"}, batch_invariant=True, weights="generated")


@attrs.define
class ExtractingEngine(FakeEngine):
    """Two scoring steps, then one extraction step, each recorded as it runs (``record``, with the phase then)."""

    lifecycle: Lifecycle | None = None
    record: list = attrs.field(factory=list)

    def warmup_steps(self, mode):
        if mode == "none":
            return []
        scoring = [Step(lambda k=k: self.record.append((f"score {k}", self.lifecycle.phase))) for k in range(2)]
        extract = Step(lambda: self.record.append(("extract", self.lifecycle.phase)), part="warmup_extract_s")
        return [*scoring, extract]


async def warm_up(engine: FakeEngine, mode: str, cost: float) -> Lifecycle:
    """``engine`` through a warm-up of ``mode`` on an executor whose every job takes ``cost`` seconds."""
    lifecycle = Lifecycle()
    lifecycle.loaded(FACTS, 1.0)
    if isinstance(engine, ExtractingEngine):
        engine.lifecycle = lifecycle
    exec_send, exec_recv = trio.open_memory_channel(0)
    loaded_send, loaded_recv = trio.open_memory_channel(1)
    warmed_send, warmed_recv = trio.open_memory_channel(1)
    async with trio.open_nursery() as nursery:
        await nursery.start(FakeExecutor(exec_recv, cost).run)
        with exec_send:
            await nursery.start(Warmup(exec_send.clone(), loaded_recv, warmed_send, lifecycle, mode).run)
        with loaded_send:
            loaded_send.send_nowait(engine)
        assert await warmed_recv.receive() is engine
    return lifecycle


async def test_the_extraction_step_is_timed_apart_and_ready_comes_after_it(autojump_clock):
    engine = ExtractingEngine()
    lifecycle = await warm_up(engine, "short", cost=1.5)
    assert engine.record == [
        ("score 0", Phase.WARMING),
        ("score 1", Phase.WARMING),
        ("extract", Phase.WARMING),
    ]
    boot = lifecycle.boot.as_dict()
    assert lifecycle.phase is Phase.READY
    # the two scoring steps, then the extraction step; the idle-memory read (a job too) counts in neither
    assert (boot["warmup_s"], boot["warmup_extract_s"]) == (3.0, 1.5)
    assert list(boot) == ["import_s", "load_s", "weights", "warmup_s", "warmup_extract_s", "warm", "idle_gib"]


async def test_an_engine_without_an_extraction_step_reports_no_warmup_extract_s(autojump_clock):
    boot = (await warm_up(FakeEngine(), "short", cost=2.0)).boot.as_dict()
    assert boot["warmup_s"] == 2.0 and "warmup_extract_s" not in boot


async def test_warm_up_none_reports_neither(autojump_clock):
    engine = ExtractingEngine()
    boot = (await warm_up(engine, "none", cost=1.0)).boot.as_dict()
    assert engine.record == [] and "warmup_s" not in boot and "warmup_extract_s" not in boot
