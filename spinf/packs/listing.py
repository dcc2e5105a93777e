"""``spinf-serve packs list`` (packs spec §4.7): the catalog a server with these options would build, no model loaded.

On ``out``: the source labels, then a table of the enabled versions in catalog order (``pack``, ``version``,
``model``, ``status``, ``source``; the default version marked ``(default)``), or a line saying nothing is enabled,
then the skipped versions with their reasons. On ``err``: the official source's failure (the exit status stays) and
the catalog errors with their count, which make the exit status 1. The options are ``packs list``'s own names
(``--no-official``, ``--allow-namespace``), so a reserved-namespace reason names ``--allow-namespace``.
`read_catalog`, the catalog with a GitHub client from the environment, is also what the server builds at start and
on a reload.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TextIO

from spinf.packs.catalog import Catalog, build_catalog
from spinf.packs.github import GitHub
from spinf.packs.report import table
from spinf.packs.sources import ALLOW_FLAG as SERVE_ALLOW_FLAG

COLUMNS = ("pack", "version", "model", "status", "source")
ALLOW_FLAG = "--allow-namespace"


def read_catalog(
    specs: Sequence[str],
    *,
    model: str | None,
    official_on: bool,
    allowed: Sequence[str],
    refresh: bool,
    official: str | None = None,
    allow_flag: str = SERVE_ALLOW_FLAG,
    environ: Mapping[str, str] | None = None,
) -> Catalog:
    """The catalog of these sources, GitHub ones fetched with a client from ``environ`` (``GITHUB_TOKEN``,
    ``SPINF_GITHUB_API``): what ``packs list`` shows and what the server builds at start and on a reload.
    ``official``: the ``packs_official`` setting (None: ``$SPINF_PACKS_OFFICIAL``, else the pinned tag)."""
    with GitHub.from_environ(environ) as github:
        return build_catalog(
            specs,
            model=model,
            official_on=official_on,
            official=official,
            allowed=allowed,
            refresh=refresh,
            github=github,
            allow_flag=allow_flag,
            environ=environ,
        )


def list_packs(
    specs: Sequence[str],
    *,
    model: str | None,
    official_on: bool,
    allowed: Sequence[str],
    refresh: bool,
    out: TextIO,
    err: TextIO,
    environ: Mapping[str, str] | None = None,
) -> int:
    catalog = read_catalog(
        specs,
        model=model,
        official_on=official_on,
        allowed=allowed,
        refresh=refresh,
        allow_flag=ALLOW_FLAG,
        environ=environ,
    )
    return report(catalog, model, out, err)


def report(catalog: Catalog, model: str | None, out: TextIO, err: TextIO) -> int:
    """Writes the listing of ``catalog``; the exit status."""
    print(f"sources: {', '.join(catalog.sources) if catalog.sources else 'none'}", file=out)
    rows = [
        (
            v.id,
            v.version + (" (default)" if v.version == catalog.packs[v.id].default else ""),
            v.model,
            v.status,
            v.source,
        )
        for v in catalog.versions()
    ]
    if rows:
        for line in table([COLUMNS, *rows]):
            print(line, file=out)
    else:
        print("no pack version is enabled" + (f" for the model {model}" if model is not None else ""), file=out)
    if catalog.skipped:
        print(f"skipped ({len(catalog.skipped)}):", file=out)
        for s in catalog.skipped:
            print(f"  {s.id} {s.version} from {s.source}: {s.reason}", file=out)
    for warning in catalog.warnings:
        print(f"warning: {warning}", file=err)
    if catalog.official_error is not None:
        print(f"the official pack source is unavailable: {catalog.official_error}", file=err)
    if catalog.errors:
        for error in catalog.errors:
            print(f"error: {error}", file=err)
        count = len(catalog.errors)
        print(f"{count} catalog error{'' if count == 1 else 's'}", file=err)
        return 1
    return 0
