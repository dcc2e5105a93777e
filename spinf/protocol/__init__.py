"""The request side of the HTTP API: decoding and validating score bodies into typed requests (api spec §4).

A leaf layer: it imports only `spinf.errors` and `spinf.settings` (and, at step 10 of a call that names packs,
`spinf.packs.calls`, which resolves them), never torch, trio or the engine. The web layer
calls `decode_json_body` and `parse_score_request`; the engine compiler takes the resulting `ScoreRequest` and runs
the token-free per-input and per-query checks of `spinf.protocol.queries` (`choose_queries`,
`expand_combinations`, `check_options`) in the spec's order, between its own token checks. Every refusal is a 400
`ApiError` with the spec's code and param path.
"""

from spinf.protocol.queries import check_options, choose_queries, expand_combinations, option_key
from spinf.protocol.request import decode_json_body, parse_score_request
from spinf.protocol.templates import parse_template
from spinf.protocol.types import (
    Generate,
    InputSpec,
    MediaPart,
    Placeholder,
    QuerySpec,
    ScoreRequest,
    Slot,
    Template,
)

__all__ = [
    "Generate",
    "InputSpec",
    "MediaPart",
    "Placeholder",
    "QuerySpec",
    "ScoreRequest",
    "Slot",
    "Template",
    "check_options",
    "choose_queries",
    "decode_json_body",
    "expand_combinations",
    "option_key",
    "parse_score_request",
    "parse_template",
]
