"""Answers of searched and generated slots (engine spec A.12.5, A.13; api spec §5.4, §5.5): every bullet, and the
fields as spinf-client 0.3.1 reads them."""

import math
import random

import pytest
import spinf_client
from spinf_client import calibration as client_calibration

from spinf.engine.extraction.answers import (
    Generated,
    currency_of,
    finish_text,
    generated_combination,
    parse_value,
    searched_combination,
    stop_characters,
    text_key,
)


def lp(p):
    return math.log(p)


def test_coca_cola_spellings_merge():
    keys = {text_key(t) for t in ["Coca-Cola", "Coca Cola", "CocaCola", "COCA COLA", "coca–cola", "“Coca‑Cola”"]}
    assert keys == {"cocacola"}


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("The Beatles", "beatles"),
        ("an apple", "apple"),
        ("A", ""),
        ("theater", "theater"),  # an article only as a whole word
        ("Paris, France.", "parisfrance"),
        ("‘Paris’ — «France»", "parisfrance"),
        ("C++ & C#", "cc"),  # ASCII punctuation, symbols included, like string.punctuation
        ("Über Straße", "überstraße"),
        ("rock'n'roll", "rocknroll"),
        ("the-end of a_thing", "endofthing"),  # punctuation becomes a space first, then articles go
    ],
)
def test_text_key(text, key):
    assert text_key(text) == key


def test_text_answers_merge_sum_and_show_the_most_probable_spelling():
    found = [(" Coca-Cola", lp(0.15)), ("Coca Cola", lp(0.1)), ("Coca Cola ", lp(0.1)), ("COCA COLA", lp(0.05)),
             ("Pepsi", lp(0.3)), ("the Pepsi", lp(0.02)), ("Fanta", lp(0.01))]  # fmt: skip
    result = searched_combination("text", {"brand": "x"}, found)
    assert result == {
        "values": {"brand": "x"},
        "answers": [{"text": "Coca Cola", "p": 0.4}, {"text": "Pepsi", "p": 0.32}, {"text": "Fanta", "p": 0.01}],
        "mass": 0.73,
    }
    assert list(result) == ["values", "answers", "mass"]  # no p_negative for text, no p_calibrated without calibration


def test_order_ties_and_the_top_k_cut():
    found = [("b", lp(0.2)), ("a", lp(0.2)), ("c", lp(0.3)), ("d", lp(0.1)), ("e", lp(0.05))]
    result = searched_combination("text", {}, found, top_k=3)
    assert [a["text"] for a in result["answers"]] == ["c", "a", "b"]  # equal p: code-point order of the text
    assert result["mass"] == 0.85  # before the cut
    tied = searched_combination("text", {}, [("Coca-Cola", lp(0.1)), ("Coca Cola", lp(0.1))])
    assert tied["answers"] == [{"text": "Coca Cola", "p": 0.2}]  # equal spellings: " " before "-"


def test_the_result_does_not_depend_on_the_recording_order():
    rng = random.Random(0)
    found = [(rng.choice(["5", "5.0", " 5", "-5", "$5", "5,000", "5 thousand"]), -rng.random() * 5) for _ in range(40)]
    expected = searched_combination("currency", {}, found, calibration=(0.7, 0.3))
    for _ in range(10):
        rng.shuffle(found)
        assert searched_combination("currency", {}, found, calibration=(0.7, 0.3)) == expected


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("5", 5.0),
        ("3.", 3.0),
        ("3.5 million", 3_500_000.0),
        ("(1,496.5 million)", -1_496_500_000.0),
        ("12.5%", 12.5),
        ("(12%)", -12.0),
        ("−7", -7.0),
        ("-$5", -5.0),
        ("$-5", -5.0),  # negative after a currency symbol too
        ("$ (5)", -5.0),
        ("€ 12", 12.0),
        ("1,2,3", 123.0),
        ("2 billion", 2e9),
        ("7 thousand", 7000.0),
        ("7thousand", 7.0),  # the scale word with its space
        ("about -3", 3.0),  # the sign only at the start
        ("3 - 4", 3.0),  # the first match
        ("abc", None),
        ("", None),
        ("-", None),
    ],
)
def test_parse_value(text, value):
    assert parse_value(text) == value


def test_currency_of():
    assert [currency_of(t) for t in ["$5", "-€5", "(£ 5)", "¥1", "5"]] == ["$", "€", "£", "¥", None]


def test_the_api_spec_number_example():
    found = [("3.5 million", lp(0.5)), ("-3.5 million", lp(0.25)), ("12", lp(0.1))]
    result = searched_combination("number", {}, found, top_k=2, calibration=(1.0, math.log(0.84 / 0.16)))
    assert result == {
        "values": {},
        "answers": [
            {"text": "3.5 million", "p": 0.5, "value": 3500000.0},
            {"text": "-3.5 million", "p": 0.25, "value": -3500000.0},
        ],  # fmt: skip
        "mass": 0.85,
        "p_negative": 0.333333,
        "p_calibrated": 0.84,
    }
    assert list(result) == ["values", "answers", "mass", "p_negative", "p_calibrated"]


def test_numbers_merge_by_value_and_currency_only_for_currency_slots():
    found = [("3,500,000", lp(0.2)), ("3.5 million", lp(0.3)), (" $5", lp(0.1)), ("$ 5", lp(0.1)), ("€5", lp(0.15)),
             ("5.0", lp(0.05))]  # fmt: skip
    number = searched_combination("number", {}, found)
    assert number["answers"] == [
        {"text": "3.5 million", "p": 0.5, "value": 3500000.0},
        {"text": "€5", "p": 0.4, "value": 5.0},
    ]
    currency = searched_combination("currency", {}, found)
    assert currency["answers"] == [
        {"text": "3.5 million", "p": 0.5, "value": 3500000.0, "currency": None},
        {"text": "$ 5", "p": 0.2, "value": 5.0, "currency": "$"},
        {"text": "€5", "p": 0.15, "value": 5.0, "currency": "€"},
        {"text": "5.0", "p": 0.05, "value": 5.0, "currency": None},
    ]
    assert number["mass"] == currency["mass"] == 0.9


def test_values_merge_at_nine_decimals():
    found = [("0.3333333331", lp(0.2)), ("0.3333333334", lp(0.1)), ("0.333333334", lp(0.05))]
    answers = searched_combination("number", {}, found)["answers"]
    assert [(a["text"], a["p"]) for a in answers] == [("0.3333333331", 0.3), ("0.333333334", 0.05)]


def test_unparsable_answers_are_dropped_before_mass():
    result = searched_combination("number", {}, [("abc", lp(0.3)), ("5", lp(0.2))])
    assert result == {"values": {}, "answers": [{"text": "5", "p": 0.2, "value": 5.0}], "mass": 0.2, "p_negative": 0.0}
    empty = searched_combination("currency", {}, [("n/a", lp(0.5))], calibration=(1.0, 0.0))
    assert empty == {"values": {}, "answers": [], "mass": 0}


def test_nothing_found():
    for kind in ("text", "number", "currency"):
        result = searched_combination(kind, {"x": "y"}, [], calibration=(2.0, 1.0))
        assert result == {"values": {"x": "y"}, "answers": [], "mass": 0}
        assert type(result["mass"]) is int  # the reference writes 0


def test_p_negative_among_answers_of_the_top_absolute_value():
    found = [("1000000000000", lp(0.4)), ("-1000000000000.5", lp(0.1)), ("(1000000001000)", lp(0.1)),
             ("-1000000002000", lp(0.2)), ("5", lp(0.15))]  # fmt: skip
    result = searched_combination("number", {}, found, top_k=1)
    assert result["p_negative"] == round(0.2 / 0.6, 6)  # within 1e-9 of |top|: the first three; the cut is after
    assert searched_combination("number", {}, [("-5", lp(0.3)), ("5", lp(0.2))])["p_negative"] == 0.6
    assert searched_combination("number", {}, [("5", lp(0.3)), ("-5.0", lp(0.2))])["p_negative"] == 0.4
    assert searched_combination("number", {}, [("0", lp(0.3)), ("-0", lp(0.2))])["p_negative"] == 0.0  # -0 is 0
    assert searched_combination("number", {}, [("5", -math.inf)])["p_negative"] is None  # a total of 0


@pytest.mark.parametrize(
    ("p", "a", "b"), [(0.5, 1.0, 0.0), (0.3, 0.76, 1.42), (1.0, 0.5, 0.0), (1e-12, 1.0, 0.0), (0.2, 1000.0, -3.0)]
)
def test_p_calibrated_equals_the_clients_formula(p, a, b):
    result = searched_combination("text", {}, [("x", math.log(p)), ("y", math.log(p / 4))], calibration=(a, b))
    assert result["p_calibrated"] == round(client_calibration.apply(p, a, b), 6)
    clamped = min(max(p, 1e-9), 1 - 1e-9)
    z = a * math.log(clamped / (1 - clamped)) + b
    assert result["p_calibrated"] == round(0.5 * (1 + math.tanh(z / 2)), 6)


def test_p_calibrated_never_overflows():
    assert searched_combination("text", {}, [("x", lp(0.9))], calibration=(-1000.0, 0.0))["p_calibrated"] == 0.0
    assert searched_combination("text", {}, [("x", lp(1e-20))], calibration=(1000.0, 0.0))["p_calibrated"] == 0.0


def test_rounding_is_pythons_round_to_six_decimals():
    rng = random.Random(1)
    for _ in range(200):
        p = rng.random() * 0.5
        result = searched_combination("number", {}, [("7", math.log(p)), ("-7", math.log(p / 3))])
        assert result["answers"][0]["p"] == round(p, 6)
        assert result["mass"] == round(math.fsum([p, p / 3]), 6)
        assert result["p_negative"] == round((p / 3) / math.fsum([p, p / 3]), 6)


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match=r"^unknown slot kind 'date'$"):
        searched_combination("date", {}, [])


def test_spinf_client_reads_the_fields():
    combination = searched_combination("currency", {"who": "acme"}, [("$1.5 million", lp(0.6)), ("-$1.5 million",
                                       lp(0.1))], calibration=(1.0, 0.0))  # fmt: skip
    response = {"results": [{"queries": [{"id": "amount", "kind": "currency", "combinations": [combination]}]}]}
    read = spinf_client.answers(response, "amount")
    assert read["answers"][0] == {"text": "$1.5 million", "p": 0.6, "value": 1500000.0, "currency": "$"}
    assert read["mass"] == 0.7 and read["p_negative"] == round(0.1 / 0.7, 6) and read["p_calibrated"] == 0.6


def test_stop_characters():
    assert stop_characters('"') == '"”'
    assert stop_characters("'s") == "'’" and stop_characters("’") == "’'" and stop_characters("”") == '”"'
    assert stop_characters(" said") == " " and stop_characters("") == ""


@pytest.mark.parametrize(
    ("text", "last", "stop", "finished"),
    [
        ("  Paris  ", "ris  ", '"', "Paris"),
        ('Paris".', 's".', '"', "Paris"),  # the quote ended inside the last token: cut there
        ("Paris”.", "s”.", '"', "Paris"),  # its typographic twin too
        ('Paris" ', " ", '"', "Paris"),  # a trailing copy from an earlier token
        ('Paris""', '""', '"', "Paris"),
        ('say "hi" now', " now", '"', 'say "hi" now'),  # a quote before the last token stays
        ("it’s here", " here", "'", "it’s here"),
        (' "x" ', ' "x" ', "", '"x"'),  # no stop text: only trimmed
        ("Canada", "Canada", "and", "Canada"),  # not a quote: nothing is cut
        ("ends with a", " a", " a", "ends with a"),
        ('Zürich"', "\ufffd", '"', "Zürich"),  # the last token does not decode alone to the text's end: no cut
        ("", "", '"', ""),
        ("Paris «here» x", " x", "»", "Paris «here» x"),
        ("Paris «here", "re", "»", "Paris «here"),
        ("Paris «here»!", "»!", "»", "Paris «here"),  # a Unicode final quote
    ],
)
def test_finish_text(text, last, stop, finished):
    assert finish_text(text, last, stop) == finished


def test_generated_combination():
    sequences = [Generated(' Paris".', 's".', "stop"), Generated(" a long", " long", "length")]
    result = generated_combination({"city": "x"}, sequences, '"')
    assert result == {
        "values": {"city": "x"},
        "answers": [{"text": "Paris", "finish": "stop"}, {"text": "a long", "finish": "length"}],
    }
    with pytest.raises(ValueError) as refused:
        Generated("x", "x", "eos")
    assert refused.value.args[0] == "'finish' must be in ('stop', 'length') (got 'eos')"
