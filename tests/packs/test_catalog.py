"""The pack catalog (packs spec §4.4, §4.5): sources in order, fetch and scan failures, the filter, sorting, the
listed set, and `Catalog.find`'s answers (api.md §4.10)."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import pytest

from spinf.packs.catalog import (
    PACK_NOT_AVAILABLE,
    UNKNOWN_PACK,
    UNKNOWN_PACK_VERSION,
    PackVersion,
    Refused,
    build_catalog,
    log_lines,
)
from spinf.packs.github import GitHub
from tests.packs.fake_github import SHA_A, FakeGitHub, FakeRepo, tarball
from tests.packs.folders import MINIMAL, entry, manifest, version, write

MODEL = "spinf/gemma-4-12b-fp8"


def pack(pack_id: str = "acme/tone", v: str = "1.0.0", model: str = MODEL) -> dict:
    raw = copy.deepcopy(MINIMAL)
    raw.update(pack=pack_id, version=v, model=model)
    return raw


def folder(tmp_path: Path, name: str, *packs: dict) -> str:
    """A folder without a manifest holding ``packs``; its spec (an absolute path)."""
    root = tmp_path / name
    root.mkdir(parents=True, exist_ok=True)
    for raw in packs:
        write(root, f"{raw['pack'].replace('/', '_')}-{raw['version']}.json", raw)
    return str(root)


def local(specs, **kwargs):
    kwargs.setdefault("official_on", False)
    return build_catalog(specs, **kwargs)


def rows(catalog) -> list[tuple[str, str, str]]:
    return [(v.id, v.version, v.source) for v in catalog.versions()]


def test_sources_in_order_official_first(tmp_path):
    official = folder(tmp_path, "official", pack("spinf/moderation"))
    a = folder(tmp_path, "a", pack("acme/a"))
    b = folder(tmp_path, "b", pack("beta/b"))
    catalog = build_catalog([b, a], official=official)
    assert catalog.sources == (f"local:{official}", f"local:{b}", f"local:{a}")
    assert list(catalog.packs) == ["spinf/moderation", "beta/b", "acme/a"]
    assert catalog.errors == () and catalog.official_error is None


def test_identical_spec_is_skipped(tmp_path):
    a = folder(tmp_path, "a", pack("acme/a"))
    catalog = local([a, f"  {a} "])
    assert catalog.sources == (f"local:{a}",)
    assert catalog.errors == ()
    assert rows(catalog) == [("acme/a", "1.0.0", f"local:{a}")]


def test_official_spec_given_again_through_packs_is_skipped(tmp_path):
    official = folder(tmp_path, "official", pack("spinf/moderation"))
    catalog = build_catalog(["official", official], official=official)
    assert catalog.sources == (f"local:{official}",)
    assert catalog.errors == ()


def test_packs_source_that_cannot_be_opened_is_an_error_and_still_listed(tmp_path):
    missing = str(tmp_path / "missing")
    a = folder(tmp_path, "a", pack("acme/a"))
    catalog = local([missing, a])
    assert catalog.sources == (f"local:{missing}", f"local:{a}")
    assert catalog.errors == (f"pack source local:{missing}: no such folder",)
    assert list(catalog.packs) == ["acme/a"]


def test_official_source_that_cannot_be_opened_is_the_official_error(tmp_path):
    a = folder(tmp_path, "a", pack("acme/a"))
    catalog = build_catalog([a], official=str(tmp_path / "missing"))
    assert catalog.errors == ()
    assert catalog.official_error == f"pack source local:{tmp_path / 'missing'}: no such folder"
    assert catalog.sources == (f"local:{a}",)


def test_packs_official_that_cannot_be_opened_is_a_catalog_error(tmp_path):
    missing = str(tmp_path / "missing")
    catalog = build_catalog(["official"], official_on=False, official=missing)
    assert catalog.official_error is None
    assert catalog.errors == (f"pack source local:{missing}: no such folder",)
    assert catalog.sources == (f"local:{missing}",)


def test_malformed_specs_are_catalog_errors(tmp_path):
    catalog = build_catalog(["github:-bad/x"], official="github:nope")
    assert len(catalog.errors) == 2
    assert all("is not github:<owner>/<repo>" in error for error in catalog.errors)


@pytest.fixture
def fake():
    repo = FakeRepo(tags={"1.0": SHA_A}, tarballs={SHA_A: tarball({"acme_gh.json": _json(pack("acme/gh"))})})
    with FakeGitHub({"acme/packs": repo}) as server:
        yield server


def _json(raw: dict) -> bytes:
    return json.dumps(raw).encode()


def _github(fake: FakeGitHub, tmp_path: Path) -> GitHub:
    return GitHub.from_environ({"SPINF_GITHUB_API": fake.url, "SPINF_PACKS_CACHE": str(tmp_path / "cache")})


def test_github_source(fake, tmp_path):
    with _github(fake, tmp_path) as github:
        catalog = local(["github:acme/packs@1.0"], github=github)
    assert catalog.errors == ()
    assert catalog.sources == ("acme/packs@1.0",)
    assert rows(catalog) == [("acme/gh", "1.0.0", "acme/packs@1.0")]


def test_github_packs_source_not_found_is_an_error_with_its_label(fake, tmp_path):
    with _github(fake, tmp_path) as github:
        catalog = local(["github:acme/packs@9.9", "github:acme/other"], github=github)
    assert catalog.sources == ("acme/packs@9.9", "acme/other")
    assert len(catalog.errors) == 2
    assert catalog.errors[0].startswith("pack source github:acme/packs@9.9: no tag, branch or commit '9.9'")
    assert catalog.errors[1].startswith("pack source github:acme/other")


def test_official_github_unreachable_is_the_official_error(fake, tmp_path):
    fake.server_error = True
    with _github(fake, tmp_path) as github:
        catalog = build_catalog([], official="github:acme/packs@1.0", github=github)
    assert catalog.errors == () and catalog.sources == ()
    assert "502" in catalog.official_error


def test_official_github_not_found_is_the_official_error(fake, tmp_path):
    with _github(fake, tmp_path) as github:
        catalog = build_catalog([], official_on=True, github=github, environ={})  # the default spinfinc tag
    assert catalog.errors == ()
    assert "spinfinc/spinf-prompts" in catalog.official_error


def test_scan_problems_are_catalog_errors_in_the_official_source_too(tmp_path):
    official = folder(tmp_path, "official", pack("spinf/moderation"))
    write(Path(official), "broken.json", {"pack": "spinf/broken", "scoring": {}})
    catalog = build_catalog([], official=official)
    assert catalog.official_error is None
    assert len(catalog.errors) >= 1
    assert all(error.startswith(f"local:{official}: broken.json") for error in catalog.errors)
    assert list(catalog.packs) == ["spinf/moderation"]


def test_reserved_namespace_is_skipped_from_a_local_packs_source(tmp_path):
    a = folder(tmp_path, "a", pack("spinf/moderation"), pack("acme/a"))
    catalog = local([a])
    assert list(catalog.packs) == ["acme/a"]
    [skipped] = catalog.skipped
    assert (skipped.id, skipped.version, skipped.source) == ("spinf/moderation", "1.0.0", f"local:{a}")
    assert "spinf/ namespace is reserved" in skipped.reason
    assert "--packs-allow-namespace spinf" in skipped.reason
    assert "--allow-namespace spinf" in local([a], allow_flag="--allow-namespace").skipped[0].reason
    assert list(local([a], allowed=["spinf"]).packs) == ["acme/a", "spinf/moderation"]  # sorted path order
    assert local([a], allowed=["acme"]).skipped  # allowing another namespace changes nothing


def test_model_filter(tmp_path):
    a = folder(tmp_path, "a", pack("acme/a"), pack("acme/b", model="spinf/tiny-gemma4"))
    catalog = local([a], model="spinf-12b")  # an alias of the 12b manifest
    assert list(catalog.packs) == ["acme/a"]
    [skipped] = catalog.skipped
    assert skipped.id == "acme/b"
    assert "spinf/tiny-gemma4" in skipped.reason and "spinf-12b" in skipped.reason
    assert list(local([a]).packs) == ["acme/a", "acme/b"]  # no model: every version kept
    assert local([a], model="SPINF/TINY-GEMMA4").skipped[0].id == "acme/a"


def test_reserved_namespace_is_checked_before_the_model(tmp_path):
    a = folder(tmp_path, "a", pack("spinf/x", model="other/model"))
    [skipped] = local([a], model=MODEL).skipped
    assert "reserved" in skipped.reason


def test_shadowing_is_an_error_naming_both_sources(tmp_path):
    a = folder(tmp_path, "a", pack("acme/tone", "1.0.0"))
    b = folder(tmp_path, "b", pack("acme/tone", "2.0.0"))
    catalog = local([a, b])
    assert rows(catalog) == [("acme/tone", "1.0.0", f"local:{a}")]
    [error] = catalog.errors
    assert "acme/tone" in error and f"local:{a}" in error and f"local:{b}" in error


def test_duplicate_version_is_an_error(tmp_path):
    a = folder(tmp_path, "a", pack("acme/tone", "1.0.0"))
    write(Path(a), "again/copy.json", pack("acme/tone", "1.0.0"))
    catalog = local([a])
    assert rows(catalog) == [("acme/tone", "1.0.0", f"local:{a}")]
    [error] = catalog.errors
    assert "acme/tone 1.0.0" in error and "already in the catalog" in error


def test_versions_without_a_manifest_sorted_newest_first(tmp_path):
    a = folder(tmp_path, "a", pack(v="1.2"), pack(v="1.10.0"), pack(v="1.9.0"), pack("acme/one", "0.1"))
    catalog = local([a])
    assert [v.version for v in catalog.packs["acme/tone"].versions] == ["1.10.0", "1.9.0", "1.2"]
    assert catalog.packs["acme/tone"].default == "1.10.0"
    assert catalog.find("acme/tone").version == "1.10.0"


def test_unorderable_versions_are_an_error(tmp_path):
    a = folder(tmp_path, "a", pack(v="1.0.1"), pack(v="1.0.rc1"))
    [error] = local([a]).errors
    assert "cannot be ordered" in error


def _manifest_folder(tmp_path: Path) -> str:
    root = tmp_path / "m"
    listed = manifest(
        entry(
            "acme/tone",
            version("1.0.0", "packs/1.0.0.json", status="deprecated"),
            version("2.0.0", "packs/2.0.0.json", status="coming_soon"),
            version("1.5.0", "packs/1.5.0.json"),
        ),
        entry("acme/later", version("0.1", "packs/later.json", status="coming_soon")),
        entry("acme/tiny", version("0.1", "packs/tiny.json", model="spinf/tiny-gemma4")),
    )
    write(root, "prompt-packs.json", listed)
    for v in ("1.0.0", "2.0.0", "1.5.0"):
        write(root, f"packs/{v}.json", pack("acme/tone", v))
    write(root, "packs/tiny.json", pack("acme/tiny", "0.1", "spinf/tiny-gemma4"))
    return str(root)


def test_manifest_order_kept_and_default_first_available(tmp_path):
    m = _manifest_folder(tmp_path)
    catalog = local([m], model=MODEL)
    assert catalog.errors == ()
    entry_ = catalog.packs["acme/tone"]
    assert [v.version for v in entry_.versions] == ["1.0.0", "2.0.0", "1.5.0"]
    assert [v.status for v in entry_.versions] == ["deprecated", "coming_soon", "available"]
    assert entry_.default == "1.5.0"


def test_listed_set_has_every_manifest_entry(tmp_path):
    m = _manifest_folder(tmp_path)
    catalog = local([m], model=MODEL)
    assert catalog.listed == {
        ("acme/tone", "1.0.0"),
        ("acme/tone", "2.0.0"),
        ("acme/tone", "1.5.0"),
        ("acme/later", "0.1"),
        ("acme/tiny", "0.1"),
    }
    assert "acme/tiny" not in catalog.packs  # skipped for the model, still listed


def test_find(tmp_path):
    m = _manifest_folder(tmp_path)
    a = folder(tmp_path, "a", pack("spinf/reserved"))
    catalog = local([m, a], model=MODEL)
    found = catalog.find("acme/tone")
    assert isinstance(found, PackVersion) and found.version == "1.5.0"
    assert catalog.find("acme/tone", "1.0.0").version == "1.0.0"  # deprecated is still served

    def refused(pack_id, v=None):
        result = catalog.find(pack_id, v)
        assert isinstance(result, Refused)
        return result.code, result.at

    assert refused("acme/tone", "2.0.0") == (PACK_NOT_AVAILABLE, "")  # loaded, coming soon
    assert refused("acme/tone", "9.9") == (UNKNOWN_PACK_VERSION, "version")
    assert "1.0.0, 2.0.0, 1.5.0" in catalog.find("acme/tone", "9.9").message
    assert refused("acme/later") == (PACK_NOT_AVAILABLE, "id")  # listed, coming soon, no file
    assert refused("acme/tiny") == (PACK_NOT_AVAILABLE, "id")  # listed, skipped for the model
    assert refused("acme/nothing") == (UNKNOWN_PACK, "id")
    assert refused("spinf/reserved") == (UNKNOWN_PACK, "id")  # skipped, but no manifest lists it
    assert "GET /v1/packs" in catalog.find("acme/nothing").message


def test_log_lines(tmp_path):
    a = folder(tmp_path, "a", pack("acme/a"), pack("acme/b", model="other/m"), pack("acme/a", "2"))
    missing = str(tmp_path / "missing")
    catalog = build_catalog([a, missing], model=MODEL, official=str(tmp_path / "nope"))
    lines = log_lines(catalog)
    levels = [level for level, _ in lines]
    texts = [text for _, text in lines]
    assert texts[0] == (
        f"pack acme/b 1.0.0 from local:{a} skipped: written for the model other/m, not the served model {MODEL}"
    )
    assert texts[1] == f"pack catalog error: pack source local:{missing}: no such folder"
    assert texts[2].startswith("the official pack repository is unavailable, running without it: ")
    assert texts[3] == f"packs: 2 versions of 1 id enabled; sources: local:{a}, local:{missing}"
    assert levels == [logging.INFO, logging.ERROR, logging.WARNING, logging.INFO]
    assert log_lines(local([]))[-1] == (logging.INFO, "packs: 0 versions of 0 ids enabled; sources: no pack source")


def test_catalog_is_frozen(tmp_path):
    import attrs

    catalog = local([folder(tmp_path, "a", pack())])
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        catalog.errors = ("x",)
