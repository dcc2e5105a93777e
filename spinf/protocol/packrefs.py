"""A call's pack references as the body gives them (api spec §4.10, step 10 of §4.12), before any pack is read.

`check_references` is what a reference must be whatever the catalog holds: an object of known keys with the right
types and an id not seen before. The parser runs it itself when packs are off (every id then ``unknown_pack``);
with packs on, `spinf.packs.calls` runs it and then looks each reference up.
"""

from __future__ import annotations

from spinf.errors import bad_request
from spinf.protocol.shapes import invalid_field

REFERENCE_KEYS = ("id", "version", "context", "decision", "include_queries")
DECISION_KEYS = ("mode", "threshold", "thresholds", "critical")
_TYPED_KEYS = (
    ("version", str, "a string"),
    ("context", str, "a string"),
    ("include_queries", bool, "true or false"),
    ("decision", dict, "an object"),
)


def check_references(scoring: dict) -> list[dict]:
    """``scoring.packs`` (absent: none) checked reference by reference; the references."""
    refs = scoring.get("packs", [])
    if not isinstance(refs, list):
        raise invalid_field("scoring.packs", "scoring.packs must be a list of pack references")
    seen: set[str] = set()
    for i, ref in enumerate(refs):
        _check_shape(ref, f"scoring.packs.{i}", seen)
    return refs


def refuse_packs_off(refs: list[dict]) -> None:
    """Packs are off on this server: the first reference is an unknown pack."""
    if refs:
        message = f"unknown pack {refs[0]['id']!r}; packs are off on this server (GET /v1/packs)"
        raise bad_request("unknown_pack", "scoring.packs.0.id", message)


def _check_shape(ref: object, p: str, seen: set[str]) -> None:
    """What a reference must be before its pack is looked up: its keys and their types, the id not seen before."""
    if not isinstance(ref, dict):
        raise invalid_field(p, f"{p} must be an object")
    for key in ref:
        if key not in REFERENCE_KEYS:
            raise invalid_field(
                f"{p}.{key}", f"{key!r} is not a pack reference key; they are {', '.join(REFERENCE_KEYS)}"
            )
    pack_id = ref.get("id")
    if not isinstance(pack_id, str) or not pack_id:
        raise invalid_field(f"{p}.id", f"{p}.id must be a non-empty string")
    if pack_id in seen:
        raise bad_request("duplicate_id", f"{p}.id", f"the pack {pack_id!r} is referenced twice")
    seen.add(pack_id)
    # Present means given: only the decision values below count null as absent (packs spec §5.1).
    for key, kind, what in _TYPED_KEYS:
        if key in ref and not isinstance(ref[key], kind):
            raise invalid_field(f"{p}.{key}", f"{p}.{key} must be {what}")
    for key in ref.get("decision", ()):
        if key not in DECISION_KEYS:
            raise invalid_field(
                f"{p}.decision.{key}", f"{key!r} is not a decision key; they are {', '.join(DECISION_KEYS)}"
            )
