"""The packs' part of a response (packs spec §5.3, §5.4; ``api.md`` §5.2, §5.6, §5.9).

`add_pack_results` gives each input's result its ``packs`` list, one entry per reference in reference order,
evaluated on that input's pack query results in the pack's answer form and rounded (`spinf.packs.evaluate`); the
lock status is the one found when the pack was loaded. It then removes the hidden packs' query results (those
without ``include_queries``) and every warning about one of their queries. An evaluation that fails is 500
``engine_error``, the message saying pack evaluation failed.
"""

from __future__ import annotations

from collections.abc import Sequence

from spinf.errors import ApiError
from spinf.packs.calls import PackUse
from spinf.packs.evaluate import PackEvaluationError, answers_from_queries, evaluate, pack_entry


def pack_results(use: PackUse, queries: Sequence[dict]) -> dict:
    """One input's ``packs[]`` entry for ``use``, from the input's ``queries`` results (the pack's among them)."""
    raw = use.pack.raw
    evaluation = evaluate(
        raw,
        answers_from_queries(raw, queries),
        lock_ok=use.pack.lock_matches is True,
        mode=use.mode,
        threshold=use.threshold,
        thresholds=use.thresholds,
        critical=None if use.critical is None else list(use.critical),
    )
    return pack_entry(raw, use.context, evaluation)


def _entry(use: PackUse, result: dict) -> dict:
    try:
        return pack_results(use, result["queries"])
    except PackEvaluationError as error:
        where = f"{use.pack.id} {use.pack.version} on input {result['input_id']!r}"
        raise ApiError(500, "engine_error", None, f"pack evaluation failed for {where}: {error}") from error


def add_pack_results(uses: Sequence[PackUse], results: list[dict], warnings: list[dict]) -> list[dict]:
    """Add ``packs`` to every result and hide the hidden packs' queries (in place); the warnings that remain."""
    hidden = {query_id for use in uses if not use.include_queries for query_id in use.query_ids}
    for result in results:
        result["packs"] = [_entry(use, result) for use in uses]
        result["queries"] = [query for query in result["queries"] if query["id"] not in hidden]
    return [warning for warning in warnings if warning.get("query_id") not in hidden]
