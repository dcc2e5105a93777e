"""Where a call's wall time goes when the GPU waits: one call under torch.profiler, then its trace read back.

`trace_call` runs one call with the profiler (CPU and CUDA activity, Python frames with ``stack``) and writes the
Chrome trace; `idle_lines` reads such a trace: how long the GPU ran (the union of its kernels, copies and sets),
where it sat idle between the first and the last of them, and which host frames were running during those idle
gaps (inclusive time, so an outer frame counts its callees too), with the CUDA runtime calls that block the host.

``python -m benchmarks.trace TRACE.json`` prints the report of a trace written earlier (a GPU run's, read here).
"""

from __future__ import annotations

import bisect
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cpu_op", "python_function", "cuda_runtime", "user_annotation")
BLOCKING = ("Synchronize", "cudaMemcpy", "cudaHostAlloc", "cudaMallocHost", "cudaFree", "cudaMalloc")


def trace_call(call: Callable[[], object], path: Path, *, stack: bool) -> float:
    """Runs ``call`` once under the profiler and writes its trace to ``path``; returns the call's seconds."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities, with_stack=stack) as prof:
        started = time.perf_counter()
        call()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
    prof.export_chrome_trace(str(path))
    return seconds


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def idle_lines(path: Path, *, min_gap_us: float = 20.0, top: int = 40) -> list[str]:
    """The report of the trace at ``path`` (times in ms)."""
    events = [e for e in json.loads(Path(path).read_text())["traceEvents"] if e.get("ph") == "X"]
    gpu = merged([(e["ts"], e["ts"] + e.get("dur", 0)) for e in events if e.get("cat") in GPU_CATEGORIES])
    host = [e for e in events if e.get("cat") in HOST_CATEGORIES]
    if not gpu:
        return ["no GPU activity in the trace"]
    first, last = gpu[0][0], gpu[-1][1]
    busy = sum(b - a for a, b in gpu)
    gaps = [(a[1], b[0]) for a, b in zip(gpu, gpu[1:], strict=False) if b[0] - a[1] >= min_gap_us]
    lead = min((e["ts"] for e in host), default=first)
    tail = max((e["ts"] + e.get("dur", 0) for e in host), default=last)
    lines = [
        f"host span {(tail - lead) / 1e3:.1f} ms; GPU from {(first - lead) / 1e3:.1f} ms to {(last - lead) / 1e3:.1f}"
        f" ms, busy {busy / 1e3:.1f} ms; idle in between {(last - first - busy) / 1e3:.1f} ms, of it"
        f" {sum(b - a for a, b in gaps) / 1e3:.1f} ms in {len(gaps)} gaps of {min_gap_us:g} us or more"
        f" (largest {max((b - a for a, b in gaps), default=0) / 1e3:.2f} ms)",
    ]
    # before the first kernel and after the last: idle too, from the host's side
    gaps = [(lead, first), *gaps, (last, tail)]
    starts = [a for a, _ in gaps]
    overlap: dict[str, float] = defaultdict(float)
    blocking: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in host:
        a, b = e["ts"], e["ts"] + e.get("dur", 0)
        if e.get("cat") == "cuda_runtime" and any(word in e["name"] for word in BLOCKING):
            blocking[e["name"]][0] += 1
            blocking[e["name"]][1] += b - a
        i = max(0, bisect.bisect_right(starts, a) - 1)
        total = 0.0
        while i < len(gaps) and gaps[i][0] < b:
            total += max(0.0, min(b, gaps[i][1]) - max(a, gaps[i][0]))
            i += 1
        if total:
            overlap[e["name"]] += total
    lines.append(
        "host frames running while the GPU was idle (inclusive ms, the first and last idle stretches included):"
    )
    for name, us in sorted(overlap.items(), key=lambda item: -item[1])[:top]:
        lines.append(f"  {us / 1e3:10.2f}  {name[:150]}")
    lines.append("CUDA runtime calls that can block the host (count, total ms):")
    for name, (count, us) in sorted(blocking.items(), key=lambda item: -item[1][1]):
        lines.append(f"  {count:6d} {us / 1e3:10.2f}  {name}")
    return lines


if __name__ == "__main__":
    print(*idle_lines(Path(sys.argv[1])), sep="\n")
