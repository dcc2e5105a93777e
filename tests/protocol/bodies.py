"""Builders of score request bodies for the protocol tests: a valid body, ways to change one part of it,
`refusal`, which runs the parser and the engine's token-free checks on a body, and `FIXED`, the settings of the
Hypothesis tests that feed it (derandomized and without an example database: a CI run is the same every time)."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

from spinf.errors import ApiError
from spinf.protocol.queries import check_options, choose_queries, expand_combinations
from spinf.protocol.request import parse_score_request

FIXED = settings(derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class _Drop:
    """The marker that removes a key; its repr is fixed, so test ids are the same in every process (pytest-xdist's
    workers must collect the same tests)."""

    def __repr__(self) -> str:
        return "DROP"


DROP = _Drop()
ALL_MEDIA = frozenset({"image", "audio", "video"})
SCORED = {"id": "q", "template": "Answer:{?}", "options": [" yes", " no"]}
TEXT = {"id": "x", "template": 'It says "{*}"'}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
AUDIO = {"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}
VIDEO = {"type": "video", "video": {"frames": []}}


def merged(base: dict, changes: dict | None) -> dict:
    out = dict(base)
    for key, value in (changes or {}).items():
        if value is DROP:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def body(*, query: dict | None = None, input: dict | None = None, scoring: dict | None = None, **top) -> dict:
    """A valid body (one shared scored query, one input); each argument replaces keys of its part (DROP removes)."""
    inp = merged({"id": "a", "messages": [{"role": "user", "content": "hello"}]}, input)
    sc = merged({"queries": [merged(SCORED, query)]}, scoring)
    return merged({"inputs": [inp], "scoring": sc}, top)


def shared(*queries: dict, **top) -> dict:
    """A valid body whose shared queries are exactly these."""
    return body(scoring={"queries": list(queries)}, **top)


def content(*parts: dict) -> dict:
    """An input whose one message has these parts."""
    return {"messages": [{"content": list(parts)}]}


def refusal(body: object, **parse_options) -> ApiError | None:
    """The `ApiError` with which the parser, then the engine's token-free per-input checks (§4.9), refuse ``body``;
    None when it gets as far as the tokenizer. ``parse_options`` go to `parse_score_request`."""
    try:
        request = parse_score_request(body, **parse_options)
        for i in range(len(request.inputs)):
            for q in choose_queries(request, i):
                expand_combinations(q)
                if q.is_scored:
                    check_options(q, case_insensitive=request.case_insensitive, max_options=request.limits.max_options)
    except ApiError as e:
        return e
    return None
