"""The J1-shaped job set (24 contents of ~470 tokens × 56 two-option questions) on the tiny model, 2 CPU cores."""

import time

from benchmarks.jobsets import j1_body

LIMIT_S = 60.0


def test_j1_shape_scores_within_a_minute_on_the_cpu(tiny_engine):
    body = j1_body()
    started = time.perf_counter()
    response = tiny_engine.score(body)
    elapsed = time.perf_counter() - started
    assert response["usage"]["scoring"]["prompts"] == 24 * 56
    assert all(len(r["queries"][0]["combinations"]) == 56 for r in response["results"])
    assert elapsed < LIMIT_S, f"J1 took {elapsed:.1f} s"
