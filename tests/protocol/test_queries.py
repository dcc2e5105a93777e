"""The token-free per-query and per-input checks: combinations (§4.7), options (§4.8), query choice (§4.2)."""

from __future__ import annotations

import pytest

from spinf.protocol.queries import check_options, choose_queries, expand_combinations, option_key
from spinf.protocol.request import parse_score_request
from spinf.protocol.templates import parse_template
from spinf.protocol.types import QuerySpec

Q = "scoring.queries.3"


def query(template: str = "{?}", **fields) -> QuerySpec:
    return QuerySpec(path=Q, id="q", template=parse_template(template, Q), **fields)


# Combinations (§4.7)


def test_no_placeholders_and_no_combinations_is_one_empty_combination():
    assert expand_combinations(query("Q:{?}")) == ({},)


def test_a_listed_combination_without_placeholders_is_each_an_empty_map():
    assert expand_combinations(query("Q:{?}", combinations=({}, {}))) == ({}, {})


def test_listed_combinations_keep_their_order_with_names_in_template_order():
    q = query("{b} {a}{?}", combinations=({"a": "1", "b": "2"}, {"b": "3", "a": "4"}))
    combinations = expand_combinations(q)
    assert combinations == ({"b": "2", "a": "1"}, {"b": "3", "a": "4"})
    assert [list(c) for c in combinations] == [["b", "a"], ["b", "a"]]


def test_all_varies_the_first_placeholder_of_the_template_slowest():
    q = query("{b} then {a} then {b}{?}", combinations="all", values={"a": ("a1", "a2", "a3"), "b": ("b1", "b2")})
    assert expand_combinations(q) == (
        {"b": "b1", "a": "a1"},
        {"b": "b1", "a": "a2"},
        {"b": "b1", "a": "a3"},
        {"b": "b2", "a": "a1"},
        {"b": "b2", "a": "a2"},
        {"b": "b2", "a": "a3"},
    )


def test_all_allows_exactly_1000_combinations():
    values = {"a": tuple(str(i) for i in range(10)), "b": tuple(str(i) for i in range(100))}
    assert len(expand_combinations(query("{a}{b}{?}", combinations="all", values=values))) == 1000


def test_values_of_256_characters_are_accepted():
    assert expand_combinations(query("{a}{?}", combinations=({"a": "x" * 256},))) == ({"a": "x" * 256},)


@pytest.mark.parametrize(
    ("template", "fields", "code", "param"),
    [
        ("{a}{?}", {}, "missing_value", f"{Q}.combinations"),
        ("{a}{?}", {"combinations": ()}, "missing_value", f"{Q}.combinations"),
        ("{?}", {"combinations": ()}, "missing_value", f"{Q}.combinations"),
        ("{a}{?}", {"combinations": ({"a": "1"}, {"a": "2", "b": "3"})}, "unknown_placeholder", f"{Q}.combinations.1"),
        ("{a}{b}{?}", {"combinations": ({"a": "1"},)}, "missing_value", f"{Q}.combinations.0"),
        ("{a}{?}", {"combinations": ({"a": "1"}, {"a": "x" * 257})}, "invalid_field", f"{Q}.combinations.1.a"),
        ("{a}{?}", {"combinations": "all"}, "missing_value", f"{Q}.values"),
        ("{?}", {"combinations": "all"}, "missing_value", f"{Q}.values"),
        (
            "{a}{?}",
            {"combinations": "all", "values": {"a": ("1",), "b": ("2",)}},
            "unknown_placeholder",
            f"{Q}.values",
        ),
        ("{a}{b}{?}", {"combinations": "all", "values": {"a": ("1",)}}, "missing_value", f"{Q}.values"),
        ("{a}{b}{?}", {"combinations": "all", "values": {"a": ("1",), "b": ()}}, "missing_value", f"{Q}.values.b"),
        (
            "{a}{b}{?}",
            {"combinations": "all", "values": {"a": tuple("0123456789"), "b": tuple(str(i) for i in range(101))}},
            "too_many_combinations",
            Q,
        ),
    ],
)
def test_combinations_refused(refused, template, fields, code, param):
    refused(lambda: expand_combinations(query(template, **fields)), code, param)


def test_a_long_value_in_all_is_reported_at_the_first_combination_that_holds_it(refused):
    # "a" varies slowest: the long "b" value first appears in combination 1 ({"a": "1", "b": long}).
    q = query("{a}{b}{?}", combinations="all", values={"a": ("1", "2"), "b": ("ok", "x" * 257)})
    error = refused(lambda: expand_combinations(q), "invalid_field", f"{Q}.combinations.1.b")
    assert error.message == "the value of 'b' has 257 characters; at most 256"


# Options (§4.8, token-free part)


@pytest.mark.parametrize(
    ("option", "case_insensitive", "key"),
    [(" Yes ", True, "yes"), (" Yes ", False, " Yes "), ("STRASSE", True, "strasse"), ("Straße", True, "strasse")],
)
def test_option_key(option, case_insensitive, key):
    assert option_key(option, case_insensitive) == key


def test_options_within_limits_pass():
    check_options(query(options=(" yes", " no", "maybe")), case_insensitive=True, max_options=3)
    check_options(query(options=(" yes", "Yes")), case_insensitive=False, max_options=3)


@pytest.mark.parametrize(
    ("options", "case_insensitive", "code", "param"),
    [
        (None, True, "missing_value", f"{Q}.options"),
        ((), True, "too_many_options", f"{Q}.options"),
        (("a", "b", "c", "d"), True, "too_many_options", f"{Q}.options"),
        ((" yes", "", " no"), True, "invalid_field", f"{Q}.options.1"),
        ((" yes", " no", "Yes "), True, "duplicate_option", f"{Q}.options.2"),
        ((" yes", " no", " yes"), False, "duplicate_option", f"{Q}.options.2"),
        ((" ", "\t"), True, "duplicate_option", f"{Q}.options.1"),
    ],
)
def test_options_refused(refused, options, case_insensitive, code, param):
    q = query(options=options)
    refused(lambda: check_options(q, case_insensitive=case_insensitive, max_options=3), code, param)


def test_whitespace_only_options_pass_when_they_do_not_clash():
    check_options(query(options=(" ", "\t")), case_insensitive=False, max_options=3)


# Choosing an input's queries (§4.2)


def request(*inputs: dict, shared: tuple[str, ...] = ("a", "b", "c")):
    return parse_score_request(
        {
            "inputs": [{"id": str(i), "messages": [], **fields} for i, fields in enumerate(inputs)],
            "scoring": {"queries": [{"id": qid, "template": "{?}", "options": ["x"]} for qid in shared]},
        }
    )


def own(*ids: str) -> list[dict]:
    return [{"id": qid, "template": "{*}"} for qid in ids]


def chosen(req, i: int = 0) -> list[tuple[str, str]]:
    return [(q.id, q.path) for q in choose_queries(req, i)]


def test_query_ids_null_chooses_every_shared_query_then_the_own_ones():
    req = request({"queries": own("z")})
    assert chosen(req) == [
        ("a", "scoring.queries.0"),
        ("b", "scoring.queries.1"),
        ("c", "scoring.queries.2"),
        ("z", "inputs.0.queries.0"),
    ]


def test_query_ids_pick_in_listed_order_and_a_repeated_id_appears_twice():
    req = request({"query_ids": ["c", "a", "c"]})
    assert chosen(req) == [("c", "scoring.queries.2"), ("a", "scoring.queries.0"), ("c", "scoring.queries.2")]


def test_an_own_id_equal_to_a_shared_query_not_chosen_is_allowed():
    req = request({"query_ids": ["a"], "queries": own("b")})
    assert chosen(req) == [("a", "scoring.queries.0"), ("b", "inputs.0.queries.0")]


def test_each_input_chooses_on_its_own():
    req = request({"query_ids": []}, {"query_ids": ["b"]}, {"queries": own("x")}, shared=("a", "b"))
    assert [q.id for q in choose_queries(req, 1)] == ["b"]
    assert [q.id for q in choose_queries(req, 2)] == ["a", "b", "x"]


@pytest.mark.parametrize(
    ("fields", "shared", "code", "param"),
    [
        ({"query_ids": ["a", "nope"]}, ("a",), "unknown_query_id", "inputs.1.query_ids.1"),
        ({"queries": own("a")}, ("a",), "duplicate_id", "inputs.1.queries.0.id"),
        ({"query_ids": ["b"], "queries": own("x", "b")}, ("a", "b"), "duplicate_id", "inputs.1.queries.1.id"),
        ({"queries": own("x", "y", "x")}, (), "duplicate_id", "inputs.1.queries.2.id"),
        ({"query_ids": []}, ("a",), "empty_queries", "inputs.1"),
        ({}, (), "empty_queries", "inputs.1"),
    ],
)
def test_choice_refused(refused, fields, shared, code, param):
    req = request({"queries": own("ok")}, fields, shared=shared)
    choose_queries(req, 0)
    refused(lambda: choose_queries(req, 1), code, param)


def test_the_messages_form_reports_input_0(refused):
    req = parse_score_request({"messages": [], "scoring": {"queries": []}})
    refused(lambda: choose_queries(req, 0), "empty_queries", "inputs.0")
