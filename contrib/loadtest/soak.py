"""Soak: many connections for a long time, every answer checked, memory and descriptors read before and after.

Two wrk processes, each with half the connections and its own body, retry at once whatever the answer. Pass when:
only 200, 429 and 503 came back, every 429 and 503 with ``Retry-After``; every 200's results equal, byte for byte,
the same call made alone; the server's resident memory at the end of the load is at most 5 % above its reading a
tenth of the way in, or ``WARM_S`` in if that is later (the allocator has grown into the load by then: on a slow
2-core machine a 15-second run still grew over its first 3 s, 528 -> 549 MiB, flat after); and its open
descriptors are back to their idle count once the clients have gone.

    python contrib/loadtest/soak.py --connections 2000 --seconds 600
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.results import append_section, cpu_machine
from contrib.loadtest.harness import ServerProcess, alone, run_wrk, score_body

BODIES = (score_body(sentences=3, questions=8), score_body(sentences=1, questions=3))
WARM_S = 5.0  # the earliest memory reading the growth is measured from, in seconds of load
TENTHS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)  # when the memory path is read, as shares of the load


def _sample_rss(server: ServerProcess, stop: threading.Event, samples: list) -> None:
    while not stop.wait(1.0):
        samples.append((time.monotonic(), server.rss_kib()))


def measure(folder: Path, *, connections: int = 2000, seconds: float = 600.0) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    server = ServerProcess(folder)
    try:
        files = []
        for k, body in enumerate(BODIES):
            body_file, expect_file = folder / f"body{k}.json", folder / f"expect{k}.json"
            body_file.write_text(json.dumps(body))
            expect_file.write_text(alone(server.url, body))
            files.append((body_file, expect_file))
        idle_fds = server.descriptors()
        samples: list = []
        stop = threading.Event()
        sampler = threading.Thread(target=_sample_rss, args=(server, stop, samples))
        counts: list = [None] * len(files)

        def load(k: int) -> None:
            body_file, expect_file = files[k]
            share = connections // len(files)
            counts[k] = run_wrk(server.url, body_file, connections=share, seconds=seconds, expect_file=expect_file)

        started = time.monotonic()
        sampler.start()
        workers = [threading.Thread(target=load, args=(k,)) for k in range(len(files))]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        stop.set()
        sampler.join()
        fds_after = _settled_descriptors(server, idle_fds)
    finally:
        exit_code = server.stop()
    early = [rss for at, rss in samples if at - started >= max(seconds / 10, WARM_S)] or [samples[0][1]]
    total = {key: sum(c.get(key, 0) for c in counts) for key in set().union(*counts)}
    path = [next((rss for at, rss in samples if at - started >= seconds * share), samples[-1][1]) for share in TENTHS]
    return {
        "rss_path_kib": path,
        "connections": connections,
        "seconds": seconds,
        "counts": total,
        "rss_early_kib": early[0],
        "rss_end_kib": samples[-1][1],
        "rss_growth": samples[-1][1] / early[0] - 1,
        "idle_fds": idle_fds,
        "fds_after": fds_after,
        "exit_code": exit_code,
    }


def _settled_descriptors(server: ServerProcess, idle: int, wait_s: float = 60.0) -> int:
    """The server's descriptors once back to ``idle`` (the clients' connections closed), or after ``wait_s``: longer
    than the keep-alive timeout (``keepalive_s``, 30 s), after which the server closes a connection left idle; at 30 s
    this check raced it (a slow machine saw 54 descriptors against 26 idle, and 11 in the next run)."""
    deadline = time.monotonic() + wait_s
    count = server.descriptors()
    while count > idle and time.monotonic() < deadline:
        time.sleep(0.5)
        count = server.descriptors()
    return count


def problems(figures: dict) -> list[str]:
    """What failed, in words; empty when the soak passed."""
    counts, found = figures["counts"], []
    for key in ("unexpected_status", "missing_retry_after", "mismatch"):
        if counts.get(key, 0):
            found.append(f"{key}: {counts[key]:.0f}")
    if not counts.get("status_200"):
        found.append("no call was answered 200")
    if figures["rss_growth"] > 0.05:
        found.append(f"resident memory grew {figures['rss_growth']:.1%}")
    if figures["fds_after"] > figures["idle_fds"]:
        found.append(f"descriptors {figures['fds_after']} after the load, {figures['idle_fds']} idle")
    if figures["exit_code"] != 0:
        found.append(f"the server exited {figures['exit_code']}")
    return found


def report(figures: dict) -> str:
    counts = figures["counts"]
    duration = counts.get("duration_s", 0) / 2 or figures["seconds"]
    statuses = [f"{key[7:]}: {value:.0f}" for key, value in sorted(counts.items()) if key.startswith("status_")]
    return (
        f"{figures['connections']} connections for {figures['seconds']:.0f} s: {', '.join(statuses)} "
        f"({counts.get('status_200', 0) / duration:.1f} 200s/s); mismatched 200s {counts.get('mismatch', 0):.0f}, "
        f"other statuses {counts.get('unexpected_status', 0):.0f}, refusals without Retry-After "
        f"{counts.get('missing_retry_after', 0):.0f}, client timeouts {counts.get('timeouts', 0):.0f}; resident "
        f"memory {figures['rss_early_kib'] / 1024:.0f} -> {figures['rss_end_kib'] / 1024:.0f} MiB "
        f"({figures['rss_growth']:+.1%}; each tenth of the load: "
        f"{', '.join(f'{kib / 1024:.0f}' for kib in figures['rss_path_kib'])} MiB); descriptors idle "
        f"{figures['idle_fds']}, after {figures['fds_after']}; "
        f"server exit {figures['exit_code']}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--results", action="store_true", help="append the figures to benchmarks/RESULTS.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        figures = measure(Path(folder), connections=args.connections, seconds=args.seconds)
    verdict = "\n".join(f"FAILED: {problem}" for problem in problems(figures)) or "passed"
    text = f"{report(figures)}\n\n{verdict}"
    print(text)
    if args.results:
        command = f"python contrib/loadtest/soak.py --connections {args.connections} --seconds {args.seconds:g}"
        command += " --results"
        append_section("Soak, tiny model on the CPU", f"- command: `{command}`; machine: {cpu_machine()}\n\n{text}")
    return 1 if problems(figures) else 0


if __name__ == "__main__":
    sys.exit(main())
