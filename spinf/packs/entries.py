"""The catalog as ``GET /v1/packs`` and ``GET /v1/packs/{id}`` answer it (``api.md`` §8), from one snapshot.

`listing` gives the body of ``GET /v1/packs``: one entry per enabled id describing its default version, in catalog
order, then a short ``coming_soon`` entry per id some manifest lists with a coming-soon version but that has no
enabled version, then the source labels in processing order. `pack_file` gives a version's pack file JSON
unchanged, or the `Refused` of §8.2 (404 ``unknown_pack`` / ``unknown_pack_version``). With packs off (no catalog)
both lists are empty and every id is unknown. Pure Python: the web layer turns a `Refused` into its error.
"""

from __future__ import annotations

from spinf.packs.catalog import UNKNOWN_PACK, Catalog, PackEntry, Refused
from spinf.packs.manifest import ListedPack

PARAMETER_KEYS = ("label", "description", "required", "default")


def listing(catalog: Catalog | None) -> dict:
    if catalog is None:
        return {"packs": [], "sources": []}
    entries = [_entry(entry) for entry in catalog.packs.values()]
    entries += [
        _coming_soon(listed)
        for pack_id, listed in catalog.manifest_entries.items()
        if pack_id not in catalog.packs and any(v.status == "coming_soon" for v in listed.versions)
    ]
    return {"packs": entries, "sources": list(catalog.sources)}


def pack_file(catalog: Catalog | None, pack_id: str, version: str | None) -> dict | Refused:
    """The pack file of ``pack_id`` at ``version`` (its default when None), as loaded. Unlike a request's pack
    reference (§4.10), an id some manifest lists without an enabled version is ``unknown_pack`` here, and an enabled
    coming-soon version is served: the file describes the pack, nothing is scored."""
    entry = catalog.packs.get(pack_id) if catalog is not None else None
    if entry is None:
        return Refused(UNKNOWN_PACK, "id", f"no pack {pack_id!r} is enabled; GET /v1/packs lists the packs")
    found = entry.version(version)
    return found if isinstance(found, Refused) else found.loaded.pack.raw


def _entry(entry: PackEntry) -> dict:
    default = entry.get(entry.default)
    loaded, pack = default.loaded, default.loaded.pack
    raw = pack.raw
    decision = raw["decision"]
    return {
        "id": entry.id,
        "name": loaded.name or entry.id,
        "status": loaded.status,
        "version": entry.default,
        "versions": [v.version for v in entry.versions],
        "description": loaded.description,
        "tags": list(loaded.tags),
        "model": pack.model,
        "media": list(pack.media),
        "source": default.source,
        "parameters": [
            {"id": name, **{key: spec[key] for key in PARAMETER_KEYS if key in spec}}
            for name, spec in (raw.get("parameters") or {}).items()
        ],
        "contexts": [{"id": name, "template": template} for name, template in pack.contexts],
        "categories": [
            {"id": name, "label": spec.get("label", name), "threshold": spec.get("threshold")}
            for name, spec in raw["categories"].items()
        ],
        "decision": {
            "mode": pack.decision.mode,
            "modes": list(pack.decision.modes),
            "fallback": pack.decision.fallback,
            "max_threshold": pack.decision.max_threshold,
            "critical": list(decision.get("critical") or []),
        },
        "queries": len(pack.queries),
        "prompts": sum(_prompts(query.spec) for query in pack.queries),
    }


def _prompts(query: dict) -> int:
    """Prompts per input of one query as §8.1 counts them: a ``combinations`` list's length, else 1."""
    combinations = query.get("combinations")
    return len(combinations) if isinstance(combinations, list) else 1


def _coming_soon(listed: ListedPack) -> dict:
    models = sorted({v.model for v in listed.versions})
    return {
        "id": listed.id,
        "name": listed.name or listed.id,
        "status": "coming_soon",
        "version": None,
        "versions": [],
        "description": listed.description,
        "tags": list(listed.tags),
        "model": models[0] if len(models) == 1 else models,
        "media": list(listed.media),
    }
