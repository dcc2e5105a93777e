"""Per-question invariance of extraction answers on the GPU (issue 14): bit for bit, whatever shares the decode.

The tiny model on CUDA through the fused path (bf16 activations, Triton tree attention for the scoring pass and
for every decode step, fp8s linears after test_gpu_invariance's calibration): each slot's raw outcomes (every
answer's tokens and fp32 log-prob, every generated sequence) alone, with its input's other slots and many scored
questions, among other inputs, with slots of other lengths in the same chunk, and in decodes shared with 63
concurrent calls through the engine loop.
"""

from __future__ import annotations

import pytest

from spinf.engine.loop import Call
from tests.engine.test_gpu_invariance import cuda_engine
from tests.engine.test_independence import CONTENT, other_questions

pytestmark = pytest.mark.gpu

OTHER = "Acme Corp sold 3.5 million barrels in 2024 at $12.50 each, up 12% on the year. " * 4
SLOTS = [
    {"id": "name", "template": '\n\nThe company is called "{*}"', "top_k": 8},
    {"id": "count", "template": "\n\nHow many? {n}", "max_tokens": 6},
    {"id": "price", "template": "\n\nThe price: {$}", "calibration": {"a": 1.5, "b": -0.2}},
    {"id": "greedy", "template": "\n\nIn short:{*}", "generate": True, "max_tokens": 20},
    {"id": "sampled", "template": "\n\nIn short:{*}", "generate": {"temperature": 0.9, "seed": 7, "n": 3}},
]


def body(queries: list[dict], inputs: list[tuple[str, str]]) -> dict:
    return {
        "inputs": [{"id": i, "messages": [{"role": "user", "content": text}]} for i, text in inputs],
        "scoring": {"queries": queries},
    }


@pytest.fixture(scope="module", params=["bf16", "fp8s"])
def gpu_engine(request, tiny_cache):
    return cuda_engine(request.param, tiny_cache)


@pytest.fixture
def outcomes(gpu_engine):
    """Every slot's raw outcome by (input id, query id, combination), recorded as results are built."""
    seen: dict[tuple, object] = {}
    extractor = gpu_engine.extractor
    original = extractor.query_entry

    def recording(ci, qi, decoded):
        cq = ci.queries[qi]
        for k in range(len(cq.combos)):
            outcome = decoded[id(ci.prompts[qi][k])]
            seen[(ci.spec.id, cq.spec.id, k)] = outcome.answers if outcome.answers is not None else outcome.sequences
        return original(ci, qi, decoded)

    extractor.query_entry = recording
    yield seen
    extractor.query_entry = original


def of(seen: dict, input_id: str, ids) -> dict:
    return {key[1:]: value for key, value in seen.items() if key[0] == input_id and key[1] in ids}


def test_every_slot_keeps_its_bits_in_six_compositions(gpu_engine, outcomes):
    engine, ids = gpu_engine, {q["id"] for q in SLOTS}
    engine.score(body(SLOTS, [("a", CONTENT)]))
    whole = of(outcomes, "a", ids)
    assert len(whole) == len(SLOTS) and any(whole[("name", 0)]), "the text slot found no answer"
    for query in SLOTS:  # each slot alone
        outcomes.clear()
        engine.score(body([query], [("a", CONTENT)]))
        assert of(outcomes, "a", ids) == {k: v for k, v in whole.items() if k[0] == query["id"]}
    outcomes.clear()  # among many scored questions, in another order
    crowd = other_questions(80)
    engine.score(body(crowd[:40] + list(reversed(SLOTS)) + crowd[40:], [("a", CONTENT)]))
    assert of(outcomes, "a", ids) == whole
    outcomes.clear()  # among other inputs that have slots too
    engine.score(body(SLOTS, [("z", "Other news."), ("b", OTHER), ("a", CONTENT), ("c", OTHER[:50])]))
    assert of(outcomes, "a", ids) == whole
    outcomes.clear()  # with longer slots in the same chunk (more steps, wider paths)
    longer = [{**q, "id": f"long-{q['id']}", "max_tokens": 40 if "generate" in q else 24} for q in SLOTS]
    engine.score(body(SLOTS + longer, [("a", CONTENT)]))
    assert of(outcomes, "a", ids) == whole
    outcomes.clear()  # decoded together with 63 concurrent calls in a shared loop
    shared = engine.new_loop(share_passes=True, floor_cache=0)
    mine = Call(body(SLOTS, [("a", CONTENT)]), "scr_mine")
    crowd_calls = [Call(body(SLOTS[k % 5 :] + crowd[:3], [(f"o{k}", f"{k}. {OTHER}")]), f"scr_{k}") for k in range(63)]
    shared.run([*crowd_calls[:32], mine, *crowd_calls[32:]])
    mine.unwrap()
    assert of(outcomes, "a", ids) == whole
