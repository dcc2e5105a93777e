"""The engine loop: every composition gives the same bits, floors are read once per key, calls leave early.

The tiny model in fp32 on the CPU is batch-invariant (a catalog model), so the loop shares passes between calls and
keeps floors across them; the comparisons below are exact.
"""

from __future__ import annotations

import random

import pytest

from spinf import Engine
from spinf.engine.compiler import compile_request
from spinf.engine.floors import FloorCache
from spinf.engine.loop import Call, EngineLoop
from spinf.errors import ApiError
from tests.engine.test_independence import CONTENT, TARGETS, body, numbers, other_questions

INPUTS = [(f"i{k}", f"Message {k}. " + CONTENT[: 80 + 37 * k]) for k in range(9)]
SHORT = [f"Order {k}: the parcel came {k} days late and the box was open." for k in range(256)]


def fresh_loop(engine: Engine, *, share: bool = True, floor_cache: int = 1024) -> EngineLoop:
    return engine.new_loop(share_passes=share, floor_cache=floor_cache)


def calls(bodies: list[dict], **flags) -> list[Call]:
    return [Call(b, f"scr_{k}", **flags) for k, b in enumerate(bodies)]


def answers(loop: EngineLoop, bodies: list[dict]) -> list[dict]:
    work = calls(bodies)
    loop.run(work)
    return [w.unwrap() for w in work]


@pytest.fixture(scope="module")
def small_budget(tiny_cache):
    return Engine("tiny", device="cpu", cache_dir=tiny_cache, token_budget=256)  # many passes, jobs held back


def test_a_question_has_the_same_bits_in_every_composition(tiny_engine, small_budget):
    alone = numbers(answers(fresh_loop(tiny_engine), [body(TARGETS, [("a", CONTENT)])])[0])
    crowd = [body(other_questions(5) + TARGETS, [("a", CONTENT)])]
    crowd += [body(other_questions(3), [("a", text)]) for text in SHORT]  # 257 concurrent calls
    warm = fresh_loop(tiny_engine)
    in_crowd = numbers(answers(warm, crowd)[0])
    warm_again = numbers(answers(warm, [body(TARGETS, [("a", CONTENT)])])[0])  # every floor from the cache
    assert warm.statistics().floor_hits >= len(TARGETS)
    shuffled = other_questions(40) + TARGETS
    random.Random(5).shuffle(shuffled)
    mixed = numbers(answers(fresh_loop(tiny_engine), [body(shuffled, [("z", SHORT[0]), ("a", CONTENT)])])[0])
    split = numbers(answers(fresh_loop(small_budget), [body(other_questions(60) + TARGETS, [("a", CONTENT)])])[0])
    not_shared = numbers(answers(fresh_loop(tiny_engine, share=False), crowd[:3])[0])
    for composition in (in_crowd, warm_again, mixed, split, not_shared):
        assert composition == alone  # exact: not one bit differs


def test_a_call_whose_floors_are_cached_runs_no_floor_rows_and_is_billed_the_same(tiny_engine):
    loop = fresh_loop(tiny_engine)
    request = {**body(TARGETS, [("a", CONTENT)]), "scoring": {"queries": TARGETS}}
    cold, warm = (Call(request, f"scr_{k}", internals=True) for k in range(2))
    loop.run([cold])
    misses = loop.statistics().floor_misses
    loop.run([warm])
    cold_answer, warm_answer = cold.unwrap(), warm.unwrap()
    stats = loop.statistics()
    assert stats.floor_misses == misses and stats.floor_hits == misses  # every key of the second call: a hit
    assert warm_answer["results"] == cold_answer["results"]
    assert warm_answer["usage"]["floor_tokens"] == cold_answer["usage"]["floor_tokens"] > 0
    assert warm_answer["usage"]["processed_tokens"] == cold_answer["usage"]["processed_tokens"]
    assert warm_answer["usage"]["packed_tokens"] < cold_answer["usage"]["packed_tokens"]  # what ran


def test_concurrent_calls_with_the_same_questions_read_each_floor_once(tiny_engine):
    loop = fresh_loop(tiny_engine)
    answers(loop, [body(TARGETS, [("a", text)]) for text in SHORT[:20]])
    stats = loop.statistics()
    keys = stats.floor_misses
    assert keys == stats.floor_entries and stats.floor_hits == 19 * keys


def test_the_floor_cache_keeps_the_most_recently_used():
    cache = FloorCache(2)
    cache.put("a", ([1.0], 0.0))
    cache.put("b", ([2.0], 0.0))
    assert cache.get("a") == ([1.0], 0.0)  # a is now the most recent
    cache.put("c", ([3.0], 0.0))
    assert (cache.get("b"), len(cache)) == (None, 2) and cache.get("a") and cache.get("c")
    off = FloorCache(0)
    off.put("a", ([1.0], 0.0))
    assert off.get("a") is None and len(off) == 0


def test_a_small_call_leaves_before_a_big_one_added_first(small_budget):
    loop = fresh_loop(small_budget)
    big, small = calls([body(other_questions(40) + TARGETS, INPUTS), body(TARGETS[:1], [("s", SHORT[1])])])
    for work in (big, small):
        loop.add(work)
    order = []
    while loop.has_work:
        order += [w.request_id for w in loop.step()]
    assert order == ["scr_1", "scr_0"] and small.unwrap()["results"] and big.unwrap()["results"]


def test_a_small_call_rides_the_next_pass_beside_a_call_of_many_inputs(small_budget):
    """Calls are compiled one input each in turn and share each pass (`spinf.engine.scheduler`), and on the CPU a
    pass is read back as soon as it ran: a call added while a call of 300 inputs runs is answered by the next
    step, and its answer is the one it gets alone."""
    loop = fresh_loop(small_budget)
    many = [(f"m{k}", f"Note {k}.") for k in range(300)]
    big, small = calls([body(TARGETS[:1], many), body(TARGETS[:1], [("s", SHORT[7])])])
    loop.add(big)
    loop.step()
    loop.add(small)
    assert [w.request_id for w in loop.step()] == ["scr_1"] and loop.has_work
    steps = 1
    while loop.has_work:
        loop.step()
        steps += 1
    assert steps > 10 and big.unwrap()["results"]  # the big call needed many more passes
    assert numbers(small.unwrap(), "s") == numbers(answers(fresh_loop(small_budget), [small.body])[0], "s")


def test_a_call_whose_caller_left_is_dropped_and_runs_nothing(tiny_engine):
    loop = fresh_loop(tiny_engine)
    gone, kept = calls([body(TARGETS, [("a", CONTENT)]), body(TARGETS, [("b", SHORT[2])])])
    gone.abandoned = True
    loop.add(gone)
    loop.add(kept)
    done = []
    while loop.has_work:
        done += loop.step()
    assert done[0] is gone and gone.finished and gone.response is None and kept.unwrap()["results"]
    kept_alone = fresh_loop(tiny_engine)
    kept_alone.run(calls([body(TARGETS, [("b", SHORT[2])])]))
    assert loop.statistics().packed_tokens == kept_alone.statistics().packed_tokens  # nothing of gone's ran


def test_a_failing_shared_pass_fails_only_the_call_that_fails_alone(tiny_cache, monkeypatch):
    engine = Engine("tiny", device="cpu", cache_dir=tiny_cache)
    poison = engine.tokenizer.tok(" poison")
    start = engine.scorer.start

    def fussy(jobs):
        if any(tuple(poison) == job.prefix[-len(poison) :] for job in jobs):
            raise RuntimeError("the engine broke on this job")
        return start(jobs)

    monkeypatch.setattr(engine.scorer, "start", fussy)
    good, bad = calls([body(TARGETS, [("a", CONTENT)]), body(TARGETS, [("b", "Something about poison")])])
    engine.loop.run([good, bad])
    assert good.unwrap()["results"]
    with pytest.raises(RuntimeError, match=r"^the engine broke on this job$"):
        bad.unwrap()


def test_a_request_over_the_processed_token_limit_fails_as_compiling_it_does(small_budget):
    request = {**body(TARGETS, INPUTS), "limits": {"max_processed_tokens": 600}}
    with pytest.raises(ApiError) as looped:
        small_budget.score(request, trusted=True)
    with pytest.raises(ApiError) as plain:
        compile_request(small_budget.parse(request, trusted=True), small_budget.tokenizer, small_budget.shape)
    assert (looped.value.status, looped.value.code, str(looped.value)) == (413, "request_too_large", str(plain.value))


def test_an_input_refused_midway_fails_the_call(small_budget):
    inputs = [*INPUTS[:3], ("long", "word " * 3000), *INPUTS[3:]]
    request = {**body(TARGETS, inputs), "limits": {"max_content_tokens": 1000}}
    with pytest.raises(ApiError) as looped:
        small_budget.score(request, trusted=True)
    assert (looped.value.code, looped.value.param) == ("content_too_long", "inputs.3")


def test_a_floor_read_whose_other_waiter_left_still_answers_the_one_left(tiny_engine, monkeypatch):
    """One floor read holds two keys; the call that needed both leaves while it runs, the call that needed one
    stays: that call is answered (the read is not ended twice while it hands out its keys). The runner is taken to
    overlap the host, as on a GPU, so that the read is still in flight after the first step."""
    monkeypatch.setattr(type(tiny_engine.scorer), "overlaps", property(lambda scorer: True))
    loop = fresh_loop(tiny_engine)
    # the read hands out its keys in the order they were claimed: the staying call's key first, then the other
    both, one = calls([body([TARGETS[2], TARGETS[1]], [("a", SHORT[3])]), body(TARGETS[2:], [("b", SHORT[4])])])
    loop.add(both)  # compiled first: the loop's floor read holds both of its keys
    loop.add(one)  # waits on one key of that read
    loop.step()
    both.abandoned = True
    while loop.has_work:
        loop.step()
    assert both.response is None and one.unwrap()["results"]
    assert numbers(one.unwrap(), "b") == numbers(answers(fresh_loop(tiny_engine), [one.body])[0], "b")


def test_a_second_caller_is_refused_while_the_loop_serves_another(tiny_engine):
    waiting = Call(body(TARGETS[:1], [("a", SHORT[5])]), "scr_first")
    tiny_engine.loop.add(waiting)
    try:
        with pytest.raises(RuntimeError, match=r"^the engine loop is serving other work; one caller drives it"):
            tiny_engine.score(body(TARGETS[:1], [("b", SHORT[6])]))
    finally:
        while tiny_engine.loop.has_work:
            tiny_engine.loop.step()
    assert waiting.unwrap()["results"]
