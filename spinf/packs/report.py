"""``spinf-serve packs validate FOLDER`` (packs spec §4.8): the pack author's and CI check of a local folder.

It scans the folder as a source is scanned (`spinf.packs.repository`), with no model filter and no namespace
reservation, and adds a lock mismatch as a problem. On ``out``: a header (manifest and namespace, or discovery), a
table of the loaded pack versions (``pack``, ``version``, ``model``, ``status``, ``queries``, ``prompts``, ``lock``),
a line per coming-soon version of the manifest. On ``err``: the problems and their count. The exit status is 1 on
any problem, else 0 after a closing line with the number of versions.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from spinf.packs.manifest import MANIFEST_NAME
from spinf.packs.problems import Problem
from spinf.packs.repository import LoadedPack, Scan, scan_folder

COLUMNS = ("pack", "version", "model", "status", "queries", "prompts", "lock")


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as lines: columns left-aligned, padded to the widest cell, two spaces apart, trailing spaces trimmed."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


def _lock(loaded: LoadedPack) -> str:
    return {None: "-", True: "ok", False: "MISMATCH"}[loaded.pack.lock_matches]


def _row(loaded: LoadedPack) -> tuple[str, ...]:
    pack = loaded.pack
    return (pack.id, pack.version, pack.model, loaded.status, str(len(pack.queries)), str(pack.prompts), _lock(loaded))


def lock_problems(scan: Scan) -> list[Problem]:
    """A problem for each loaded version whose micro-layer lock does not match its content (§1.10)."""
    return [
        Problem(
            "decision.micro_layer.lock",
            f"{loaded.pack.id} {loaded.pack.version}: the lock does not match: the file was edited after the "
            "micro-layer was fitted (refit it, or restore the locked queries, reads and platt values)",
            loaded.file,
        )
        for loaded in scan.packs
        if loaded.pack.lock_matches is False
    ]


def validate_folder(folder: str, out: TextIO, err: TextIO) -> int:
    """Run the check on ``folder``, print the report and return the exit status."""
    scan = scan_folder(folder)
    if scan.manifest is not None:
        print(f"{folder}: {MANIFEST_NAME}, namespace {scan.manifest.namespace}", file=out)
    elif Path(folder, MANIFEST_NAME).is_file():
        print(f"{folder}: {MANIFEST_NAME} is invalid, nothing loaded", file=out)
    else:
        print(f"{folder}: no {MANIFEST_NAME}, pack files found by discovery", file=out)
    if scan.packs:
        for line in table([COLUMNS, *map(_row, scan.packs)]):
            print(line, file=out)
    else:
        print("no pack files", file=out)
    for pack_id, version in scan.coming_soon:
        print(f"coming soon: {pack_id} {version}", file=out)
    problems = [*scan.problems, *lock_problems(scan)]
    if problems:
        for problem in problems:
            print(problem.render(), file=err)
        print(f"{len(problems)} problem{'s' if len(problems) != 1 else ''}", file=err)
        return 1
    count = len(scan.packs)
    print(f"{count} pack version{'s' if count != 1 else ''}, no problem", file=out)
    return 0
