"""Filling a context and wrapping content (packs spec §1.5), against spinf-client's ``parameter_values`` and
``wrap`` as the oracle."""

from __future__ import annotations

import copy

import pytest
from spinf_client import packs as client

from spinf.packs.contexts import ParameterError, context_texts, parameter_values, wrap_messages, wrap_text
from spinf.packs.packfile import parse_pack
from tests.packs.folders import MINIMAL, TONE

BRAND = copy.deepcopy(MINIMAL)
BRAND["parameters"] = {
    "brand": {"label": "Brand"},
    "tone": {"required": False},
    "level": {"required": False, "default": 1.0},
    "loud": {"default": True},
}
BRAND["contexts"] = {
    "support": "To {brand} support ({tone}, {level}, {loud}), {unknown braces} {a b} {}:\n{X}\nEnd of {brand}.",
    "bare": "{X}",
}


def parsed(raw: dict):
    pack = parse_pack(raw).pack
    assert pack is not None
    return pack


GIVEN = [
    {"brand": "Kestrel"},
    {"brand": "Kestrel", "tone": None, "level": 3, "loud": False},
    {"brand": "{tone}", "tone": "calm"},  # substituted in declaration order: a value may hold a later placeholder
    {"brand": 2.5, "level": None},
    {"brand": ""},
]


@pytest.mark.parametrize("given", GIVEN)
@pytest.mark.parametrize("context", [None, "support", "bare"])
def test_wrapping_one_text_equals_spinf_clients(given, context):
    pack = parsed(BRAND)
    assert parameter_values(pack, given) == client.parameter_values(BRAND, given)
    assert wrap_text(pack, "a message", context, given) == client.wrap(BRAND, "a message", context, given)


@pytest.mark.parametrize("raw", [MINIMAL, TONE], ids=["minimal", "tone"])
def test_packs_without_parameters_wrap_like_spinf_client(raw):
    pack = parsed(raw)
    for name, _ in pack.contexts:
        assert wrap_text(pack, "x", name) == client.wrap(raw, "x", name)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({}, "the parameter 'brand' of example/off-topic is required"),
        ({"brand": None}, "the parameter 'brand' of example/off-topic is required"),
        ({"brand": "k", "zz": 1, "aa": 2}, "example/off-topic has no parameter 'aa'"),
    ],
)
def test_parameter_errors(given, message):
    with pytest.raises(ParameterError, match=f"^{message}$"):
        parameter_values(parsed(BRAND), given)
    with pytest.raises(ValueError):
        client.parameter_values(BRAND, given)


def test_the_texts_around_the_content():
    before, after = context_texts(parsed(BRAND), None, {"brand": "K"})
    assert before == "To K support (, 1.0, True), {unknown braces} {a b} {}:\n" and after == "\nEnd of K."


def test_wrapping_messages_puts_the_texts_around_the_whole_conversation():
    one = [{"role": "user", "content": "hi"}]
    assert wrap_messages(one, "B", "A") == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "B"}, {"type": "text", "text": "hi"}, {"type": "text", "text": "A"}],
        }
    ]
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,"}}
    several = [{"role": "user", "content": [image]}, {"role": "assistant", "content": "ok"}]
    assert wrap_messages(several, "B", "") == [
        {"role": "user", "content": [{"type": "text", "text": "B"}, image]},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
    ]
    assert several[1]["content"] == "ok"  # not changed in place
