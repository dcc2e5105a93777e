"""Fair admission and scheduling as ratios in one run (issue 33 item 2): polite callers beside a flood, and a small
call beside a call of 45,000 inputs.

One server process, three phases back to back on the same machine:

1. **polite alone**: ``--polite`` clients, each from its own loopback address (127.0.0.2, 127.0.0.3, ...), call one
   after another for ``--seconds``; a 429 or 503 makes a client sleep its ``Retry-After`` first, as spinf-client
   does. Their 200s per second are the reference rate.
2. **polite beside a flood**: the same clients again, while wrk opens ``--flood`` connections from 127.0.0.1 that
   retry at once whatever the answer (`score.lua`). The polite ratio is the polite clients' 200s per second over
   their rate alone (target >= 0.5); the total ratio is everyone's 200s per second, polite and flood, over the same
   reference (target >= 0.8).
3. **a small call beside a huge one**: a call of ``--inputs`` one-word inputs is sent and left running; once the
   server has had it for a few seconds, small calls (the polite clients' body) are sent one after another and timed
   from request to answer (target: each <= 2 s). The huge call is then abandoned (its connection closed).

The huge body is over the default 2 MiB ``max_body_bytes`` (2.7 MB compact), so this server takes 4 MiB; nothing
else differs from the defaults. Every request loop is bounded in time and targets 127.0.0.1 only.

    python contrib/loadtest/fairness.py --seconds 15 --flood 500
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.results import append_section, cpu_machine
from contrib.loadtest.harness import ServerProcess, percentile, run_wrk, score_body

HEADERS = {"Content-Type": "application/json"}
MAX_BODY_BYTES = 4 * 1024 * 1024
TARGETS = {"polite_ratio": 0.5, "total_ratio": 0.8, "small_max_s": 2.0}


def polite_clients(port: int, body: bytes, *, clients: int, seconds: float) -> dict:
    """``clients`` threads, each on its own loopback address, calling for ``seconds`` and sleeping each
    ``Retry-After``; their 200s per second, the refusals and the seconds of each 200."""
    answered: list[float] = []
    refused = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60, source_address=(f"127.0.0.{k + 2}", 0))
        try:
            while time.monotonic() < deadline:
                began = time.perf_counter()
                conn.request("POST", "/v1/score", body=body, headers=HEADERS)
                answer = conn.getresponse()
                answer.read()
                with lock:
                    if answer.status == 200:
                        answered.append(time.perf_counter() - began)
                    else:
                        refused[0] += 1
                if answer.status != 200:
                    time.sleep(min(float(answer.getheader("Retry-After") or 1), max(0.0, deadline - time.monotonic())))
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - started
    return {
        "goodput": len(answered) / wall,
        "refused": refused[0],
        "p50_s": percentile(answered, 0.5),
        "p99_s": percentile(answered, 0.99),
    }


def beside_flood(server: ServerProcess, body: bytes, body_file: Path, *, clients: int, flood: int, seconds: float):
    """The polite clients while wrk floods: (polite figures, wrk's counts)."""
    counts: dict = {}

    def load() -> None:
        counts.update(run_wrk(server.url, body_file, connections=flood, seconds=seconds + 2))

    wrk = threading.Thread(target=load)
    wrk.start()
    time.sleep(1.0)  # the flood's connections open first: the polite clients meet the flood, not its start
    polite = polite_clients(server.port, body, clients=clients, seconds=seconds)
    wrk.join()
    return polite, counts


def huge_body(inputs: int) -> bytes:
    inputs_ = [{"id": str(k), "messages": [{"role": "user", "content": "word"}]} for k in range(inputs)]
    query = {"id": "q", "template": " Is it good? Answer:{?}", "options": [" yes", " no"]}
    return json.dumps({"inputs": inputs_, "scoring": {"queries": [query]}}, separators=(",", ":")).encode()


def beside_huge_call(port: int, small: bytes, *, inputs: int, calls: int, settle_s: float = 3.0) -> dict:
    """Small calls one after another while a call of ``inputs`` inputs runs; the seconds of each, then the huge call
    is abandoned. ``huge_status`` is its answer's status if it came back first (None: still running, as expected)."""
    payload = huge_body(inputs)
    outcome: dict = {"huge_status": None}
    sock = socket.create_connection(("127.0.0.1", port))

    def huge() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        conn.sock = sock
        try:
            conn.request("POST", "/v1/score", body=payload, headers=HEADERS)
            outcome["huge_status"] = conn.getresponse().status
        except OSError:
            pass  # abandoned below

    thread = threading.Thread(target=huge)
    thread.start()
    time.sleep(settle_s)  # read, parsed and in its first passes
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600, source_address=("127.0.0.7", 0))
    seconds, statuses = [], []
    try:
        for _ in range(calls):
            began = time.perf_counter()
            conn.request("POST", "/v1/score", body=small, headers=HEADERS)
            answer = conn.getresponse()
            answer.read()
            seconds.append(time.perf_counter() - began)
            statuses.append(answer.status)
            time.sleep(0.2)
    finally:
        conn.close()
    running = outcome["huge_status"] is None
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()
    thread.join()
    return {"small_s": seconds, "statuses": statuses, "huge_running": running, "huge_bytes": len(payload)}


def measure(
    folder: Path,
    *,
    clients: int = 5,
    flood: int = 500,
    seconds: float = 15.0,
    inputs: int = 45_000,
    reject_rate: float | None = None,
) -> dict:
    """The three phases on one fresh server (its ``reject_rate`` given, or its default); the figures and the three
    target readings."""
    folder.mkdir(parents=True, exist_ok=True)
    body_file = folder / "body.json"
    body_file.write_text(json.dumps(score_body()))
    body = body_file.read_bytes()
    env = {"SPINF_MAX_BODY_BYTES": str(MAX_BODY_BYTES)}
    if reject_rate is not None:
        env["SPINF_REJECT_RATE"] = str(reject_rate)
    server = ServerProcess(folder, env=env)
    try:
        polite_clients(server.port, body, clients=clients, seconds=2)  # warm the path
        alone = polite_clients(server.port, body, clients=clients, seconds=seconds)
        flooded, counts = beside_flood(server, body, body_file, clients=clients, flood=flood, seconds=seconds)
        small_alone = polite_clients(server.port, body, clients=1, seconds=2)["p50_s"]
        huge = beside_huge_call(server.port, body, inputs=inputs, calls=5)
    finally:
        exit_code = server.stop()
    flood_goodput = counts.get("status_200", 0) / counts["duration_s"]
    return {
        "alone": alone,
        "flooded": flooded,
        "flood": {"connections": flood, "goodput": flood_goodput, "wrk": counts},
        "polite_ratio": flooded["goodput"] / alone["goodput"],
        "total_ratio": (flooded["goodput"] + flood_goodput) / alone["goodput"],
        "small_alone_s": small_alone,
        "huge": huge,
        "small_max_s": max(huge["small_s"]),
        "exit_code": exit_code,
        "clients": clients,
        "inputs": inputs,
        "reject_rate": reject_rate,
    }


def problems(figures: dict) -> list[str]:
    """The targets missed and the answers that should not have come, in words; empty when all is well."""
    found = []
    if figures["polite_ratio"] < TARGETS["polite_ratio"]:
        found.append(f"polite ratio {figures['polite_ratio']:.2f} < {TARGETS['polite_ratio']}")
    if figures["total_ratio"] < TARGETS["total_ratio"]:
        found.append(f"total ratio {figures['total_ratio']:.2f} < {TARGETS['total_ratio']}")
    if figures["small_max_s"] > TARGETS["small_max_s"]:
        found.append(f"a small call took {figures['small_max_s']:.2f} s > {TARGETS['small_max_s']} s")
    if set(figures["huge"]["statuses"]) != {200}:
        found.append(f"small calls beside the huge one answered {figures['huge']['statuses']}")
    if not figures["huge"]["huge_running"]:
        found.append("the huge call ended before the small calls did: nothing was measured beside it")
    wrk = figures["flood"]["wrk"]
    if wrk.get("unexpected_status", 0) or wrk.get("missing_retry_after", 0):
        found.append(f"the flood got unexpected answers: {wrk}")
    return found


def report(figures: dict) -> str:
    alone, flooded, flood, huge = figures["alone"], figures["flooded"], figures["flood"], figures["huge"]
    rows = [
        "| phase | 200s/s | refusals | p50 s | p99 s |",
        "|---|---|---|---|---|",
        f"| {figures['clients']} polite clients alone | {alone['goodput']:.1f} | {alone['refused']} | "
        f"{alone['p50_s']:.3f} | {alone['p99_s']:.3f} |",
        f"| the same beside {flood['connections']} flood connections | {flooded['goodput']:.1f} | "
        f"{flooded['refused']} | {flooded['p50_s']:.3f} | {flooded['p99_s']:.3f} |",
        f"| the flood itself | {flood['goodput']:.1f} | {flood['wrk'].get('status_429', 0):.0f} | – | – |",
        "",
        f"polite ratio {figures['polite_ratio']:.2f} (target >= {TARGETS['polite_ratio']}), total ratio "
        f"{figures['total_ratio']:.2f} (target >= {TARGETS['total_ratio']})",
        "",
        f"small call alone: {figures['small_alone_s']:.3f} s; beside a call of {figures['inputs']:,} one-word inputs "
        f"({huge['huge_bytes'] / 1e6:.1f} MB, still running: {huge['huge_running']}): "
        + ", ".join(f"{s:.2f}" for s in huge["small_s"])
        + f" s (max {figures['small_max_s']:.2f}, median {statistics.median(huge['small_s']):.2f}; target <= "
        f"{TARGETS['small_max_s']} s); server exit {figures['exit_code']}"
        + ("" if figures["reject_rate"] is None else f"; reject_rate {figures['reject_rate']:.0f}"),
    ]
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polite", type=int, default=5)
    parser.add_argument("--flood", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--inputs", type=int, default=45_000)
    parser.add_argument("--reject-rate", type=float, help="the server's reject_rate (default: its own default)")
    parser.add_argument("--results", action="store_true", help="append the figures to benchmarks/RESULTS.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        figures = measure(
            Path(folder),
            clients=args.polite,
            flood=args.flood,
            seconds=args.seconds,
            inputs=args.inputs,
            reject_rate=args.reject_rate,
        )
    text = report(figures)
    missed = problems(figures)
    print(text + "".join(f"\nMISSED: {line}" for line in missed))
    if args.results:
        command = f"python contrib/loadtest/fairness.py --polite {args.polite} --flood {args.flood} "
        command += f"--seconds {args.seconds:g} --inputs {args.inputs}"
        command += "" if args.reject_rate is None else f" --reject-rate {args.reject_rate:g}"
        command += " --results"
        body = f"- command: `{command}`; machine: {cpu_machine()}; wrk, loopback\n\n{text}"
        append_section("Admission under a flood (issue 33 item 2)", body)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
