"""Settings: the request limits and feature switches a deployment chooses.

For now this holds the two plain objects the engine and the request parser need (`Limits`, `Features`); the
layered settings tree (flags > ``SPINF_*`` > TOML > manifest > defaults) grows here with the settings issue.
"""

from __future__ import annotations

import attrs

MEDIA_KINDS = ("image", "audio", "video")


def _positive(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{attribute.name} must be an integer greater than 0, got {value!r}")


def _non_negative(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{attribute.name} must be an integer of at least 0, got {value!r}")


@attrs.frozen
class Limits:
    """The ten request limits of spec §9.4, with the hosted service's defaults."""

    max_content_tokens: int = attrs.field(default=4096, validator=_positive)
    max_query_tokens: int = attrs.field(default=256, validator=_positive)
    max_prompts_per_input: int = attrs.field(default=10_000, validator=_positive)
    max_processed_tokens: int = attrs.field(default=2_000_000, validator=_positive)
    max_extractions_per_input: int = attrs.field(default=10, validator=_non_negative)
    max_options: int = attrs.field(default=1000, validator=_positive)
    max_option_tokens: int = attrs.field(default=5, validator=_positive)
    max_frames: int = attrs.field(default=1024, validator=_positive)
    max_audio_seconds: int = attrs.field(default=600, validator=_positive)
    max_image_pixels: int = attrs.field(default=50_000_000, validator=_positive)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(a.name for a in attrs.fields(cls))

    def as_dict(self) -> dict[str, int]:
        return attrs.asdict(self)


@attrs.frozen
class Features:
    """What a server (or a trusted call) switches on: media kinds, extraction, generation."""

    media: frozenset[str] = frozenset(MEDIA_KINDS)
    extraction: bool = True
    generation: bool = True
