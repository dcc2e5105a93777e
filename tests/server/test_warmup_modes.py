"""``--warmup full|short|none`` in a real server process (``spinf-serve serve spinf/tiny-gemma4 --device cpu``).

What each mode ran is read off ``/metrics`` once ``/readyz`` is 200: ``spinf_warmup_steps`` and
``spinf_warmup_passes`` (the warm-up's passes, which stay out of ``spinf_pass_seconds``), and ``boot.warmup_s`` and
``boot.warmup_extract_s`` (the tiny model extracts, so ``short`` and ``full`` end with an extraction call).
``none`` is ready without a pass and its first call pays; ``full`` runs ``short``'s calls and more passes. The token
budget is small so that ``full``'s largest pass stays quick on the CPU. tests/engine/test_warm.py checks which
passes each mode builds.
"""

from __future__ import annotations

import re

import httpx
import pytest

from contrib.loadtest.harness import ServerProcess, score_body, tiny_cache


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tiny_cache(tmp_path_factory.mktemp("hf-home"))


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    if match is None:
        raise AssertionError(f"{name} is not in /metrics")
    return float(match[1])


@pytest.fixture(scope="module")
def booted(tmp_path_factory, cache) -> dict:
    """Per mode: the boot object, the warm-up's steps and passes, and the served passes, read once ready; then the
    served passes after one call."""
    found = {}
    for mode in ("none", "short", "full"):
        server = ServerProcess(
            tmp_path_factory.mktemp(mode), "--warmup", mode, "--token-budget", "2048", hf_home=cache
        )
        try:
            boot = httpx.get(f"{server.url}/readyz", timeout=10).json()["boot"]
            ready = httpx.get(f"{server.url}/metrics", timeout=10).text
            answer = httpx.post(f"{server.url}/v1/score", json=score_body(), timeout=60)
            after = httpx.get(f"{server.url}/metrics", timeout=10).text
        finally:
            assert server.stop() == 0
        assert answer.status_code == 200, answer.text
        found[mode] = {
            "boot": boot,
            "steps": metric(ready, "spinf_warmup_steps"),
            "passes": metric(ready, "spinf_warmup_passes"),
            "served": metric(ready, "spinf_pass_seconds_count"),
            "served_after": metric(after, "spinf_pass_seconds_count"),
            "passes_after": metric(after, "spinf_warmup_passes"),
            "jobs": metric(ready, "spinf_engine_thread_jobs"),
            "jobs_after": metric(after, "spinf_engine_thread_jobs"),
            "busy": metric(ready, "spinf_engine_thread_busy_seconds"),
            "busy_after": metric(after, "spinf_engine_thread_busy_seconds"),
        }
    return found


def test_none_is_ready_without_a_pass_and_its_first_call_pays(booted):
    none = booted["none"]
    assert (none["steps"], none["passes"]) == (0, 0)
    assert "warmup_s" not in none["boot"] and "warmup_extract_s" not in none["boot"] and none["boot"]["warm"] is True
    assert none["served"] == 0 and none["served_after"] > 0


def test_short_and_full_run_their_shapes_and_full_runs_more(booted):
    short, full = booted["short"], booted["full"]
    assert short["steps"] == 4 and short["passes"] >= 1  # two scoring calls, the media call and the extraction call
    assert full["steps"] == short["steps"] + 9  # the eight graph buckets and the token budget
    assert full["passes"] >= short["passes"] + 9
    for boot in (short["boot"], full["boot"]):
        assert boot["warmup_s"] > 0 and boot["warmup_extract_s"] > 0
        assert list(boot)[3:5] == ["warmup_s", "warmup_extract_s"]


@pytest.mark.parametrize("mode", ["none", "short", "full"])
def test_the_warm_ups_passes_are_not_served_passes(booted, mode):
    found = booted[mode]
    assert found["served"] == 0 and found["served_after"] >= 1
    assert found["passes_after"] == found["passes"]


@pytest.mark.parametrize("mode", ["none", "short", "full"])
def test_the_engine_threads_jobs_count_the_load_the_warm_up_and_the_calls(booted, mode):
    """The executor's statistics on /metrics: the load and each warm-up step are jobs of the engine thread, and a
    call adds its own; the seconds it was busy only grow."""
    found = booted[mode]
    assert found["jobs"] >= 1 + found["steps"]
    assert found["jobs_after"] > found["jobs"]
    assert found["busy_after"] >= found["busy"] > 0
