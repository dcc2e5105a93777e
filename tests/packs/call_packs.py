"""A pack repository for the tiny model, for the tests of packs in requests (``api.md`` §4.10, packs spec §5).

Every pack is a variant of ``fixtures/packs`` (``tiny/moderation``: a micro-layer, answers from log-probs) or of the
spec's minimal and tone packs with the model set to the tiny one. Each exists for one rule: a required parameter, a
case-insensitive rule, a broken lock, a ``views`` category without views, a version coming soon, a
version listed for another model.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from spinf.packs.catalog import Catalog, build_catalog
from tests.packs.folders import MINIMAL, TONE, write

ROOT = Path(__file__).resolve().parents[2]
MODERATION = json.loads((ROOT / "fixtures" / "packs" / "moderation" / "0.1.0.json").read_text())
TINY = "spinf/tiny-gemma4"
AI_CONTEXT = MODERATION["contexts"]["ai"]


def _variant(base: dict, pack_id: str, version: str = "1.0.0", **changes: object) -> dict:
    raw = copy.deepcopy(base)
    raw.update({"pack": pack_id, "version": version, "model": TINY, **changes})
    return raw


def support(pack_id: str = "tiny/support", **changes: object) -> dict:
    """The minimal pack in the moderation pack's ``ai`` context (so the two can share a call)."""
    return _variant(MINIMAL, pack_id, contexts={"ai": AI_CONTEXT}, **changes)


def packs() -> dict[str, dict]:
    """Every pack of the repository by file name (``<name>.json``)."""
    unlocked = copy.deepcopy(MODERATION)
    unlocked.update(pack="tiny/unlocked")
    unlocked["reads"][0]["mean"] = -0.9  # the lock covers the reads: it no longer matches
    broken = support("tiny/broken")
    broken["categories"]["off_topic"]["aggregate"] = "views"  # and no read has a view: evaluation fails
    loose = support("tiny/loose")
    loose["scoring"] = {**loose["scoring"], "case_insensitive": True}
    loose["scoring"]["queries"] = [dict(loose["scoring"]["queries"][0], id="on_topic_loose")]
    loose["reads"] = [dict(loose["reads"][0], query="on_topic_loose")]
    return {
        "moderation": copy.deepcopy(MODERATION),
        "moderation-0.2.0": _variant(MODERATION, "tiny/moderation", "0.2.0"),
        "support": support(),
        "twin": support("tiny/twin"),  # the same query id as tiny/support
        "brand": _variant(
            MINIMAL,
            "tiny/brand",
            contexts={"support": "A message sent to {brand}'s support chat ({tier}):\n{X}", "plain": "{X}"},
            parameters={"brand": {"label": "Brand"}, "tier": {"required": False, "default": "free"}},
        ),
        "tone": _variant(TONE, "tiny/tone"),
        "loose": loose,
        "unlocked": unlocked,
        "broken": broken,
        "far": _variant(MINIMAL, "tiny/far", model="other/model"),
    }


def _listed(name: str, raw: dict, **fields: object) -> dict:
    return {"version": raw["version"], "file": f"packs/{name}.json", "model": raw["model"], **fields}


def repository(folder: Path) -> Path:
    """The repository with its manifest, written into ``folder``; ``tiny/moderation`` 0.2.0 is coming soon."""
    entries: dict[str, dict] = {}
    for name, raw in packs().items():
        fields = {"status": "coming_soon"} if raw["version"] == "0.2.0" else {}
        parameters = sorted(raw.get("parameters", {}))
        entry = entries.setdefault(
            raw["pack"], {"id": raw["pack"], "name": raw["pack"], "parameters": parameters, "versions": []}
        )
        entry["versions"].append(_listed(name, raw, **fields))
        write(folder, f"packs/{name}.json", raw)
    manifest = {"format": 1, "namespace": "tiny", "name": "Call tests", "packs": list(entries.values())}
    write(folder, "prompt-packs.json", manifest)
    return folder


def catalog(folder: Path) -> Catalog:
    built = build_catalog([str(repository(folder))], model=TINY, official_on=False)
    if built.errors:
        raise AssertionError(built.errors)
    return built
