"""A one-line progress bar for a terminal: done/total, percent, items per second and the time left.

No dependency: it rewrites one line with a carriage return, at most every ``interval`` seconds (and always for the
last item). The rate counts only the items of this run, so a resumed run does not claim the earlier run's speed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO


def _clock_text(seconds: float) -> str:
    minutes, secs = divmod(int(seconds + 0.5), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


class ProgressBar:
    """Call it with ``(done, total)``; the first call sets where this run started. ``close()`` ends the line."""

    def __init__(
        self,
        stream: TextIO,
        *,
        width: int = 30,
        interval: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._stream = stream
        self._width = width
        self._interval = interval
        self._clock = clock
        self._start: tuple[float, int] | None = None
        self._drawn_at = float("-inf")
        self._shown = 0

    def __call__(self, done: int, total: int) -> None:
        now = self._clock()
        if self._start is None:
            self._start = (now, done)
        if done < total and now - self._drawn_at < self._interval:
            return
        self._drawn_at = now
        text = self.line(done, total, now)
        self._stream.write("\r" + text.ljust(self._shown))
        self._stream.flush()
        self._shown = len(text)

    def line(self, done: int, total: int, now: float) -> str:
        started_at, started_done = self._start or (now, done)
        elapsed = now - started_at
        rate = (done - started_done) / elapsed if elapsed > 0 else 0.0
        share = done / total if total else 1.0
        filled = int(share * self._width)
        eta = _clock_text((total - done) / rate) if rate > 0 else "-:--:--"
        bar = "#" * filled + "-" * (self._width - filled)
        return f"{done:,}/{total:,} [{bar}] {share:6.1%} {rate:,.1f} items/s ETA {eta}"

    def close(self) -> None:
        if self._shown:
            self._stream.write("\n")
            self._stream.flush()
            self._shown = 0
