"""Shared fixtures: the tiny model generated once per session into a private cache (nothing is downloaded)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    """``gpu``-marked tests run on the GPU machine and skip elsewhere."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("hub-cache")


@pytest.fixture(scope="session")
def tiny_engine(tiny_cache):
    from spinf import Engine

    return Engine("spinf/tiny-gemma4", device="cpu", cache_dir=tiny_cache)
