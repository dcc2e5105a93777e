"""CUDA graphs for small passes (spinf.engine.graphs): a replayed pass gives the eager pass's bits.

The tiny model on CUDA through the fused path, in bf16 and in fp8s: every number of a small call with its passes
replayed equals the same call run eagerly, a pass larger than the biggest bucket runs eagerly, and weights changed
after a capture are read by a new capture.
"""

from __future__ import annotations

import pytest

from spinf import Engine
from spinf.engine.quant import AmaxRecorder
from tests.engine.test_independence import CONTENT, TARGETS, body, numbers, other_questions

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", params=["bf16", "fp8s"])
def gpu_engine(request, tiny_cache):
    import torch

    engine = Engine("tiny", device="cuda", cache_dir=tiny_cache)
    engine.model.to(torch.bfloat16)
    if request.param == "fp8s":
        if torch.cuda.get_device_capability() < (8, 9):
            pytest.skip("fp8 needs compute capability 8.9")
        recorder = AmaxRecorder()
        with engine.model.observing(recorder.observe):
            engine.score(body(other_questions(30) + TARGETS, [("a", CONTENT)]))
        engine.model.to_fp8s(recorder.scales())
    return engine


def eager(engine: Engine, request: dict) -> dict:
    graphs, engine.scorer.graphs = engine.scorer.graphs, None
    try:
        return numbers(engine.score(request))
    finally:
        engine.scorer.graphs = graphs


def test_a_replayed_pass_gives_the_eager_bits(gpu_engine):
    small = body(TARGETS, [("a", CONTENT)])
    replays = gpu_engine.scorer.graphs.replays
    graphed = numbers(gpu_engine.score(small))
    assert gpu_engine.scorer.graphs.replays > replays and not gpu_engine.scorer.graphs.failed
    assert graphed == eager(gpu_engine, small)
    again = numbers(gpu_engine.score(body(other_questions(12) + TARGETS, [("z", "Other news."), ("a", CONTENT)])))
    assert again == graphed  # another bucket, other jobs in the pass


def test_a_pass_larger_than_every_bucket_runs_eagerly(gpu_engine):
    large = body(other_questions(300) + TARGETS, [("a", CONTENT * 3)])  # one job of several thousand tokens
    before = gpu_engine.scorer.graphs.replays
    found = numbers(gpu_engine.score(large))
    assert found == numbers(gpu_engine.score(body(TARGETS, [("a", CONTENT * 3)])))
    assert gpu_engine.scorer.graphs.replays - before <= 2  # the floor passes only, not the content's


def test_the_full_warm_up_captures_every_bucket(tiny_cache):
    import torch

    from spinf.engine.graphs import all_buckets

    engine = Engine("tiny", device="cuda", cache_dir=tiny_cache)
    engine.model.to(torch.bfloat16)
    for step in engine.warmup_steps("short"):
        step()
    assert set(engine.scorer.graphs.captured) < set(all_buckets())  # short captures only where its calls land
    for step in engine.warmup_steps("full"):
        step()
    assert engine.scorer.graphs.captured == all_buckets() and not engine.scorer.graphs.failed
