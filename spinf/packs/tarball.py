"""Safe extraction of a GitHub tarball (packs spec §4.2 step 3).

Only regular files and folders are written, by this module itself (never `tarfile.TarFile.extract`), under one
top-level folder. A member whose path is absolute or has a ``..`` part, a symbolic or hard link, a device or FIFO, a
second top-level folder, a name seen twice, more than `Limits.max_members` members or more than
`Limits.max_tree_bytes` of content refuses the whole archive. The gzip stream is read to its end, so a truncated or
corrupt download (a short stream, a bad CRC) is an `ArchiveError` too, not a partial tree.
"""

from __future__ import annotations

import gzip
import shutil
import tarfile
import zlib
from pathlib import Path

import attrs

from spinf.errors import SpinfError

# The caps, each a whole archive's: the tarball as downloaded (gzip), its content once extracted, its members.
# The official repository is a few hundred kilobytes of JSON; these leave room for large private ones.
MAX_DOWNLOAD_BYTES = 256 * 2**20
MAX_TREE_BYTES = 1 * 2**30
MAX_MEMBERS = 20_000

_CHUNK = 1 << 16


class ArchiveError(SpinfError):
    """A tarball that is unsafe, too large, truncated or corrupt; the message says which member and why."""


@attrs.frozen
class Limits:
    """The caps on one download and its extraction (tests lower them)."""

    max_download_bytes: int = MAX_DOWNLOAD_BYTES
    max_tree_bytes: int = MAX_TREE_BYTES
    max_members: int = MAX_MEMBERS


@attrs.define
class _Tally:
    members: int = 0
    content_bytes: int = 0
    tops: set[str] = attrs.Factory(set)
    names: set[tuple[str, ...]] = attrs.Factory(set)


def extract(archive: Path, into: Path, limits: Limits | None = None) -> Path:
    """Extracts the gzip tarball ``archive`` into the new folder ``into``; returns the archive's single top-level
    folder there. Raises `ArchiveError`; ``into`` may then hold a partial tree, which the caller removes."""
    limits = Limits() if limits is None else limits
    into.mkdir()
    tally = _Tally()
    try:
        with gzip.open(archive) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                parts = _check(member, tally, limits)
                _write(tar, member, into.joinpath(*parts))
            _drain(stream, limits.max_tree_bytes)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as error:
        raise ArchiveError(f"the tarball is truncated or corrupt ({error or type(error).__name__})") from None
    if len(tally.tops) != 1 or not (into / next(iter(tally.tops))).is_dir():
        raise ArchiveError("the tarball has no single top-level folder")
    return into / next(iter(tally.tops))


def _check(member: tarfile.TarInfo, tally: _Tally, limits: Limits) -> tuple[str, ...]:
    """The member's path parts, once it passed every rule and cap."""
    tally.members += 1
    if tally.members > limits.max_members:
        raise ArchiveError(f"the tarball has more than {limits.max_members} members")
    parts = _parts(member.name)
    if member.issym() or member.islnk():
        raise ArchiveError(f"the tarball member {member.name!r} is a link")
    if not (member.isfile() or member.isdir()):
        raise ArchiveError(f"the tarball member {member.name!r} is a special file (device, FIFO or other)")
    if member.isfile():
        tally.content_bytes += member.size
        if tally.content_bytes > limits.max_tree_bytes:
            raise ArchiveError(f"the tarball's content is larger than {limits.max_tree_bytes} bytes")
    if parts in tally.names:
        raise ArchiveError(f"the tarball member {member.name!r} appears twice")
    tally.names.add(parts)
    tally.tops.add(parts[0])
    if len(tally.tops) > 1:
        raise ArchiveError(f"the tarball has more than one top-level entry ({', '.join(sorted(tally.tops))})")
    return parts


def _parts(name: str) -> tuple[str, ...]:
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise ArchiveError(f"the tarball member {name!r} has an absolute path")
    if "\\" in name or "\0" in name:
        raise ArchiveError(f"the tarball member {name!r} has a backslash or NUL in its path")
    parts = tuple(part for part in name.split("/") if part not in ("", "."))
    if ".." in parts:
        raise ArchiveError(f"the tarball member {name!r} escapes its folder ('..')")
    if not parts:
        raise ArchiveError(f"the tarball member {name!r} has an empty path")
    return parts


def _write(tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path) -> None:
    try:
        if member.isdir():
            path.mkdir(parents=True, exist_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        source = tar.extractfile(member)
        with open(path, "xb") as target:
            if source is not None:
                shutil.copyfileobj(source, target, _CHUNK)
    except (FileExistsError, NotADirectoryError) as error:
        raise ArchiveError(f"the tarball member {member.name!r} clashes with another ({error.strerror})") from None


def _drain(stream: gzip.GzipFile, max_bytes: int) -> None:
    """Reads the gzip stream to its end (the tar end blocks and padding), so a short stream or a bad CRC shows."""
    total = 0
    while chunk := stream.read(_CHUNK):
        total += len(chunk)
        if total > max_bytes:
            raise ArchiveError(f"the tarball's content is larger than {max_bytes} bytes")
