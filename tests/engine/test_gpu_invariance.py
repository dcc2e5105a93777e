"""Per-question batch invariance on the GPU (engine spec C.1): bit for bit, whatever shares the pass.

The tiny model on CUDA through the fused path (bf16 activations, Triton tree attention, fp8s linears after a
calibration): every question's log-probs alone, with its input's other questions, in a crowd of other inputs, in
another order, and in a pass shared with a concurrent request. The 12B-shaped run of the same check is
``python benchmarks/gpu_fast.py --invariance`` (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import random

import pytest

from spinf import Engine
from spinf.engine.quant import AmaxRecorder
from tests.engine.test_independence import CONTENT, TARGETS, body, numbers, other_questions

pytestmark = pytest.mark.gpu

OTHER = "Where is my parcel? It was due on Monday and the tracking page has not changed since. " * 6


@pytest.fixture(scope="module", params=["bf16", "fp8s"])
def gpu_engine(request, tiny_cache):
    import torch

    engine = Engine("tiny", device="cuda", cache_dir=tiny_cache)
    engine.model.to(torch.bfloat16)  # the fused path runs bf16 activations
    if request.param == "fp8s":
        if torch.cuda.get_device_capability() < (8, 9):
            pytest.skip("fp8 needs compute capability 8.9")
        recorder = AmaxRecorder()
        with engine.model.observing(recorder.observe):
            engine.score(body(other_questions(30) + TARGETS, [("a", CONTENT), ("b", OTHER)]))
        engine.model.to_fp8s(recorder.scales())
    return engine


def test_every_question_keeps_its_bits_in_five_compositions(gpu_engine):
    engine = gpu_engine
    whole = numbers(engine.score(body(TARGETS, [("a", CONTENT)])))  # log-probs, p, floors, residuals
    # alone: each target query on its own
    for query in TARGETS:
        alone = numbers(engine.score(body([query], [("a", CONTENT)])))
        assert alone == {k: v for k, v in whole.items() if k[0] == query["id"]}
    # with many other questions on the same input, placed before and after
    crowd = other_questions(120)
    assert numbers(engine.score(body(crowd[:60] + TARGETS + crowd[60:], [("a", CONTENT)]))) == whole
    # among other inputs, in another order
    rng = random.Random(3)
    shuffled = list(reversed(TARGETS))
    inputs = [("z", "Other news."), ("b", OTHER), ("a", CONTENT)]
    rng.shuffle(inputs)
    assert numbers(engine.score(body(other_questions(40) + shuffled, inputs))) == whole
    # in passes shared with a concurrent request
    first = engine.prepare(body(TARGETS, [("a", CONTENT)]))
    second = engine.prepare(body(other_questions(200), [("b", OTHER), ("c", CONTENT + " More.")]))
    values, stats = engine.run([second.compiled.jobs, first.compiled.jobs])
    assert numbers(engine.respond(first, values[1], stats)) == whole
