"""The catalog tests never see the caller's manifests, caches or offline switch, and never touch the network:
each test gets an empty ``HF_HOME`` of its own."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def isolated_environment(tmp_path_factory, monkeypatch):
    for name in ("SPINF_MANIFEST_DIRS", "SPINF_CACHE_DIRS", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf-home")))
