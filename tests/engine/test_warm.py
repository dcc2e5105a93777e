"""The warm-up's steps (spinf.engine.warm) on the CPU: ``full`` runs a pass in every CUDA-graph bucket and one past
them all at the token budget, after ``short``'s calls; both end with the extraction call; ``none`` runs nothing.
The bucket rule is graphs.py's own, so a bucket added there and missed here fails the first test.
tests/server/test_warmup_modes.py runs each mode in a real server; the GPU's captures are checked in
tests/engine/test_gpu_graphs.py."""

from __future__ import annotations

import pytest

from spinf import Engine
from spinf.engine import warm
from spinf.engine.graphs import all_buckets, bucket_of
from spinf.errors import ModelError
from spinf.settings import Features


@pytest.fixture(scope="module")
def engine(tiny_cache):
    return Engine("spinf/tiny-gemma4", device="cpu", cache_dir=tiny_cache, token_budget=2048)


def started_passes(engine: Engine, mode: str, monkeypatch) -> list[int]:
    """The token count of every pass the scorer started while the steps of ``mode`` ran."""
    found = []
    start = engine.scorer.start

    def recording(jobs):
        found.append(sum(job.num_tokens for job in jobs))
        return start(jobs)

    monkeypatch.setattr(engine.scorer, "start", recording)
    for step in engine.warmup_steps(mode):
        step()
    return found


def test_full_runs_a_pass_in_every_graph_bucket_and_one_past_them(engine, monkeypatch):
    passes = started_passes(engine, "full", monkeypatch)
    buckets = {bucket_of(n) for n in passes}
    assert set(all_buckets()) <= buckets
    assert None in buckets  # an eager pass
    assert max(passes) == engine.shape.token_budget == 2048  # the largest pass, before ready


def test_short_runs_its_calls_only_and_none_nothing(engine, monkeypatch):
    assert started_passes(engine, "none", monkeypatch) == []
    short = started_passes(engine, "short", monkeypatch)
    assert 0 < len(short) < len(all_buckets()) and max(short) <= all_buckets()[-1]


def test_full_begins_with_the_calls_of_short_and_both_end_with_the_extraction_call(engine):
    short, full = engine.warmup_steps("short"), engine.warmup_steps("full")
    calls = [(s.run.func, s.run.args) for s in short]
    assert calls[:3] == [(s.run.func, s.run.args) for s in full[:3]] and calls[-1] == (
        full[-1].run.func,
        full[-1].run.args,
    )
    # two scoring calls, the media call, extraction; each answer checked for non-finite numbers
    assert [(s.run.func, s.run.args[0]) for s in short] == [(warm.checked_score, engine)] * 4
    assert [s.part for s in short] == ["warmup_s", "warmup_s", "warmup_s", "warmup_extract_s"]
    assert [s.part for s in full] == ["warmup_s"] * (len(full) - 1) + ["warmup_extract_s"]
    assert len(full) == len(short) + len(all_buckets()) + 1


def test_the_extraction_call_has_every_slot_kind_and_answers_them(engine):
    body = warm.extract_body("short", max_slots=10, generation=True)
    slots = [query for item in body["inputs"] for query in item["queries"]]
    assert [q["template"].rstrip('"')[-3:] for q in slots] == ["{*}", "{n}", "{$}", "{*}", "{*}"]
    assert [q.get("generate") for q in slots][3:] == [True, {"temperature": 0.7, "seed": 0, "n": 2}]
    results = engine.score(body)["results"]
    kinds = [(r["queries"][0]["kind"], r["queries"][0].get("generate", False)) for r in results]
    assert kinds == [("text", False), ("number", False), ("currency", False), ("text", True), ("text", True)]
    assert [len(r["queries"][0]["combinations"][0]["answers"]) for r in results][3:] == [1, 2]


def test_the_extraction_call_follows_the_limit_and_the_generation_switch():
    assert warm.extract_body("none", max_slots=10, generation=True) is None
    assert warm.extract_body("full", max_slots=0, generation=True) is None  # no slot could be admitted
    without = warm.extract_body("full", max_slots=1, generation=False)
    assert [q["id"] for i in without["inputs"] for q in i["queries"]] == ["text", "number", "amount"]
    assert all(len(i["queries"]) == 1 for i in without["inputs"])  # one slot per input: a limit of 1 admits it


def test_an_engine_that_cannot_extract_has_no_extraction_step(tiny_cache):
    off = Engine(
        "spinf/tiny-gemma4", device="cpu", cache_dir=tiny_cache, token_budget=2048, features=Features(extraction=False)
    )
    assert off.extractor is None
    assert [s.part for s in off.warmup_steps("short")] == ["warmup_s", "warmup_s", "warmup_s"]


def test_the_media_call_reads_what_the_embedders_read(engine, tiny_cache):
    body = warm.media_body("short", frozenset({"image", "audio", "video"}))
    usage = engine.score(body)["usage"]["content"]
    assert (usage["images"], usage["audio_seconds"]) == (1, 0.5)
    only_audio = Engine("spinf/tiny-gemma4", device="cpu", cache_dir=tiny_cache, features=Features(media={"audio"}))
    kinds = [p["type"] for p in warm.media_body("short", only_audio.features.media)["messages"][0]["content"]]
    assert kinds == ["text", "input_audio"]
    assert warm.media_body("none", frozenset({"image"})) is None and warm.media_body("short", frozenset()) is None
    no_media = Engine("spinf/tiny-gemma4", device="cpu", cache_dir=tiny_cache, features=Features(media=frozenset()))
    assert len(no_media.warmup_steps("short")) == len(engine.warmup_steps("short")) - 1


@pytest.mark.parametrize("budget", [128, 1024, 2048, 16_000, 16_384])
def test_the_built_passes_land_where_they_should(budget):
    built = warm.passes("full", budget)
    assert [bucket_of(p.num_tokens) for p in built[:-1]] == list(all_buckets())
    assert all(p.num_tokens == b and p.depth % 16 == 0 for p, b in zip(built, all_buckets(), strict=False))
    largest = built[-1]
    assert largest.num_tokens == max(budget, all_buckets()[-1] + 1) and bucket_of(largest.num_tokens) is None
    assert largest.depth % 16 and max(largest.sizes) <= warm.BUDGET_JOB
    assert warm.passes("short", budget) == warm.passes("none", budget) == []


def test_the_built_jobs_have_the_planned_sizes_paths_and_reads():
    filler = (2, 17, 18, 19)
    plan = warm.WarmPass((40, 7), depth=5)
    jobs = warm.jobs(plan, filler)
    assert [job.num_tokens for job in jobs] == [40, 7]
    assert all(job.prefix[0] == 2 and max(job.trie.depth) == 4 and len(job.reads) == 1 for job in jobs)


def test_a_pass_runs_through_the_engine_loop(engine):
    plan = warm.passes("full", 2048)[0]
    filler = engine.tokenizer.bos + engine.tokenizer.tok(warm.SENTENCE)
    before = engine.loop.statistics().passes
    assert warm.run_pass(engine.loop, warm.jobs(plan, filler)) == plan.num_tokens
    assert engine.loop.statistics().passes == before + 1


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match=r"^warm-up mode 'half': one of full, short, none$"):
        warm.passes("half", 2048)


def test_a_warm_up_call_that_scores_nan_fails_naming_where(engine, monkeypatch):
    """Regression (issue 33 item 8): a checkpoint that loads but computes NaN passed the warm-up and reported
    ready while every call was a 500. A warm-up call whose answer holds a non-finite number now fails."""
    [first, *_] = engine.warmup_steps("short")
    assert first()["results"]  # finite: passes
    score = engine.score

    def poisoned(body):
        response = score(body)
        response["results"][0]["queries"][0]["combinations"][0]["options"][1]["p"] = float("nan")
        return response

    monkeypatch.setattr(engine, "score", poisoned)
    with pytest.raises(
        ModelError,
        match=r"^the model computes non-finite scores \(the warm-up call's "
        r"results\.0\.queries\.0\.combinations\.0\.options\.1\.p is not a finite number\)",
    ):
        first()


def test_non_finite_finds_nan_and_infinities_in_order():
    value = {"a": [1.0, float("inf"), {"b": float("nan")}], "c": -float("inf"), "d": "nan", "e": 3}
    assert list(warm.non_finite(value, "x")) == ["x.a.1", "x.a.2.b", "x.c"]
