"""The scheduler's capture bound: a pass keeps at most the capture budget's keys and values for extraction slots."""

from __future__ import annotations

from spinf.engine.scheduler import PACES, Scheduler


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


def test_a_small_call_rides_the_next_pass_beside_a_big_one_waiting_first():
    scheduler = Scheduler(1000, share_passes=True)
    for index in range(300):  # three passes' worth, all older than the small call's jobs
        scheduler.add("big", index, 10)
    scheduler.add("small", 0, 10)
    scheduler.add("small", 1, 30)
    first = scheduler.schedule()
    assert {(w.owner, w.index) for w in first} >= {("small", 0), ("small", 1)}
    assert sum(w.num_tokens for w in first) == 1000  # the room left is still filled
    assert [w.index for w in first if w.owner == "big"] == list(range(96))  # the big call's oldest jobs


def test_each_owner_gets_an_equal_share_of_the_pass_before_the_room_left_is_packed():
    scheduler = Scheduler(900, share_passes=True)
    for owner in ("a", "b", "c"):
        for index in range(100):
            scheduler.add(owner, index, 10)
    first = scheduler.schedule()
    assert [sum(w.owner == owner for w in first) for owner in "abc"] == [30, 30, 30]


def test_a_single_owner_is_packed_fullest_first_as_before():
    scheduler = Scheduler(1000, share_passes=True)
    for index, tokens in enumerate([600, 300, 500, 400, 200]):
        scheduler.add("call", index, tokens)
    assert sorted(w.index for w in scheduler.schedule()) == [0, 3]  # first-fit-decreasing: 600 + 400
    assert sorted(w.index for w in scheduler.schedule()) == [1, 2, 4]


def test_an_oldest_job_over_the_budget_runs_alone_though_others_wait():
    scheduler = Scheduler(1000, share_passes=True)
    scheduler.add("long", 0, 1500)
    scheduler.add("short", 0, 100)
    assert [(w.owner, w.index) for w in scheduler.schedule()] == [("long", 0)]
    assert [(w.owner, w.index) for w in scheduler.schedule()] == [("short", 0)]
    scheduler.add("older", 0, 1200)
    scheduler.add("longer", 0, 2000)
    assert [(w.owner, w.index) for w in scheduler.schedule()] == [("older", 0)]  # the oldest, not the largest


def test_each_owners_oldest_job_goes_over_its_share_while_it_fits_the_room_left():
    scheduler = Scheduler(1000, share_passes=True)
    for index in range(3):
        scheduler.add("a", index, 200)  # a's share of 333 holds one
    scheduler.add("b", 0, 700)  # over b's share, but it fits the 800 left
    scheduler.add("c", 0, 100)
    scheduler.add("c", 1, 100)  # fits c's share, not the room left
    assert [(w.owner, w.index) for w in scheduler.schedule()] == [("a", 0), ("b", 0), ("c", 0)]
    assert sorted((w.owner, w.index) for w in scheduler.schedule()) == [("a", 1), ("a", 2), ("c", 1)]


def test_a_bounded_pass_holds_what_the_last_pass_ran_in_max_pass_s():
    scheduler = Scheduler(1000, share_passes=True, max_pass_s=0.5)
    for index in range(200):
        scheduler.add("call", index, 10)
    assert scheduler.pass_budget() == 1000  # no pace yet: the token budget
    scheduler.ran(1000, 2.0)  # 2 ms a token: half a second is 250 tokens
    assert scheduler.pass_budget() == 250 and scheduler.target_tokens(0) == 250
    assert sum(w.num_tokens for w in scheduler.schedule()) == 250
    assert sum(w.num_tokens for w in scheduler.schedule(bounded=False)) == 1000  # warm-up: the full budget
    scheduler.ran(250, 0.05)  # a faster pass: the slowest of the last passes still sets the bound
    assert scheduler.pass_budget() == 250
    for _ in range(PACES):
        scheduler.ran(250, 0.05)  # 0.2 ms a token: never past the token budget
    assert scheduler.pass_budget() == 1000


def test_a_job_over_the_time_bound_runs_alone_and_no_bound_means_the_token_budget():
    scheduler = Scheduler(1000, share_passes=True, max_pass_s=0.1)
    scheduler.ran(100, 1.0)  # 10 ms a token: 10 tokens in a tenth of a second
    scheduler.add("call", 0, 400)
    scheduler.add("call", 1, 5)
    assert [w.index for w in scheduler.schedule()] == [0]  # over the bound, alone
    unbounded = Scheduler(1000, share_passes=True)
    unbounded.ran(100, 1.0)
    assert unbounded.pass_budget() == 1000
