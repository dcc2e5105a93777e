"""`Engine.score` streams a request (compile, run and read back overlapped); the answer is the sequential one."""

from __future__ import annotations

import pytest

from spinf import Engine
from spinf.errors import ApiError
from tests.engine.test_independence import CONTENT, TARGETS, body, other_questions

INPUTS = [(f"i{k}", f"Message {k}. " + CONTENT[: 80 + 37 * k]) for k in range(9)]


@pytest.fixture(scope="module")
def small_budget(tiny_cache):
    return Engine("tiny", device="cpu", cache_dir=tiny_cache, token_budget=256)  # many passes, jobs held back


def sequential(engine: Engine, request: dict, **flags) -> dict:
    prepared = engine.prepare(request, **flags)
    (values,), stats = engine.run([prepared.compiled.jobs])
    return engine.respond(prepared, values, stats)


def comparable(response: dict) -> dict:
    return {k: v for k, v in response.items() if k not in {"id", "created", "timing"}}


@pytest.mark.parametrize("queries", [TARGETS, other_questions(12) + TARGETS])
def test_the_streamed_answer_is_the_sequential_one(small_budget, queries):
    request = body(queries, INPUTS)
    streamed = small_budget.score(request)
    assert comparable(streamed) == comparable(sequential(small_budget, request))
    assert streamed["usage"]["processed_tokens"] > 4 * 256  # it did run in several windows


def test_a_request_over_the_processed_token_limit_fails_the_same_way(small_budget):
    request = {**body(TARGETS, INPUTS), "limits": {"max_processed_tokens": 600}}
    with pytest.raises(ApiError) as streamed:
        small_budget.score(request, trusted=True)
    with pytest.raises(ApiError) as plain:
        small_budget.prepare(request, trusted=True)
    assert (streamed.value.status, streamed.value.code, str(streamed.value)) == (
        413,
        "request_too_large",
        str(plain.value),
    )


def test_an_input_refused_midway_fails_the_call(small_budget):
    inputs = [*INPUTS[:3], ("long", "word " * 3000), *INPUTS[3:]]
    request = {**body(TARGETS, inputs), "limits": {"max_content_tokens": 1000}}
    with pytest.raises(ApiError) as streamed:
        small_budget.score(request, trusted=True)
    with pytest.raises(ApiError) as plain:
        small_budget.prepare(request, trusted=True)
    assert (
        (streamed.value.code, streamed.value.param)
        == (plain.value.code, plain.value.param)
        == (
            "content_too_long",
            "inputs.3",
        )
    )
