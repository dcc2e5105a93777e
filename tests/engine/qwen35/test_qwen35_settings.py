"""The ``layers`` and ``lm_head`` settings on the Qwen3.5 stack, as on Gemma (issue 35 item 5; engine spec B.7,
docs/configuration.md): a model cut to its first N layers scores as transformers' model of N layers (to 1e-4), and
each head mode against the fp32 head: f32out on an fp32 model is the fp32 head bit for bit and by fingerprint, bf16
rounds operands and logits within its bound; on a bf16 model the three modes differ and each names itself in the
fingerprint. The checkpoint is one transformers wrote (`tests.engine.qwen35.hf_checkpoint`)."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from spinf import Engine
from spinf.engine.head import HEAD_MODES
from spinf.errors import ModelError
from tests.engine.qwen35.hf_checkpoint import check_scores, oracle_of, write_transformers_qwen35
from tests.engine.test_oracle import CHOSEN, text_input

# the bf16 head on the fp32 model: |log-prob| error (max, median) over `logprobs`' 12 options; measured (0.0072,
# 0.0017); on the bf16 model every mode is within 0.18 of the fp32 model's scores (max; medians about 0.068)
BF16_HEAD = (0.02, 0.005)
BF16_MODEL = 0.35
BODY = {
    "inputs": [
        text_input("in0", "I was charged twice for one order and the parcel came late. Please refund one payment."),
        text_input("in1", "The delivery was quick and the support team was great."),
    ],
    "scoring": {
        "queries": [
            {"id": "refund", "template": "\n\nA refund? Answer:{?}", "options": [" yes", " no", " maybe"]},
            {"id": "tone", "template": " The tone is{?}", "options": [" positive", " negative", " very much so"]},
        ]
    },
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_transformers_qwen35(tmp_path_factory.mktemp("hf-qwen35"))


@pytest.fixture(scope="module")
def truncated(folder, tmp_path_factory):
    """The same checkpoint with ``num_hidden_layers`` 4 in its config: transformers' model of the first 4 layers
    (the others' weights are unexpected keys it skips)."""
    out = tmp_path_factory.mktemp("hf-qwen35-4")
    shutil.copytree(folder, out, dirs_exist_ok=True)
    config = json.loads((out / "config.json").read_text())
    config["num_hidden_layers"] = 4
    config["layer_types"] = config["layer_types"][:4]
    (out / "config.json").write_text(json.dumps(config))
    return out


def logprobs(engine: Engine) -> dict:
    out = {}
    for result in engine.score(BODY)["results"]:
        for query in result["queries"]:
            for option in query["combinations"][0]["options"]:
                out[result["input_id"], query["id"], option["text"]] = option["logprob"]
    return out


def test_the_first_layers_score_as_transformers_model_of_that_many(folder, truncated):
    engine = Engine(str(folder), device="cpu", layers=4)
    assert len(engine.model.layers) == 4 and engine.info()["layers"] == 4
    for body in (BODY, CHOSEN["the cut"]):
        check_scores(engine.score(body), body, oracle_of(truncated))
    whole = Engine(str(folder), device="cpu")
    assert engine.system_fingerprint != whole.system_fingerprint  # a truncated model is another model
    assert logprobs(engine) != logprobs(whole)


def test_more_layers_than_the_checkpoint_has_are_refused(folder):
    with pytest.raises(ModelError, match=r"the checkpoint has 8 layers, fewer than the 9 asked$"):
        Engine(str(folder), device="cpu", layers=9)


def test_the_head_modes_on_the_fp32_model(folder):
    engines = {mode: Engine(str(folder), device="cpu", lm_head=mode) for mode in HEAD_MODES}
    found = {mode: logprobs(engine) for mode, engine in engines.items()}
    assert found["f32out"] == found["fp32"]
    assert engines["f32out"].system_fingerprint == engines["fp32"].system_fingerprint
    assert {mode: e.info()["lm_head"] for mode, e in engines.items()} == {
        "f32out": "lm_head fp32",
        "fp32": "lm_head fp32",
        "bf16": "lm_head bf16",
    }
    assert engines["bf16"].system_fingerprint != engines["fp32"].system_fingerprint
    diffs = sorted(abs(found["bf16"][k] - found["fp32"][k]) for k in found["fp32"])
    worst, median = diffs[-1], diffs[len(diffs) // 2]
    assert 0 < worst <= BF16_HEAD[0] and median <= BF16_HEAD[1], (worst, median)


def test_the_head_modes_on_a_bf16_model(folder):
    """On bf16 weights the three modes differ (f32out rounds the normed rows to bf16, bf16 the logits too, fp32
    neither), each within bf16's reach of the fp32 model's scores, and each names its mode in the fingerprint."""
    engines = {mode: Engine(str(folder), device="cpu", quant="bf16", lm_head=mode) for mode in HEAD_MODES}
    found = {mode: logprobs(engine) for mode, engine in engines.items()}
    exact = logprobs(Engine(str(folder), device="cpu"))
    assert found["f32out"] != found["fp32"] and found["f32out"] != found["bf16"]
    assert len({engine.system_fingerprint for engine in engines.values()}) == 3
    assert {mode: e.info()["lm_head"] for mode, e in engines.items()} == {m: f"lm_head {m}" for m in HEAD_MODES}
    for mode, scores in found.items():
        assert max(abs(scores[k] - exact[k]) for k in exact) < BF16_MODEL, mode  # bf16 activations, 8 layers


def test_a_head_mode_that_does_not_exist(folder):
    with pytest.raises(ValueError, match=r"^lm_head 'f16' is not one of f32out, bf16, fp32$"):
        Engine(str(folder), device="cpu", lm_head="f16")


def test_a_deciders_readout_takes_no_head_mode(tmp_path):
    from spinf.engine.qwen35.tiny import write_tiny_decider

    folder = write_tiny_decider(tmp_path / "decider")
    assert Engine(str(folder), device="cpu", layers=2).info()["lm_head"] == "readout fp32"  # layers apply
    with pytest.raises(
        ModelError, match=r"lm_head bf16 sets an LM head's precision; the decider's readout runs in fp32$"
    ):
        Engine(str(folder), device="cpu", lm_head="bf16")


def test_served_by_path_with_both_settings_answers_as_in_process(folder, tmp_path):
    from contrib.loadtest.harness import ServerProcess

    server = ServerProcess(tmp_path / "server", "--lm-head", "bf16", model=str(folder), env={"SPINF_LAYERS": "4"})
    try:
        answer = httpx.post(f"{server.url}/v1/score", json={"model": str(folder), **BODY}, timeout=120)
        assert answer.status_code == 200, answer.text
        engine = Engine(str(folder), device="cpu", layers=4, lm_head="bf16")
        assert answer.json()["results"] == engine.score(BODY)["results"]
        assert answer.json()["system_fingerprint"] == engine.system_fingerprint
    finally:
        assert server.stop() == 0
