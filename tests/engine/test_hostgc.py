"""The cyclic collector is paused around engine host work and always comes back as it was."""

from __future__ import annotations

import gc

import pytest

from spinf.engine import hostgc


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_paused_restores_the_collector_after_nested_uses_and_errors(collector_on):
    with hostgc.paused():
        assert not gc.isenabled()
        with hostgc.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer use still holds it
    assert gc.isenabled()
    with pytest.raises(RuntimeError), hostgc.paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled(collector_on):
    gc.disable()
    with hostgc.paused():
        pass
    assert not gc.isenabled()
    gc.enable()


def test_settle_moves_the_live_heap_out_of_collections():
    try:
        hostgc.settle()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_a_scoring_call_runs_with_the_collector_paused_and_restores_it(collector_on, tiny_engine, monkeypatch):
    seen = []
    launch = tiny_engine.scorer.launch

    def watching(layout):
        seen.append(gc.isenabled())
        return launch(layout)

    monkeypatch.setattr(tiny_engine.scorer, "launch", watching)
    body = {"inputs": [{"id": "a", "messages": [{"role": "user", "content": "The parcel came two weeks late."}]}]}
    body["scoring"] = {"queries": [{"id": "late", "template": "Late? Answer:{?}", "options": [" yes", " no"]}]}
    tiny_engine.score(body)
    assert seen and not any(seen)
    assert gc.isenabled()


def test_chained_pauses_still_collect_every_few_seconds(collector_on, monkeypatch):
    """Overlapping calls keep the collector paused for as long as a load lasts; cycles must not pile up."""
    clock = [1000.0]
    monkeypatch.setattr(hostgc.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(hostgc, "_collected_at", clock[0])
    outer = hostgc.paused()
    outer.__enter__()  # a call that never ends while others come and go
    try:
        gc.collect()
        made = _cycle()
        with hostgc.paused():
            clock[0] += 1.0
        assert made() is not None  # a second in: no collection yet
        with hostgc.paused():
            clock[0] += hostgc.COLLECT_EVERY_S
        assert made() is None and not gc.isenabled()  # collected, and the outer call still has it paused
    finally:
        outer.__exit__(None, None, None)
    assert gc.isenabled()


def _cycle():
    import weakref

    class Node:
        pass

    node = Node()
    node.self = node
    ref = weakref.ref(node)
    del node
    return ref
