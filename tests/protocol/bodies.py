"""Builders of score request bodies for the protocol tests: a valid body, and ways to change one part of it."""

from __future__ import annotations

DROP = object()
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
