"""Validation of a pack file (packs spec §1, §8): every problem of a parsed JSON value, each with its JSON path.

`check_pack` runs the checks in the file's order and never raises, whatever the JSON: ``pack``, ``version``,
``model``, ``media``, ``answers``, ``parameters``, ``contexts``, ``scoring``, then the reads, the categories and the
decision (`spinf.packs.validate_decision`). It stops early only where §8 says: a value that is not an object, missing
top-level fields, and an invalid ``decision`` object or mode. A *draft* (§1.11) skips the fitted constants: ``mu``,
``mean``/``sd``, ``platt``, ``decision.max.threshold`` and the need for a micro-layer may be absent (when present they
are still checked). The lock is not compared here: a mismatch is not a file problem (§1.10).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from spinf.errors import ApiError
from spinf.packs.problems import Problems, is_int, is_number
from spinf.packs.validate_decision import check_categories, check_decision
from spinf.protocol.schema import QUERY

ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*$")
VERSION_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+-]*$")
IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
REQUIRED = ("pack", "version", "model", "contexts", "scoring", "reads", "categories", "decision")
MEDIA = ("text", "image", "audio", "video")
ANSWERS = ("p", "logprob")
KINDS = ("pair", "option", "any", "set")
SCORING_KEYS = ("queries", "empty_floor", "case_insensitive")


def check_pack(raw: object, *, draft: bool = False) -> Problems:
    """Every problem of ``raw`` as a pack file (§8), in check order."""
    problems = Problems()
    if not isinstance(raw, dict):
        problems.add("", "a pack file is a JSON object")
        return problems
    for key in REQUIRED:
        if key not in raw:
            problems.add(key, f"the top-level field {key!r} is missing")
    if problems:
        return problems
    _check_header(raw, problems)
    parameters = _check_parameters(raw.get("parameters"), problems)
    _check_contexts(raw["contexts"], parameters, problems)
    queries = _check_scoring(raw["scoring"], problems)
    _check_reads(raw["reads"], queries, raw["categories"], problems, draft)
    check_categories(raw["categories"], raw["reads"], problems, draft)
    check_decision(raw, problems, draft)
    return problems


def _check_header(raw: dict, problems: Problems) -> None:
    if not (isinstance(raw["pack"], str) and ID_RE.match(raw["pack"])):
        problems.add(
            "pack",
            "the pack id must be <namespace>/<name>: lower case, digits, '.', '_', '-', each part "
            "starting with a letter or a digit",
        )
    if not (isinstance(raw["version"], str) and VERSION_RE.match(raw["version"])):
        problems.add("version", "the version must start with a letter or digit, then letters, digits, '.', '+', '-'")
    if not (isinstance(raw["model"], str) and raw["model"]):
        problems.add("model", "the model id the pack was calibrated on is required (a non-empty string)")
    media = raw.get("media", ["text"])
    if not (isinstance(media, list) and "text" in media and all(m in MEDIA for m in media)):
        problems.add("media", "media must be a list holding 'text' plus any of 'image', 'audio', 'video'")
    if raw.get("answers", "p") not in ANSWERS:
        problems.add("answers", "answers must be one of 'p', 'logprob'")


def _check_parameters(parameters: object, problems: Problems) -> tuple[str, ...]:
    """The declared parameter names (those well formed), after reporting every parameter problem."""
    if parameters is None:
        return ()
    shape = "parameters must be {name: {label, description?, required?, default?}}"
    if not isinstance(parameters, dict):
        problems.add("parameters", shape)
        return ()
    names = []
    for name, spec in parameters.items():
        path = f"parameters.{name}"
        if name == "X":
            problems.add(path, "a parameter may not be named 'X': {X} is the content placeholder")
        elif not IDENTIFIER_RE.match(name) or not isinstance(spec, dict):
            problems.add(path, shape + " with an identifier as the name")
        else:
            if "label" in spec and not isinstance(spec["label"], str):
                problems.add(f"{path}.label", f"the label of parameter {name!r} must be a string")
            if "required" in spec and not isinstance(spec["required"], bool):
                problems.add(f"{path}.required", f"'required' of parameter {name!r} must be a boolean")
            names.append(name)
    return tuple(names)


def _check_contexts(contexts: object, parameters: tuple[str, ...], problems: Problems) -> None:
    if not (isinstance(contexts, dict) and contexts and all(isinstance(t, str) for t in contexts.values())):
        problems.add("contexts", "contexts must be an object of name -> template string, with at least one context")
        return
    for name, template in contexts.items():
        used = PLACEHOLDER_RE.findall(template)
        if used.count("X") != 1:
            problems.add(f"contexts.{name}", f"the context {name!r} must contain exactly one {{X}}")
        unknown = sorted({u for u in used if u != "X" and u not in parameters})
        if unknown:
            listed = ", ".join("{" + u + "}" for u in unknown)
            problems.add(
                f"contexts.{name}",
                f"the context {name!r} uses placeholders that are neither a parameter nor {{X}}: {listed}",
            )


def _check_scoring(scoring: object, problems: Problems) -> dict[str, dict]:
    """The queries that passed every check, by id (what reads may name), after reporting the scoring problems."""
    if not (isinstance(scoring, dict) and "queries" in scoring):
        problems.add("scoring", "scoring must be {queries, empty_floor?, case_insensitive?}")
        return {}
    extra = [key for key in scoring if key not in SCORING_KEYS]
    if extra:
        problems.add("scoring", f"scoring has unknown keys: {', '.join(map(repr, extra))}")
    for flag in ("empty_floor", "case_insensitive"):
        if flag in scoring and not isinstance(scoring[flag], bool):
            problems.add(f"scoring.{flag}", f"{flag} must be true or false")
    queries = scoring["queries"]
    if not (isinstance(queries, list) and queries):
        problems.add("scoring.queries", "scoring.queries must be a non-empty list of queries")
        return {}
    good: dict[str, dict] = {}
    seen: set[str] = set()
    for i, query in enumerate(queries):
        if _check_query(query, i, problems):
            if query["id"] in seen:
                problems.add(f"scoring.queries.{i}.id", f"query {i} repeats the query id {query['id']!r}")
            else:
                good[query["id"]] = query
            seen.add(query["id"])
    return good


def _check_query(query: object, i: int, problems: Problems) -> bool:
    """Whether query ``i`` passes the API query schema (then reads may name it); every problem of it reported."""
    path = f"scoring.queries.{i}"
    if not isinstance(query, dict):
        problems.add(path, f"query {i} must be an object")
        return False
    before = len(problems)
    for field in QUERY.shape.fields:
        where = f"{path}.{field.key}"
        if field.key not in query:
            if field.required:
                problems.add(where, f"query {i} fails the query schema: {field.key!r} is required")
            continue
        try:
            field.shape.check(query[field.key], where)
        except ApiError as exc:
            problems.add(exc.param or where, f"query {i} fails the query schema: {exc.message}")
    if len(problems) > before:
        return False
    scored = "{?}" in query["template"] and isinstance(query.get("options"), list) and len(query["options"]) >= 2
    if not scored:
        problems.add(path, f"query {i} ({query['id']!r}) must be a scored query with {{?}} and at least two options")
    if "group" in query:
        problems.add(f"{path}.group", f"query {i} ({query['id']!r}) must not set 'group': the loader sets it")
    return True


def _check_reads(reads: object, queries: dict, categories: object, problems: Problems, draft: bool) -> None:
    if not (isinstance(reads, list) and reads):
        problems.add("reads", "reads must be a non-empty list")
        return
    seen: set[str] = set()
    for i, read in enumerate(reads):
        path = f"reads.{i}"
        if not (isinstance(read, dict) and isinstance(read.get("id"), str) and read["id"]):
            problems.add(path, f"read {i} must be an object with an id (a non-empty string)")
            continue
        if read["id"] in seen:
            problems.add(f"{path}.id", f"read {i} repeats the read id {read['id']!r}")
        seen.add(read["id"])
        query = queries.get(read.get("query")) if isinstance(read.get("query"), str) else None
        if query is None:
            if queries:
                problems.add(f"{path}.query", f"read {i}: the query {read.get('query')!r} is not in scoring.queries")
            continue
        _check_f(read, query, path, problems)
        _check_kind(read, len(query.get("options") or ()), path, problems, draft)
        _check_standardisation(read, path, problems, draft)
        if not (
            isinstance(categories, dict) and isinstance(read.get("category"), str) and read["category"] in categories
        ):
            problems.add(f"{path}.category", f"read {i}: the category {read.get('category')!r} is not in categories")
        if read.get("view") is not None and not isinstance(read["view"], str):
            problems.add(f"{path}.view", f"read {i}: view must be a string")


def _check_f(read: dict, query: dict, path: str, problems: Problems) -> None:
    combinations = query.get("combinations")
    if combinations is None:
        if "F" in read:
            problems.add(f"{path}.F", f"the query {query['id']!r} has no combinations, so the read takes no F")
    elif combinations == "all":
        values = (query.get("values") or {}).get("F") or []
        if read.get("F") not in values:
            problems.add(f"{path}.F", f"the read's F {read.get('F')!r} is not one of the query's values.F")
    elif read.get("F") not in [c.get("F") for c in combinations]:
        problems.add(f"{path}.F", f"the read's F {read.get('F')!r} is not the F of any combination of its query")


def _check_kind(read: dict, n: int, path: str, problems: Problems, draft: bool) -> None:
    kind = read.get("kind")
    mu = read.get("mu")
    needs_mu = not (draft and "mu" not in read)
    if kind == "pair":
        if n != 2 or read.get("sign", 1) not in (1, -1) or isinstance(read.get("sign"), bool):
            problems.add(path, f"a pair read needs a query with two options (it has {n}) and sign 1 or -1")
    elif kind == "option":
        option = read.get("option")
        if not (is_int(option) and 0 <= option < n) or (needs_mu and not is_number(mu)):
            problems.add(path, f"an option read needs an option index below {n} and a number as mu")
    elif kind in ("any", "set"):
        if needs_mu and not (isinstance(mu, list) and len(mu) == n and all(map(is_number, mu))):
            problems.add(f"{path}.mu", f"an {kind} read needs one mu per option: a list of {n} numbers")
        if kind == "set":
            unsafe = read.get("unsafe")
            fine = isinstance(unsafe, list) and unsafe and all(is_int(u) and 0 <= u < n for u in unsafe)
            if not fine or len(set(unsafe)) == n:
                problems.add(f"{path}.unsafe", f"a set read needs unsafe option indices below {n}, not all of them")
    else:
        problems.add(f"{path}.kind", "kind must be one of 'pair', 'option', 'any', 'set'")


def _check_standardisation(read: Mapping, path: str, problems: Problems, draft: bool) -> None:
    if draft and "mean" not in read and "sd" not in read:
        return
    mean, sd = read.get("mean"), read.get("sd")
    if not (is_number(mean) and is_number(sd) and sd > 0):
        problems.add(path, "mean and sd must be numbers, with sd > 0")
