"""Where a call's wall time goes: the host's steps against the device's passes, on one timeline.

Used by ``benchmarks/gpu_fast.py --timeline``: it wraps one `Scorer`'s ``launch`` and ``collect`` for one call,
records a CUDA event at the call's start (the device idle, so device time 0 is host time 0) and at each pass's
start and end, and prints the spans in which the device had nothing queued (gaps), each with what the host was
doing then. Device-side only; nothing here changes what the engine computes.
"""

from __future__ import annotations

import time

import torch


class Timeline:
    def __init__(self, scorer):
        self.scorer = scorer
        self.host: list[tuple[str, float, float]] = []  # (what, start, end) in seconds from the call's start
        self.passes: list[tuple[object, object, int]] = []  # (start event, end event, rows)

    def __enter__(self):
        scorer, launch, collect = self.scorer, self.scorer.launch, self.scorer.collect
        torch.cuda.synchronize()
        self.t0 = time.perf_counter()
        self.e0 = torch.cuda.Event(enable_timing=True)
        self.e0.record()

        def timed_launch(layout):
            began = time.perf_counter()
            launched = launch(layout)
            self.host.append(("launch", began - self.t0, time.perf_counter() - self.t0))
            self.passes.append((*launched.timing, layout.num_tokens))
            return launched

        def timed_collect(pending):
            began = time.perf_counter()
            found = collect(pending)
            self.host.append(("wait+read", began - self.t0, time.perf_counter() - self.t0))
            return found

        scorer.launch, scorer.collect = timed_launch, timed_collect
        return self

    def __exit__(self, *exc):
        del self.scorer.launch, self.scorer.collect  # back to the class's methods
        torch.cuda.synchronize()
        self.t1 = time.perf_counter() - self.t0

    def report(self, name: str) -> str:
        spans = [(self.e0.elapsed_time(a) / 1000, self.e0.elapsed_time(b) / 1000, n) for a, b, n in self.passes]
        lines = [f"{name}: call {self.t1 * 1000:.0f} ms, {len(spans)} passes"]
        at, idle = 0.0, 0.0
        for k, (start, end, rows) in enumerate(spans):
            if start - at > 0.001:
                idle += start - at
                lines.append(f"  gap {at * 1000:8.1f} -> {start * 1000:8.1f} ms ({(start - at) * 1000:.1f} ms)")
            lines.append(f"  pass {k:2d} {start * 1000:8.1f} -> {end * 1000:8.1f} ms ({rows} rows)")
            at = max(at, end)
        idle += self.t1 - at
        lines.append(f"  tail {at * 1000:8.1f} -> {self.t1 * 1000:8.1f} ms; device idle {idle * 1000:.0f} ms in all")
        for what, start, end in self.host:
            lines.append(f"  host {what:9s} {start * 1000:8.1f} -> {end * 1000:8.1f} ms")
        return "\n".join(lines)
