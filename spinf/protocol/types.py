"""The typed form of a score request, as the parser hands it to the engine.

Everything here is plain data (attrs, frozen). The parser (`spinf.protocol.request`) builds it from the JSON body
after the schema checks of api spec §4.12 steps 1–13; the engine compiler performs the token-level and per-input
checks of §4.7–§4.9 on it, in the spec's order, using the helpers of `spinf.protocol.queries`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import attrs

from spinf.settings import Features, Limits

# The media kind of each non-text content part type (the media gates, and the pack media check of api spec §4.10).
MEDIA_KINDS = {"image_url": "image", "input_audio": "audio", "video": "video"}


class Slot(enum.Enum):
    """The one slot of a template: a scored slot or one of the three extraction slots."""

    SCORE = "?"
    TEXT = "*"
    NUMBER = "n"
    CURRENCY = "$"

    @property
    def kind(self) -> str | None:
        """The response's ``kind`` for extraction slots; None for a scored slot."""
        return {"*": "text", "n": "number", "$": "currency"}.get(self.value)


@attrs.frozen
class Template:
    """A parsed template: literal text and placeholders before the slot, the slot, and stop text after it.

    ``pieces`` alternates freely between literal text (escapes already resolved) and `Placeholder` markers;
    ``names`` lists each placeholder name once, in order of first appearance (the grid order of §4.7).
    """

    text: str
    pieces: tuple[str | Placeholder, ...]
    names: tuple[str, ...]
    slot: Slot
    stop_text: str = ""

    def fill(self, values: Mapping[str, str]) -> str:
        """The filled template text before the slot (values substituted verbatim)."""
        return "".join(values[p.name] if isinstance(p, Placeholder) else p for p in self.pieces)


@attrs.frozen
class Placeholder:
    name: str


@attrs.frozen
class Generate:
    """The object form of ``generate`` with its defaults filled (§4.5)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 1
    seed: int = 0
    n: int = 1


@attrs.frozen
class QuerySpec:
    """One query as sent, typed but not yet checked against limits or the tokenizer.

    ``path`` is the query's param path (``scoring.queries.<k>`` or ``inputs.<i>.queries.<k>``).
    ``combinations`` is None, the string ``"all"``, or a tuple of ``{name: value}`` maps exactly as sent
    (values are strings; keys not yet compared with the template). ``values`` is the ``"all"`` grid as sent.
    ``options`` is None when the key is absent. Extraction fields are None when absent. ``pack`` is the group
    (``<id>@<version>``) of the pack a merged pack query came from (None for the caller's own): pack templates are
    exempt from ``max_query_tokens`` (api spec §4.8).
    """

    path: str
    id: str
    template: Template
    options: tuple[str, ...] | None = None
    combinations: str | tuple[Mapping[str, str], ...] | None = None
    values: Mapping[str, tuple[str, ...]] | None = None
    empty_floor: bool | None = None
    group: str | None = None
    max_tokens: int | None = None
    top_k: int | None = None
    calibration: tuple[float, float] | None = None
    generate: Generate | None = None
    pack: str | None = None

    @property
    def is_scored(self) -> bool:
        return self.template.slot is Slot.SCORE


@attrs.frozen
class MediaPart:
    """A non-text content part (image, audio, video) and its param path; ``decoded`` is what the media decoders made
    of its payload (`spinf.media.items.decode_media`), None until they ran."""

    kind: str
    path: str
    payload: Mapping
    decoded: object = None


@attrs.frozen
class InputSpec:
    """One input: its id, its content as merged segments (text strings and media parts), and its query choice.

    ``segments`` follows api spec §4.3: messages joined with ``"\\n\\n"``, parts concatenated, empty strings
    dropped, adjacent text merged, standalone images moved to the front.
    """

    path: str
    id: str
    segments: tuple[str | MediaPart, ...]
    query_ids: tuple[str, ...] | None = None
    queries: tuple[QuerySpec, ...] = ()
    parameters: Mapping[str, str | int | float | bool] | None = None

    @property
    def text(self) -> str:
        """The content's text, media left out."""
        return "".join(s for s in self.segments if isinstance(s, str))


@attrs.frozen
class ScoreRequest:
    """A parsed ``/v1/score`` (or chat) body with the call's effective limits and features.

    ``packs`` holds the call's checked pack references in reference order (`spinf.packs.calls.PackUse`); their
    queries are already merged into ``queries`` and every input is already wrapped in their context. ``warnings``
    are the parser's own (api spec §5.6): the keys of a trusted caller's ``limits`` and ``features`` that it
    ignored; the response lists them first."""

    inputs: tuple[InputSpec, ...]
    queries: tuple[QuerySpec, ...]
    empty_floor: bool = True
    case_insensitive: bool = True
    model: str | None = None
    endpoint: str | None = None
    messages_form: bool = False
    limits: Limits = Limits()
    features: Features = Features()
    packs: tuple = ()
    warnings: tuple[Mapping[str, str], ...] = ()
