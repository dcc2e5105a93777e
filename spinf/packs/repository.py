"""Reading a source folder (packs spec §3): by its repository manifest when it has one, else by discovery.

`scan_folder` never raises on what the folder holds: every problem is collected, naming the file (relative to the
folder) and, inside it, the JSON path. With a manifest, each listed version is loaded, validated and compared with
its entry; without one, every ``*.json`` file that looks like a pack file is loaded (hidden files and folders
excluded, sorted path order). No model filter and no namespace reservation apply here: those are the catalog's (§4).

Only regular files inside the folder are read, in both modes: a listed path that resolves outside the folder is
missing, and a discovered ``*.json`` link to a file outside it is a problem naming the link (the folder is what
the operator chose to serve). A FIFO, socket or device is skipped with a log line, never opened for a blocking
read: a FIFO in the folder held the catalog build, and so the start or a reload, for ever.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import attrs

from spinf.packs.manifest import MANIFEST_NAME, ListedPack, ListedVersion, Manifest, parse_manifest
from spinf.packs.packfile import MAX_FILE_BYTES, PackFile, loads_strict, parse_pack, read_pack_file
from spinf.packs.problems import Problem

SNIFF_CHARS = 4096
log = logging.getLogger(__name__)


@attrs.frozen
class LoadedPack:
    """A pack version the folder provides, with what its manifest entry says about it (defaults without one)."""

    pack: PackFile
    file: str
    status: str = "available"
    name: str = ""
    description: str = ""
    tags: tuple[str, ...] = ()
    readme: str | None = None
    samples: str | None = None
    fixture: str | None = None
    note: str | None = None


@attrs.frozen
class Scan:
    """What a folder holds: the manifest (None: read by discovery), the loaded packs in order, the coming-soon
    versions the manifest lists as ``(id, version)``, every listed ``(id, version)``, and the problems."""

    manifest: Manifest | None
    packs: tuple[LoadedPack, ...]
    coming_soon: tuple[tuple[str, str], ...]
    listed: frozenset[tuple[str, str]]
    problems: tuple[Problem, ...]


def scan_folder(folder: str | os.PathLike) -> Scan:
    """Read ``folder`` as §3 says. A folder that does not exist holds nothing (no problem)."""
    folder = Path(folder)
    manifest_path = folder / MANIFEST_NAME
    if not manifest_path.is_file():
        return _discover(folder)
    try:
        text = manifest_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return Scan(None, (), (), frozenset(), (Problem("", f"the manifest cannot be read: {exc}", MANIFEST_NAME),))
    manifest = parse_manifest(text)
    if isinstance(manifest, Problem):
        return Scan(None, (), (), frozenset(), (manifest,))
    return _ByManifest(folder, manifest).run()


def _inside(folder: Path, relative: str) -> Path | None:
    """The existing file at ``relative`` under ``folder``; None when it is missing or would lie outside."""
    try:
        path = (folder / relative).resolve()
        inside = path.is_file() and path.is_relative_to(folder.resolve())
    except (OSError, ValueError, RuntimeError):  # a NUL byte in the name, a symlink loop (RuntimeError in 3.11)
        return None
    return path if inside else None


def _links_out(folder: Path, path: Path) -> bool:
    """Whether ``path`` (found under ``folder``) resolves to somewhere outside it, or cannot be resolved."""
    try:
        return not path.resolve().is_relative_to(folder.resolve())
    except (OSError, ValueError, RuntimeError):
        return True


@attrs.define
class _ByManifest:
    folder: Path
    manifest: Manifest
    packs: list[LoadedPack] = attrs.field(factory=list)
    coming_soon: list[tuple[str, str]] = attrs.field(factory=list)
    listed: set[tuple[str, str]] = attrs.field(factory=set)
    problems: list[Problem] = attrs.field(factory=list)

    def problem(self, message: str, path: str = "") -> None:
        self.problems.append(Problem(path, message, MANIFEST_NAME))

    def run(self) -> Scan:
        ids: set[str] = set()
        for i, entry in enumerate(self.manifest.packs):
            where = f"packs.{i}"
            if not entry.id.startswith(self.manifest.namespace + "/"):
                self.problem(f"{entry.id!r} is not in the manifest's namespace {self.manifest.namespace!r}", where)
            elif entry.id in ids:
                self.problem(f"{entry.id!r} is listed twice; the second entry is skipped", where)
            else:
                ids.add(entry.id)
                self.entry(entry, where)
        return Scan(
            self.manifest, tuple(self.packs), tuple(self.coming_soon), frozenset(self.listed), tuple(self.problems)
        )

    def entry(self, entry: ListedPack, where: str) -> None:
        for key in ("readme", "samples"):
            relative = getattr(entry, key)
            if relative is not None and _inside(self.folder, relative) is None:
                self.problem(f"{entry.id}: the {key} {relative!r} does not exist in the folder", f"{where}.{key}")
        for j, version in enumerate(entry.versions):
            self.version(entry, version, f"{where}.versions.{j}")

    def version(self, entry: ListedPack, listed: ListedVersion, where: str) -> None:
        key = (entry.id, listed.version)
        named = f"{entry.id} {listed.version}"
        if key in self.listed:
            self.problem(f"{named} is listed twice", where)
            return
        self.listed.add(key)
        if listed.status == "coming_soon":
            self.coming_soon.append(key)
        if listed.fixture is not None and _inside(self.folder, listed.fixture) is None:
            self.problem(f"{named}: the fixture {listed.fixture!r} does not exist in the folder", f"{where}.fixture")
        path = _inside(self.folder, listed.file)
        if path is None:
            if listed.status != "coming_soon":
                self.problem(f"{named}: the file {listed.file!r} does not exist in the folder", f"{where}.file")
            return
        parsed = read_pack_file(path)
        if parsed.problems:
            self.problems.extend(p.in_file(listed.file) for p in parsed.problems)
            return
        if self.matches(entry, listed, parsed.pack, where):
            self.packs.append(_loaded(parsed.pack, entry, listed))

    def matches(self, entry: ListedPack, listed: ListedVersion, pack: PackFile, where: str) -> bool:
        """Whether the file is the version the entry lists; a media or parameter difference is reported only."""
        named = f"{entry.id} {listed.version}"
        said, found = (entry.id, listed.version, listed.model), (pack.id, pack.version, pack.model)
        if said != found:
            self.problem(
                f"{named}: the manifest says (id, version, model) {said} but {listed.file} holds {found}", where
            )
            return False
        if set(entry.media) != set(pack.media):
            self.problem(
                f"{named}: the manifest says media {sorted(entry.media)}, the file {sorted(pack.media)}", f"{where}"
            )
        names = sorted(p.name for p in pack.parameters)
        if sorted(entry.parameters) != names:
            self.problem(f"{named}: the manifest says parameters {sorted(entry.parameters)}, the file {names}", where)
        return True


def _loaded(pack: PackFile, entry: ListedPack, listed: ListedVersion) -> LoadedPack:
    return LoadedPack(
        pack=pack,
        file=listed.file,
        status=listed.status,
        name=entry.name,
        description=entry.description,
        tags=entry.tags,
        readme=entry.readme,
        samples=entry.samples,
        fixture=listed.fixture,
        note=listed.note,
    )


def _discover(folder: Path) -> Scan:
    """Every pack-looking ``*.json`` file under ``folder`` (§3, without a manifest)."""
    packs, problems = [], []
    for path in _json_files(folder):
        relative = path.relative_to(folder).as_posix()
        if _links_out(folder, path):
            problems.append(
                Problem("", "a link to a file outside the folder; not read (a source serves its folder)", relative)
            )
            continue
        raw = _sniff(path, relative)
        if raw is None:
            continue
        parsed = read_pack_file(path) if raw is _TOO_LARGE else parse_pack(raw)
        if parsed.problems:
            problems.extend(p.in_file(relative) for p in parsed.problems)
        else:
            packs.append(LoadedPack(parsed.pack, relative))
    return Scan(None, tuple(packs), (), frozenset(), tuple(problems))


def _json_files(folder: Path) -> list[Path]:
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found.extend(Path(root, name) for name in files if name.endswith(".json") and not name.startswith("."))
    return sorted(found, key=lambda path: path.relative_to(folder).parts)


_TOO_LARGE = object()


def _sniff(path: Path, relative: str) -> object:
    """The file's JSON object when it looks like a pack file (``pack`` and ``scoring`` keys); `_TOO_LARGE` for one
    that mentions ``"pack"`` but is over the size limit (read_pack_file then refuses it); None to skip it. Opened
    without blocking and checked on the open descriptor, so a FIFO is never waited on."""
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                log.warning(
                    "pack folder %s: %s is not a regular file (a FIFO, socket or device); skipped",
                    path.parent,
                    relative,
                )
                return None
            if '"pack"' not in f.read(4 * SNIFF_CHARS).decode("utf-8", errors="replace")[:SNIFF_CHARS]:
                return None
            if info.st_size > MAX_FILE_BYTES:
                return _TOO_LARGE
            f.seek(0)
            raw = loads_strict(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return None
    if not (isinstance(raw, dict) and "pack" in raw and "scoring" in raw):
        return None
    return raw
