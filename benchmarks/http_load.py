"""A real ``spinf-serve serve`` process and the HTTP clients that time it: many calls at once, or one after another.

`ServerProcess` starts ``python -m spinf serve …`` (the ``spinf-serve`` command) as a child process with its log
in a file, waits for ``/readyz`` to answer 200, and stops it with SIGTERM as a process manager would. `concurrent`
opens one connection per call, then sends every call at the same moment (a barrier) and times until the last
answer is read: the client's view of a busy server. `one_after_another` sends one body repeatedly on one kept-alive
connection and times each call from the request's first byte to the answer's last. Bodies are encoded before the
clock starts and answers decoded after it stops. The standard library's ``http.client`` only, one thread a call.
"""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

HOST = "127.0.0.1"
HEADERS = {"Content-Type": "application/json"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class ServerProcess:
    """``python -m spinf serve`` with ``args`` on a free local port; ``log`` gets its output."""

    def __init__(self, args: list[str], *, env: dict[str, str], log: Path, cwd: Path, python: str):
        self.port = free_port()
        self.argv = [python, "-m", "spinf", "serve", *args, "--host", HOST, "--port", str(self.port)]
        self.env, self.log, self.cwd = env, log, cwd
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float) -> float:
        """Start it and wait until ``/readyz`` answers 200; the seconds that took. `RuntimeError` (with the log's
        end) when it exits first or is not ready in ``timeout`` seconds."""
        started = time.perf_counter()
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd
            )
        while time.perf_counter() - started < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.log_tail()}")
            if self._ready():
                return time.perf_counter() - started
            time.sleep(0.5)
        raise RuntimeError(f"the server was not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def _ready(self) -> bool:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=5)
        try:
            conn.request("GET", "/readyz")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; its exit status (None if it never started)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _post(conn: http.client.HTTPConnection, payload: bytes) -> tuple[int, bytes]:
    conn.request("POST", "/v1/score", body=payload, headers=HEADERS)
    answer = conn.getresponse()
    return answer.status, answer.read()


def concurrent(port: int, bodies: list[dict], timeout: float = 600.0) -> tuple[float, list[tuple[int, object, float]]]:
    """Every body as its own call, all sent at once: the wall seconds from the start to the last answer, and per
    call (status, decoded answer, seconds)."""
    payloads = [json.dumps(body).encode() for body in bodies]
    conns = [http.client.HTTPConnection(HOST, port, timeout=timeout) for _ in payloads]
    for conn in conns:
        conn.connect()
    gate = threading.Barrier(len(payloads) + 1)
    raw: list[tuple[int, bytes, float]] = [(0, b"", 0.0)] * len(payloads)

    def call(i: int) -> None:
        gate.wait()
        began = time.perf_counter()
        try:
            status, data = _post(conns[i], payloads[i])
        except OSError as exc:
            status, data = -1, str(exc).encode()
        raw[i] = (status, data, time.perf_counter() - began)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(payloads))]
    for thread in threads:
        thread.start()
    gate.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    for conn in conns:
        conn.close()
    return wall, [(status, _decoded(data), seconds) for status, data, seconds in raw]


def one_after_another(port: int, body: dict, calls: int) -> tuple[list[float], list[object]]:
    """``calls`` calls of one body on one connection: each one's seconds, and the decoded answers."""
    payload = json.dumps(body).encode()
    conn = http.client.HTTPConnection(HOST, port, timeout=600)
    seconds, answers = [], []
    try:
        for _ in range(calls):
            began = time.perf_counter()
            status, data = _post(conn, payload)
            seconds.append(time.perf_counter() - began)
            if status != 200:
                raise RuntimeError(f"the server answered {status}: {data[:500]!r}")
            answers.append(data)
    finally:
        conn.close()
    return seconds, [_decoded(data) for data in answers]


def _decoded(data: bytes) -> object:
    try:
        return json.loads(data)
    except ValueError:
        return data.decode(errors="replace")


def percentile(sorted_seconds: list[float], share: float) -> float:
    """The value at ``share`` of a sorted list, rounded down (p99 of 200 calls is the 198th smallest)."""
    return sorted_seconds[int(share * (len(sorted_seconds) - 1))]
