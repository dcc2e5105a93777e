"""J1 on the built-in tiny model, on the CPU: 24 contents of ~470 tokens × 56 two-option questions.

Run: ``python benchmarks/cpu_tiny.py`` (appends a section to benchmarks/RESULTS.md). The tiny model's numbers
measure the engine's host work and CPU path only; GPU figures come from the GPU benchmarks.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.jobsets import j1_body  # noqa: E402
from spinf import Engine  # noqa: E402

RESULTS = Path(__file__).with_name("RESULTS.md")


def main(repeats: int = 3) -> None:
    started = time.perf_counter()
    engine = Engine("spinf/tiny-gemma4", device="cpu")
    load_s = time.perf_counter() - started
    body = j1_body()
    times, response = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        response = engine.score(body, debug=True)
        times.append(time.perf_counter() - t)
    usage = response["usage"]
    questions = usage["scoring"]["prompts"]
    content = usage["content"]["tokens"] / usage["inputs"]
    median = statistics.median(times)
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "spinf"], capture_output=True, text=True).stdout.strip()
    revision = f"{revision}-dirty" if revision and dirty else revision
    lines = [
        f"\n## CPU, tiny model, J1 shape — {datetime.date.today().isoformat()}, revision {revision or 'unknown'}\n",
        f"- command: `python benchmarks/cpu_tiny.py`; machine: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}",
        f"- job: {usage['inputs']} contents of {content:.0f} tokens on average × 56 two-option questions "
        f"= {questions} questions; processed tokens {usage['processed_tokens']}, packed {usage['packed_tokens']}",
        f"- engine load {load_s:.2f} s; score: median {median:.2f} s of {repeats} "
        f"({', '.join(f'{t:.2f}' for t in times)}); {questions / median:.0f} questions/s",
    ]
    text = "\n".join(lines) + "\n"
    if not RESULTS.exists():
        RESULTS.write_text(
            "# Benchmark results\n\nEach section: what ran, the command, the machine, the date, the revision.\n"
        )
    with RESULTS.open("a") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
