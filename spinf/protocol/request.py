"""Decoding and validating a score request body into a `ScoreRequest` (api spec §2.1, §4.1–§4.5, §4.11, §4.12).

`parse_score_request` runs steps 1–13 of §4.12 in the spec's order and raises the first problem as a 400 `ApiError`;
the schema of step 11 lives in `spinf.protocol.schema`. After step 13 it checks that shared query ids and input ids
are unique and builds each input's content segments (§4.3). Checks that need the tokenizer, the media decoders or
an input's choice of queries belong to the engine, which uses `spinf.protocol.queries` for the token-free ones.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection
from typing import Protocol

import attrs

from spinf.errors import bad_request
from spinf.protocol.packrefs import check_references, refuse_packs_off
from spinf.protocol.schema import ENDPOINT, MODEL, PART_TYPES, check_input, check_scoring
from spinf.protocol.shapes import invalid_field as _invalid
from spinf.protocol.templates import parse_template
from spinf.protocol.types import MEDIA_KINDS, Generate, InputSpec, MediaPart, QuerySpec, ScoreRequest, Slot
from spinf.settings import Features, Limits

MAX_SEARCHED_TOKENS = 64
_EXTRACTION_FIELDS = ("max_tokens", "top_k", "calibration", "generate")
FEATURE_KEYS = ("media", "extraction", "generation")  # a trusted caller's features (§4.11)
IGNORED_FIELD = "ignored_field"  # the §5.6 warning code of a trusted limits or features key that is ignored
_DIGITS = re.compile(r"[0-9]+")


class PackedCall(Protocol):
    """What step 10 makes of a call that names packs: the packs used, and the merged ``scoring`` and wrapped
    ``inputs`` (raw JSON) that the later steps validate in place of the body's (`spinf.packs.calls.PackCall`)."""

    uses: tuple
    scoring: dict
    inputs: list
    own_queries: int  # how many of the merged scoring.queries are the caller's; the packs' follow


class PackStep(Protocol):
    """Step 10 of §4.12 as the packs run it (`spinf.packs.calls.PackStep`): the call's pack references checked
    against a pack catalog; None when the call names no pack. The parser imports no packs: its caller hands it this."""

    def __call__(self, scoring: dict, inputs: list, *, messages_form: bool) -> PackedCall | None: ...


def body_has_media(body: object) -> bool:
    """Whether a raw body (checked or not) has a content part of a media type anywhere in its messages: the
    server decodes such a call in a worker thread before the engine loop takes it. A quick look, no checks."""
    if not isinstance(body, dict):
        return False
    messages = [body.get("messages")]
    inputs = body.get("inputs")
    if isinstance(inputs, list):
        messages += [item.get("messages") for item in inputs if isinstance(item, dict)]
    for listed in messages:
        for message in listed if isinstance(listed, list) else ():
            content = message.get("content") if isinstance(message, dict) else None
            for part in content if isinstance(content, list) else ():
                kind = part.get("type") if isinstance(part, dict) else None
                if isinstance(kind, str) and kind in MEDIA_KINDS:
                    return True
    return False


# A JSON escape of a UTF-16 surrogate; only when one occurs is the decoded value searched for a lone surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_DEFAULT_LIMITS = Limits()  # frozen, so one shared default is safe
_DEFAULT_FEATURES = Features()


def decode_json_body(raw: bytes) -> object:
    """The JSON value of a request body (§2.1); 400 ``invalid_json`` when it is empty, not JSON or not decodable.

    The encoding (UTF-8, -16 or -32, with or without a BOM) is detected as `json.loads` detects it on bytes. NaN
    and infinities (literals, or numbers too large for a float) and lone UTF-16 surrogates are refused too: the
    first cannot be written back out as JSON, the second cannot be tokenised.
    """
    if not raw:
        raise bad_request("invalid_json", None, "the request body is empty")
    try:
        text = raw.decode(json.detect_encoding(raw))
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
        if _SURROGATE_ESCAPE.search(text):
            json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (ValueError, RecursionError) as e:  # UnicodeError and JSONDecodeError are ValueErrors
        reason = "it is nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise bad_request("invalid_json", None, f"the request body is not valid JSON: {reason}") from e
    return value


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text} is out of range")
    return value


def parse_score_request(
    body: object,
    *,
    chat: bool = False,
    served_names: Collection[str] | None = None,
    model_media: frozenset[str] = frozenset(),
    limits: Limits = _DEFAULT_LIMITS,
    features: Features = _DEFAULT_FEATURES,
    trusted: bool = False,
    packs: PackStep | None = None,
) -> ScoreRequest:
    """Validate a decoded ``/v1/score`` (``chat=True``: chat route) body and return the typed request.

    ``served_names`` are the served model's names (None skips the check); ``model_media`` the media kinds the model
    can read; ``limits`` and ``features`` the server's, narrowed by a trusted caller's overrides (§4.11) and
    returned on the request as the call's effective values. Untrusted callers' ``limits``/``features`` are ignored.
    ``packs`` runs step 10 (`PackStep`); None: packs are off.
    """
    if not isinstance(body, dict):
        raise _invalid("body", "the request body must be a JSON object")
    messages, raw_inputs = body.get("messages"), body.get("inputs")
    if (messages is None) == (raw_inputs is None):
        raise _invalid("messages", "send exactly one of messages and inputs")
    if chat and body.get("scoring") is None:
        raise bad_request("scoring_required", "scoring", "the chat route needs scoring; the server does not chat")
    model = _model(body, served_names)
    endpoint = _endpoint(body)
    warnings: list[dict[str, str]] = []  # §5.6: the trusted keys ignored
    if trusted:
        limits = _limits(body, limits, warnings)
        features = _features(body, features, warnings)
    scoring = body.get("scoring", {})
    if not isinstance(scoring, dict):
        raise _invalid("scoring", "scoring must be an object")
    shared = scoring.get("queries", [])
    if not isinstance(shared, list):
        raise _invalid("scoring.queries", "scoring.queries must be a list of queries")
    if messages is not None:
        raw_inputs = [{"id": "0", "messages": messages}]  # the messages form (§4.1): params then read inputs.0...
    elif not isinstance(raw_inputs, list) or not raw_inputs:
        raise _invalid("inputs", "inputs must be a non-empty list of inputs")
    pack_call = _check_packs(scoring, raw_inputs, packs, messages is not None)
    if pack_call is not None:
        scoring, raw_inputs = pack_call.scoring, pack_call.inputs
    check_scoring(scoring)
    for i, raw in enumerate(raw_inputs):
        check_input(raw, f"inputs.{i}")
    for i, raw in enumerate(raw_inputs):
        _check_media_gates(raw["messages"], f"inputs.{i}", model_media, features)
    shared = scoring.get("queries", [])  # the packs' queries follow the caller's own
    own_count = len(shared) if pack_call is None else pack_call.own_queries
    queries = tuple(
        _query(q, f"scoring.queries.{k}", features, pack=q["group"] if k >= own_count else None)
        for k, q in enumerate(shared)
    )
    own = [
        tuple(_query(q, f"inputs.{i}.queries.{k}", features) for k, q in enumerate(raw.get("queries", [])))
        for i, raw in enumerate(raw_inputs)
    ]
    _check_unique([q.id for q in queries], "scoring.queries", "shared query id")
    _check_unique([raw["id"] for raw in raw_inputs], "inputs", "input id")
    return ScoreRequest(
        inputs=tuple(_input(raw, f"inputs.{i}", own[i]) for i, raw in enumerate(raw_inputs)),
        queries=queries,
        empty_floor=scoring.get("empty_floor", True),
        case_insensitive=scoring.get("case_insensitive", True),
        model=model,
        endpoint=endpoint,
        messages_form=messages is not None,
        limits=limits,
        features=features,
        packs=() if pack_call is None else pack_call.uses,
        warnings=tuple(warnings),
    )


# Steps 4-6 and 10: the top-level fields checked before the schema.


def _model(body: dict, served_names: Collection[str] | None) -> str | None:
    if "model" not in body:
        return None
    model = body["model"]
    MODEL.check(model, "model")
    if served_names is not None and model.casefold() not in {name.casefold() for name in served_names}:
        # each name once: the served name is often the manifest id too, and names compare without case
        distinct: dict[str, str] = {}
        for name in served_names:
            distinct.setdefault(name.casefold(), name)
        served = ", ".join(repr(name) for name in distinct.values())
        raise bad_request("model_not_served", "model", f"model {model!r} is not served here; its names are {served}")
    return model


def _endpoint(body: dict) -> str | None:
    if "endpoint" not in body:
        return None
    ENDPOINT.check(body["endpoint"], "endpoint")
    return body["endpoint"]


def _limits(body: dict, server: Limits, warnings: list[dict[str, str]]) -> Limits:
    """A trusted caller's limits: each given key capped by the server's value; keys left out keep it (D4).

    As the reference reads them: a key that is not a limit is ignored (with a warning here), and a string of
    ASCII digits is its integer (a front end that sends ``"8192"``). Any other value must pass the server
    setting's own validator."""
    if "limits" not in body:
        return server
    given = body["limits"]
    if not isinstance(given, dict):
        raise _invalid("limits", "limits must be an object")
    changes = {}
    for key, value in given.items():
        if key not in Limits.keys():
            warnings.append(_ignored(f"limits.{key}", f"the limits are {', '.join(Limits.keys())}"))
            continue
        value = _limit_value(value, f"limits.{key}")
        try:
            attrs.evolve(server, **{key: value})  # the server setting's own validator
        except ValueError as e:
            raise _invalid(f"limits.{key}", str(e)) from e
        changes[key] = min(value, getattr(server, key))
    return attrs.evolve(server, **changes)


def _limit_value(value: object, param: str) -> object:
    """A limit as sent, with a string of ASCII digits read as its integer (not signs, spaces, ``_`` or other
    scripts' digits, which `int` would take too); anything else unchanged, for the setting's validator."""
    if not (isinstance(value, str) and _DIGITS.fullmatch(value)):
        return value
    try:
        return int(value)
    except ValueError as e:  # longer than Python reads (4,300 digits)
        raise _invalid(param, f"{param} has {len(value)} digits; too many to read") from e


def _ignored(param: str, known: str) -> dict[str, str]:
    """The §5.6 warning for a trusted key the parser ignored."""
    message = f"{param} is not a key this server knows, so it was ignored; {known}"
    return {"code": IGNORED_FIELD, "message": message, "param": param}


def _features(body: dict, server: Features, warnings: list[dict[str, str]]) -> Features:
    """A trusted caller's features, capped by the server's (§4.11); keys left out keep the server's value, and
    another key is ignored with a warning (the reference ignores it silently)."""
    if "features" not in body:
        return server
    given = body["features"]
    if not isinstance(given, dict):
        raise _invalid("features", "features must be an object")
    for key in given:
        if key not in FEATURE_KEYS:
            warnings.append(_ignored(f"features.{key}", f"the features are {', '.join(FEATURE_KEYS)}"))
    media = given.get("media", [])
    if not isinstance(media, list) or not all(isinstance(kind, str) for kind in media):
        raise _invalid("features.media", "features.media must be a list of media kinds")
    for key in ("extraction", "generation"):
        if not isinstance(given.get(key, True), bool):
            raise _invalid(f"features.{key}", f"features.{key} must be true or false")
    extraction = server.extraction and given.get("extraction", True)
    return Features(
        media=server.media & frozenset(media) if "media" in given else server.media,
        extraction=extraction,
        generation=extraction and server.generation and given.get("generation", True),
        extraction_note=server.extraction_note,
    )


def _check_packs(scoring: dict, raw_inputs: list, step: PackStep | None, messages_form: bool) -> PackedCall | None:
    """Step 10: the call's pack references by ``step``, the packs' own (`spinf.packs.calls.PackStep` over the
    catalog: the lookups, the call-level rules, the reserved group, the context wrapping, the pack media check,
    ``api.md`` §4.10). None when the call names no pack. With packs off (no step) the references are checked and
    the first is an unknown pack."""
    if step is not None:
        return step(scoring, raw_inputs, messages_form=messages_form)
    refuse_packs_off(check_references(scoring))
    return None


# Steps 12-13 and what follows them: feature gates, typed queries, unique ids, content.


def _check_media_gates(messages: list, path: str, model_media: frozenset[str], features: Features) -> None:
    kinds = {
        MEDIA_KINDS[part["type"]]
        for message in messages
        if isinstance(message["content"], list)
        for part in message["content"]
        if part["type"] in MEDIA_KINDS
    }
    for kind in sorted(kinds):
        if kind not in model_media:
            raise bad_request("media_not_supported", f"{path}.messages", f"the served model cannot read {kind}")
        if kind not in features.media:
            raise bad_request("media_disabled", f"{path}.messages", f"{kind} input is switched off on this server")


def _query(raw: dict, path: str, features: Features, *, pack: str | None = None) -> QuerySpec:
    """Step 13 for one schema-checked query: its template, the slot rules of §4.5, the feature gates. ``pack``: the
    group of the pack a merged pack query came from."""
    template = parse_template(raw["template"], path)
    generate = _generate_spec(raw.get("generate"))
    _check_slot_fields(raw, template.slot, generate is not None, path)
    if template.slot is not Slot.SCORE and not features.extraction:
        why = features.extraction_note or "extraction slots are switched off"
        raise bad_request("extraction_disabled", f"{path}.template", why)
    if generate is not None and not features.generation:
        raise bad_request("generation_disabled", f"{path}.generate", "generation is switched off")
    options, combinations, values = raw.get("options"), raw.get("combinations"), raw.get("values")
    calibration = raw.get("calibration")
    return QuerySpec(
        path=path,
        id=raw["id"],
        template=template,
        options=None if options is None else tuple(options),
        combinations=tuple(combinations) if isinstance(combinations, list) else combinations,
        values=None if values is None else {name: tuple(v) for name, v in values.items()},
        empty_floor=raw.get("empty_floor"),
        group=raw.get("group"),
        max_tokens=raw.get("max_tokens"),
        top_k=raw.get("top_k"),
        calibration=None if calibration is None else (float(calibration.get("a", 1)), float(calibration.get("b", 0))),
        generate=generate,
        pack=pack,
    )


def _generate_spec(value: bool | dict | None) -> Generate | None:
    """The typed ``generate``: None when not requested (absent, null or false); ``true`` and ``{}`` are greedy."""
    if value is None or value is False:
        return None
    given = value if isinstance(value, dict) else {}
    temperature = float(given.get("temperature", 0.0))
    return Generate(
        temperature=temperature,
        top_p=float(given.get("top_p", 1.0)),
        top_k=given.get("top_k", 40 if temperature > 0 else 1),
        seed=given.get("seed", 0),
        n=given.get("n", 1),
    )


def _check_slot_fields(raw: dict, slot: Slot, generating: bool, path: str) -> None:
    """The §4.5 rules on which fields go with which slot (given = present and not null)."""
    if slot is Slot.SCORE:
        given = [key for key in _EXTRACTION_FIELDS if raw.get(key) is not None]
        if given:
            raise _invalid(path, f"{', '.join(given)} apply only to extraction slots, not to a {{?}} query")
        return
    if raw.get("options") is not None:
        raise _invalid(f"{path}.options", "an extraction slot takes no options, not even []")
    if slot is not Slot.TEXT and raw.get("generate") is not None:
        raise _invalid(f"{path}.generate", "generate applies only to {*} slots")
    if generating and (raw.get("top_k") is not None or raw.get("calibration") is not None):
        raise _invalid(path, "top_k and calibration apply to searched slots; they cannot go with generate")
    if not generating and raw.get("max_tokens", 0) > MAX_SEARCHED_TOKENS:
        raise _invalid(path, f"max_tokens above {MAX_SEARCHED_TOKENS} needs generate")


def _check_unique(ids: list[str], prefix: str, what: str) -> None:
    seen = set()
    for k, id_ in enumerate(ids):
        if id_ in seen:
            raise bad_request("duplicate_id", f"{prefix}.{k}.id", f"{what} {id_!r} appears more than once")
        seen.add(id_)


def _input(raw: dict, path: str, queries: tuple[QuerySpec, ...]) -> InputSpec:
    query_ids = raw.get("query_ids")
    return InputSpec(
        path=path,
        id=raw["id"],
        segments=_segments(raw["messages"], path),
        query_ids=None if query_ids is None else tuple(query_ids),
        queries=queries,
        parameters=raw.get("parameters"),
    )


def _segments(messages: list, path: str) -> tuple[str | MediaPart, ...]:
    """One input's content (§4.3): messages joined by a blank line, images first, text runs merged."""
    runs: list[str | MediaPart] = []
    for m, message in enumerate(messages):
        if m:
            runs.append("\n\n")
        content = message["content"]
        if isinstance(content, str):
            runs.append(content)
        else:
            runs.extend(_part_segment(part, f"{path}.messages.{m}.content.{k}") for k, part in enumerate(content))
    segments: list[str | MediaPart] = [run for run in runs if _is_image(run)]
    for run in runs:
        if _is_image(run) or run == "":
            continue
        if isinstance(run, str) and segments and isinstance(segments[-1], str):
            segments[-1] += run
        else:
            segments.append(run)
    return tuple(segments)


def _is_image(run: str | MediaPart) -> bool:
    return isinstance(run, MediaPart) and run.kind == "image"


def _part_segment(part: dict, path: str) -> str | MediaPart:
    kind = part["type"]
    if kind not in PART_TYPES:
        raise bad_request("unsupported_content", path, f"unknown part type {kind!r}; the types are {PART_TYPES}")
    payload = part.get(kind)
    if payload is None:
        raise bad_request("unsupported_content", path, f"a {kind!r} part needs its {kind!r} payload")
    if kind == "text":
        return payload
    # The media issue decodes and checks the payload; a non-object one is already bad media data.
    if not isinstance(payload, dict):
        raise bad_request("invalid_media", path, f"the {kind!r} payload must be an object")
    return MediaPart(kind=MEDIA_KINDS[kind], path=path, payload=payload)
