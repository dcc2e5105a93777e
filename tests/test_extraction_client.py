"""Extraction and generated slots (api spec §4.5, §5.2, §5.4, §5.5) against a real server process over a real socket.

``spinf-serve serve spinf/tiny-gemma4 --device cpu`` runs as a child process; spinf-client 0.3.1, unchanged, builds
the queries (`spinf_client.query`: ``top_k``, ``calibration``, ``generate``) and reads the answers the way it
exposes them (`spinf_client.answers`: the combination, whole); raw httpx calls check what the client does not read
(the key order of §5.2, ``usage.extraction`` and ``usage.generation`` of §5.7, ``timing.decode_ms`` of §5.8) and the
chat route (§6). Two more servers, started with ``--no-extraction`` and ``--no-generation``, check the switches'
refusals (§4.12 step 13), their ``/v1/models`` entries (§7) and their boot (§3.1). The tiny model's weights are
random, so its answers mean nothing; what is checked is their shape and the rules that tie the numbers together.
"""

from __future__ import annotations

import math
import re

import httpx
import pytest
from spinf_client import SpinfClient, SpinfError, answers, calibration, query, text

from contrib.loadtest.harness import ServerProcess, tiny_cache

MODEL = "spinf/tiny-gemma4"
CONTENT = "Order 1234 from Acme arrived 3 days late. I paid $45.50 for 2 items and want a refund of $45.50."
TOKEN, TRUSTED = "tok", "boss"
SEARCHED_KEYS = {  # an answer's keys, in order, by kind (§5.2)
    "text": ["text", "p"],
    "number": ["text", "p", "value"],
    "currency": ["text", "p", "value", "currency"],
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tiny_cache(tmp_path_factory.mktemp("hf-home"))


@pytest.fixture(scope="module")
def server(tmp_path_factory, cache):
    process = ServerProcess(
        tmp_path_factory.mktemp("extraction"), "--token", TOKEN, "--trusted-token", TRUSTED, hf_home=cache
    )
    yield process
    assert process.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return SpinfClient(api_key=TOKEN, base_url=server.url, model=MODEL)


def post(server, path: str, body: dict, token: str = TOKEN) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def scoring(*queries: dict) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": CONTENT}], "scoring": {"queries": list(queries)}}


def spec_value(answer: str) -> float:
    """``value`` as api spec §5.4 defines it, from the answer's text."""
    match = re.search(r"\d[\d,]*(\.\d+)?", answer)
    value = float(match[0].replace(",", ""))
    scale = re.match(r"\s*(thousand|million|billion)\b", answer[match.end() :])
    if scale:
        value *= {"thousand": 1e3, "million": 1e6, "billion": 1e9}[scale[1]]
    return -value if answer.lstrip().startswith(("-", "\u2212", "(")) else value


def check_searched(found: dict, kind: str, top_k: int) -> list[dict]:
    """The rules of §5.2 and §5.4 every searched slot's combination keeps; its answers back."""
    shown = found["answers"]
    assert 0 < len(shown) <= top_k  # the tiny model finds something in every slot used here
    assert [list(a) for a in shown] == [SEARCHED_KEYS[kind]] * len(shown)
    assert [a["p"] for a in shown] == sorted((a["p"] for a in shown), reverse=True)
    assert all(0 < a["p"] <= 1 and a["text"] == a["text"].strip() for a in shown)
    assert sum(a["p"] for a in shown) <= found["mass"] + 1e-5 <= 1 + 1e-5  # mass: every answer found, before the cut
    if kind != "text":
        assert all(math.isclose(a["value"], spec_value(a["text"]), rel_tol=1e-9) for a in shown)
        assert 0 <= found["p_negative"] <= 1
    else:
        assert "p_negative" not in found
    return shown


# ---------------------------------------------------------------------------------------------- spinf-client


def test_text_slot_with_top_k(client):
    response = client.score([text(CONTENT)], [query("vendor", '\n\nThe vendor is "{*}"', top_k=3)])
    assert response["results"][0]["queries"][0]["kind"] == "text"
    found = answers(response, "vendor")
    assert list(found) == ["values", "answers", "mass"] and found["values"] == {}
    check_searched(found, "text", top_k=3)
    wider = answers(client.score([text(CONTENT)], [query("vendor", '\n\nThe vendor is "{*}"', top_k=8)]), "vendor")
    assert wider["answers"][:3] == found["answers"] and wider["mass"] == found["mass"]  # top_k only cuts


def test_number_slot_defaults_to_five_answers_and_may_find_none(client):
    response = client.score([text(CONTENT)], [query("days", "\n\nDays late:{n}")])
    assert response["results"][0]["queries"][0]["kind"] == "number"
    found = answers(response, "days")
    assert list(found) == ["values", "answers", "mass", "p_negative"]
    check_searched(found, "number", top_k=5)
    # on this template no beam of the random weights ends a number: no answer, mass 0 and no p_negative
    none = answers(client.score([text(CONTENT)], [query("days", "\n\nHow many days late?{n}")]), "days")
    assert none == {"values": {}, "answers": [], "mass": 0}


def test_amount_slot_with_calibration(client):
    a, b = 1.3, -0.4
    response = client.score([text(CONTENT)], [query("paid", "\n\nAmount paid:{$}", calibration=(a, b))])
    found = answers(response, "paid")
    assert list(found) == ["values", "answers", "mass", "p_negative", "p_calibrated"]
    shown = check_searched(found, "currency", top_k=5)
    assert all(x["currency"] in {"$", "\u20ac", "\u00a3", "\u00a5", None} for x in shown)
    # sigma(a * logit(p_top) + b), by the client's own calibration map, from the top answer's rounded p
    assert math.isclose(found["p_calibrated"], calibration.apply(shown[0]["p"], a, b), abs_tol=1e-5)
    plain = answers(client.score([text(CONTENT)], [query("paid", "\n\nAmount paid:{$}")]), "paid")
    assert "p_calibrated" not in plain and plain["answers"] == found["answers"]


def test_placeholders_give_one_combination_per_value(client):
    asked = query("who", '\n\nThe {role} is "{*}"', combinations=[{"role": "vendor"}, {"role": "customer"}], top_k=2)
    response = client.score([text(CONTENT)], [asked])
    for c, role in enumerate(("vendor", "customer")):
        found = answers(response, "who", combination=c)
        assert found["values"] == {"role": role}
        check_searched(found, "text", top_k=2)


def test_greedy_generation(client):
    asked = query("reply", '\n\nA short reply: "{*}"', generate=True, max_tokens=10)
    response = client.score([text(CONTENT)], [asked])
    result = response["results"][0]["queries"][0]
    assert [result[k] for k in ("id", "kind", "generate")] == ["reply", "text", True]
    found = answers(response, "reply")
    assert list(found) == ["values", "answers"]  # no p, mass or p_negative
    (only,) = found["answers"]
    assert list(only) == ["text", "finish"] and only["finish"] in {"stop", "length"}
    assert 0 < response["usage"]["completion_tokens"] <= 10
    assert answers(client.score([text(CONTENT)], [asked]), "reply") == found  # greedy: the same text again


def test_sampled_generation_is_seeded(client):
    def sampled(seed: int) -> list[dict]:
        options = {"temperature": 1.0, "top_p": 0.9, "top_k": 50, "seed": seed, "n": 3}
        asked = query("reply", '\n\nA short reply: "{*}"', generate=options, max_tokens=8)
        return answers(client.score([text(CONTENT)], [asked]), "reply")["answers"]

    first = sampled(7)
    assert len(first) == 3 and all(list(a) == ["text", "finish"] for a in first)
    assert all(a["finish"] in {"stop", "length"} for a in first)
    assert sampled(7) == first  # sequence b draws from its own stream seeded with (seed, b)
    assert len({a["text"] for a in first + sampled(8)}) > 1  # at temperature 1 the random weights do not repeat


def test_the_client_sees_the_slot_limits_as_errors(client):
    eleven = [query(f"x{k}", f'\n\nFact {k}: "{{*}}"') for k in range(11)]
    with pytest.raises(SpinfError) as caught:
        client.score([text(CONTENT)], eleven)
    assert (caught.value.status, caught.value.code, caught.value.param) == (400, "too_many_extractions", "inputs.0")
    with pytest.raises(SpinfError) as caught:
        client.score([text(CONTENT)], [query("x", '\n\nA fact: "{*}"', max_tokens=65)])  # over 64 needs generate
    assert (caught.value.code, caught.value.param) == ("invalid_field", "scoring.queries.0")
    with pytest.raises(SpinfError) as caught:
        client.score([text(CONTENT)], [query("x", '\n\nA fact: "{*}"', generate=True, max_tokens=101)])
    assert (caught.value.code, caught.value.param) == ("invalid_field", "scoring.queries.0.max_tokens")
    with pytest.raises(SpinfError) as caught:
        client.score([text(CONTENT)], [query("x", "\n\nDays:{n}", generate=True)])
    assert (caught.value.code, caught.value.param) == ("invalid_field", "scoring.queries.0.generate")


def test_models_and_boot_report_extraction(client, server):
    (entry,) = client.models()["models"]
    assert entry["capabilities"] == ["score", "extract", "generate"]
    assert entry["features"] == {"media": ["image", "audio", "video"], "extraction": True, "generation": True}
    assert entry["limits"]["max_extractions_per_input"] == 10
    boot = httpx.get(f"{server.url}/readyz", timeout=10).json()["boot"]
    assert boot["warmup_s"] > 0 and boot["warmup_extract_s"] > 0  # --warmup short: the extraction call ran


# ---------------------------------------------------------------------------------------------- raw HTTP

SLOTS = [
    {"id": "refund", "template": "\n\nDoes the customer ask for a refund? Answer:{?}", "options": [" yes", " no"]},
    {"id": "vendor", "template": '\n\nThe vendor is "{*}"', "top_k": 2},
    {"id": "days", "template": "\n\nDays late:{n}", "max_tokens": 6},
    {"id": "paid", "template": "\n\nAmount paid:{$}", "calibration": {"a": 1, "b": 0}},
    {"id": "reply", "template": '\n\nA short reply: "{*}"', "generate": True, "max_tokens": 8},
    {
        "id": "ideas",
        "template": '\n\nOne idea: "{*}"',
        "generate": {"temperature": 0.8, "seed": 3, "n": 2},
        "max_tokens": 12,
    },
]


@pytest.fixture(scope="module")
def scored(server) -> dict:
    answer = post(server, "/v1/score", scoring(*SLOTS))
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_response_has_the_shape_of_5_2(scored):
    queries = scored["results"][0]["queries"]
    assert [q["id"] for q in queries] == [q["id"] for q in SLOTS]
    assert [list(q) for q in queries] == [
        ["id", "combinations"],  # a scored query has no kind
        ["id", "kind", "combinations"],
        ["id", "kind", "combinations"],
        ["id", "kind", "combinations"],
        ["id", "kind", "generate", "combinations"],
        ["id", "kind", "generate", "combinations"],
    ]
    assert [q.get("kind") for q in queries] == [None, "text", "number", "currency", "text", "text"]
    for q, kind, top_k in zip(queries[1:4], ("text", "number", "currency"), (2, 5, 5), strict=True):
        check_searched(q["combinations"][0], kind, top_k)
    paid = queries[3]["combinations"][0]
    assert math.isclose(paid["p_calibrated"], paid["answers"][0]["p"], abs_tol=1e-6)  # a = 1, b = 0: p_top itself
    assert [len(q["combinations"][0]["answers"]) for q in queries[4:]] == [1, 2]
    assert "choices" not in scored and scored["object"] == "score"
    assert {w["query_id"] for w in scored["warnings"]} <= {"refund"}  # low_option_mass is for scored queries only


def test_usage_counts_the_slots_and_the_generated_tokens(scored):
    usage = scored["usage"]
    assert usage["extraction"] == {
        "slots": 5,  # generated slots included
        "text": 3,
        "number": 1,
        "currency": 1,
        "answers": usage["extraction"]["answers"],
        "decode_tokens": usage["extraction"]["decode_tokens"],
    }
    shown = sum(len(q["combinations"][0]["answers"]) for q in scored["results"][0]["queries"][1:4])
    assert usage["extraction"]["answers"] >= shown and usage["extraction"]["decode_tokens"] > 0
    generation = usage["generation"]
    assert list(generation) == ["slots", "sequences", "max_tokens", "generated_tokens"]
    assert (generation["slots"], generation["sequences"]) == (2, 3)  # sequences: the slots' n summed
    assert generation["max_tokens"] == 12
    assert 0 < generation["generated_tokens"] == usage["completion_tokens"] <= 8 + 2 * 12
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    details = usage["prompt_tokens_details"]
    assert usage["prompt_tokens"] == details["content_tokens"] + details["query_tokens"] + details["floor_tokens"]
    # scored queries only (api spec §5.7: the extraction slots are counted in usage.extraction)
    assert usage["scoring"]["queries"] == 1 and usage["scoring"]["options"] == 2 and usage["scoring"]["prompts"] == 1
    assert usage["scoring"]["floor_prompts"] == 1  # extraction has no floor


def test_timing_has_decode_ms_only_with_extraction(server, scored):
    timing = scored["timing"]
    assert list(timing) == ["wall_ms", "queue_ms", "compile_ms", "score_ms", "gpu_busy_ms", "decode_ms"]
    assert all(isinstance(v, int) and v >= 0 for v in timing.values())
    plain = post(server, "/v1/score", scoring(SLOTS[0])).json()
    assert "decode_ms" not in plain["timing"]
    assert "extraction" not in plain["usage"] and "generation" not in plain["usage"]
    searched = post(server, "/v1/score", scoring(SLOTS[1])).json()
    assert "decode_ms" in searched["timing"] and "generation" not in searched["usage"]


def test_a_seeded_call_gives_the_same_answers_again_and_on_the_chat_route(server, scored):
    again = post(server, "/v1/score", scoring(*SLOTS)).json()
    assert again["results"] == scored["results"]
    chat = post(server, "/v1/chat/completions", scoring(*SLOTS) | {"temperature": 0.2, "stream": False})
    assert chat.status_code == 200, chat.text
    body = chat.json()
    assert body["object"] == "score" and body["choices"] == [] and list(body)[-1] == "choices"
    assert body["results"] == scored["results"]
    assert body["usage"]["generation"] == scored["usage"]["generation"]
    assert "decode_ms" in body["timing"]


def test_trusted_features_and_limits_narrow_extraction(server):
    off = scoring(SLOTS[0], SLOTS[1]) | {"features": {"extraction": False}}
    refused = post(server, "/v1/score", off, token=TRUSTED)
    assert refused.status_code == 400
    assert (refused.json()["error"]["code"], refused.json()["error"]["param"]) == (
        "extraction_disabled",
        "scoring.queries.1.template",
    )
    assert post(server, "/v1/score", off).status_code == 200  # an untrusted caller's features are ignored
    no_generation = scoring(SLOTS[1], SLOTS[4]) | {"features": {"generation": False}}
    error = post(server, "/v1/score", no_generation, token=TRUSTED).json()["error"]
    assert (error["code"], error["param"]) == ("generation_disabled", "scoring.queries.1.generate")
    searched_only = scoring(SLOTS[1]) | {"features": {"generation": False}}
    assert post(server, "/v1/score", searched_only, token=TRUSTED).status_code == 200
    one_slot = scoring(SLOTS[1], SLOTS[2]) | {"limits": {"max_extractions_per_input": 1}}
    error = post(server, "/v1/score", one_slot, token=TRUSTED).json()["error"]
    assert (error["code"], error["param"]) == ("too_many_extractions", "inputs.0")


# ---------------------------------------------------------------------------------------------- the switches


@pytest.fixture(scope="module")
def switched(tmp_path_factory, cache) -> dict:
    """Per switch: the boot, the ``/v1/models`` entry and the answers to a searched and a generated slot."""
    found = {}
    for flag in ("--no-extraction", "--no-generation"):
        process = ServerProcess(tmp_path_factory.mktemp(flag.strip("-")), flag, hf_home=cache)
        try:
            found[flag] = {
                "boot": httpx.get(f"{process.url}/readyz", timeout=10).json()["boot"],
                "entry": httpx.get(f"{process.url}/v1/models", timeout=10).json()["models"][0],
                "searched": httpx.post(f"{process.url}/v1/score", json=scoring(SLOTS[0], SLOTS[1]), timeout=60),
                "generated": httpx.post(f"{process.url}/v1/score", json=scoring(SLOTS[4]), timeout=60),
                "chat": httpx.post(f"{process.url}/v1/chat/completions", json=scoring(SLOTS[2]), timeout=60),
            }
        finally:
            assert process.stop() == 0
    return found


def error_of(answer: httpx.Response) -> tuple[int, str, str]:
    error = answer.json()["error"]
    return answer.status_code, error["code"], error["param"]


def test_no_extraction_refuses_every_slot_and_warms_up_no_decoding(switched):
    found = switched["--no-extraction"]
    assert error_of(found["searched"]) == (400, "extraction_disabled", "scoring.queries.1.template")
    assert error_of(found["generated"]) == (400, "extraction_disabled", "scoring.queries.0.template")
    assert error_of(found["chat"]) == (400, "extraction_disabled", "scoring.queries.0.template")
    assert found["entry"]["capabilities"] == ["score"]
    assert found["entry"]["features"] == {
        "media": ["image", "audio", "video"],
        "extraction": False,
        "generation": False,
    }
    assert found["boot"]["warmup_s"] > 0 and "warmup_extract_s" not in found["boot"]


def test_no_generation_refuses_generated_slots_only(switched):
    found = switched["--no-generation"]
    assert found["searched"].status_code == 200, found["searched"].text
    assert found["chat"].status_code == 200 and found["chat"].json()["choices"] == []
    assert error_of(found["generated"]) == (400, "generation_disabled", "scoring.queries.0.generate")
    assert found["entry"]["capabilities"] == ["score", "extract"]
    assert found["entry"]["features"] == {
        "media": ["image", "audio", "video"],
        "extraction": True,
        "generation": False,
    }
    assert found["boot"]["warmup_extract_s"] > 0  # the searched slots are still warmed up
