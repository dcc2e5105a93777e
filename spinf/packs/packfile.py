"""A pack file, parsed (packs spec §1): frozen attrs objects built only from a file that validates.

`read_pack_file` refuses a file over 16 MiB before reading it and a file that is not strict JSON (NaN and Infinity
are not JSON), then `parse_pack` validates the value (`spinf.packs.validate`) and, with no problem, builds a
`PackFile`. Nothing here raises on bad input: problems come back collected, each with its JSON path. A `PackFile`
keeps the file's JSON value (``raw``) as loaded, which is what the lock (§1.10) and the evaluator read, and knows
whether its micro-layer's lock matches. A draft (§1.11) may lack the fitted constants: they are then None.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import struct
from pathlib import Path

import attrs

from spinf.packs.lock import lock_of
from spinf.packs.problems import Problem
from spinf.packs.validate import check_pack

MAX_FILE_BYTES = 16 * 2**20


@attrs.frozen
class Parameter:
    name: str
    label: str | None
    description: object
    required: bool
    default: object


@attrs.frozen
class Query:
    """A pack query; ``spec`` is its JSON object exactly as in the file (what the server sends, with a group)."""

    id: str
    options: tuple[str, ...]
    prompts: int
    spec: dict = attrs.field(eq=False, repr=False)


@attrs.frozen
class Read:
    id: str
    query: str
    F: str | None
    kind: str
    sign: int
    option: int | None
    mu: float | tuple[float, ...] | None
    unsafe: tuple[int, ...]
    mean: float | None
    sd: float | None
    category: str
    view: str | None


@attrs.frozen
class Category:
    id: str
    label: str
    platt: tuple[float, float] | None
    threshold: float | None
    normal_quantiles: tuple[tuple[float, ...], tuple[float, ...]] | None
    aggregate: str | None
    requires: tuple[str, ...]
    decides: bool


@attrs.frozen
class MicroLayer:
    inputs: tuple[str, ...]
    weights: tuple[float, ...]
    hidden: int
    lock: str

    @property
    def threshold(self) -> float:
        """The stored threshold: the last float of the weights (§1.9)."""
        return self.weights[-1]


@attrs.frozen
class Decision:
    mode: str
    fallback: str
    max_threshold: float | None
    critical: tuple[str, ...]
    micro_layer: MicroLayer | None
    has_max: bool

    @property
    def modes(self) -> tuple[str, ...]:
        """The modes a call may choose, in the spec's order (§1.9)."""
        return (("max",) if self.has_max else ()) + ("per_category",) + (("micro_layer",) if self.micro_layer else ())


@attrs.frozen
class PackFile:
    id: str
    version: str
    model: str
    media: tuple[str, ...]
    answers: str
    contexts: tuple[tuple[str, str], ...]
    parameters: tuple[Parameter, ...]
    empty_floor: bool
    case_insensitive: bool
    queries: tuple[Query, ...]
    reads: tuple[Read, ...]
    categories: tuple[Category, ...]
    decision: Decision
    lock_matches: bool | None  # None: no micro-layer
    raw: dict = attrs.field(eq=False, repr=False)

    @property
    def namespace(self) -> str:
        return self.id.partition("/")[0]

    @property
    def group(self) -> str:
        """The query group the server runs this pack's queries in (§1.2)."""
        return f"{self.id}@{self.version}"

    @property
    def default_context(self) -> str:
        return self.contexts[0][0]

    @property
    def prompts(self) -> int:
        """Prompts per input as ``packs validate`` counts them (§4.8): ``"all"`` counts 1, an undercount."""
        return sum(query.prompts for query in self.queries)


@attrs.frozen
class Parsed:
    """A pack file's problems, and the `PackFile` when there are none."""

    pack: PackFile | None
    problems: tuple[Problem, ...]


def read_pack_file(path: str | os.PathLike, *, draft: bool = False) -> Parsed:
    """Read, validate and parse the pack file at ``path``."""
    path = Path(path)
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block the read for ever
            return _refused("the file is not a regular file (a FIFO, socket or device)")
        if info.st_size > MAX_FILE_BYTES:
            return _refused(f"the file is larger than 16 MiB ({info.st_size} bytes)")
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        return _refused(f"the file cannot be read: {exc.strerror or exc}")
    except UnicodeDecodeError as exc:
        return _refused(f"the file is not JSON: not UTF-8 ({exc.reason} at byte {exc.start})")
    try:
        raw = loads_strict(text)
    except ValueError as exc:
        return _refused(f"the file is not JSON: {exc}")
    return parse_pack(raw, draft=draft)


def loads_strict(text: str) -> object:
    """``json.loads``, refusing NaN, Infinity and -Infinity (not JSON); raises ValueError."""
    return json.loads(text, parse_constant=_no_constant)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON value")


def _refused(message: str) -> Parsed:
    return Parsed(None, (Problem("", message),))


def parse_pack(raw: object, *, draft: bool = False) -> Parsed:
    """Validate ``raw`` (a JSON value) as a pack file and, if it has no problem, build its `PackFile`."""
    problems = check_pack(raw, draft=draft)
    if problems:
        return Parsed(None, tuple(problems.items))
    return Parsed(_build(raw), ())


def _build(raw: dict) -> PackFile:
    scoring = raw["scoring"]
    decision = _decision(raw["decision"])
    return PackFile(
        id=raw["pack"],
        version=raw["version"],
        model=raw["model"],
        media=tuple(dict.fromkeys(raw.get("media", ["text"]))),
        answers=raw.get("answers", "p"),
        contexts=tuple(raw["contexts"].items()),
        parameters=tuple(_parameter(name, spec) for name, spec in (raw.get("parameters") or {}).items()),
        empty_floor=scoring.get("empty_floor", True),
        case_insensitive=scoring.get("case_insensitive", False),
        queries=tuple(_query(q) for q in scoring["queries"]),
        reads=tuple(_read(r) for r in raw["reads"]),
        categories=tuple(_category(name, spec) for name, spec in raw["categories"].items()),
        decision=decision,
        lock_matches=None if decision.micro_layer is None else decision.micro_layer.lock == lock_of(raw),
        raw=raw,
    )


def _parameter(name: str, spec: dict) -> Parameter:
    return Parameter(name, spec.get("label"), spec.get("description"), spec.get("required", True), spec.get("default"))


def _query(spec: dict) -> Query:
    combinations = spec.get("combinations")
    prompts = len(combinations) if isinstance(combinations, list) else 1
    return Query(spec["id"], tuple(spec["options"]), prompts, spec)


def _read(spec: dict) -> Read:
    mu = spec.get("mu")
    return Read(
        id=spec["id"],
        query=spec["query"],
        F=spec.get("F"),
        kind=spec["kind"],
        sign=spec.get("sign", 1),
        option=spec.get("option"),
        mu=tuple(mu) if isinstance(mu, list) else mu,
        unsafe=tuple(spec.get("unsafe") or ()),
        mean=spec.get("mean"),
        sd=spec.get("sd"),
        category=spec["category"],
        view=spec.get("view"),
    )


def _category(name: str, spec: dict) -> Category:
    quantiles = spec.get("normal_quantiles")
    return Category(
        id=name,
        label=spec["label"] if isinstance(spec.get("label"), str) else name,
        platt=tuple(spec["platt"]) if "platt" in spec else None,
        threshold=spec.get("threshold"),
        normal_quantiles=None if quantiles is None else (tuple(quantiles["levels"]), tuple(quantiles["values"])),
        aggregate=spec.get("aggregate"),
        requires=tuple(spec.get("requires", ())),
        decides=spec.get("decides", True),
    )


def _decision(spec: dict) -> Decision:
    limit = spec.get("max")
    micro = spec.get("micro_layer")
    return Decision(
        mode=spec["mode"],
        fallback=spec.get("fallback", "per_category"),
        max_threshold=limit.get("threshold") if isinstance(limit, dict) else None,
        critical=tuple(spec.get("critical", ())),
        micro_layer=_micro_layer(micro) if micro else None,
        has_max=bool(limit),
    )


def _micro_layer(spec: dict) -> MicroLayer:
    data = base64.b64decode(spec["weights"], validate=True)
    weights = struct.unpack(f"<{len(data) // 4}f", data)
    return MicroLayer(tuple(spec["inputs"]), weights, spec.get("hidden", 0), spec["lock"])
