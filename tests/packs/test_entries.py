"""The bodies of ``GET /v1/packs`` and ``GET /v1/packs/{id}`` (api.md §8) from a catalog built on a folder: the
fields of an entry and their fallbacks, versions in catalog order with the default, the coming-soon rows, packs off,
and the 404s of §8.2."""

from __future__ import annotations

from spinf.packs.catalog import UNKNOWN_PACK, UNKNOWN_PACK_VERSION, Refused, build_catalog
from spinf.packs.entries import listing, pack_file
from tests.packs.folders import entry, manifest, tone, version, write

PARAMETERS = {
    "brand": {"label": "Brand", "required": True},
    "site": {"required": False, "default": "shop", "description": "where it was posted"},
}


def tone_pack(v: str) -> dict:
    pack = tone(version=v, parameters=PARAMETERS)
    pack["contexts"] = {"chat": "A chat message about {brand}:\n{X}", "review": "A review:\n{X}\n"}
    del pack["categories"]["targeted"]["label"]  # the label falls back to the id
    return pack


def catalog_of(tmp_path, *extra_entries: dict):
    write(tmp_path, "packs/tone/1.0.0.json", tone_pack("1.0.0"))
    write(tmp_path, "packs/tone/1.1.0.json", tone_pack("1.1.0"))
    listed = entry(
        "acme/tone",
        version("1.1.0", "packs/tone/1.1.0.json", status="coming_soon"),
        version("1.0.0"),
        description="Rudeness and targeting.",
        tags=["tone"],
        parameters=["brand", "site"],
    )
    write(tmp_path, "prompt-packs.json", manifest(listed, *extra_entries))
    catalog = build_catalog([str(tmp_path)], official_on=False)
    assert catalog.errors == ()
    return catalog


def test_an_entry_describes_the_default_version_with_the_fields_of_8_1(tmp_path):
    body = listing(catalog_of(tmp_path))
    assert body["sources"] == [f"local:{tmp_path}"]
    assert body["packs"] == [
        {
            "id": "acme/tone",
            "name": "Tone",
            "status": "available",
            "version": "1.0.0",  # the first available version in manifest order
            "versions": ["1.1.0", "1.0.0"],
            "description": "Rudeness and targeting.",
            "tags": ["tone"],
            "model": "spinf/gemma-4-12b-fp8",
            "media": ["text"],
            "source": f"local:{tmp_path}",
            "parameters": [
                {"id": "brand", "label": "Brand", "required": True},
                {"id": "site", "description": "where it was posted", "required": False, "default": "shop"},
            ],
            "contexts": [
                {"id": "chat", "template": "A chat message about {brand}:\n{X}"},
                {"id": "review", "template": "A review:\n{X}\n"},
            ],
            "categories": [
                {"id": "rudeness", "label": "Rudeness", "threshold": 0.6},
                {"id": "targeted", "label": "targeted", "threshold": None},
            ],
            "decision": {
                "mode": "micro_layer",
                "modes": ["max", "per_category", "micro_layer"],
                "fallback": "max",
                "max_threshold": 0.5,
                "critical": ["rudeness"],
            },
            "queries": 3,
            "prompts": 4,
        }
    ]


def test_without_max_or_fallback_the_decision_has_per_category_and_a_null_max_threshold(tmp_path):
    pack = tone_pack("1.0.0")
    pack["decision"] = {key: pack["decision"][key] for key in ("mode", "micro_layer")}
    write(tmp_path, "tone.json", pack)  # no manifest: the name falls back to the id
    [described] = listing(build_catalog([str(tmp_path)], official_on=False))["packs"]
    assert described["decision"] == {
        "mode": "micro_layer",
        "modes": ["per_category", "micro_layer"],
        "fallback": "per_category",
        "max_threshold": None,
        "critical": [],
    }
    assert (described["name"], described["description"], described["tags"]) == ("acme/tone", "", [])


def test_an_id_listed_only_as_coming_soon_gets_a_short_row_after_the_enabled_ids(tmp_path):
    soon = entry(
        "acme/soon",
        version("2.0.0", "packs/soon/2.0.0.json", status="coming_soon", model="spinf/b"),
        version("1.0.0", "packs/soon/1.0.0.json", status="coming_soon", model="spinf/a"),
        media=["text", "image"],
    )
    one_model = entry("acme/later", version("1.0.0", "packs/later.json", status="coming_soon"), name="")
    rows = listing(catalog_of(tmp_path, soon, one_model))["packs"]
    assert [row["id"] for row in rows] == ["acme/tone", "acme/soon", "acme/later"]
    assert rows[1] == {
        "id": "acme/soon",
        "name": "Tone",
        "status": "coming_soon",
        "version": None,
        "versions": [],
        "description": "",
        "tags": [],
        "model": ["spinf/a", "spinf/b"],
        "media": ["text", "image"],
    }
    assert (rows[2]["name"], rows[2]["model"]) == ("acme/later", "spinf/gemma-4-12b-fp8")


def test_pack_file_gives_the_file_unchanged_the_default_without_version_and_the_404s(tmp_path):
    catalog = catalog_of(tmp_path)
    assert pack_file(catalog, "acme/tone", None) == tone_pack("1.0.0")
    assert pack_file(catalog, "acme/tone", "1.1.0") == tone_pack("1.1.0")  # coming soon: described, not scored
    assert pack_file(catalog, "acme/tone", "9") == Refused(
        UNKNOWN_PACK_VERSION, "version", "the pack acme/tone has no version '9' (versions: 1.1.0, 1.0.0)"
    )
    for pack_id in ("acme/none", ""):
        refused = pack_file(catalog, pack_id, None)
        assert (refused.code, refused.at) == (UNKNOWN_PACK, "id") and "GET /v1/packs" in refused.message


def test_with_packs_off_both_lists_are_empty_and_every_id_is_unknown():
    assert listing(None) == {"packs": [], "sources": []}
    assert pack_file(None, "acme/tone", None).code == UNKNOWN_PACK
