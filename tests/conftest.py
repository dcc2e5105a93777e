"""Shared fixtures: the tiny model generated once per session into a private cache (nothing is downloaded)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("hub-cache")


@pytest.fixture(scope="session")
def tiny_engine(tiny_cache):
    from spinf import Engine

    return Engine("spinf/tiny-gemma4", device="cpu", cache_dir=tiny_cache)
