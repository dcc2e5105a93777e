"""Per-query and per-input semantic checks that need no tokenizer: combinations, options, query choice.

These are the checks of api spec §4.2, §4.7 and the first, token-free part of §4.8. The parser
(`spinf.protocol.request`) only checks the request's shape; the engine compiler calls these helpers per input and
per query, in the spec's order (§4.9: choose the queries, then for each query expand its combinations and check its
options), interleaved with its own token checks. Everything here is pure: it reads a `QuerySpec` or `ScoreRequest`
and returns plain data or raises a 400 `ApiError`.
"""

from __future__ import annotations

import itertools
import math

from spinf.errors import bad_request
from spinf.protocol.types import QuerySpec, ScoreRequest

MAX_COMBINATIONS = 1000
MAX_VALUE_CHARS = 256


def expand_combinations(q: QuerySpec) -> tuple[dict[str, str], ...]:
    """The query's combinations in response order (§4.7), each a ``{name: value}`` map in template name order.

    A too-long value is reported as ``invalid_field <q>.combinations.<j>.<name>`` in both forms. For ``"all"``,
    ``j`` is the index of the first produced combination that holds the value, i.e. its index in the response.
    """
    names = q.template.names
    if q.combinations is None:
        if names:
            message = f'the template has the placeholders {_list(names)}: send combinations (a list, or "all")'
            raise bad_request("missing_value", f"{q.path}.combinations", message)
        return ({},)
    if q.combinations == "all":
        combinations = _grid(q)
    else:
        combinations = _listed(q)
    for j, combination in enumerate(combinations):
        for name, value in combination.items():
            if len(value) > MAX_VALUE_CHARS:
                raise bad_request(
                    "invalid_field",
                    f"{q.path}.combinations.{j}.{name}",
                    f"the value of {name!r} has {len(value)} characters; at most {MAX_VALUE_CHARS}",
                )
    return combinations


def _listed(q: QuerySpec) -> tuple[dict[str, str], ...]:
    """An explicit combination list, each entry's keys checked against the template's names."""
    names = q.template.names
    if not q.combinations:
        raise bad_request("missing_value", f"{q.path}.combinations", "the combination list is empty")
    out = []
    for j, entry in enumerate(q.combinations):
        _match_names(entry.keys(), names, f"{q.path}.combinations.{j}")
        out.append({name: entry[name] for name in names})
    return tuple(out)


def _grid(q: QuerySpec) -> tuple[dict[str, str], ...]:
    """The ``"all"`` grid: the cartesian product with the template's first placeholder varying slowest."""
    names = q.template.names
    if q.values is None:
        raise bad_request("missing_value", f"{q.path}.values", 'combinations "all" needs values')
    _match_names(q.values.keys(), names, f"{q.path}.values")
    for name in names:
        if not q.values[name]:
            raise bad_request("missing_value", f"{q.path}.values.{name}", f"the value list of {name!r} is empty")
    count = math.prod(len(q.values[name]) for name in names)
    if count > MAX_COMBINATIONS:
        raise bad_request(
            "too_many_combinations", q.path, f'"all" gives {count} combinations; at most {MAX_COMBINATIONS}'
        )
    # itertools.product varies its last iterable fastest, so the first name in template order varies slowest.
    return tuple(dict(zip(names, row, strict=True)) for row in itertools.product(*(q.values[n] for n in names)))


def _match_names(keys, names: tuple[str, ...], param: str) -> None:
    extra = [k for k in keys if k not in names]
    if extra:
        raise bad_request(
            "unknown_placeholder", param, f"{_list(extra)} not in the template; its placeholders are {_list(names)}"
        )
    missing = [n for n in names if n not in keys]
    if missing:
        raise bad_request("missing_value", param, f"no value for the placeholders {_list(missing)}")


def option_key(option: str, case_insensitive: bool) -> str:
    """The form under which two options clash (§4.8): trimmed and casefolded when case-insensitive."""
    return option.strip().casefold() if case_insensitive else option


def check_options(q: QuerySpec, *, case_insensitive: bool, max_options: int) -> None:
    """The token-free option checks of a scored query (§4.8), in the spec's order.

    A whitespace-only option is a non-empty string and passes here; its key is ``""``, so two of them clash when
    case-insensitive. Whether it makes a usable token sequence is left to the tokenizer checks (``option_too_long``).
    """
    param = f"{q.path}.options"
    if q.options is None:
        raise bad_request("missing_value", param, "a {?} query needs options")
    if not q.options:
        raise bad_request("too_many_options", param, f"the option list is empty; send 1 to {max_options} options")
    if len(q.options) > max_options:
        raise bad_request("too_many_options", param, f"{len(q.options)} options; at most {max_options}")
    seen: set[str] = set()
    for j, option in enumerate(q.options):
        if not option:
            raise bad_request("invalid_field", f"{param}.{j}", "an option may not be the empty string")
        key = option_key(option, case_insensitive)
        if key in seen:
            how = " (after trimming and casefolding)" if case_insensitive else ""
            raise bad_request("duplicate_option", f"{param}.{j}", f"option {option!r} repeats an earlier one{how}")
        seen.add(key)


def choose_queries(request: ScoreRequest, input_index: int) -> tuple[QuerySpec, ...]:
    """The queries an input is scored with (§4.2): the chosen shared queries, then its own, in response order."""
    spec = request.inputs[input_index]
    if spec.query_ids is None:
        chosen = list(request.queries)
    else:
        shared = {q.id: q for q in request.queries}  # the parser has made shared ids unique
        chosen = []
        for k, qid in enumerate(spec.query_ids):
            if qid not in shared:
                raise bad_request(
                    "unknown_query_id", f"{spec.path}.query_ids.{k}", f"there is no shared query with id {qid!r}"
                )
            chosen.append(shared[qid])
    taken = {q.id for q in chosen}
    for k, q in enumerate(spec.queries):
        if q.id in taken:
            raise bad_request(
                "duplicate_id", f"{spec.path}.queries.{k}.id", f"query id {q.id!r} is already used for this input"
            )
        taken.add(q.id)
    if not chosen and not spec.queries:
        raise bad_request("empty_queries", spec.path, "this input has no query to score")
    return (*chosen, *spec.queries)


def _list(items) -> str:
    return ", ".join(repr(i) for i in items)
