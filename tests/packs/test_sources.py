"""Pack source specs, labels, local folder sources and the reserved namespace (packs spec §4.1, §4.3)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spinf.packs.sources import (
    OFFICIAL_SPEC,
    GitHubSource,
    LocalSource,
    OpenedSource,
    SourceError,
    may_define,
    official_source,
    open_local,
    open_source,
    parse_source,
    reserved_reason,
)

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    ("spec", "owner", "repo", "ref", "path"),
    [
        ("github:acme/packs", "acme", "packs", None, ""),
        ("  github:acme/packs@v1.2  ", "acme", "packs", "v1.2", ""),
        ("github:acme/packs#sub/dir/", "acme", "packs", None, "sub/dir"),
        ("github:Acme-Co/my.packs_2@feature/x#/packs/", "Acme-Co", "my.packs_2", "feature/x", "packs"),
        (f"github:acme/packs@{COMMIT}", "acme", "packs", COMMIT, ""),
        ("github:acme/packs#", "acme", "packs", None, ""),
    ],
)
def test_github_specs(spec, owner, repo, ref, path):
    source = parse_source(spec, environ={})
    assert source == GitHubSource(owner, repo, ref, path)


def test_github_labels():
    commit = "89abcdef0123" + "4" * 28
    assert parse_source("github:acme/packs@v1.2#x", environ={}).label(commit) == "acme/packs@v1.2"
    assert parse_source("github:acme/packs", environ={}).label(commit) == "acme/packs@89abcdef0123"
    assert parse_source("github:acme/packs@v1#a/", environ={}).spec == "github:acme/packs@v1#a"


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("github:", r"^pack source 'github:' is not github:<owner>/<repo>\[@<ref>\]\[#<path>\] \(owner: .*\)$"),
        ("github:acme", r"^pack source 'github:acme' is not github:<owner>/<repo>"),
        ("github:-acme/packs", r"^pack source 'github:-acme/packs' is not github:"),
        ("github:acme/pa/cks", r"^pack source 'github:acme/pa/cks' is not github:"),
        ("github:acme/packs@", r"^pack source 'github:acme/packs@' is not github:"),
        ("github:acme/packs@#x", r"^pack source 'github:acme/packs@#x' is not github:"),
        ("github:ac_me/packs", r"^pack source 'github:ac_me/packs' is not github:"),
        ("github:acme/..", r"^pack source 'github:acme/\.\.': '\.\.' is not a repository name$"),
        ("github:acme/packs@../x", r"^pack source 'github:acme/packs@\.\./x': the ref '\.\./x' has an empty, '\.'"),
        ("github:acme/packs#a/../../b", r"^pack source 'github:acme/packs#a/\.\./\.\./b': the path 'a/\.\./\.\./b'"),
        ("   ", r"^a pack source spec is empty$"),
    ],
)
def test_bad_specs(spec, match):
    with pytest.raises(SourceError, match=match):
        parse_source(spec, environ={})


def test_local_specs(monkeypatch):
    monkeypatch.setenv("HOME", "/home/someone")
    assert parse_source(" my-packs ", environ={}) == LocalSource("my-packs")
    assert parse_source("my-packs", environ={}).label == "local:my-packs"
    assert parse_source("./a/../b/", environ={}).label == "local:./a/../b/"
    assert parse_source("~/packs", environ={}).label == "local:/home/someone/packs"
    assert parse_source("/srv/packs", environ={}).label == "local:/srv/packs"


def test_official():
    source = official_source(environ={})
    assert source == GitHubSource("spinfinc", "spinf-prompts", "0.1.0", "", official_slot=True)
    assert source.spec == OFFICIAL_SPEC
    assert source.label(COMMIT) == "spinfinc/spinf-prompts@0.1.0"
    assert parse_source(" official ", environ={"SPINF_PACKS_OFFICIAL": "  "}) == source
    assert parse_source("official", official="", environ={"SPINF_PACKS_OFFICIAL": "/elsewhere"}) == source
    moved = parse_source("official", environ={"SPINF_PACKS_OFFICIAL": "github:acme/packs@2"})
    assert moved == GitHubSource("acme", "packs", "2", "", official_slot=True)
    assert parse_source("official", official="github:acme/packs@2", environ={}) == moved
    local = official_source(environ={"SPINF_PACKS_OFFICIAL": "/srv/checkout"})
    assert local == LocalSource("/srv/checkout", official_slot=True)
    assert official_source("~/checkout", environ={}) == LocalSource(
        os.path.expanduser("~/checkout"), official_slot=True
    )
    with pytest.raises(SourceError, match=r"^pack source 'github:acme' \(the official source\) is not github:"):
        official_source(environ={"SPINF_PACKS_OFFICIAL": "github:acme"})
    with pytest.raises(SourceError, match=r"^pack source 'github:a/\.\.' \(the official source\): '\.\.' is not a"):
        official_source("github:a/..")


def test_reserved_namespace():
    official = official_source(environ={})
    checkout = official_source(environ={"SPINF_PACKS_OFFICIAL": "/srv/checkout"})
    by_packs = parse_source("github:SpinfInc/Spinf-Prompts@main", environ={})
    fork = parse_source("github:someone/spinf-prompts", environ={})
    local = parse_source("/srv/checkout", environ={})
    assert by_packs.is_official_repository and not fork.is_official_repository
    for source in (official, checkout, by_packs):
        assert may_define("spinf", source)
    for source in (fork, local):
        assert not may_define("spinf", source)
        assert may_define("spinf", source, {"spinf"})
        assert may_define("acme", source)
        assert not may_define("spinf", source, {"acme"})
    assert reserved_reason("spinf") == (
        "the spinf/ namespace is reserved for the official repository spinfinc/spinf-prompts;"
        " --packs-allow-namespace spinf allows it from this source"
    )
    narrow = reserved_reason("spinf", flag="--allow-namespace")
    assert narrow.endswith("; --allow-namespace spinf allows it from this source")


def test_open_local(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "packs").mkdir()
    (tmp_path / "file.json").write_text("{}")
    opened = open_local(parse_source("packs", environ={}))
    assert opened == OpenedSource(LocalSource("packs"), "local:packs", Path("packs"))
    with pytest.raises(SourceError, match=r"^pack source local:missing: no such folder$"):
        open_local(parse_source("missing", environ={}))
    with pytest.raises(SourceError, match=r"^pack source local:file.json: not a folder$"):
        open_local(parse_source("file.json", environ={}))


def test_open_local_unreadable(tmp_path, monkeypatch):
    (tmp_path / "locked").mkdir()

    def refuse(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "scandir", refuse)
    with pytest.raises(SourceError, match=r"^pack source local:.*/locked: cannot be read \(Permission denied\)$"):
        open_local(LocalSource(str(tmp_path / "locked")))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any folder")
def test_open_local_unreadable_for_real(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0)
    try:
        with pytest.raises(SourceError, match=r"cannot be read \(Permission denied\)$"):
            open_local(LocalSource(str(locked)))
    finally:
        locked.chmod(0o755)


def test_open_source_dispatches(tmp_path):
    calls = []

    class Fetcher:
        def fetch(self, source, *, refresh):
            calls.append((source, refresh))
            return OpenedSource(source, source.label(COMMIT), tmp_path, COMMIT)

    github = parse_source("github:acme/packs", environ={})
    assert open_source(github, github=Fetcher(), refresh=True).label == "acme/packs@0123456789ab"
    assert open_source(LocalSource(str(tmp_path)), github=Fetcher()).folder == tmp_path
    assert calls == [(github, True)]
