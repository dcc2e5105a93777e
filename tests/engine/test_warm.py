"""The warm-up's steps (spinf.engine.warm) on the CPU: ``full`` runs a pass in every CUDA-graph bucket and one past
them all at the token budget, after ``short``'s calls; ``none`` runs nothing. The bucket rule is graphs.py's own,
so a bucket added there and missed here fails the first test. tests/server/test_warmup_modes.py runs each mode in
a real server; the GPU's captures are checked in tests/engine/test_gpu_graphs.py."""

from __future__ import annotations

import pytest

from spinf import Engine
from spinf.engine import warm
from spinf.engine.graphs import all_buckets, bucket_of


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


def test_full_begins_with_the_calls_of_short(engine):
    short, full = engine.warmup_steps("short"), engine.warmup_steps("full")
    assert [(s.func, s.args) for s in short] == [(s.func, s.args) for s in full[: len(short)]]
    assert [s.func for s in short] == [engine.score, engine.score]
    assert len(full) == len(short) + len(all_buckets()) + 1


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
