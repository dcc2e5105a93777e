"""spinf-client's pack and moderation helpers (packs spec §7) against a real server process over a real socket.

The server runs the tiny model with two pack sources: the official slot pointed at ``fixtures/official-packs`` (a
local stand-in for the official repository holding ``spinf/moderation`` for the tiny model, which is the pack
``SpinfClient.moderate()`` names) and ``--packs fixtures/packs`` (``tiny/moderation``). Nothing is mocked: the client
is spinf-client 0.3.1 unchanged, the numbers come from the engine, the decisions from our evaluator, and they are
checked against the client's own evaluator (``spinf_client.packs.evaluate``) on the same answers.
"""

from __future__ import annotations

import math

import pytest
from spinf_client import SpinfClient, SpinfError, pack, pack_result, packs, query

from contrib.loadtest.harness import ROOT, ServerProcess, tiny_cache

OFFICIAL = ROOT / "fixtures" / "official-packs"
LOCAL = ROOT / "fixtures" / "packs"
TEXTS = [
    "You are a wonderful person and I hope your day goes well.",
    "I will find where you live and hurt you, and nobody will stop me.",
    "Buy cheap pills now!!! Click this link for a free prize, limited offer.",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("packs-client")
    env = {"SPINF_PACKS_OFFICIAL": str(OFFICIAL)}
    process = ServerProcess(folder, "--packs", str(LOCAL), env=env, hf_home=tiny_cache(folder / "hf"))
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(server):
    return SpinfClient(base_url=server.url, model="spinf/tiny-gemma4")


def close(a, b) -> bool:
    return math.isclose(a, b, rel_tol=0, abs_tol=1e-6)


def test_list_packs_and_get_pack_name_both_sources(client):
    listed = client.list_packs()
    ids = [entry["id"] for entry in listed["packs"]]
    assert ids == ["spinf/moderation", "tiny/moderation"]  # the official source first
    assert len(listed["sources"]) == 2
    got = client.get_pack("spinf/moderation")
    assert (got["pack"], got["version"], got["model"]) == ("spinf/moderation", "0.1.0", "spinf/tiny-gemma4")
    assert client.get_pack("tiny/moderation", "0.1.0")["pack"] == "tiny/moderation"
    with pytest.raises(SpinfError) as caught:
        client.get_pack("tiny/nothing")
    assert caught.value.status == 404 and caught.value.code == "unknown_pack"


def test_moderate_one_text_and_many_on_the_hosted_path(client):
    one = client.moderate(TEXTS[1])
    assert (one.pack, one.version, one.context, one.mode) == ("spinf/moderation", "0.1.0", "ai", "micro_layer")
    pack_file = client.get_pack("spinf/moderation")
    assert list(one.categories) == list(pack_file["categories"])
    assert isinstance(one.unsafe, bool) and one.raw is None and one.queries == []
    assert all(0.0 <= c.score <= 1.0 for c in one.categories.values())
    many = client.moderate(TEXTS, ids=["a", "b", "c"], context="forum", mode="max", threshold=0.3)
    assert [m.id for m in many] == ["a", "b", "c"] and [m.text for m in many] == TEXTS
    assert all(m.mode == "max" and m.context == "forum" for m in many)
    assert all(m.decision["threshold"] == 0.3 for m in many)
    for m in many:  # flagged = the categories at or above their threshold, highest first (the client's reading)
        assert m.unsafe == (m.decision["score"] >= 0.3 or bool(m.critical))


def test_the_servers_decision_is_the_clients_on_the_same_answers(client):
    """include_queries keeps the raw answers: the client re-decides them locally and gets the server's decision
    (rounded to 6 places), in every mode and with overrides, as packs spec §11.3 requires."""
    pack_file = client.get_pack("spinf/moderation")
    calls = [
        {},
        {"mode": "max", "threshold": 0.25},
        {"mode": "per_category", "thresholds": {"violence": 0.1, "spam": None}},
        {"mode": "micro_layer", "threshold": -1.0, "critical": []},
    ]
    for kwargs in calls:
        for hosted in client.moderate(TEXTS, include_queries=True, **kwargs):
            assert hosted.raw is not None and len(hosted.raw) == len(pack_file["scoring"]["queries"])
            local = packs.evaluate(
                pack_file,
                packs.answers_from_result(hosted.raw, pack_file),
                kwargs.get("mode"),
                kwargs.get("threshold"),
                kwargs.get("thresholds"),
                kwargs.get("critical"),
            )
            assert list(hosted.decision) == list(local["decision"]), kwargs
            for key, value in local["decision"].items():
                if isinstance(value, float):
                    assert close(hosted.decision[key], value), (kwargs, key)
                else:
                    assert hosted.decision[key] == value, (kwargs, key)
            for name, category in local["categories"].items():
                assert close(hosted.categories[name].score, category["score"])
            again = hosted.redecide(pack_file, **kwargs)  # Moderation.redecide: the same decision, nothing scored
            assert (again.unsafe, again.flagged, again.mode) == (hosted.unsafe, hosted.flagged, hosted.mode)


def test_a_pack_file_sent_as_ordinary_queries_scores_like_the_hosted_pack(client):
    """moderate(pack_file=...) sends the file's queries as ordinary grouped queries and decides locally: the same
    numbers as the server's own pack (per-question batch invariance, api spec D6)."""
    pack_file = client.get_pack("spinf/moderation")
    hosted = client.moderate(TEXTS, include_queries=True)
    local = client.moderate(TEXTS, pack_file=pack_file, include_queries=True)
    for h, lo in zip(hosted, local, strict=True):
        assert h.unsafe == lo.unsafe and h.flagged == lo.flagged
        for name in h.categories:
            assert close(h.categories[name].score, lo.categories[name].score), name
        assert close(h.decision["score"], lo.decision["score"])


def test_score_with_pack_and_own_queries_and_pack_result(client):
    own = query("q", "Is this text about the weather? {?}", [" yes", " no"])
    ref = pack("tiny/moderation", context="forum", mode="per_category", include_queries=False)
    response = client.score(
        inputs=[{"id": "x", "content": [{"type": "text", "text": TEXTS[2]}]}], queries=[own], packs=[ref]
    )
    result = response["results"][0]
    assert [q["id"] for q in result["queries"]] == ["q"]  # the pack's own queries are hidden
    entry = pack_result(response, "tiny/moderation")
    assert (entry["id"], entry["version"], entry["context"]) == ("tiny/moderation", "0.1.0", "forum")
    assert entry["decision"]["mode"] == "per_category" and "score" not in entry["decision"]
    assert response["usage"]["packs"]["count"] == 1 and response["usage"]["packs"]["query_tokens"] > 0
    with pytest.raises(KeyError):
        pack_result(response, "spinf/moderation")


def test_pack_errors_reach_the_client_with_their_codes(client):
    content = [{"type": "text", "text": "hello"}]
    cases = [
        (pack("tiny/nothing"), 400, "unknown_pack"),
        (pack("tiny/moderation", "9.9.9"), 400, "unknown_pack_version"),
    ]
    for ref, status, code in cases:
        with pytest.raises(SpinfError) as caught:
            client.score(inputs=[{"id": "x", "content": content}], queries=[], packs=[ref])
        assert (caught.value.status, caught.value.code) == (status, code)
