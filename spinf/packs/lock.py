"""The micro-layer lock of a pack file (packs spec §1.10): what it covers and how its text is made canonical.

The lock ties a fitted micro-layer to the constants it was fitted on: the queries, the reads, every category's Platt
pair and the layer's inputs. It is ``"sha256:"`` plus the hex SHA-256 of that object's canonical JSON text, which is
exactly Python's ``json.dumps(..., sort_keys=True, separators=(",", ":"))`` with ``ensure_ascii`` on, applied to the
values as ``json.load`` parsed them (so ``-2`` and ``-2.0`` lock differently). Nothing else of the file is covered:
thresholds, percentile maps and even the weights may change without breaking it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

PREFIX = "sha256:"


def canonical_text(value: object) -> str:
    """The canonical JSON text of ``value`` (§1.10): keys sorted at every depth, no whitespace, ASCII only."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def locked_content(pack: Mapping) -> dict:
    """The object the lock hashes: the micro-layer inputs, every category's ``platt``, the queries and the reads,
    each exactly as in the file. ``pack`` is a validated pack file (a missing ``inputs`` or ``platt`` is null)."""
    micro = (pack.get("decision") or {}).get("micro_layer") or {}
    return {
        "inputs": micro.get("inputs"),
        "platt": {name: spec.get("platt") for name, spec in pack["categories"].items()},
        "queries": pack["scoring"]["queries"],
        "reads": pack["reads"],
    }


def lock_of(pack: Mapping) -> str:
    """The lock ``pack``'s micro-layer must carry: ``sha256:`` and 64 lowercase hex digits."""
    text = canonical_text(locked_content(pack))
    return PREFIX + hashlib.sha256(text.encode("utf-8")).hexdigest()
