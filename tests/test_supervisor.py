"""Process set-up in spinf.supervisor: the malloc arena cap (the wiring itself is exercised by tests/server)."""

from __future__ import annotations

import platform
import sys

import pytest

from spinf.supervisor import cap_malloc_arenas


def test_an_arena_count_the_operator_set_is_left_alone(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert cap_malloc_arenas() is False


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_on_glibc_the_arenas_are_capped(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert cap_malloc_arenas() is True
