"""Shutdown and abandoned calls as a real process sees them (issue 33 items 3 and 4): what every client got.

Three measurements, each on a fresh server process (`ServerProcess`, the tiny model on the CPU):

- ``shutdown``: ``--clients`` threads each open a connection, send one scoring call, read the answer and start
  again, as fast as they can; after ``--load-s`` seconds the server gets SIGTERM. Each attempt ends as an answer
  (its status; for a 503 whether it is the spec's envelope with ``model_unavailable`` and a ``Retry-After``), a
  connection refused (the listener has closed: nothing was sent), or a loss: a reset or a connection closed
  without an answer after the request was sent. The target: no loss, every answer 200, 429 or an enveloped 503, the
  process out within ``shutdown_s`` + 1 s of the signal.
- ``deadline``: one call that needs far longer than ``shutdown_s`` (2 s) is running at SIGTERM: what it got, and
  when the process exited.
- ``abandoned``: ``--abandoned`` calls of many passes each, whose clients close their connections a second in;
  once the server has noticed, small calls one after another: how many got 429 before one was admitted, its
  seconds (it waits for the pass under way: a pass is not cut), the access log's 499 lines and
  ``spinf_requests_abandoned_total``.

    python contrib/loadtest/shutdown.py --clients 500 --results
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import re
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx

from benchmarks.results import append_section, cpu_machine
from contrib.loadtest.harness import ServerProcess, score_body, tiny_cache

HEADERS = {"Content-Type": "application/json"}
LOSSES = ("reset", "closed without an answer", "other error")


def _attempt(port: int, payload: bytes) -> tuple[str, str]:
    """One call on a new connection: what came of it (an answer's status, ``refused``, or a loss) and the step it
    was at (``connect``, ``send`` or ``read``: where a loss happened)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    step = "connect"
    try:
        try:
            conn.connect()
        except ConnectionRefusedError:
            return "refused", step
        step = "send"
        conn.request("POST", "/v1/score", body=payload, headers=HEADERS)
        step = "read"
        answer = conn.getresponse()
        data = answer.read()
    except ConnectionResetError:
        return "reset", step
    except http.client.RemoteDisconnected:
        return "closed without an answer", step
    except (OSError, http.client.HTTPException):
        return "other error", step
    finally:
        conn.close()
    if answer.status != 503:
        return str(answer.status), step
    try:
        code = json.loads(data)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    enveloped = code == "model_unavailable" and (answer.getheader("Retry-After") or "").isdigit()
    return ("503 enveloped" if enveloped else "503 bare"), step


def shutdown(folder: Path, *, clients: int, load_s: float = 3.0, shutdown_s: float = 30.0) -> dict:
    """Clients calling at once when SIGTERM comes: the count of each outcome and the exit."""
    env = {"SPINF_SHUTDOWN_S": str(shutdown_s)}
    server = ServerProcess(folder, env=env, hf_home=tiny_cache(folder / "hf"))
    payload = json.dumps(score_body()).encode()
    outcomes: collections.Counter[str] = collections.Counter()
    lock, start = threading.Lock(), threading.Barrier(clients + 1)
    give_up = time.monotonic() + load_s + shutdown_s + 30

    lost: list[tuple[str, str, float]] = []  # each loss: its kind, its step, when it ended

    def client() -> None:
        start.wait()
        while time.monotonic() < give_up:
            outcome, step = _attempt(server.port, payload)
            with lock:
                outcomes[outcome] += 1
                if outcome in LOSSES:
                    lost.append((outcome, step, time.monotonic()))
            if outcome == "refused":
                return

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    start.wait()
    time.sleep(load_s)
    signalled = time.monotonic()
    exit_code = server.stop(timeout_s=shutdown_s + 30)  # SIGTERM
    exit_s = time.monotonic() - signalled
    for thread in threads:
        thread.join()
    where = [f"{kind} at {step}, {ended - signalled:+.2f} s" for kind, step, ended in lost]  # against SIGTERM
    return {"clients": clients, "outcomes": dict(outcomes), "exit_code": exit_code, "exit_s": exit_s, "lost": where}


def deadline(folder: Path, *, shutdown_s: float = 2.0) -> dict:
    """A call that outlasts the deadline: its status, code and Retry-After, and the seconds to the exit."""
    server = ServerProcess(folder, env={"SPINF_SHUTDOWN_S": str(shutdown_s)}, hf_home=tiny_cache(folder / "hf"))
    got: list = []

    def call() -> None:
        try:
            answer = httpx.post(f"{server.url}/v1/score", json=_long_body(400, 60), timeout=120)
            got.append(
                (answer.status_code, answer.json().get("error", {}).get("code"), answer.headers.get("Retry-After"))
            )
        except httpx.TransportError as exc:
            got.append((type(exc).__name__, None, None))

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(2.0)  # well inside its first passes
    signalled = time.monotonic()
    exit_code = server.stop(timeout_s=shutdown_s + 60)
    exit_s = time.monotonic() - signalled
    thread.join()
    return {"shutdown_s": shutdown_s, "answer": got[0], "exit_code": exit_code, "exit_s": exit_s}


def abandoned(folder: Path, *, calls: int = 5, token_budget: int | None = None, wait_noticed: bool = True) -> dict:
    """``calls`` long calls (the 5 slots by default) whose clients leave a second in; then, once the server has
    noticed (its counter, or 5 s without one; at once without ``wait_noticed``), small calls one after another
    until one is answered 200."""
    flags = ["--token-budget", str(token_budget)] if token_budget else []
    server = ServerProcess(folder, *flags, hf_home=tiny_cache(folder / "hf"))
    payload = json.dumps(_long_body(400, 60)).encode()
    head = "POST /v1/score HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    request = f"{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload
    alone = _timed(server.url)
    socks = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(calls)]
    for sock in socks:
        sock.sendall(request)
    time.sleep(1.0)
    for sock in socks:
        sock.close()
    left = time.monotonic()
    while wait_noticed and _abandoned_count(server.url) < calls and time.monotonic() - left < 5:
        time.sleep(0.01)
    noticed_s, refused = time.monotonic() - left, 0
    while (status_seconds := _timed(server.url))[0] == 429 and time.monotonic() - left < 60:
        refused += 1
        time.sleep(0.1)
    after_s = time.monotonic() - left
    time.sleep(0.5)  # the last log lines
    lines = len(re.findall(r" POST /v1/score 499 ", server.output()))
    counted = _abandoned_count(server.url)
    server.stop()
    return {
        "calls": calls,
        "token_budget": token_budget,
        "alone_s": alone[1],
        "noticed_s": noticed_s,
        "next": status_seconds,
        "refused_first": refused,
        "answered_after_s": after_s,
        "log_499": lines,
        "counted": counted,
    }


def _abandoned_count(url: str) -> float:
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    counted = re.search(r'^spinf_requests_abandoned_total\{route="/v1/score"\} (\S+)$', metrics, re.M)
    return float(counted[1]) if counted else 0.0


def _long_body(inputs: int, words: int) -> dict:
    """Many inputs of ``words`` words: passes' worth of work for the tiny model on a CPU."""
    text = [
        {"id": str(i), "messages": [{"role": "user", "content": " ".join(f"w{i}x{k}" for k in range(words))}]}
        for i in range(inputs)
    ]
    query = {"id": "q", "template": "\n\nIs the customer upset? Answer:{?}", "options": [" yes", " no"]}
    return {"inputs": text, "scoring": {"queries": [query]}}


def _timed(url: str) -> tuple[int, float]:
    began = time.monotonic()
    answer = httpx.post(f"{url}/v1/score", json=score_body(), timeout=120)
    return answer.status_code, time.monotonic() - began


def losses(figures: dict) -> int:
    return sum(figures["outcomes"].get(kind, 0) for kind in (*LOSSES, "503 bare"))


def report(shut: list[dict], cut: dict | None, left: dict | None) -> str:
    rows = ["| clients | answers (status: count) | refused at connect | lost | exit | seconds from SIGTERM |"]
    rows.append("|---|---|---|---|---|---|")
    for figures in shut:
        outcomes = figures["outcomes"]
        answers = ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items()) if k not in (*LOSSES, "refused"))
        lost = ", ".join(f"{k}: {outcomes[k]}" for k in LOSSES if outcomes.get(k)) or "0"
        rows.append(
            f"| {figures['clients']} | {answers} | {outcomes.get('refused', 0)} | {lost} | "
            f"{figures['exit_code']} | {figures['exit_s']:.2f} |"
        )
    for figures in shut:
        if figures.get("lost"):  # where each loss happened, against SIGTERM (before it: negative)
            rows.append(f"\n{figures['clients']} clients, losses: " + "; ".join(figures["lost"][:20]))
    if cut is not None:
        status, code, retry = cut["answer"]
        rows += [
            "",
            f"deadline: a call running at SIGTERM with shutdown_s {cut['shutdown_s']:g} got {status} {code} "
            f"(Retry-After {retry}); exit {cut['exit_code']} {cut['exit_s']:.2f} s after SIGTERM",
        ]
    if left is not None:
        status, seconds = left["next"]
        budget = left["token_budget"] or "default"
        rows += [
            "",
            f"abandoned: {left['calls']} long calls (token budget {budget}) left 1 s in (small calls sent from "
            f"{left['noticed_s']:.2f} s on); {left['refused_first']} small calls got 429 before one got {status} "
            f"in {seconds:.2f} s (alone {left['alone_s']:.2f} s), {left['answered_after_s']:.2f} s after they left; "
            f"499 lines {left['log_499']}, spinf_requests_abandoned_total {left['counted']:g}",
        ]
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[20, 500])
    parser.add_argument("--abandoned", type=int, default=5)
    parser.add_argument("--results", action="store_true", help="append the figures to benchmarks/RESULTS.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        shut = [shutdown(root / f"shutdown-{n}", clients=n) for n in args.clients]
        cut = deadline(root / "deadline")
        left = abandoned(root / "abandoned", calls=args.abandoned, wait_noticed=False)
    text = report(shut, cut, left)
    print(text)
    if args.results:
        command = f"python contrib/loadtest/shutdown.py --clients {' '.join(map(str, args.clients))} --results"
        body = f"- command: `{command}`; machine: {cpu_machine()}; 2 shared cores, tiny model, loopback\n\n{text}"
        append_section("Shutdown and abandoned calls (issue 33 items 3–4)", body)
    ok = all(losses(f) == 0 and f["exit_s"] <= 30 + 1 for f in shut)
    return 0 if ok and cut["exit_s"] <= cut["shutdown_s"] + 1 and left["next"][0] == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
