"""Random and broken bodies against the real server: never a 5xx, every refusal is the error envelope (api spec §2.5).

The tiny-model server runs in this process on 127.0.0.1 under ``trio.run`` in the test's thread (the drain controller
listens for signals, which only the main thread may do); Hypothesis drives it from a worker thread through a plain
HTTP client. Bodies are valid requests built from the spec's keys (so many reach the tokenizer and the model), then
mutated: a value swapped for any JSON, a key removed or added, a huge number; or raw bytes: NaN and infinities,
non-UTF-8 text, other UTF encodings, lone surrogates, deep nesting.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spinf.server.openapi import ERROR_CODES
from spinf.server.supervisor import serve
from tests.server.fakes import models_entry, options

MAX_BODY_BYTES = 65536
TYPE_BY_STATUS = {400: "invalid_request", 401: "authentication_error", 404: "not_found", 429: "rate_limited"}
TYPE_BY_STATUS |= {413: "invalid_request", 503: "unavailable"}
# Numbers past a float, past 4,300 digits (Python's int parsing limit), and at the edges of the spec's ranges.
HUGE = ["1" + "0" * 5000, "-1e400", "1e308", str(2**64), str(2**31), "123456789012345678901234567890.5", "-0.0"]
ACCESS, TRUSTED = {"Authorization": "Bearer tok"}, {"Authorization": "bearer  boss"}
CALLERS = [ACCESS, ACCESS, ACCESS, TRUSTED, TRUSTED, TRUSTED, {}, {"Authorization": "Basic tok"}]

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([2**31, 2**63, -(2**63) - 1, 10**30, 10**300, 0, -1, 1.5, 1e308, -1e-308])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=12,
)


def rarely(good: st.SearchStrategy, bad: st.SearchStrategy) -> st.SearchStrategy:
    """``good`` about four times in five, else ``bad``."""
    return st.integers(0, 4).flatmap(lambda k: bad if k == 4 else good)


# Text that stresses the tokenizer, casing and the boundary rule (dotless i, sharp s, a combining accent, NUL).
tricky = st.sampled_from(["ı", "I", "İ", "ß", "SS", "e\u0301", "\x00", "🙂", "{", "}", "{{", "\n", " ", "  ", "日本"])
texts = st.lists(tricky | st.text(max_size=6), max_size=4).map("".join)
# Templates with their placeholder names; the wild ones are mostly template errors or extraction slots.
TEMPLATES = {
    "\n\nRefund? Answer:{?}": (),
    "{?}": (),
    "\n\nDoes {who} want {what}? Answer:{?}": ("who", "what"),
    "Q {x1}:{?}": ("x1",),
    "{a}{b}{c}{d}{e} is{?}": ("a", "b", "c", "d", "e"),
    "The tone is{?}": (),
}
wild_templates = st.builds(lambda a, slot: a + slot, texts, st.sampled_from(["{?}", "{*}", "{n}", "{$}", "{?} x", ""]))
option_lists = st.lists(
    st.sampled_from([" yes", " no", " maybe so", " Yes", " ı", " I", "ß", " SS", " e\u0301", " 🙂", " ", "sue"])
    | texts,
    min_size=1,
    max_size=4,
)
values = texts | st.sampled_from(["the customer", "x" * 257, "", "a " * 128])


@st.composite
def queries(draw, ids=("q1", "q2", "q3")) -> dict:
    """A query that is mostly well formed: its combinations name the template's placeholders."""
    template = draw(rarely(st.sampled_from(list(TEMPLATES)), wild_templates))
    names = TEMPLATES.get(template, ("who",))
    query = {"id": draw(st.sampled_from(ids)), "template": template, "options": draw(option_lists)}
    if names and draw(st.booleans()):
        query["combinations"] = "all"
        query["values"] = {name: draw(st.lists(values, min_size=1, max_size=4)) for name in names}
    elif names:
        query["combinations"] = draw(
            st.lists(st.fixed_dictionaries({n: values for n in names}), min_size=1, max_size=3)
        )
    extra = {"empty_floor": st.none() | st.booleans(), "group": st.none() | st.text(max_size=4)}
    extra |= {"max_tokens": st.integers(0, 101), "generate": st.none() | st.booleans()}
    for key in draw(st.lists(st.sampled_from(list(extra)), max_size=2, unique=True)):
        query[key] = draw(extra[key])
    return query


def unique_ids(strategy: st.SearchStrategy, **bounds) -> st.SearchStrategy:
    return st.lists(strategy, unique_by=lambda item: item["id"], **bounds)


parts = rarely(
    st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
    st.fixed_dictionaries({"type": st.sampled_from(["image_url", "input_audio", "video", "file"])}),
)
contents = texts | st.lists(parts, max_size=3)
messages = st.lists(st.fixed_dictionaries({"content": contents}, optional={"role": st.text(max_size=6)}), max_size=3)
inputs = unique_ids(
    st.fixed_dictionaries(
        {"id": st.sampled_from(["a", "b", "c"]), "messages": messages},
        optional={
            "query_ids": st.none() | st.lists(st.sampled_from(["q1", "q2", "zz"]), max_size=3),
            "queries": unique_ids(queries(("own1", "own2", "q1")), max_size=2),
        },
    ),
    min_size=1,
    max_size=3,
)
scoring = st.fixed_dictionaries(
    {"queries": unique_ids(queries(), min_size=1, max_size=3)},
    optional={
        "empty_floor": st.booleans(),
        "case_insensitive": st.booleans(),
        "packs": rarely(st.just([]), st.lists(json_values, max_size=2)),
    },
)
limit_keys = st.sampled_from(["max_content_tokens", "max_options", "max_option_tokens", "max_query_tokens", "bogus"])
limits = st.dictionaries(limit_keys, rarely(st.integers(1, 50), scalars), max_size=2)
features = st.fixed_dictionaries(
    {}, optional={"media": st.lists(st.sampled_from(["image", "smell"])), "extraction": st.booleans()}
)
bodies = st.one_of(
    st.fixed_dictionaries({"messages": messages, "scoring": scoring}, optional={"model": st.sampled_from(["tiny"])}),
    st.fixed_dictionaries(
        {"inputs": inputs, "scoring": scoring},
        optional={
            "endpoint": rarely(st.text(min_size=1, max_size=8), st.text()),
            "limits": limits,
            "features": rarely(features, json_values),
        },
    ),
)


class Long(bytes):
    """A long body that Hypothesis reports by its size and start, not byte by byte."""

    def __repr__(self) -> str:
        return f"Long({bytes(self[:40])!r} + ... ({len(self)} bytes))"


def paths(value, at=()):
    """Every location in a JSON value, the root first."""
    yield at
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, inner in items:
        yield from paths(inner, (*at, key))


def changed(value, at, change):
    """A copy of ``value`` with ``change(parent, key)`` applied at the location ``at`` (not the root)."""
    value = json.loads(json.dumps(value))
    parent = value
    for key in at[:-1]:
        parent = parent[key]
    change(parent, at[-1])
    return value


@st.composite
def mutated(draw) -> bytes:
    """A valid-looking body with one mutation, as the bytes sent."""
    body = draw(bodies)
    at = draw(st.sampled_from(list(paths(body))[1:]))
    how = draw(st.sampled_from(["none", "none", "none", "replace", "delete", "extra", "huge", "nest"]))
    if how == "replace":
        new = draw(json_values)
        body = changed(body, at, lambda parent, key: parent.__setitem__(key, new))
    elif how == "delete":
        body = changed(body, at, lambda parent, key: parent.pop(key))
    elif how == "extra":
        body = changed(body, at, lambda parent, key: parent.__setitem__(key, {"zz": 1, "value": parent[key]}))
    elif how in ("huge", "nest"):
        depth = draw(st.integers(10, 2000))
        literal = "[" * depth + "1" + "]" * depth if how == "nest" else draw(st.sampled_from(HUGE))
        return Long(spliced(body, at, literal))
    return json.dumps(body, ensure_ascii=draw(st.booleans())).encode()


def spliced(body, at, literal: str) -> bytes:
    """``body`` as JSON with the value at ``at`` replaced by the raw JSON text ``literal``."""
    marker = "\x00splice\x00"
    text = json.dumps(changed(body, at, lambda parent, key: parent.__setitem__(key, marker)))
    return text.replace(json.dumps(marker), literal).encode()


def raw_bytes(source: st.SearchStrategy) -> st.SearchStrategy:
    """Bodies that are not (quite) JSON, or ``source``'s JSON in another encoding."""
    valid = source.map(json.dumps)
    constant = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999"])
    nan_text = st.builds(lambda text, c: text.replace("true", c).replace("[]", f"[{c}]"), valid, constant)
    bad = st.sampled_from([b"\xff", b"\xc3(", b"\xed\xa0\x80", b"\x80\x80", b"\xf4\x90\x80\x80"])
    non_utf8 = st.builds(lambda text, b, k: text.encode()[:k] + b + text.encode()[k:], valid, bad, st.integers(0, 40))
    encodings = st.sampled_from(["utf-16", "utf-16-le", "utf-32", "utf-32-be", "utf-8-sig"])
    deep = st.integers(1, 40_000).flatmap(
        lambda n: st.sampled_from([b"[" * n + b"]" * n, b'{"a":' * n + b"1" + b"}" * n, b"[" * n])
    )
    return st.one_of(
        nan_text.map(str.encode),
        non_utf8,
        st.builds(lambda text, enc: text.encode(enc), valid, encodings),
        st.sampled_from([b"", b" ", b"null", b"[]", b'"\\ud800"', b'{"messages": [{"content": "\\udfff"}]}']),
        deep.map(Long),
        st.binary(max_size=64),
        st.just(Long(b"x" * (MAX_BODY_BYTES + 1))),
    )


requests = st.tuples(
    st.sampled_from(["/v1/score", "/v1/chat/completions"]),
    st.sampled_from(CALLERS),
    st.one_of(
        mutated(),
        mutated(),
        mutated(),
        mutated(),
        raw_bytes(bodies),
        json_values.map(lambda v: json.dumps(v).encode()),
    ),
)


def check_answer(answer: httpx.Response) -> None:
    """200 with ``results``, or the envelope of §2.5 with a code of the answer's status; never a 5xx."""
    assert answer.status_code < 500, answer.text
    body = answer.json()
    assert isinstance(body, dict)
    if answer.status_code == 200:
        assert isinstance(body["results"], list) and body["id"] == answer.headers["x-request-id"]
        assert ("choices" in body) == answer.request.url.path.endswith("/chat/completions")
        return
    assert answer.headers["content-type"] == "application/json"
    assert set(body) <= {"error", "request_id", "rejected"}
    error = body["error"]
    assert error["type"] == TYPE_BY_STATUS.get(answer.status_code, "invalid_request"), body
    assert error["code"] in ERROR_CODES[answer.status_code], body
    assert error["param"] is None or isinstance(error["param"], str), body
    assert body["request_id"] == answer.headers["x-request-id"]
    if "rejected" in body:
        assert body["rejected"] == {key: error[key] for key in ("code", "message", "param")}


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(request=requests)
def fuzz(client: httpx.Client, request: tuple[str, dict, bytes]) -> None:
    path, headers, content = request
    if len(content) > MAX_BODY_BYTES:  # refused before it is read; the stall test below covers the connection
        headers = {**headers, "Connection": "close"}
    check_answer(client.post(path, content=content, headers=headers))


def run_with_server(engine, drive: Callable[[str], None]) -> None:
    """Run the tiny-model server under ``trio.run`` in this thread, and ``drive(url)`` in a worker thread once the
    server is ready."""
    opts = options(token="tok", trusted_token="boss", max_body_bytes=MAX_BODY_BYTES)

    def ready_then_drive(url: str) -> None:
        deadline = time.monotonic() + 60
        while httpx.get(url + "/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        drive(url)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(functools.partial(serve, opts, lambda: engine, models_entry))
            await trio.to_thread.run_sync(ready_then_drive, binds[0])
            nursery.cancel_scope.cancel()

    trio.run(main)


@pytest.fixture(autouse=True)
def drain_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SPINF_DRAIN_FILE", str(tmp_path / "drain"))


def test_random_bodies_get_scores_or_the_envelope(tiny_engine):
    def drive(url: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as client:  # one keep-alive connection, as clients use
            fuzz(client)

    run_with_server(tiny_engine, drive)


def test_a_body_refused_before_it_is_read_does_not_stall_the_connection(tiny_engine):
    """Found by the fuzz test. A 413 ``body_too_large`` is answered from the Content-Length, before the body has
    arrived; the next request on that keep-alive connection must still be answered."""
    outcomes = []

    def late(size: int) -> Iterator[bytes]:
        time.sleep(0.05)  # the body arrives after the answer, as it does for any large upload
        yield b"x" * size

    def drive(url: str) -> None:
        size = MAX_BODY_BYTES + 1
        with httpx.Client(base_url=url, headers=ACCESS, timeout=3) as client:
            for _ in range(3):
                refused = client.post("/v1/score", content=late(size), headers={"Content-Length": str(size)})
                try:
                    outcomes.append((refused.status_code, client.get("/healthz").status_code))
                except httpx.ReadTimeout:
                    outcomes.append((refused.status_code, "no answer within 3 s"))

    run_with_server(tiny_engine, drive)
    assert outcomes == [(413, 200)] * 3
