"""Per-question batch invariance on the GPU (engine spec C.1): bit for bit, whatever shares the pass.

The tiny model on CUDA through the fused path (bf16 activations, Triton tree attention, fp8s linears after a
calibration): every question's log-probs alone, with its input's other questions, in a crowd of other inputs, in
another order, and in passes shared with 255 concurrent calls through the engine loop, with a cold and a warm floor
cache. The 12B-shaped run of the same check is
``python benchmarks/gpu_fast.py --invariance`` (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import random

import pytest

from spinf import Engine
from spinf.engine.loop import Call
from spinf.engine.quant import AmaxRecorder
from tests.engine.test_independence import CONTENT, TARGETS, body, numbers, other_questions

pytestmark = pytest.mark.gpu

OTHER = "Where is my parcel? It was due on Monday and the tracking page has not changed since. " * 6


def cuda_engine(scheme: str, tiny_cache) -> Engine:
    """The tiny model on CUDA in ``scheme``: bf16 activations, and for fp8s linears calibrated on a few questions
    (test_gpu_extraction.py's engines too)."""
    import torch

    engine = Engine("tiny", device="cuda", cache_dir=tiny_cache)
    engine.model.to(torch.bfloat16)  # the fused path runs bf16 activations
    return to_fp8s(engine) if scheme == "fp8s" else engine


def to_fp8s(engine: Engine) -> Engine:
    """``engine``'s linears in fp8s, with scales calibrated on a few questions (skipped below compute capability
    8.9); the engine."""
    import torch

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability 8.9")
    recorder = AmaxRecorder()
    with engine.model.observing(recorder.observe):
        engine.score(body(other_questions(30) + TARGETS, [("a", CONTENT), ("b", OTHER)]))
    engine.model.to_fp8s(recorder.scales())
    return engine


@pytest.fixture(scope="module", params=["bf16", "fp8s"])
def gpu_engine(request, tiny_cache):
    return cuda_engine(request.param, tiny_cache)


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
    # in passes shared with 255 concurrent calls, with a cold floor cache, then alone with a warm one
    shared = engine.new_loop(share_passes=True, floor_cache=4096)
    mine = Call(body(TARGETS, [("a", CONTENT)]), "scr_mine")
    crowd_calls = [Call(body(other_questions(20), [("b", f"{k}. {OTHER}")]), f"scr_{k}") for k in range(255)]
    shared.run([*crowd_calls[:128], mine, *crowd_calls[128:]])
    assert numbers(mine.unwrap()) == whole
    again = Call(body(TARGETS, [("a", CONTENT)]), "scr_again")
    hits = shared.statistics().floor_hits
    shared.run([again])
    assert numbers(again.unwrap()) == whole and shared.statistics().floor_hits > hits
