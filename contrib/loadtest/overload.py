"""Overload as a ratio in one run: goodput and p99 of admitted calls under a flood, against a few polite clients.

One server process, one body, two phases back to back on the same machine: ``--clients`` connections (5 = the
default ``queue + 1`` slots, so nothing is refused), then ``--flood`` connections that retry at once whatever the
answer, never honouring ``Retry-After``. Goodput is the 200s per second; the latency of admitted calls is the
server's access-log time of each 200 (from the request's first byte handled to its answer). The targets (issue
10): flood goodput >= 80 % of the polite figure, flood p99 <= 2x the polite p99.

    python contrib/loadtest/overload.py --seconds 20 --flood 500
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.results import append_section, cpu_machine
from contrib.loadtest.harness import ServerProcess, percentile, run_wrk, score_body


def phase(server: ServerProcess, body_file: Path, connections: int, seconds: float) -> dict:
    mark = server.log_lines()
    counts = run_wrk(server.url, body_file, connections=connections, seconds=seconds)
    time.sleep(0.5)  # the last answers' log lines
    durations = server.durations_ms(mark)
    return {
        "connections": connections,
        "goodput": counts.get("status_200", 0) / counts["duration_s"],
        "refused_per_s": (counts.get("status_429", 0) + counts.get("status_503", 0)) / counts["duration_s"],
        "p50_ms": percentile(durations, 0.50),
        "p99_ms": percentile(durations, 0.99),
        "max_ms": max(durations, default=float("nan")),
        "unexpected": counts.get("unexpected_status", 0) + counts.get("missing_retry_after", 0),
        "timeouts": counts.get("timeouts", 0),
    }


def measure(
    folder: Path, *, clients: int = 5, flood: int = 500, seconds: float = 20.0, reject_rate: float | None = None
) -> dict:
    """Both phases on one fresh server (its ``reject_rate`` given, or its default); the figures and the two
    ratios."""
    body_file = folder / "body.json"
    folder.mkdir(parents=True, exist_ok=True)
    body_file.write_text(json.dumps(score_body()))
    server = ServerProcess(folder, env=None if reject_rate is None else {"SPINF_REJECT_RATE": str(reject_rate)})
    try:
        run_wrk(server.url, body_file, connections=clients, seconds=2)  # warm the path
        polite = phase(server, body_file, clients, seconds)
        flooded = phase(server, body_file, flood, seconds)
    finally:
        exit_code = server.stop()
    return {
        "polite": polite,
        "flood": flooded,
        "goodput_ratio": flooded["goodput"] / polite["goodput"],
        "p99_ratio": flooded["p99_ms"] / polite["p99_ms"],
        "exit_code": exit_code,
        "reject_rate": reject_rate,
    }


def report(figures: dict) -> str:
    polite, flood = figures["polite"], figures["flood"]
    rows = [
        "| phase | connections | 200s/s | refusals/s | p50 ms | p99 ms | max ms | timeouts |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in (("polite", polite), ("flood", flood)):
        rows.append(
            f"| {name} | {row['connections']} | {row['goodput']:.1f} | {row['refused_per_s']:.0f} | "
            f"{row['p50_ms']:.1f} | {row['p99_ms']:.1f} | {row['max_ms']:.1f} | {row['timeouts']:.0f} |"
        )
    rows.append("")
    rows.append(
        f"goodput ratio {figures['goodput_ratio']:.2f} (target >= 0.80), p99 ratio {figures['p99_ratio']:.2f} "
        f"(target <= 2.0), server exit {figures['exit_code']}"
        + ("" if figures.get("reject_rate") is None else f", reject_rate {figures['reject_rate']:.0f}")
    )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--flood", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--reject-rate", type=float, help="the server's reject_rate (default: its own default)")
    parser.add_argument("--results", action="store_true", help="append the figures to benchmarks/RESULTS.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        figures = measure(
            Path(folder), clients=args.clients, flood=args.flood, seconds=args.seconds, reject_rate=args.reject_rate
        )
    text = report(figures)
    print(text)
    if args.results:
        command = f"python contrib/loadtest/overload.py --clients {args.clients} --flood {args.flood} "
        command += f"--seconds {args.seconds:g} --results"
        body = f"- command: `{command}`; machine: {cpu_machine()}; wrk, loopback\n\n{text}"
        append_section("Overload, tiny model on the CPU", body)
    return 0 if figures["goodput_ratio"] >= 0.8 and figures["p99_ratio"] <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
