"""The HTTP side of benchmarks/scaleout.py: HAProxy in front of the replicas, the callers, the drain.

`Balancer` runs contrib/balancer/haproxy.cfg unchanged (the addresses come from its environment variables) in the
foreground and reads ``show stat`` from its admin socket. `Callers` are threads that each hold one connection and
call ``/v1/score`` without a pause, keeping every answer with its start and end times; `alone_results` sends each
body to each replica with nothing else running; `drain_one` drains a replica under load as contrib/kubernetes's
preStop script does, then stops it with SIGTERM, and says what happened. Everything targets 127.0.0.1 and every
loop is bounded in time.
"""

from __future__ import annotations

import concurrent.futures
import csv
import io
import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import attrs
import httpx

from contrib.kubernetes import prestop_drain
from contrib.loadtest.harness import ROOT, ServerProcess, free_port

CONFIG = ROOT / "contrib" / "balancer" / "haproxy.cfg"
CALL_TIMEOUT_S = 300.0


class Balancer:
    """haproxy with `CONFIG` in front of the replicas on ``ports`` (at most the eight the file names)."""

    def __init__(self, haproxy: str, folder: Path, ports: list[int]):
        folder.mkdir(parents=True, exist_ok=True)
        self.servers = [f"replica{k}" for k in range(len(ports))]
        self.url = f"http://127.0.0.1:{free_port()}"
        self.socket = folder / "haproxy.sock"
        self.log = folder / "haproxy.log"
        env = {
            **os.environ,
            "SPINF_LB_BIND": self.url.removeprefix("http://"),
            "SPINF_LB_STATS_SOCKET": str(self.socket),
        }
        env.update({f"SPINF_REPLICA_{k}": f"127.0.0.1:{port}" for k, port in enumerate(ports)})
        with self.log.open("w") as log:
            self.process = subprocess.Popen([haproxy, "-db", "-f", str(CONFIG)], env=env, stdout=log, stderr=log)

    def states(self) -> dict[str, str]:
        """Each replica's state in ``show stat`` (``UP``, ``DOWN``, …)."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(self.socket))
            sock.sendall(b"show stat\n")
            text = b"".join(iter(lambda: sock.recv(65536), b"")).decode()
        rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
        return {row["svname"]: row["status"] for row in rows if row["pxname"] == "replicas"}

    def wait_up(self, timeout_s: float = 30.0) -> None:
        """Until haproxy's checks have put every replica in rotation."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("haproxy exited:\n" + self.log.read_text())
            try:
                if all(self.states().get(server) == "UP" for server in self.servers):
                    return
            except OSError:  # the socket is not there yet
                pass
            time.sleep(0.1)
        raise RuntimeError(f"not every replica is UP after {timeout_s:g} s: {self.states()}")

    def __enter__(self) -> Balancer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


@attrs.frozen
class Answer:
    body: int  # the index of the body sent
    status: int  # 0: no answer (the connection failed)
    started: float  # time.monotonic()
    ended: float
    results: str  # the answer's results as JSON, or what went wrong


def post(client: httpx.Client, url: str, payload: bytes, body: int) -> Answer:
    started = time.monotonic()
    try:
        answer = client.post(url, content=payload, headers={"Content-Type": "application/json"})
    except httpx.HTTPError as exc:
        return Answer(body, 0, started, time.monotonic(), f"{type(exc).__name__}: {exc}")
    ended = time.monotonic()
    ok = answer.status_code == 200
    got = json.dumps(answer.json()["results"], ensure_ascii=False) if ok else answer.text[:300]
    return Answer(body, answer.status_code, started, ended, got)


class Callers:
    """``count`` threads calling ``url``/v1/score without a pause until `stop`, caller k sending bodies k, k+1, …"""

    def __init__(self, url: str, payloads: list[bytes], count: int, token: str):
        self.url, self.payloads, self.token = url, payloads, token
        self.answers: list[Answer] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._call, args=(k,), daemon=True) for k in range(count)]
        for thread in self._threads:
            thread.start()

    def _call(self, first: int) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=CALL_TIMEOUT_S) as client:
            k = first
            while not self._stop.is_set():
                answer = post(client, "/v1/score", self.payloads[k % len(self.payloads)], k % len(self.payloads))
                with self._lock:
                    self.answers.append(answer)
                k += 1

    def since(self, moment: float) -> list[Answer]:
        with self._lock:
            return [answer for answer in self.answers if answer.ended >= moment]

    def stop(self) -> list[Answer]:
        """Stops the callers once their calls in flight are answered; every answer."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=CALL_TIMEOUT_S + 10)
        return self.answers


def alone_results(replicas: list[ServerProcess], payloads: list[bytes], token: str) -> list[list[str]]:
    """Per replica, each body's results sent alone (one call at a time per replica, the replicas side by side)."""

    def one_replica(replica: ServerProcess) -> list[str]:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=replica.url, headers=headers, timeout=CALL_TIMEOUT_S) as client:
            answers = [post(client, "/v1/score", payload, k) for k, payload in enumerate(payloads)]
        refused = [answer for answer in answers if answer.status != 200]
        if refused:
            raise RuntimeError(f"{replica.url} answered {refused[0].status} alone: {refused[0].results}")
        return [answer.results for answer in answers]

    with concurrent.futures.ThreadPoolExecutor(len(replicas)) as pool:
        return list(pool.map(one_replica, replicas))


def drain_one(replica: ServerProcess, others: list[ServerProcess], load: Callers, trusted: str) -> list[str]:
    """Drains ``replica`` while ``load`` goes on (contrib/kubernetes/prestop_drain.py: ``POST /v0/drain``, then
    until quiet), sends it SIGTERM, lets the load run 2 s more on the others; the report's lines."""
    began = time.monotonic()
    in_flight, _ = prestop_drain.read_load(replica.url)
    mark, marks = replica.log_lines(), [other.log_lines() for other in others]
    drain = ["--url", replica.url, "--token", trusted, "--settle-s", "3", "--quiet-s", "1", "--timeout-s", "60"]
    quiet = prestop_drain.main(drain) == 0
    finished = len(replica.durations_ms(mark))
    drained_s = time.monotonic() - began
    code = replica.stop()
    time.sleep(2.0)
    moved = sum(len(other.durations_ms(since)) for other, since in zip(others, marks, strict=True))
    answers = load.since(began)
    failed = [answer for answer in answers if answer.status != 200]
    first = f" (the first: {failed[0].status} {failed[0].results[:200]})" if failed else ""
    others_named = "the other replica" if len(others) == 1 else f"the other {len(others)} replicas"
    return [
        f"\n- drain of replica{len(others)} at N = {len(others) + 1}, under the same load: "
        f"{len(failed)} of {len(answers)} calls failed at the client from the drain on{first}",
        f"- the drained replica: {in_flight} calls in flight at `POST /v0/drain`, {finished} answered 200 after it, "
        f"{'quiet' if quiet else 'NOT quiet (prestop_drain timed out)'} after {drained_s:.1f} s; exit status "
        f"{code} after SIGTERM",
        f"- traffic moved: {others_named} answered {moved} calls from the drain until 2 s after the SIGTERM",
    ]
