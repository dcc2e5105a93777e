"""The scheduler's capture bound: a pass keeps at most the capture budget's keys and values for extraction slots."""

from __future__ import annotations

from spinf.engine.scheduler import Scheduler


def test_slot_jobs_past_the_capture_budget_wait_for_the_next_pass():
    scheduler = Scheduler(1000, share_passes=True, capture_budget=300)
    for index, (tokens, capture) in enumerate([(200, 200), (150, 0), (200, 200), (100, 100), (50, 0)]):
        scheduler.add("call", index, tokens, capture)
    first = scheduler.schedule()
    assert sum(w.capture for w in first) <= 300
    assert {w.index for w in first} >= {1, 4}  # jobs without slots are never held back
    assert scheduler.waiting_tokens == sum(w.num_tokens for w in scheduler._waiting)
    second = scheduler.schedule()
    assert sum(w.capture for w in second) <= 300
    rest = [w for _ in range(3) if scheduler.num_waiting for w in scheduler.schedule()]
    assert sorted(w.index for w in first + second + rest) == [0, 1, 2, 3, 4]


def test_a_slot_job_over_the_budget_alone_still_runs():
    scheduler = Scheduler(1000, share_passes=False, capture_budget=100)
    scheduler.add("call", 0, 500, 500)
    scheduler.add("call", 1, 400, 400)
    assert [w.index for w in scheduler.schedule()] in ([0], [1])
    assert scheduler.num_waiting == 1


def test_no_budget_packs_as_before():
    scheduler = Scheduler(1000, share_passes=True)
    for index in range(4):
        scheduler.add("call", index, 200, 200)
    assert len(scheduler.schedule()) == 4
