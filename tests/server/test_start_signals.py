"""Signals during a start (issue 33 item 1), sent to a real ``spinf-serve serve`` process
(`spinf.server.start_signals`).

The handlers exist from the first line of ``main``; before that only the interpreter itself runs (about 50 ms), and
a signal then still gets Python's default. Each test therefore waits until the process catches SIGHUP (its
``SigCgt`` mask in ``/proc``) and signals it at once from then on: a SIGHUP, however often and whenever it comes,
never ends a start; a SIGTERM ends it at any point with status 0 and a log line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from contrib.loadtest.harness import ROOT, free_port, tiny_cache

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the signal masks in /proc")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tiny_cache(tmp_path_factory.mktemp("hf-home"))


class Starting:
    """``spinf-serve serve spinf/tiny-gemma4`` spawned, its output in a file; returns once it catches SIGHUP."""

    def __init__(self, folder: Path, hf_home: Path):
        self.port = free_port()
        self.log_path = folder / "server.log"
        env = {**os.environ, "HF_HOME": str(hf_home), "PYTHONUNBUFFERED": "1"}
        command = [sys.executable, "-m", "spinf", "serve", "spinf/tiny-gemma4", "--device", "cpu"]
        command += ["--host", "127.0.0.1", "--port", str(self.port), "--warmup", "short", "--no-official-packs"]
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.monotonic() + 30
        while not self.catches(signal.SIGHUP):
            assert self.process.poll() is None, self.output()
            assert time.monotonic() < deadline, "the process never caught SIGHUP"
            time.sleep(0.001)

    def catches(self, signum: int) -> bool:
        try:
            status = Path(f"/proc/{self.process.pid}/status").read_text()
        except FileNotFoundError:
            return False
        mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
        return bool(int(mask, 16) & (1 << (signum - 1)))

    def output(self) -> str:
        return self.log_path.read_text()

    def is_ready(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def wait(self, timeout_s: float) -> int:
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise


def test_sighup_during_the_start_never_ends_it(tmp_path, cache):
    server = Starting(tmp_path, cache)
    for _ in range(3):  # at once, before the imports, the settings and the pack catalog
        server.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 120
    sent = 3
    while not server.is_ready():  # and all along the start, the load and the warm-up
        assert server.process.poll() is None, f"the start ended ({server.process.returncode}):\n{server.output()}"
        assert time.monotonic() < deadline, "not ready within 120 s:\n" + server.output()
        server.process.send_signal(signal.SIGHUP)
        sent += 1
        time.sleep(0.05)
    try:
        log = server.output()
        assert sent > 3
        assert "while starting: reloading the pack sources once" in log
        assert "pack reload (SIGHUP)" in log
    finally:
        server.process.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0


def test_sigterm_at_once_ends_the_start_with_status_0(tmp_path, cache):
    server = Starting(tmp_path, cache)
    server.process.send_signal(signal.SIGHUP)
    server.process.send_signal(signal.SIGTERM)
    assert server.wait(10) == 0
    assert "received SIGTERM: stopping before the server runs" in server.output()


def test_sigterm_while_loading_exits_promptly_with_status_0(tmp_path, cache):
    server = Starting(tmp_path, cache)
    deadline = time.monotonic() + 60
    while "loading the model" not in server.output():
        assert server.process.poll() is None, server.output()
        assert time.monotonic() < deadline, server.output()
        time.sleep(0.01)
    assert not server.is_ready()
    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    # the load of the tiny model runs to its end (the engine's thread is never abandoned mid-job), then the exit
    assert server.wait(30) == 0
    assert time.monotonic() - signalled < 15
    assert "spinf.server.actors.drain: received SIGTERM: stopping" in server.output()
