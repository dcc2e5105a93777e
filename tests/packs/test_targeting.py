"""Model targeting (packs spec §1.3): case-insensitive equality, or the same catalog manifest by id or alias."""

from __future__ import annotations

import pytest

from spinf.catalog import load_catalog
from spinf.packs.targeting import same_model

CATALOG = load_catalog([])


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("spinf/gemma-4-12b-fp8", "spinf/gemma-4-12b-fp8", True),
        ("SPINF/Gemma-4-12B-fp8", "spinf/gemma-4-12b-fp8", True),
        ("spinf-12b", "spinf/gemma-4-12b-fp8", True),  # an alias and the id
        ("gemma-4-12b", "Google/Gemma-4-12B", True),  # two aliases of one manifest
        ("tiny", "spinf/tiny-gemma4", True),
        ("spinf-12b", "spinf-31b", False),  # two manifests
        ("acme/private-model", "ACME/Private-Model", True),  # no manifest: equality ignoring case
        ("acme/private-model", "/models/private-model", False),
        ("spinf-12b", "/models/gemma-4-12b", False),  # one resolves, the other does not
        ("/models/x", "spinf-12b", False),
    ],
)
def test_same_model(a, b, same):
    assert same_model(a, b, CATALOG) is same
    assert same_model(b, a, CATALOG) is same
