"""What the server knows of the engine without importing it: the protocols its actors call, and the facts it reads.

The engine itself is never shared: it travels over channels (loader -> warm-up -> packer) and only the executor
thread runs its torch work. `ServedEngine` and `ServedLoop` state what the actors use of it, so nothing in
`spinf.server` imports the engine or torch; the web layer knows it only through `EngineFacts`, a frozen snapshot
the loader takes in the executor thread.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Protocol

import attrs

from spinf.settings import Features


class ServedLoop(Protocol):
    """What the warm-up reads of the engine loop (`spinf.engine.loop.EngineLoop`) between its steps."""

    pass_log: list[tuple[int, float]]  # (tokens, busy seconds) per pass since the log was last taken


class WarmupStep(Protocol):
    """One warm-up step (`spinf.engine.warm.Step`): call it to run it; ``part`` is the ``boot`` field its seconds
    count in (``warmup_s`` or ``warmup_extract_s``)."""

    part: str

    def __call__(self) -> object: ...


class ServedEngine(Protocol):
    """What the server's loader and warm-up use of `spinf.engine.Engine` (this module never imports the engine)."""

    batch_invariant: bool
    degraded: str | None  # device memory not freed after an out-of-memory error (api spec §3.2)
    weights: str
    loop: ServedLoop
    features: Features | None  # its media kinds and switches (None: not said, as a test's fake engine)

    def info(self) -> dict: ...

    def idle_gib(self) -> float: ...

    def settle(self) -> None: ...  # once warm: the collector stops traversing the model (spinf.engine.hostgc)

    def warmup_steps(self, mode: str) -> list[WarmupStep]: ...

    def score(self, body: object) -> dict: ...


@attrs.frozen
class EngineFacts:
    """What the web layer knows of the loaded engine: ``/v0/info``'s engine object (api spec §3.6), whether it is
    batch-invariant (``/v1/models``) and where its weights came from (``boot.weights``)."""

    info: Mapping[str, object] = attrs.field(converter=lambda info: types.MappingProxyType(dict(info)))
    batch_invariant: bool
    weights: str
    media: frozenset[str] | None = None  # the media kinds it reads (its embedders, --media); None: not said
    # whether its extraction and generation are on (the switches and what its stack runs); None: not said
    extraction: bool | None = None
    generation: bool | None = None

    @classmethod
    def of(cls, engine: ServedEngine) -> EngineFacts:
        """The facts of ``engine``; call it in the executor thread (``engine.info()`` reads torch)."""
        features = engine.features
        if features is None:
            return cls(engine.info(), bool(engine.batch_invariant), engine.weights)
        media, extraction, generation = frozenset(features.media), features.extraction, features.generation
        return cls(engine.info(), bool(engine.batch_invariant), engine.weights, media, extraction, generation)
