"""The Qwen3.5 stack through the engine on a GPU (gpu-marked): the tiny twin in bf16 and a tiny GPTQ folder in each
int4 mode score what the CPU engine scores, within each precision's rounding, and a question scores bit for bit the
same alone and among other inputs and questions.

The tolerances are loose on purpose: the tiny random model is sharp (int4 rounding alone moves its log-probs by up
to 6.6, tests/engine/qwen35/test_int4.py), so these catch wiring faults (a wrong plan, a layer skipped), not
precision; the CPU tests hold the exactness."""

from __future__ import annotations

import pytest
import torch

from spinf import Engine
from spinf.engine.qwen35.int4_write import write_gptq_checkpoint
from spinf.engine.qwen35.tiny import write_tiny_qwen35

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
QUESTIONS = [
    {"id": "refund", "template": "\n\nDoes the customer ask for a refund? Answer:{?}", "options": [" yes", " no"]},
    {"id": "angry", "template": "\n\nIs the customer angry? Answer:{?}", "options": [" very much so", " not at all"]},
]
TEXTS = ["I was charged twice for one order. Please refund one payment.", "The parcel came late and broken."]
# long enough that its fixed prefix (all but its last 64 tokens) runs chunked (spinf/engine/qwen35/chunked.py)
LONG = " ".join(f"Order {n} was charged twice and the parcel came late, so I asked for a refund." for n in range(12))


def body(texts: list[str], queries: list[dict]) -> dict:
    inputs = [{"id": f"in{i}", "messages": [{"role": "user", "content": t}]} for i, t in enumerate(texts)]
    return {"inputs": inputs, "scoring": {"queries": queries}}


def options(response: dict) -> list[tuple[float, float]]:
    return [
        (o["logprob"], o["p"])
        for result in response["results"]
        for q in result["queries"]
        for c in q["combinations"]
        for o in c["options"]
    ]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen-gpu")
    float_folder = write_tiny_qwen35(root / "float")
    return float_folder, write_gptq_checkpoint(float_folder, root / "int4", outlier_channels=4)


@pytest.mark.parametrize(("which", "quant", "tolerance"), [
    ("float", "", 0.5), ("int4", "bf16", 0.5), ("int4", "f16", 0.5), ("int4", "i8", 1.0), ("int4", "fp8", 3.0),
])  # fmt: skip
def test_the_gpu_engine_scores_what_the_cpu_engine_scores(folders, which, quant, tolerance):
    folder = folders[0] if which == "float" else folders[1]
    gpu = Engine(str(folder), device="cuda", quant=quant)
    cpu = Engine(str(folder), device="cpu", quant=quant if which == "int4" else "")
    request = body([*TEXTS, LONG], QUESTIONS)
    got, expected = options(gpu.score(request)), options(cpu.score(request))
    print(which, gpu.quant, max(abs(a[0] - b[0]) for a, b in zip(got, expected, strict=True)))
    for (lp, p), (lp_cpu, p_cpu) in zip(got, expected, strict=True):
        assert abs(lp - lp_cpu) <= tolerance and abs(p - p_cpu) <= tolerance / 2


@pytest.mark.parametrize(
    ("which", "quant"), [("float", ""), ("int4", "i8"), ("int4", "bf16"), ("int4", "f16"), ("int4", "fp8")]
)
def test_a_question_scores_the_same_bits_alone_and_among_others_on_the_gpu(folders, which, quant):
    engine = Engine(str(folders[0] if which == "float" else folders[1]), device="cuda", quant=quant)
    more = [*QUESTIONS, {"id": "late", "template": "\n\nWas it late? Answer:{?}", "options": [" yes", " no"]}]
    for text in (TEXTS[0], LONG):  # a short content, and one whose fixed prefix runs chunked
        alone = engine.score(body([text], QUESTIONS[:1]))["results"][0]["queries"][0]
        among = engine.score(body([LONG if text != LONG else TEXTS[0], text, "Thanks, all good."], more))
        assert alone == among["results"][1]["queries"][0]


def test_int4_i8_shares_passes_and_caches_floors_as_a_catalog_model_does(folders):
    """A catalog Qwen model in int4-i8 is batch-invariant (engine spec B.10 item 8): concurrent calls share passes,
    floors come from the cache, and every question keeps the bits it has alone. The tiny folder is resolved as a
    catalog model would be (a folder served by path carries no guarantee, api spec §9.6)."""
    import attrs

    from spinf.catalog import resolve_model
    from spinf.engine.loop import EngineLoop

    resolved = attrs.evolve(resolve_model(str(folders[1])), batch_invariant=True)
    engine = Engine(str(folders[1]), device="cuda", quant="i8", resolved=resolved)
    assert (engine.quant, engine.batch_invariant, engine.loop.share_passes) == ("int4-i8", True, True)
    texts = [TEXTS[0], LONG, TEXTS[1], "Thanks, all good."]
    alone = [engine.score(body([text], QUESTIONS))["results"][0] for text in texts]
    before = engine.loop.statistics()
    calls = [EngineLoop.new_call(body([text], QUESTIONS), f"shared-{i}") for i, text in enumerate(texts)]
    engine.loop.run(calls)  # four concurrent calls in one run of the loop
    after = engine.loop.statistics()
    assert [call.unwrap()["results"][0] for call in calls] == alone  # the same bits, passes shared
    assert after.passes - before.passes == 1  # one pass held all four calls' jobs
    assert after.floor_hits > before.floor_hits and after.floor_misses == before.floor_misses  # floors cached
