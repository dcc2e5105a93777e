"""The ``/v1/models`` entry (api spec §7) that the app's model routes answer with, built from the layered settings.

`ModelsEntry` is what the routes read: the entry for the lifecycle now, OpenAI's entry beside it, and the names the
model answers to. `ModelEntry` is the served model's (`models_entry_for` builds it once, at the start); the tests'
fake entries stand in for it behind the same protocol.
"""

from __future__ import annotations

import time
from typing import Protocol

import attrs

from spinf.server.lifecycle import Lifecycle


class ModelsEntry(Protocol):
    """What the web layer reads of the served model (`ModelEntry`): the ``/v1/models`` entry of api
    spec §7 for the lifecycle now, and OpenAI's entry beside it, which ``GET /v1/models/{id}`` answers for a name
    the model ``answers_to`` (its id or an alias, case-insensitively, as requests name it: §9.6)."""

    def __call__(self, lifecycle: Lifecycle) -> dict: ...

    def openai(self) -> dict: ...

    def answers_to(self, name: str) -> bool: ...


@attrs.frozen
class ModelEntry:
    """The one ``/v1/models`` entry (api spec §7): the model's own fields, its status, limits and features.

    ``extraction`` and ``generation`` are the server's switches. A feature is on when its switch is and the model's
    capabilities name it; generation needs extraction too (``--no-extraction`` reports both off), and
    ``capabilities`` lists the model's minus what the switches turn off. ``media`` (in the entry and its features)
    is the kinds the model reads that ``--media`` keeps, in the manifest's order: before the engine is loaded the
    manifest's kinds, then those the engine reads (its checkpoint may lack an embedder the manifest names).

    Beside it, OpenAI's entry (`openai`) for the openai SDK's ``models.list()`` and ``models.retrieve()``. Its
    ``created`` is when this entry was made, at the server's start: no file we hold says when the model was made
    (manifests carry no date; a checkpoint's file times are when it was downloaded or generated), and a time fixed
    for the process keeps the list and every retrieve in agreement. ``owned_by`` is the namespace of the name the
    model is published under, the catalog's (``spinf``) or the Hub repo's organisation; ``spinf-serve`` for a local
    folder, whose owner nothing records.
    """

    resolved: object  # spinf.catalog.ResolvedModel
    served_model: str
    limits: dict
    extraction: bool = True
    generation: bool = True
    media: frozenset[str] = frozenset()  # the server's --media
    created: int = attrs.field(factory=lambda: int(time.time()))  # Unix seconds: the server's start

    def __call__(self, lifecycle: Lifecycle) -> dict:
        body = self.resolved.listing()
        body["id"] = self.id
        status = "error" if lifecycle.error else "available" if lifecycle.is_warm else "loading"
        engine = lifecycle.engine
        capabilities = self.capabilities(engine)
        reads = engine.media if engine and engine.media is not None else self.media
        media = [kind for kind in self.resolved.media if kind in reads]
        limits = dict(self.limits)
        manifest = self.resolved.manifest
        if manifest is not None and manifest.head == "readout":  # api spec §9.4: the decider forces 0
            limits["max_extractions_per_input"] = 0
        body.update(status=status, capabilities=capabilities, media=media, limits=limits)
        body["features"] = {
            "media": list(media),
            "extraction": "extract" in capabilities,
            "generation": "generate" in capabilities,
        }
        # ours, beyond §7: a checkpoint outside the catalog carries no batch-invariance guarantee (§9.6, D2)
        body["batch_invariant"] = engine.batch_invariant if engine else self.resolved.batch_invariant
        return dict(sorted(body.items(), key=lambda item: _MODEL_KEYS.index(item[0])))

    @property
    def id(self) -> str:
        return self.served_model or self.resolved.served_name

    @property
    def names(self) -> tuple[str, ...]:
        """The names a request's ``model`` may give (api spec §9.6): the served name, the manifest id, its aliases."""
        manifest = self.resolved.manifest
        return (self.id, *((manifest.id,) if manifest is not None else ()), *self.resolved.aliases)

    def answers_to(self, name: str) -> bool:
        """Whether ``name`` is one of the model's `names`, compared case-insensitively, as a request's ``model`` is."""
        return name.casefold() in {known.casefold() for known in self.names}

    def openai(self) -> dict:
        """OpenAI's model object for the served model (api spec §7, "OpenAI's shape beside it")."""
        published = self.resolved.manifest.id if self.resolved.manifest is not None else self.resolved.repo_id
        owner = published.split("/")[0] if published and "/" in published else "spinf-serve"
        return {"id": self.id, "object": "model", "created": self.created, "owned_by": owner}

    def capabilities(self, engine=None) -> list[str]:
        """The model's capabilities (all three without a manifest) minus what the switches turn off, and once the
        engine is loaded (its `EngineFacts`) minus what its stack does not run (the Qwen stack's extraction)."""
        extract = self.extraction and "extract" in self.resolved.capabilities
        if engine is not None and engine.extraction is not None:
            extract = extract and engine.extraction
        off = set() if extract else {"extract", "generate"}
        if not self.generation or (engine is not None and engine.generation is False):
            off.add("generate")
        return [name for name in self.resolved.capabilities if name not in off]


def models_entry_for(resolved, settings) -> ModelEntry:
    """The ``/v1/models`` entry of ``resolved`` as the layered ``settings`` serve it."""
    features = settings.features
    return ModelEntry(
        resolved,
        settings.engine.served_model,
        settings.limits.as_dict(),
        extraction=features.extraction,
        generation=features.generation,
        media=frozenset(features.media),
    )


_MODEL_KEYS = ["id", "name", "status", "base_model", "aliases", "family", "capabilities", "media", "limits"]
_MODEL_KEYS += ["features", "image", "batch_invariant"]
