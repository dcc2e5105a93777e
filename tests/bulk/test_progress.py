"""The terminal progress bar: one line redrawn in place, items/s over this run only, ETA, throttled redraws."""

from __future__ import annotations

import io

from spinf.bulk.progress import ProgressBar


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_line_shows_done_total_rate_and_eta():
    clock, out = Clock(), io.StringIO()
    bar = ProgressBar(out, width=10, clock=clock)
    bar(200, 1200)  # a resumed run: 200 were there before
    clock.now += 5
    bar(700, 1200)
    assert out.getvalue().split("\r")[-1] == "700/1,200 [#####-----]  58.3% 100.0 items/s ETA 0:00:05"
    clock.now += 5
    bar(1200, 1200)
    bar.close()
    assert out.getvalue().endswith("\r1,200/1,200 [##########] 100.0% 100.0 items/s ETA 0:00:00\n")
    assert out.getvalue().count("\n") == 1


def test_redraws_are_throttled_but_the_last_one_is_not():
    clock, out = Clock(), io.StringIO()
    bar = ProgressBar(out, clock=clock)
    for done in range(0, 100, 10):
        clock.now += 0.01
        bar(done, 100)
    clock.now += 0.01
    bar(100, 100)
    assert out.getvalue().count("\r") == 2  # the first call and the last one
    assert out.getvalue().startswith("\r0/100 [") and "ETA -:--:--" in out.getvalue()


def test_a_shorter_line_blanks_the_rest_of_the_longer_one():
    clock, out = Clock(), io.StringIO()
    bar = ProgressBar(out, width=4, clock=clock)
    bar(0, 10)
    clock.now += 3600 * 10
    bar(1, 10)
    first, second = out.getvalue().split("\r")[1:]
    assert len(second) >= len(first)
    assert second.rstrip().endswith("ETA 90:00:00")
