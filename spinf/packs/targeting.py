"""Model targeting (packs spec §1.3): whether a pack's ``model`` is the model a server serves.

Two names are the same model when they are equal ignoring case, or when both resolve to the same model manifest of
the catalog (as its id or an alias, ``api.md`` §9.5), so a pack for ``spinf-12b`` is served by a
``spinf/gemma-4-12b-fp8`` server. A name that resolves to no manifest (a checkpoint served by its repo id or path)
matches by case-insensitive equality only. The repository manifest compares exactly instead
(`spinf.packs.repository`); this is the catalog's filter.
"""

from __future__ import annotations

from spinf.catalog import Catalog


def same_model(a: str, b: str, catalog: Catalog) -> bool:
    if a.casefold() == b.casefold():
        return True
    found = catalog.find(a)
    return found is not None and found is catalog.find(b)
