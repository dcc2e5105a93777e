"""J1 on the built-in tiny model, on the CPU: 24 contents of ~470 tokens × 56 two-option questions.

Run: ``python benchmarks/cpu_tiny.py`` prints the figures; with ``--results`` it also appends them as a section to
benchmarks/RESULTS.md (with the command, machine, date and revision). The tiny model's numbers
measure the engine's host work and CPU path only; GPU figures come from the GPU benchmarks.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.jobsets import j1_body  # noqa: E402
from benchmarks.results import RESULTS, append_section, cpu_machine  # noqa: E402
from spinf import Engine  # noqa: E402


def main(repeats: int = 3, results: bool = False) -> None:
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
    command = "python benchmarks/cpu_tiny.py" + (" --results" if results else "")
    lines = [
        f"- command: `{command}`; machine: {cpu_machine()}",
        f"- job: {usage['inputs']} contents of {content:.0f} tokens on average × 56 two-option questions "
        f"= {questions} questions; processed tokens {usage['processed_tokens']}, packed {usage['packed_tokens']}",
        f"- engine load {load_s:.2f} s; score: median {median:.2f} s of {repeats} "
        f"({', '.join(f'{t:.2f}' for t in times)}); {questions / median:.0f} questions/s",
    ]
    if results:
        print(append_section("CPU, tiny model, J1 shape", "\n".join(lines), RESULTS))
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="J1 on the built-in tiny model, on the CPU")
    parser.add_argument("--repeats", type=int, default=3, help="scoring calls timed (default 3)")
    parser.add_argument("--results", action="store_true", help="append the figures to benchmarks/RESULTS.md")
    arguments = parser.parse_args()
    main(arguments.repeats, arguments.results)
