"""The packs of a call, before any scoring (packs spec §5.1, §5.2 steps 1–5; ``api.md`` §4.10, §4.12 step 10).

`resolve_packs` runs step 10 of the validation order on the raw body, before the schema: each reference parsed and
checked against the catalog (`PackUse`: the version, the context, the effective decision settings), then the
call-level rules (own query ids, the case rule), the reserved group, each input's context texts and the pack media
check. It returns the *merged* request as raw JSON (`PackCall`): the case rule imposed, the packs' queries appended
to ``scoring.queries`` with their floor setting and group, every input wrapped in the context and an explicit
``query_ids`` list extended. The parser then validates and types that merged body as usual (step 11 on). Parts of
the body that do not yet have the schema's shape are left alone, so the schema reports them.

Every refusal is a 400 `ApiError` with the code and param path of §4.10.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from spinf.errors import bad_request
from spinf.packs.catalog import Refused
from spinf.packs.contexts import ParameterError, context_texts, wrap_messages
from spinf.packs.packfile import PackFile
from spinf.packs.repository import LoadedPack
from spinf.protocol.packrefs import check_references
from spinf.protocol.shapes import is_number
from spinf.protocol.types import MEDIA_KINDS  # any other part type, and string content, counts as text (§4.10)


@attrs.frozen
class PackUse:
    """One checked pack reference: the loaded version, the context used, and the call's decision settings.

    ``mode`` is the asked mode (the reference's, else the pack's ``decision.mode``); ``threshold``, ``thresholds``
    and ``critical`` are None when the reference does not give them (``critical=()`` means none). A per-call
    threshold is a float (§5.4)."""

    loaded: LoadedPack
    context: str
    mode: str
    include_queries: bool = False
    threshold: float | None = None
    thresholds: Mapping[str, float | None] | None = None
    critical: tuple[str, ...] | None = None

    @property
    def pack(self) -> PackFile:
        return self.loaded.pack

    @property
    def query_ids(self) -> tuple[str, ...]:
        return tuple(query.id for query in self.pack.queries)


@attrs.frozen
class PackCall:
    """The resolved packs in reference order, and the merged ``scoring`` and ``inputs`` (raw JSON) to validate."""

    uses: tuple[PackUse, ...]
    scoring: dict
    inputs: list
    own_queries: int  # how many of the merged scoring.queries are the caller's; the packs' follow


@attrs.frozen
class PackStep:
    """Step 10 over ``catalog`` (a `spinf.packs.catalog.Catalog`) as the parser takes it
    (`spinf.protocol.request.PackStep`); with packs off the parser runs its own (every id ``unknown_pack``)."""

    catalog: object

    def __call__(self, scoring: dict, inputs: list, *, messages_form: bool) -> PackCall | None:
        return resolve_packs(scoring, inputs, self.catalog, messages_form=messages_form)


def _invalid(param: str, message: str):
    return bad_request("invalid_field", param, message)


def resolve_packs(scoring: dict, inputs: list, catalog: object, *, messages_form: bool = False) -> PackCall | None:
    """Step 10 of ``api.md`` §4.12 on the raw ``scoring`` object and input list; None when the call names no pack.

    ``catalog`` is the pack catalog (a `spinf.packs.catalog.Catalog`), or None when packs are off: every id is then
    ``unknown_pack``. ``messages_form``: the body used ``messages``, so media and parameter params say so."""
    refs = check_references(scoring)
    uses = [_reference(ref, f"scoring.packs.{i}", catalog) for i, ref in enumerate(refs)]
    if not uses:
        return None
    shared = scoring.get("queries", [])
    _check_query_ids(shared, inputs, uses)
    rule = _case_rule(scoring, uses)
    _check_groups(shared, uses)
    texts = [_input_texts(raw, i, uses, messages_form) for i, raw in enumerate(inputs)]
    for i, raw in enumerate(inputs):
        _check_media(raw, i, uses, messages_form)
    merged = dict(scoring)
    if isinstance(scoring.get("case_insensitive", rule), bool):  # a wrong type stays, for the schema to refuse
        merged["case_insensitive"] = rule
    merged["queries"] = list(shared) + [_pack_query(use, query.spec) for use in uses for query in use.pack.queries]
    wrapped = [_wrapped(raw, pair, uses) for raw, pair in zip(inputs, texts, strict=True)]
    return PackCall(tuple(uses), merged, wrapped, len(shared))


# Step 1: one reference.


def _reference(ref: dict, p: str, catalog: object) -> PackUse:
    """A shape-checked reference against the catalog: the version, the context, the decision settings."""
    found = catalog.find(ref["id"], ref.get("version"))
    if isinstance(found, Refused):
        raise bad_request(found.code, f"{p}.{found.at}" if found.at else p, found.message)
    pack = found.loaded.pack
    names = [name for name, _ in pack.contexts]
    context = ref.get("context", pack.default_context)
    if context not in names:
        raise _invalid(f"{p}.context", f"{pack.id} {pack.version} has no context {context!r}; its contexts: {names}")
    decision = _decision(ref.get("decision"), pack, f"{p}.decision")
    return PackUse(found.loaded, context, include_queries=ref.get("include_queries", False), **decision)


def _decision(given: dict | None, pack: PackFile, d: str) -> dict:
    """The call's decision settings (§4.10): the mode, then the threshold for it, the thresholds, the critical list."""
    if given is None:
        return {"mode": pack.decision.mode}
    modes = pack.decision.modes
    mode = given.get("mode", pack.decision.mode)
    if mode not in modes:  # an explicit null included
        raise _invalid(f"{d}.mode", f"the mode of {pack.id} must be one of {', '.join(modes)}, not {mode!r}")
    return {
        "mode": mode,
        "threshold": _threshold(given.get("threshold"), mode, f"{d}.threshold"),
        "thresholds": _thresholds(given.get("thresholds"), pack, f"{d}.thresholds"),
        "critical": _critical(given.get("critical"), pack, f"{d}.critical"),
    }


def _threshold(value: object, mode: str, param: str) -> float | None:
    if value is None:
        return None
    if not is_number(value):
        raise _invalid(param, "the threshold must be a finite number")
    if mode == "per_category":
        raise _invalid(param, "per_category decides by the category thresholds; it takes no threshold")
    if mode == "max" and not 0 <= value <= 1:
        raise _invalid(param, f"a max threshold must be between 0 and 1, not {value}")
    return float(value)


def _thresholds(value: object, pack: PackFile, param: str) -> dict[str, float | None] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _invalid(param, "thresholds must be an object mapping categories to numbers in [0, 1] or null")
    categories = [category.id for category in pack.categories]
    out: dict[str, float | None] = {}
    for name, t in value.items():
        if name not in categories:
            raise bad_request("unknown_category", f"{param}.{name}", f"{pack.id} has no category {name!r}")
        if t is not None and not (is_number(t) and 0 <= t <= 1):
            raise _invalid(f"{param}.{name}", f"the threshold of {name!r} must be a number in [0, 1] or null")
        out[name] = None if t is None else float(t)
    return out


def _critical(value: object, pack: PackFile, param: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise _invalid(param, "critical must be a list of category ids")
    categories = {category.id for category in pack.categories}
    for j, name in enumerate(value):
        if name not in categories:
            raise bad_request("unknown_category", f"{param}.{j}", f"{pack.id} has no category {name!r}")
    return tuple(dict.fromkeys(value))


# Step 2: the call-level rules.


def _check_query_ids(shared: object, inputs: list, uses: Sequence[PackUse]) -> None:
    """No two packs with one query id (``pack_conflict``), no own query with a pack's query id (``duplicate_id``)."""
    owners: dict[str, PackFile] = {}
    for use in uses:
        for query_id in use.query_ids:
            if owners.setdefault(query_id, use.pack) is not use.pack:
                message = f"the packs {owners[query_id].id} and {use.pack.id} both have a query {query_id!r}"
                raise bad_request("pack_conflict", "scoring.packs", message)
    own = list(shared) if isinstance(shared, list) else []
    for raw in inputs:
        if isinstance(raw, dict) and isinstance(raw.get("queries"), list):
            own.extend(raw["queries"])
    for query in own:
        query_id = query.get("id") if isinstance(query, dict) else None
        if isinstance(query_id, str) and query_id in owners:
            pack = owners[query_id]
            raise bad_request(
                "duplicate_id", "scoring.queries", f"the query id {query_id!r} is a query of the pack {pack.id}"
            )


def _case_rule(scoring: dict, uses: Sequence[PackUse]) -> bool:
    """The packs' one case rule; a ``scoring.case_insensitive`` the caller sent must equal it."""
    sent = scoring.get("case_insensitive")
    if isinstance(sent, bool):
        for use in uses:
            if use.pack.case_insensitive != sent:
                raise bad_request(
                    "pack_conflict",
                    "scoring.case_insensitive",
                    f"the pack {use.pack.id} matches options with case_insensitive "
                    f"{str(use.pack.case_insensitive).lower()}; the call sent {str(sent).lower()}",
                )
    rules = {use.pack.case_insensitive for use in uses}
    if len(rules) > 1:
        raise bad_request(
            "pack_conflict", "scoring.packs", "the packs of the call match options by different case rules"
        )
    return rules.pop()


def _check_groups(shared: object, uses: Sequence[PackUse]) -> None:
    groups = {use.pack.group for use in uses}
    for k, query in enumerate(shared if isinstance(shared, list) else ()):
        group = query.get("group") if isinstance(query, dict) else None
        if isinstance(group, str) and group in groups:
            raise bad_request(
                "reserved_group", f"scoring.queries.{k}.group", f"the group {group!r} is a pack's in this call"
            )


# Steps 4 and 5: the merged queries, the context texts, the media check, the wrapping.


def _pack_query(use: PackUse, spec: dict) -> dict:
    query = dict(spec)
    if query.get("empty_floor") is None:
        query["empty_floor"] = use.pack.empty_floor
    query["group"] = use.pack.group
    return query


def _input_texts(raw: object, i: int, uses: Sequence[PackUse], messages_form: bool) -> tuple[str, str]:
    """The one (before, after) pair of every pack's context for this input, parameters filled."""
    param = "messages.parameters" if messages_form else f"inputs.{i}.parameters"
    given = raw.get("parameters") if isinstance(raw, dict) else None
    if given is not None and not isinstance(given, dict):
        raise _invalid(param, "parameters must be an object mapping names to strings, numbers or booleans")
    for name, value in (given or {}).items():
        if value is not None and not isinstance(value, str | int | float):
            raise _invalid(f"{param}.{name}", f"the parameter {name!r} must be a string, a number or a boolean")
    pairs = []
    for use in uses:
        try:
            pairs.append(context_texts(use.pack, use.context, given))
        except ParameterError as error:
            raise _invalid(param, str(error)) from error
    if len(set(pairs)) > 1:
        raise bad_request(
            "pack_conflict", "scoring.packs", f"the packs of the call wrap input {i} in different contexts"
        )
    return pairs[0]


def _check_media(raw: object, i: int, uses: Sequence[PackUse], messages_form: bool) -> None:
    messages = raw.get("messages") if isinstance(raw, dict) else None
    at = "messages" if messages_form else f"inputs.{i}.messages"
    for m, message in enumerate(messages if isinstance(messages, list) else ()):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts = [("text", f"{at}.{m}.content")]
        elif isinstance(content, list):
            parts = [
                (MEDIA_KINDS.get(part.get("type"), "text"), f"{at}.{m}.content.{k}.type")
                for k, part in enumerate(content)
                if isinstance(part, dict)
            ]
        else:
            parts = []
        for kind, param in parts:
            for use in uses:
                if kind not in use.pack.media:
                    raise bad_request(
                        "pack_media_not_supported", param, f"the pack {use.pack.id} does not read {kind} content"
                    )


def _wrapped(raw: object, pair: tuple[str, str], uses: Sequence[PackUse]) -> object:
    """The input with its messages wrapped in the context, the packs' ids added to an explicit ``query_ids``, and
    its parameters without explicit nulls (the schema, which refuses them, checks the merged input)."""
    if not isinstance(raw, dict):
        return raw
    out = dict(raw)
    messages = raw.get("messages")
    if (
        isinstance(messages, list)
        and messages
        and all(isinstance(m, dict) and isinstance(m.get("content"), str | list) for m in messages)
    ):
        out["messages"] = wrap_messages(messages, *pair)
    if isinstance(raw.get("parameters"), dict):  # checked at step 10, where an explicit null means no value (§1.5)
        out["parameters"] = {name: value for name, value in raw["parameters"].items() if value is not None}
    query_ids = raw.get("query_ids")
    if isinstance(query_ids, list):
        added = [query_id for use in uses for query_id in use.query_ids if query_id not in query_ids]
        out["query_ids"] = query_ids + added
    return out
