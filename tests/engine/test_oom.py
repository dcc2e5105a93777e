"""Out of memory during a call's passes (api spec §4.9, §3.2): 413 ``request_too_large``, the memory freed, and
the next call scored as a fresh engine scores it; ``degraded`` when device memory does not come back to idle.

On the CPU the out-of-memory error is injected into the scorer's per-pass step (`Scorer.launch`), after the pass
has run, so the failed call really holds tensors; the gpu-marked test provokes a real one on CUDA.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from spinf import Engine
from spinf.engine.engine import IDLE_SLACK_BYTES
from spinf.engine.loop import Call
from spinf.errors import ApiError
from tests.engine.test_independence import CONTENT, TARGETS, body, other_questions

INPUTS = [(f"i{k}", f"Message {k}. " + CONTENT[: 80 + 37 * k]) for k in range(4)]
REQUEST = body(other_questions(12) + TARGETS, INPUTS)  # five passes at a budget of 256 tokens
OTHER = body(TARGETS, [("a", CONTENT)])
OOM_MESSAGE = r"^out of memory while scoring this call; send fewer or shorter inputs$"
GIB = 2**30
TRIED = "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 139.80 GiB"


def comparable(response: dict) -> dict:
    return {k: v for k, v in response.items() if k not in {"id", "created", "timing"}}


def make_engine(cache) -> Engine:
    return Engine("spinf/tiny-gemma4", device="cpu", cache_dir=cache, token_budget=256)


@pytest.fixture
def engine(tiny_cache):
    return make_engine(tiny_cache)


@pytest.fixture(scope="module")
def fresh(tiny_cache):
    """The reference: an engine of the same shape that never ran out of memory."""
    return make_engine(tiny_cache)


class FailingPass:
    """Replaces ``engine.scorer.launch``: runs every pass, and raises ``error()`` after the ``fail_at``-th one
    (counting from 1) has run; keeps a weak reference to every pass's picks."""

    def __init__(self, engine: Engine, fail_at: int, error=lambda: torch.OutOfMemoryError(TRIED)):
        self.launch, self.fail_at, self.error = engine.scorer.launch, fail_at, error
        self.passes: list[weakref.ref] = []
        engine.scorer.launch = self

    def __call__(self, layout):
        launched = self.launch(layout)
        self.passes.append(weakref.ref(launched.picked))
        if len(self.passes) == self.fail_at:
            raise self.error()
        return launched


def refused(call) -> ApiError:
    with pytest.raises(ApiError, match=OOM_MESSAGE) as caught:
        call()
    assert (caught.value.status, caught.value.code, caught.value.param) == (413, "request_too_large", None)
    return caught.value


@pytest.mark.parametrize("fail_at", [1, 3, 5])
def test_an_out_of_memory_pass_answers_413_and_the_next_call_scores_as_a_fresh_engine(engine, fresh, fail_at):
    threads = torch.get_num_threads()
    failing = FailingPass(engine, fail_at)
    error = refused(lambda: engine.score(REQUEST))
    assert isinstance(error.__cause__, torch.OutOfMemoryError)
    assert len(failing.passes) == fail_at
    # the error (held here, as a log record would) no longer keeps the failed passes' tensors alive
    assert [ref() for ref in failing.passes] == [None] * fail_at
    assert torch.get_num_threads() == threads
    assert engine.degraded is None
    engine.scorer.launch = failing.launch
    assert comparable(engine.score(REQUEST)) == comparable(fresh.score(REQUEST))
    assert comparable(engine.score(OTHER)) == comparable(fresh.score(OTHER))


def test_a_shared_pass_out_of_memory_is_retried_with_each_call_alone(tiny_cache):
    """Two calls share the first pass, which runs out of memory: each runs again alone, and neither fails."""
    engine, fresh = (Engine("spinf/tiny-gemma4", device="cpu", cache_dir=tiny_cache) for _ in range(2))
    bodies = [OTHER, body(TARGETS[:1], [("b", "Where is my parcel?")])]
    failing = FailingPass(engine, 1)
    calls = [Call(b, f"scr_{k}") for k, b in enumerate(bodies)]
    engine.loop.run(calls)
    # the shared pass, then each of its works alone: the two calls and the floor read
    assert len(failing.passes) == 4 and failing.passes[0]() is None
    assert engine.degraded is None
    for call, request in zip(calls, bodies, strict=True):
        assert comparable(call.unwrap()) == comparable(fresh.score(request))


def test_the_cpu_allocators_own_failure_is_out_of_memory_too(engine):
    FailingPass(engine, 2, error=lambda: torch.empty(2**62, dtype=torch.uint8))  # DefaultCPUAllocator refuses
    error = refused(lambda: engine.score(REQUEST))
    assert type(error.__cause__) is RuntimeError and "can't allocate memory" in str(error.__cause__)
    assert engine.degraded is None


def test_an_error_that_is_not_out_of_memory_is_not_a_413(engine):
    FailingPass(engine, 1, error=lambda: RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    with pytest.raises(RuntimeError, match=r"^mat1 and mat2 shapes cannot be multiplied$"):
        engine.score(REQUEST)
    assert engine.degraded is None


@pytest.mark.parametrize(
    ("held", "degraded"),
    [
        (IDLE_SLACK_BYTES, None),
        (IDLE_SLACK_BYTES + 1, "0.06 GiB still held after an out-of-memory error"),
        (3 * GIB, "3.00 GiB still held after an out-of-memory error"),
    ],
)
def test_memory_not_back_to_idle_marks_the_engine_degraded(engine, fresh, monkeypatch, held, degraded):
    reading = [5 * GIB]  # the faked device memory; the idle figure is taken when the first call succeeds
    monkeypatch.setattr(engine.scorer, "allocated_bytes", lambda: reading[0])
    engine.score(OTHER)
    failing = FailingPass(engine, 2)
    reading[0] += held
    refused(lambda: engine.score(REQUEST))
    assert engine.degraded == degraded
    engine.scorer.launch = failing.launch  # a degraded engine keeps serving, and stays degraded
    reading[0] -= held
    assert comparable(engine.score(REQUEST)) == comparable(fresh.score(REQUEST))
    assert engine.degraded == degraded


def test_an_out_of_memory_error_before_any_call_succeeded_is_measured_against_the_load_figure(engine, monkeypatch):
    monkeypatch.setattr(engine.scorer, "allocated_bytes", lambda: 2 * GIB)  # the load figure was 0 (the CPU)
    FailingPass(engine, 1)
    refused(lambda: engine.score(OTHER))
    assert engine.degraded == "2.00 GiB still held after an out-of-memory error"


@pytest.mark.gpu
def test_a_real_gpu_out_of_memory_frees_its_memory_and_the_next_call_scores_the_same(tiny_cache):
    engine = Engine("spinf/tiny-gemma4", device="cuda", cache_dir=tiny_cache)
    large = body(other_questions(300) + TARGETS, INPUTS)  # one pass of about 11,000 tokens
    device = torch.cuda.current_device()
    torch.cuda.reset_peak_memory_stats(device)
    expected = comparable(engine.score(large))
    torch.cuda.synchronize(device)
    gc.collect()  # the out-of-memory path collects too: engines left by earlier tests must not go during the call
    torch.cuda.empty_cache()
    idle = torch.cuda.memory_allocated(device)
    needed = torch.cuda.max_memory_allocated(device) - idle
    assert needed > 8 * 2**20
    # half of what the call needs: the caching allocator refuses to reserve past the cap, midway through the pass
    cap = idle + needed // 2
    torch.cuda.set_per_process_memory_fraction(cap / torch.cuda.get_device_properties(device).total_memory, device)
    try:
        with pytest.raises(ApiError, match=r"^out of GPU memory while scoring this call; send fewer") as caught:
            engine.score(large)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
    assert (caught.value.status, caught.value.code, caught.value.param) == (413, "request_too_large", None)
    assert isinstance(caught.value.__cause__, torch.OutOfMemoryError)
    assert torch.cuda.memory_allocated(device) == idle
    assert engine.degraded is None
    assert comparable(engine.score(large)) == expected
