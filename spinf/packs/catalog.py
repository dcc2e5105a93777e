"""The pack catalog (packs spec §4.4, §4.5): every enabled pack version of the sources, built once.

`build_catalog` processes the sources in order, the official source first (when on), then each ``--packs`` spec; a
spec identical to one already processed is skipped. Each source is opened (a failure of the official source is the
*official error*, of a ``--packs`` source a catalog error, its label still listed), scanned (every problem is a
catalog error), and each loaded version filtered: reserved namespace and model skip it with a reason, an id from a
second source label and a repeated ``(id, version)`` are catalog errors. An id its source's manifest does not list
gets its versions sorted newest first (§1.2). The result is a frozen `Catalog`, a snapshot that later code can swap
as a whole; `Catalog.find` answers a request's ``(id, version)`` as ``api.md`` §4.10 says. `log_lines` gives §4.5's
start-up lines. Nothing here raises on what the sources hold.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from spinf.catalog import Catalog as ModelCatalog
from spinf.catalog import load_catalog
from spinf.packs.repository import LoadedPack, scan_folder
from spinf.packs.sources import (
    ALLOW_FLAG,
    GitHubFetcher,
    GitHubSource,
    LocalSource,
    Source,
    SourceError,
    may_define,
    official_source,
    open_source,
    parse_source,
    reserved_reason,
)
from spinf.packs.targeting import same_model
from spinf.packs.versions import UnorderableVersions, default_version, newest_first

if TYPE_CHECKING:
    from spinf.packs.manifest import ListedPack

UNKNOWN_PACK = "unknown_pack"
UNKNOWN_PACK_VERSION = "unknown_pack_version"
PACK_NOT_AVAILABLE = "pack_not_available"


@attrs.frozen
class PackVersion:
    """One enabled version and the label of the source it came from."""

    loaded: LoadedPack
    source: str

    @property
    def id(self) -> str:
        return self.loaded.pack.id

    @property
    def version(self) -> str:
        return self.loaded.pack.version

    @property
    def model(self) -> str:
        return self.loaded.pack.model

    @property
    def status(self) -> str:
        return self.loaded.status


@attrs.frozen
class PackEntry:
    """An id's enabled versions in catalog order (manifest order, else newest first) and its default version."""

    id: str
    versions: tuple[PackVersion, ...]
    default: str

    @property
    def source(self) -> str:
        return self.versions[0].source

    def get(self, version: str) -> PackVersion | None:
        return next((v for v in self.versions if v.version == version), None)

    def version(self, version: str | None) -> PackVersion | Refused:
        """The enabled ``version`` (the default when None), or ``unknown_pack_version`` listing the versions."""
        found = self.get(self.default if version is None else version)
        if found is None:
            known = ", ".join(v.version for v in self.versions)
            return Refused(
                UNKNOWN_PACK_VERSION, "version", f"the pack {self.id} has no version {version!r} (versions: {known})"
            )
        return found


@attrs.frozen
class Skipped:
    """A loaded version the filter left out (not an error)."""

    id: str
    version: str
    source: str
    reason: str


@attrs.frozen
class Refused:
    """Why `Catalog.find` gives no version: ``code`` is the ``api.md`` §4.10 error code; ``at`` the part of the pack
    reference it is about (``"id"``, ``"version"``, or ``""`` for the reference as a whole)."""

    code: str
    at: str
    message: str


@attrs.frozen
class Catalog:
    """The catalog snapshot: the source labels in order, the enabled ids (catalog order), the skipped versions, the
    catalog errors (any refuses the start), the official error (the server runs without the official source), the
    branch warnings of the fetches, the catalog-wide listed set of every manifest's ``(id, version)``, and every
    manifest entry by id (the first source's, for the coming-soon rows of ``GET /v1/packs``)."""

    sources: tuple[str, ...] = ()
    packs: Mapping[str, PackEntry] = attrs.field(factory=dict)
    skipped: tuple[Skipped, ...] = ()
    errors: tuple[str, ...] = ()
    official_error: str | None = None
    warnings: tuple[str, ...] = ()
    listed: frozenset[tuple[str, str]] = frozenset()
    manifest_entries: Mapping[str, ListedPack] = attrs.field(factory=dict)  # by id, the first source's entry

    @property
    def listed_ids(self) -> frozenset[str]:
        return frozenset(pack_id for pack_id, _ in self.listed)

    def versions(self) -> Iterable[PackVersion]:
        """Every enabled version in catalog order (the rows of ``packs list``)."""
        for entry in self.packs.values():
            yield from entry.versions

    @property
    def enabled_count(self) -> int:
        return sum(len(entry.versions) for entry in self.packs.values())

    def find(self, pack_id: str, version: str | None = None) -> PackVersion | Refused:
        """The version a request names (its default when ``version`` is None), or why there is none (§4.10): an id
        with no enabled version is ``pack_not_available`` when some manifest lists it, else ``unknown_pack``; a
        version not enabled is ``unknown_pack_version``; an enabled ``coming_soon`` version is
        ``pack_not_available``."""
        entry = self.packs.get(pack_id)
        if entry is None:
            if pack_id in self.listed_ids:
                return Refused(PACK_NOT_AVAILABLE, "id", f"the pack {pack_id} is not available on this server")
            return Refused(UNKNOWN_PACK, "id", f"unknown pack {pack_id!r}; GET /v1/packs lists the available packs")
        found = entry.version(version)
        if isinstance(found, Refused):
            return found
        if found.status == "coming_soon":
            return Refused(PACK_NOT_AVAILABLE, "", f"{pack_id} {found.version} is coming soon, not yet available")
        return found


def _failed_label(source: Source) -> str:
    """The label of a source that could not be opened (a GitHub source without a ref has no commit to name)."""
    if isinstance(source, LocalSource):
        return source.label
    return source.label("") if source.ref is not None else f"{source.owner}/{source.repo}"


@attrs.define
class _Builder:
    model: str | None
    models: ModelCatalog | None
    allowed: frozenset[str]
    allow_flag: str
    sources: list[str] = attrs.field(factory=list)
    found: dict[str, list[PackVersion]] = attrs.field(factory=dict)
    unlisted: set[str] = attrs.field(factory=set)  # ids some version of which came without a manifest entry
    skipped: list[Skipped] = attrs.field(factory=list)
    errors: list[str] = attrs.field(factory=list)
    official_error: str | None = None
    warnings: list[str] = attrs.field(factory=list)
    listed: set[tuple[str, str]] = attrs.field(factory=set)
    manifest_entries: dict[str, ListedPack] = attrs.field(factory=dict)

    def source(self, source: Source, github: GitHubFetcher | None, refresh: bool, *, official: bool) -> None:
        """One source; ``official``: it is the official slot (first, official on), whose failure to open is the
        official error. A ``--packs official`` is a ``--packs`` source here, though it may carry ``spinf/``."""
        try:
            if isinstance(source, GitHubSource) and github is None:
                raise SourceError(f"pack source {source.spec}: no GitHub client to fetch it")
            opened = open_source(source, github=github, refresh=refresh)  # type: ignore[arg-type]
        except SourceError as error:
            if official:
                self.official_error = str(error)
            else:
                self.errors.append(str(error))
                self.sources.append(_failed_label(source))
            return
        label = opened.label
        self.sources.append(label)
        self.warnings.extend(opened.warnings)
        scan = scan_folder(opened.folder)
        self.errors.extend(f"{label}: {problem.render()}" for problem in scan.problems)
        self.listed |= scan.listed
        if scan.manifest is not None:
            for entry in scan.manifest.packs:
                self.manifest_entries.setdefault(entry.id, entry)
        manifest_ids = {entry.id for entry in scan.manifest.packs} if scan.manifest is not None else set()
        touched: set[str] = set()
        for loaded in scan.packs:
            if self.keep(loaded, source, label):
                touched.add(loaded.pack.id)
        for pack_id in touched - manifest_ids:
            self.unlisted.add(pack_id)
            if len(self.found[pack_id]) > 1:
                self.sort(pack_id, label)

    def keep(self, loaded: LoadedPack, source: Source, label: str) -> bool:
        pack = loaded.pack
        named = f"{pack.id} {pack.version}"
        if not may_define(pack.namespace, source, self.allowed):
            self.skipped.append(
                Skipped(pack.id, pack.version, label, reserved_reason(pack.namespace, flag=self.allow_flag))
            )
            return False
        if self.model is not None and not same_model(pack.model, self.model, self._models()):
            reason = f"written for the model {pack.model}, not the served model {self.model}"
            self.skipped.append(Skipped(pack.id, pack.version, label, reason))
            return False
        versions = self.found.setdefault(pack.id, [])
        if versions and versions[0].source != label:
            self.errors.append(
                f"{named} from {label}: the pack {pack.id} already comes from {versions[0].source}"
                " (one id must come from one source)"
            )
            return False
        if any(v.version == pack.version for v in versions):
            self.errors.append(f"{named} from {label}: the version is already in the catalog ({loaded.file})")
            return False
        versions.append(PackVersion(loaded, label))
        return True

    def sort(self, pack_id: str, label: str) -> None:
        versions = self.found[pack_id]
        try:
            order = newest_first([v.version for v in versions])
        except UnorderableVersions as error:
            self.errors.append(f"{label}: {pack_id}: {error}")
            return
        by_version = {v.version: v for v in versions}
        self.found[pack_id] = [by_version[v] for v in order]

    def _models(self) -> ModelCatalog:
        if self.models is None:
            self.models = load_catalog([])
        return self.models

    def catalog(self) -> Catalog:
        packs = {}
        for pack_id, versions in self.found.items():
            if not versions:
                continue
            pairs = [(v.version, v.status) for v in versions]
            default = versions[0].version if pack_id in self.unlisted else default_version(pairs, listed=True)
            packs[pack_id] = PackEntry(pack_id, tuple(versions), default)
        return Catalog(
            sources=tuple(self.sources),
            packs=packs,
            skipped=tuple(self.skipped),
            errors=tuple(self.errors),
            official_error=self.official_error,
            warnings=tuple(self.warnings),
            listed=frozenset(self.listed),
            manifest_entries=dict(self.manifest_entries),
        )


def build_catalog(
    specs: Sequence[str] = (),
    *,
    model: str | None = None,
    official_on: bool = True,
    official: str | None = None,
    allowed: Iterable[str] = (),
    refresh: bool = False,
    github: GitHubFetcher | None = None,
    models: ModelCatalog | None = None,
    allow_flag: str = ALLOW_FLAG,
    environ: Mapping[str, str] | None = None,
) -> Catalog:
    """The catalog of §4.4. ``specs`` are the ``--packs`` specs in order; ``official`` the ``packs_official``
    setting (None: ``$SPINF_PACKS_OFFICIAL``, else the default tag); ``github`` fetches the GitHub sources (a
    `spinf.packs.github.GitHub`; without one a GitHub source fails to open); ``models`` the model catalog for the
    model filter (§1.3; the built-in one when None); ``allow_flag`` the flag a reserved-namespace reason names
    (``packs list`` has its own). A spec that does not parse is a catalog error (the official one included)."""
    builder = _Builder(model, models, frozenset(allowed), allow_flag)
    seen: set[str] = set()
    parsed: list[tuple[Source, bool]] = []
    if official_on:
        try:
            parsed.append((official_source(official, environ=environ), True))
        except SourceError as error:
            builder.errors.append(str(error))
    for spec in specs:
        try:
            parsed.append((parse_source(spec, official=official, environ=environ), False))
        except SourceError as error:
            builder.errors.append(str(error))
    for source, is_official in parsed:
        if source.spec in seen:
            continue
        seen.add(source.spec)
        builder.source(source, github, refresh, official=is_official)
    return builder.catalog()


def log_lines(catalog: Catalog) -> list[tuple[int, str]]:
    """§4.5's start-up lines as ``(logging level, message)``: the fetch warnings, one per skipped version, one per
    catalog error, the official source's failure, then the summary."""
    lines = [(logging.WARNING, warning) for warning in catalog.warnings]
    lines += [(logging.INFO, f"pack {s.id} {s.version} from {s.source} skipped: {s.reason}") for s in catalog.skipped]
    lines += [(logging.ERROR, f"pack catalog error: {error}") for error in catalog.errors]
    if catalog.official_error is not None:
        # A warning, not an error: an offline or firewalled server is healthy without the official packs
        message = f"the official pack repository is unavailable, running without it: {catalog.official_error}"
        lines.append((logging.WARNING, message))
    sources = ", ".join(catalog.sources) if catalog.sources else "no pack source"
    enabled = f"{_count(catalog.enabled_count, 'version')} of {_count(len(catalog.packs), 'id')}"
    lines.append((logging.INFO, f"packs: {enabled} enabled; sources: {sources}"))
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
