"""Packs in a scored call on the tiny engine (packs spec §5.2–§5.4, §11.3; ``api.md`` §5.2, §5.6, §5.7, §5.9): the
merged order of queries, hidden pack queries and their warnings, ``usage.packs``, the messages form, parameters, the
case rule, the entries against spinf-client's evaluator, and the D6 property (a pack's numbers do not depend on the
rest of the call, nor on whether the server or spinf-client's ``pack_file`` path asked the questions)."""

from __future__ import annotations

import math

import pytest
from spinf_client import packs as client

from tests.packs import call_packs
from tests.packs.test_calls import MOD, TEXT, body, own

MOD_IDS = ["harmful", "topic", "attacks", "spam"]
OTHER = "Send me the money by Friday or else."


@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    return call_packs.catalog(tmp_path_factory.mktemp("call-packs"))


def raw_pack(catalog, pack_id: str) -> dict:
    return catalog.find(pack_id).loaded.pack.raw


def text_input(input_id: str, text: str, **fields: object) -> dict:
    return {"id": input_id, "messages": [{"role": "user", "content": text}], **fields}


def ids(result: dict) -> list[str]:
    return [query["id"] for query in result["queries"]]


def test_merged_order_own_then_packs_then_per_input(tiny_engine, catalog):
    inputs = [
        text_input("a", TEXT, queries=[own("mine")]),
        text_input("b", TEXT, query_ids=["o2"]),
        text_input("c", TEXT, query_ids=["spam", "o1"]),
    ]
    ref = {"id": MOD, "include_queries": True}
    response = tiny_engine.score(body(ref, queries=[own("o1"), own("o2")], inputs=inputs), packs=catalog)
    a, b, c = response["results"]
    assert ids(a) == ["o1", "o2", *MOD_IDS, "mine"]
    assert ids(b) == ["o2", *MOD_IDS]  # an explicit query_ids gets the pack's ids appended
    assert ids(c) == ["spam", "o1", "harmful", "topic", "attacks"]  # without duplicates
    assert list(a) == ["input_id", "queries", "packs"]


def test_hidden_pack_queries_and_their_warnings_are_removed(tiny_engine, catalog):
    shown = tiny_engine.score(body({"id": MOD, "include_queries": True}, queries=[own()]), packs=catalog)
    hidden = tiny_engine.score(body({"id": MOD}, queries=[own()]), packs=catalog)
    shown_warned = {w["query_id"] for w in shown["warnings"]}
    assert shown_warned & set(MOD_IDS)  # the tiny model's options hold little mass: pack queries are warned about
    assert ids(hidden["results"][0]) == ["own"]
    assert {w["query_id"] for w in hidden["warnings"]} == shown_warned - set(MOD_IDS)
    assert hidden["results"][0]["packs"] == shown["results"][0]["packs"]
    assert hidden["results"][0]["queries"][0] == shown["results"][0]["queries"][0]
    assert hidden["usage"] == shown["usage"]


def test_usage_packs_is_the_pack_queries_share(tiny_engine, catalog):
    inputs = [text_input("a", TEXT), text_input("b", OTHER, query_ids=[])]
    refs = ({"id": MOD}, {"id": "tiny/support"})
    with_packs = tiny_engine.score(body(*refs, queries=[own()], inputs=inputs), packs=catalog)["usage"]
    # the same questions as the caller's own: the pack queries in their groups, the inputs wrapped
    wrapped = [
        text_input(i["id"], call_packs.AI_CONTEXT.replace("{X}", i["messages"][0]["content"]), **extra)
        for i, extra in zip(inputs, ({}, {"query_ids": []}), strict=True)
    ]
    queries = [own()]
    for pack_id in (MOD, "tiny/support"):
        queries += client.request_scoring(raw_pack(catalog, pack_id))["queries"]
    wrapped[1]["query_ids"] = [q["id"] for q in queries[1:]]
    plain = body(queries=queries, inputs=wrapped, case_insensitive=False)
    del plain["scoring"]["packs"]
    without = tiny_engine.score(plain)["usage"]
    own_share = tiny_engine.score({"inputs": wrapped[:1], "scoring": {"queries": [own()]}})["usage"]["scoring"]
    pack_share = without["scoring"]["query_tokens"] - own_share["query_tokens"]
    assert with_packs.pop("packs") == {"count": 2, "query_tokens": pack_share}
    assert with_packs == without
    assert list(tiny_engine.score(body(*refs), packs=catalog)["usage"])[-3:] == [
        "packs",
        "processed_tokens",
        "billed_tokens",
    ]


def test_the_messages_form_scores_as_one_input(tiny_engine, catalog):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": TEXT}]},
    ]
    ref = {"id": MOD, "include_queries": True}
    by_messages = tiny_engine.score({"messages": messages, "scoring": {"packs": [ref]}}, packs=catalog)
    by_inputs = tiny_engine.score(body(ref, inputs=[{"id": "0", "messages": messages}]), packs=catalog)
    assert by_messages["results"] == by_inputs["results"]
    # several messages: the context's text goes before the first one's content
    before = call_packs.AI_CONTEXT.split("{X}")[0]
    flat = [{"content": before + "Be brief."}, {"content": TEXT}]
    plain = {"inputs": [{"id": "0", "messages": flat}], "scoring": pack_file_scoring(raw_pack(catalog, MOD))}
    assert numbers(tiny_engine.score(plain)["results"][0]) == numbers(by_messages["results"][0])


def pack_file_scoring(pack: dict) -> dict:
    """spinf-client's ``moderate(pack_file=…)`` queries: the pack's own, in its group, floors off (packs spec §7)."""
    scoring = client.request_scoring(pack)
    scoring["queries"] = [{**query, "empty_floor": False} for query in scoring["queries"]]
    return scoring


def numbers(result: dict) -> list:
    """A result's log-probs and ps, without the floors."""
    return [
        (q["id"], c["values"], [(o["text"], o["logprob"], o["p"]) for o in c["options"]], c["residual"])
        for q in result["queries"]
        for c in q["combinations"]
    ]


def client_entry(pack: dict, result: dict, context: str, decision: dict) -> dict:
    """What the server's entry must be: spinf-client's evaluation, rounded like ``round(x, 6)``, id added."""
    got = client.evaluate(pack, client.answers_from_result(result, pack), **decision)

    def rounded(value):
        return round(value, 6) if isinstance(value, float) else value

    categories = {c: {k: rounded(v) for k, v in values.items()} for c, values in got["categories"].items()}
    out = {k: rounded(v) for k, v in got["decision"].items()}
    return {
        "id": pack["pack"],
        "version": pack["version"],
        "context": context,
        "categories": categories,
        "decision": out,
    }


def assert_same_entry(server: dict, expected: dict) -> None:
    """Numbers within 1e-6, everything else (keys, key order, lists, flags) equal; a ``warning`` in both or neither."""
    assert list(server) == list(expected)
    for key in ("id", "version", "context"):
        assert server[key] == expected[key]
    assert list(server["categories"]) == list(expected["categories"])
    for category, values in expected["categories"].items():
        assert list(server["categories"][category]) == list(values)
        for name, value in values.items():
            assert _close(server["categories"][category][name], value), (category, name)
    assert list(server["decision"]) == list(expected["decision"])
    for name, value in expected["decision"].items():
        if name != "warning":
            assert _close(server["decision"][name], value), name


def _close(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=0, abs_tol=1e-6)
    return a == b and type(a) is type(b)


DECISIONS = [
    {},
    {"mode": "per_category"},
    {"mode": "max"},
    {"mode": "max", "threshold": 0.001},
    {"mode": "micro_layer"},
    {"mode": "micro_layer", "threshold": -30.0},
    {"thresholds": {"general": 0.0, "violence": None, "harassment": 0.3}},
    {"mode": "per_category", "thresholds": {"harassment": 0.0, "spam": 0.2}, "critical": ["spam", "spam"]},
    {"critical": []},
    {"critical": ["harassment", "general"], "thresholds": {"harassment": 0.01}},
]
TONE_DECISIONS = [
    {},
    {"mode": "max"},
    {"mode": "max", "threshold": 0.0},
    {"mode": "per_category", "thresholds": {"rudeness": 0.0, "targeted": None}},
    {"mode": "micro_layer", "threshold": -100.0, "critical": []},
]


def cases():
    for decision in DECISIONS:
        yield MOD, "forum", decision
    for decision in DECISIONS[:6]:
        yield "tiny/unlocked", "ai", decision  # a broken lock: micro_layer falls back to max, with a warning
    for decision in TONE_DECISIONS:
        yield "tiny/tone", "review", decision


@pytest.mark.parametrize(("pack_id", "context", "decision"), list(cases()))
def test_entries_are_spinf_clients_rounded(tiny_engine, catalog, pack_id, context, decision):
    ref = {"id": pack_id, "context": context, "include_queries": True, "decision": decision}
    inputs = [text_input("a", TEXT), text_input("b", OTHER)]
    response = tiny_engine.score(body(ref, inputs=inputs), packs=catalog)
    pack = raw_pack(catalog, pack_id)
    for result in response["results"]:
        [entry] = result["packs"]
        critical = decision.get("critical")  # the server drops duplicates, keeping the order (api §4.10)
        critical = None if critical is None else list(dict.fromkeys(critical))
        expected = client_entry(pack, result, context, {**decision, "critical": critical})
        assert_same_entry(entry, expected)
        asked = decision.get("mode", pack["decision"]["mode"])
        assert ("warning" in entry["decision"]) == (pack_id == "tiny/unlocked" and asked == "micro_layer")


def test_a_threshold_stored_as_an_integer_is_returned_as_one(tiny_engine, catalog):
    entry = tiny_engine.score(body({"id": MOD, "decision": {"mode": "max"}}), packs=catalog)["results"][0]["packs"][0]
    assert entry["decision"]["threshold"] == 0.5  # stored as 0.5
    tone = raw_pack(catalog, "tiny/tone")
    stored = tone["decision"]["max"]["threshold"]
    entry = tiny_engine.score(body({"id": "tiny/tone", "decision": {"mode": "max"}}), packs=catalog)
    assert type(entry["results"][0]["packs"][0]["decision"]["threshold"]) is type(stored)


def test_d6_a_packs_numbers_do_not_depend_on_the_rest_of_the_call(tiny_engine, catalog):
    ref = {"id": MOD, "include_queries": True}
    alone = tiny_engine.score(body(ref), packs=catalog)["results"][0]
    inputs = [text_input("z", OTHER), text_input("a", TEXT, queries=[own("mine")]), text_input("y", TEXT + "!")]
    crowded = body({"id": "tiny/support", "include_queries": True}, ref, queries=[own("o1"), own("o2")], inputs=inputs)
    among = tiny_engine.score(crowded, packs=catalog)["results"][1]
    assert among["packs"][1] == alone["packs"][0]
    pick = [q for q in among["queries"] if q["id"] in MOD_IDS]
    assert pick == alone["queries"]


@pytest.mark.parametrize(("pack_id", "context"), [(MOD, "forum"), ("tiny/tone", "review")])
def test_the_spinf_client_pack_file_path_gives_the_same_numbers(tiny_engine, catalog, pack_id, context):
    """Both answer forms (log-probs, ps), and a context with text after the content."""
    pack = raw_pack(catalog, pack_id)
    ref = {"id": pack_id, "context": context, "include_queries": True}
    served = tiny_engine.score(body(ref, inputs=[text_input("a", OTHER)]), packs=catalog)["results"][0]
    scoring = pack_file_scoring(pack)
    scoring["queries"] = scoring["queries"] + [own()]  # the caller's own may share the call (they come after)
    local = {"inputs": [{"id": "a", "messages": [{"content": client.wrap(pack, OTHER, context)}]}], "scoring": scoring}
    result = tiny_engine.score(local)["results"][0]
    assert numbers({"queries": result["queries"][:-1]}) == numbers(served)
    assert served["packs"][0] == client_entry(pack, result, context, {})


def test_parameters_fill_the_context(tiny_engine, catalog):
    pack = raw_pack(catalog, "tiny/brand")
    given = [{"brand": "Kestrel"}, {"brand": "Kestrel", "tier": 2}, {"brand": True, "tier": None}]
    inputs = [text_input(str(k), TEXT, parameters=params) for k, params in enumerate(given)]
    served = tiny_engine.score(body({"id": "tiny/brand"}, inputs=inputs), packs=catalog)["results"]
    for params, result in zip(given, served, strict=True):
        content = client.wrap(pack, TEXT, "support", params)
        local = {"inputs": [{"id": "x", "messages": [{"content": content}]}], "scoring": pack_file_scoring(pack)}
        expected = client_entry(pack, tiny_engine.score(local)["results"][0], "support", {})
        assert result["packs"][0] == expected
    assert served[0]["packs"] != served[2]["packs"]
    # a context without the placeholder still needs the required parameter (packs spec §1.5 fills every one)
    plain = body({"id": "tiny/brand", "context": "plain"}, inputs=[text_input("a", TEXT, parameters={"brand": 1})])
    assert tiny_engine.score(plain, packs=catalog)["results"][0]["packs"][0]["context"] == "plain"


def test_the_packs_case_rule_applies_to_the_callers_queries(tiny_engine, catalog):
    query = own(options=[" Yes", " no"])
    with_pack = tiny_engine.score(body({"id": MOD}, queries=[query]), packs=catalog)["results"][0]["queries"]
    wrapped = [text_input("a", call_packs.AI_CONTEXT.replace("{X}", TEXT))]
    for rule, same in ((False, True), (True, False)):
        plain = body(queries=[query], inputs=wrapped, case_insensitive=rule)
        del plain["scoring"]["packs"]
        alone = tiny_engine.score(plain)["results"][0]["queries"]
        assert (numbers({"queries": alone}) == numbers({"queries": with_pack})) is same
