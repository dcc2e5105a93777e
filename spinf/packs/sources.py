"""Pack sources (packs spec §4.1, §4.3): parsing a source spec into a typed source with its label, opening a local
folder source, and the reserved-namespace rule.

A spec is ``github:<owner>/<repo>[@<ref>][#<path>]``, the word ``official`` (replaced by the ``packs_official``
setting, ``$SPINF_PACKS_OFFICIAL``, or `OFFICIAL_SPEC`), or a local folder path. Fetching a GitHub source is
`spinf.packs.github`'s job; `open_source` takes the fetcher as an argument, so this module never reaches the network.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import attrs

from spinf.errors import SpinfError

OFFICIAL_SPEC = "github:spinfinc/spinf-prompts@0.1.0"
OFFICIAL_REPOSITORY = "spinfinc/spinf-prompts"
OFFICIAL_ENV = "SPINF_PACKS_OFFICIAL"
# §4.3: the only reserved namespace, and the flags that allow it anyway
RESERVED_NAMESPACES = frozenset({"spinf"})
ALLOW_FLAG = "--packs-allow-namespace"

_GITHUB = re.compile(
    r"github:(?P<owner>[A-Za-z0-9][A-Za-z0-9-]*)/(?P<repo>[A-Za-z0-9._-]+)(?:@(?P<ref>[^#]+))?(?:#(?P<path>.*))?", re.S
)
_COMMIT = re.compile(r"[0-9a-f]{40}")


class SourceError(SpinfError):
    """A pack source that cannot be parsed, found or read; the one-line message names the source."""


@attrs.frozen
class LocalSource:
    """A local folder, as given after ``~`` expansion (a relative path stays relative)."""

    folder: str
    official_slot: bool = False

    @property
    def spec(self) -> str:
        return self.folder

    @property
    def label(self) -> str:
        return f"local:{self.folder}"


@attrs.frozen
class GitHubSource:
    """``github:<owner>/<repo>[@<ref>][#<path>]``; ``ref`` None follows the default branch, ``path`` "" is the root."""

    owner: str
    repo: str
    ref: str | None
    path: str
    official_slot: bool = False

    @property
    def spec(self) -> str:
        ref = "" if self.ref is None else f"@{self.ref}"
        path = f"#{self.path}" if self.path else ""
        return f"github:{self.owner}/{self.repo}{ref}{path}"

    @property
    def is_official_repository(self) -> bool:
        """§4.1: ``spinfinc/spinf-prompts`` (any case, any ref) counts as official, even through ``--packs``."""
        return f"{self.owner}/{self.repo}".lower() == OFFICIAL_REPOSITORY

    def label(self, commit: str) -> str:
        """``<owner>/<repo>@<ref>`` with the ref as written, or the resolved ``commit``'s first 12 hex digits."""
        return f"{self.owner}/{self.repo}@{self.ref if self.ref is not None else commit[:12]}"


Source = LocalSource | GitHubSource


@attrs.frozen
class OpenedSource:
    """A source ready to scan: its label, its folder on disk, the commit (GitHub) and warnings to log (a branch)."""

    source: Source
    label: str
    folder: Path
    commit: str | None = None
    warnings: tuple[str, ...] = ()


class GitHubFetcher(Protocol):
    def fetch(self, source: GitHubSource, *, refresh: bool) -> OpenedSource: ...


def parse_source(spec: str, *, official: str | None = None, environ: Mapping[str, str] | None = None) -> Source:
    """The source a spec names (§4.1); a malformed ``github:`` spec is a `SourceError` naming it. The word
    ``official`` names the official slot's source: ``official`` (the ``packs_official`` setting) when given, else
    ``$SPINF_PACKS_OFFICIAL``, either only when non-empty, else `OFFICIAL_SPEC`."""
    spec = spec.strip()
    if spec == "official":
        return official_source(official, environ=environ)
    return _parse(spec, "", official_slot=False)


def official_source(official: str | None = None, *, environ: Mapping[str, str] | None = None) -> Source:
    """The official slot's source (§4.1, §4.3), which may carry the reserved namespace whatever it is."""
    if official is None:
        official = (os.environ if environ is None else environ).get(OFFICIAL_ENV, "")
    return _parse(official.strip() or OFFICIAL_SPEC, " (the official source)", official_slot=True)


def _parse(spec: str, where: str, *, official_slot: bool) -> Source:
    if not spec:
        raise SourceError("a pack source spec is empty")
    if spec.startswith("github:"):
        return _parse_github(spec, where, official_slot=official_slot)
    return LocalSource(os.path.expanduser(spec), official_slot=official_slot)


def _parse_github(spec: str, where: str, *, official_slot: bool) -> GitHubSource:
    match = _GITHUB.fullmatch(spec)
    if match is None:
        raise SourceError(
            f"pack source {spec!r}{where} is not github:<owner>/<repo>[@<ref>][#<path>] (owner: letters, digits and"
            " '-', not starting with '-'; repo: letters, digits, '.', '_' and '-')"
        )
    owner, repo, ref = match["owner"], match["repo"], match["ref"]
    path = (match["path"] or "").strip("/")
    if repo in (".", ".."):
        raise SourceError(f"pack source {spec!r}{where}: {repo!r} is not a repository name")
    if ref is not None and _has_dot_segment(ref):
        raise SourceError(f"pack source {spec!r}{where}: the ref {ref!r} has an empty, '.' or '..' part")
    if path and _has_dot_segment(path):
        raise SourceError(f"pack source {spec!r}{where}: the path {path!r} has an empty, '.' or '..' part")
    return GitHubSource(owner, repo, ref, path, official_slot=official_slot)


def _has_dot_segment(text: str) -> bool:
    return any(part in ("", ".", "..") for part in text.split("/"))


def is_commit(ref: str) -> bool:
    """A 40-character lowercase hex ref names a commit (§4.2: no API call)."""
    return _COMMIT.fullmatch(ref) is not None


def open_local(source: LocalSource) -> OpenedSource:
    """The folder of a local source, which must be an existing, readable directory: else a `SourceError` (the start
    refuses an unreadable ``--packs`` source with this one line)."""
    folder = Path(source.folder)
    if not folder.exists():
        raise SourceError(f"pack source {source.label}: no such folder")
    if not folder.is_dir():
        raise SourceError(f"pack source {source.label}: not a folder")
    try:
        with os.scandir(folder) as entries:
            next(entries, None)
    except OSError as error:
        raise SourceError(f"pack source {source.label}: cannot be read ({error.strerror or error})") from None
    return OpenedSource(source, source.label, folder)


def open_source(source: Source, *, github: GitHubFetcher, refresh: bool = False) -> OpenedSource:
    """Opens a local source here, a GitHub source through ``github`` (a `spinf.packs.github.GitHub`)."""
    if isinstance(source, LocalSource):
        return open_local(source)
    return github.fetch(source, refresh=refresh)


def may_define(namespace: str, source: Source, allowed: frozenset[str] | set[str] = frozenset()) -> bool:
    """§4.3: a reserved namespace comes only from the official slot or a GitHub source of the official repository,
    unless it is allowed (``--packs-allow-namespace``); any other namespace comes from anywhere."""
    if namespace not in RESERVED_NAMESPACES or namespace in allowed:
        return True
    if source.official_slot:
        return True
    return isinstance(source, GitHubSource) and source.is_official_repository


def reserved_reason(namespace: str, *, flag: str = ALLOW_FLAG) -> str:
    """The skip reason for a reserved-namespace pack: names the namespace and the flag that allows it (``packs
    list`` passes its own ``--allow-namespace``)."""
    return (
        f"the {namespace}/ namespace is reserved for the official repository {OFFICIAL_REPOSITORY};"
        f" {flag} {namespace} allows it from this source"
    )
