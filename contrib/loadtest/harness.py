"""The pieces every load test here shares: a real server process on loopback, wrk as the load, and the readings.

`ServerProcess` runs ``spinf-serve serve`` (the built-in tiny model on the CPU unless told otherwise) on a free
loopback port and reads its resident memory, open descriptors and access log. `run_wrk` drives it with wrk
(Debian's ``wrk``) and `score.lua`, which retries at once whatever the answer and checks every answer: only 200,
429 and 503, a ``Retry-After`` on each 429 and 503, and every 200's results byte for byte against the same call
made alone. Every request loop here is bounded in time and targets 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SCRIPT = HERE / "score.lua"
SENTENCE = "I was charged twice for my order and the parcel arrived damaged. Please refund one payment. "
ACCESS = re.compile(r" POST (?P<route>\S+) (?P<status>\d{3}) (?P<ms>[\d.]+)ms")


def score_body(sentences: int = 3, questions: int = 8) -> dict:
    """A support-ticket call: ``sentences`` of content and ``questions`` two-option questions."""
    template = "\n\nQuestion {k}: is the customer upset? Answer:{{?}}"
    queries = [{"id": f"q{k}", "template": template.format(k=k), "options": [" yes", " no"]} for k in range(questions)]
    return {"messages": [{"role": "user", "content": SENTENCE * sentences}], "scoring": {"queries": queries}}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tiny_cache(root: Path) -> Path:
    """An HF_HOME holding the tiny model's snapshot (generated locally, nothing downloaded)."""
    from spinf.engine.gemma4.tiny import ensure_tiny_snapshot

    ensure_tiny_snapshot(root / "hub")
    return root


class ServerProcess:
    """``spinf-serve serve MODEL`` on 127.0.0.1 as a child process, ready when constructed (``model`` None: no model
    argument, the default model; ``device`` the ``--device``; ``ready_s`` how long it may take)."""

    def __init__(
        self,
        folder: Path,
        *flags: str,
        model: str | None = "spinf/tiny-gemma4",
        env: dict | None = None,
        hf_home: Path | None = None,
        device: str = "cpu",
        ready_s: float = 120.0,
    ):
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = folder / f"server-{self.port}.log"
        hf_home = hf_home or tiny_cache(folder / "hf")
        base = {"HF_HOME": str(hf_home), "SPINF_DRAIN_FILE": str(folder / "drain")}
        env = {**os.environ, **base, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.command = ["serve", *([model] if model else []), "--device", device, "--host", "127.0.0.1"]
        self.command += ["--port", str(self.port), "--warmup", "short", *flags]
        self._log = open(self.log_path, "w+")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "spinf", *self.command],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        self.wait_ready(ready_s)

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("the server exited while starting:\n" + self.output())
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError("the server did not become ready:\n" + self.output())

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def log_lines(self) -> int:
        return len(self.output().splitlines())

    def durations_ms(self, since_line: int, status: int = 200, route: str = "/v1/score") -> list[float]:
        """The access log's durations of answers with ``status`` on ``route`` after line ``since_line``."""
        found = []
        for line in self.output().splitlines()[since_line:]:
            match = ACCESS.search(line)
            if match and match["route"] == route and int(match["status"]) == status:
                found.append(float(match["ms"]))
        return found

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS line")

    def descriptors(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, then the exit status."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_s)
        finally:
            self._log.close()


def alone(url: str, body: dict) -> str:
    """The ``results`` of ``body`` scored alone, as the server writes them (the bytes a loaded answer must match)."""
    answer = httpx.post(f"{url}/v1/score", json=body, timeout=60)
    answer.raise_for_status()
    return json.dumps(answer.json()["results"], ensure_ascii=False)


def run_wrk(
    url: str,
    body_file: Path,
    *,
    connections: int,
    seconds: float,
    threads: int = 2,
    expect_file: Path | None = None,
    timeout_s: float = 30.0,
) -> dict[str, float]:
    """wrk with `score.lua` against ``url``/v1/score; the counts it printed (``status_200``, ``mismatch``, ...)."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeError("wrk is not installed (Debian: apt-get install wrk)")
    env = {**os.environ, "SPINF_LOAD_BODY": str(body_file)}
    if expect_file is not None:
        env["SPINF_LOAD_EXPECT"] = str(expect_file)
    command = [wrk, f"-t{threads}", f"-c{connections}", f"-d{max(1, round(seconds))}s", f"--timeout={timeout_s:g}s"]
    command += ["-s", str(SCRIPT), f"{url}/v1/score"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=seconds + timeout_s + 60)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr.strip()}")
    counts: dict[str, float] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        if re.fullmatch(r"[a-z_]+\d*", key) and re.fullmatch(r"[\d.]+", value):
            counts[key] = float(value)
    return counts


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile (``share`` 0.99 for p99); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]
