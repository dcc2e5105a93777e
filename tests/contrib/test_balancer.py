"""contrib/balancer/haproxy.cfg, unchanged, in front of three real tiny servers on loopback, under a bounded load.

Three client threads call the balancer without a pause while one replica is drained (contrib/kubernetes's preStop
script: ``POST /v0/drain``, then the wait until it is quiet), stopped, restarted and put back (``DELETE
/v0/drain``), and another is sent SIGTERM without a drain. Not one call may fail, and every answer's ``results``
must be the bytes of the same body scored on a lone server (a replica called directly before the load). The
SIGTERM leg is where the configuration's retries matter: the stopping replica answers 503 until the balancer's
health checks take it out, then refuses connections, and the balancer sends those calls to another replica.

haproxy comes from Debian (``apt-get install haproxy``; .ci/run installs it): without it the test fails under CI
and is skipped elsewhere. It takes about a minute (three server starts and a restart), so it is ``slow``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from contrib.kubernetes import prestop_drain
from contrib.loadtest.harness import ROOT, free_port, score_body, tiny_cache

HAPROXY = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
if HAPROXY is None:
    if os.environ.get("CI"):
        raise RuntimeError("haproxy is not installed: .ci/run installs it (apt-get install haproxy)")
    pytest.skip("haproxy is not installed (apt-get install haproxy)", allow_module_level=True)

CONFIG = ROOT / "contrib" / "balancer" / "haproxy.cfg"
TOKEN, TRUSTED = "access-token", "trusted-token"
BODIES = [score_body(sentences, questions) for sentences, questions in ((1, 2), (2, 5), (3, 8), (5, 3))]
LONG_BODY = score_body(100, 150)  # about 5 s alone on the tiny model
CLIENTS = 6
BURST = 16


class Replica:
    """``spinf-serve serve`` of the tiny model on a fixed loopback port, with a drain marker of its own."""

    def __init__(self, folder: Path, hf_home: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "HF_HOME": str(hf_home), "SPINF_DRAIN_FILE": str(folder / "drain")}
        self.env["PYTHONUNBUFFERED"] = "1"
        self.starts = 0
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        command = [sys.executable, "-m", "spinf", "serve", "spinf/tiny-gemma4", "--device", "cpu"]
        command += ["--host", "127.0.0.1", "--port", str(self.port), "--warmup", "short"]
        # room for every call at once on two replicas (haproxy.cfg: size --queue for a replica's share)
        command += ["--token", TOKEN, "--trusted-token", TRUSTED, "--queue", str(CLIENTS + BURST)]
        self.starts += 1
        log = open(self.folder / f"server-{self.starts}.log", "w")  # noqa: SIM115 - the child holds it
        with log:
            self.process = subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)

    def wait(self, probe: str, timeout_s: float = 180.0) -> None:
        """Until ``probe`` (``/readyz``, or ``/livez`` for a warm server that is draining) answers 200."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.url} exited while starting:\n{self.output()}")
            try:
                if httpx.get(self.url + probe, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.url}{probe} did not answer 200 in {timeout_s:g} s:\n{self.output()}")

    def output(self) -> str:
        return "".join(path.read_text() for path in sorted(self.folder.glob("server-*.log")))

    def scored(self) -> int:
        """Scoring calls this replica answered with 200, over all its starts (from its access logs)."""
        return self.output().count("POST /v1/score 200")

    def stop(self, timeout_s: float = 60.0) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout_s)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


class Balancer:
    """haproxy with ``CONFIG`` in the foreground; its stats through the admin socket."""

    def __init__(self, folder: Path, replicas: list[Replica]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.socket = folder / "haproxy.sock"
        self.log_path = folder / "haproxy.log"
        env = {**os.environ, "SPINF_LB_BIND": f"127.0.0.1:{self.port}", "SPINF_LB_STATS_SOCKET": str(self.socket)}
        env.update({f"SPINF_REPLICA_{k}": f"127.0.0.1:{replica.port}" for k, replica in enumerate(replicas)})
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen([HAPROXY, "-db", "-f", str(CONFIG)], env=env, stderr=log, stdout=log)

    def stats(self) -> dict[str, dict[str, str]]:
        """``show stat`` of the replicas backend: a row per server, and ``BACKEND``."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(self.socket))
            sock.sendall(b"show stat\n")
            data = b"".join(iter(lambda: sock.recv(65536), b""))
        rows = csv.DictReader(io.StringIO(data.decode().lstrip("# ")))
        return {row["svname"]: row for row in rows if row["pxname"] == "replicas"}

    def wait_status(self, server: str, status: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("haproxy exited:\n" + self.log_path.read_text())
            try:
                if self.stats()[server]["status"] == status:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{server} is not {status} after {timeout_s:g} s: {self.stats()[server]['status']}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


class Load:
    """``CLIENTS`` threads posting the bodies in turn to the balancer until `stop`, and bursts of one-call threads
    (`burst`); every answer is kept."""

    def __init__(self, url: str):
        self.url = url
        self.answers: list[tuple[int, int, str]] = []  # (body index, status, results or what went wrong)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, args=(k, None)) for k in range(CLIENTS)]
        for thread in self._threads:
            thread.start()

    def _client(self, first: int, calls: int | None, go: threading.Event | None = None) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=60) as client:
            if go is not None:
                go.wait()
            k = first
            while not self._stop.is_set() and (calls is None or k < first + calls):
                index = k % len(BODIES)
                try:
                    answer = client.post("/v1/score", json=BODIES[index])
                    status = answer.status_code
                    got = results_of(answer) if status == 200 else answer.text[:300]
                except httpx.HTTPError as exc:
                    status, got = 0, f"{type(exc).__name__}: {exc}"
                with self._lock:
                    self.answers.append((index, status, got))
                k += 1

    def burst(self, calls: int) -> threading.Event:
        """``calls`` one-call clients, on new connections beside the steady clients, made ready now (a client takes
        tens of milliseconds to build on a slow machine) and sent at once when the returned event is set."""
        go = threading.Event()
        threads = [threading.Thread(target=self._client, args=(k, 1, go)) for k in range(calls)]
        for thread in threads:
            thread.start()
        self._threads += threads
        return go

    def count(self) -> int:
        with self._lock:
            return len(self.answers)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=90)


class _Post(threading.Thread):
    def __init__(self, url: str, body: dict):
        super().__init__(daemon=True)  # a failed test does not wait for it at exit
        self.url, self.body, self.status = url, body, None

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        try:
            self.status = httpx.post(f"{self.url}/v1/score", json=self.body, headers=headers, timeout=120).status_code
        except httpx.HTTPError as exc:
            self.status = f"{type(exc).__name__}: {exc}"


def _post_in_thread(url: str, body: dict) -> _Post:
    thread = _Post(url, body)
    thread.start()
    return thread


def results_of(answer: httpx.Response) -> str:
    return json.dumps(answer.json()["results"], ensure_ascii=False)


def _wait_stopping(replica: Replica, timeout_s: float = 10.0) -> None:
    """Until ``replica``'s /readyz answers 503 (its process has taken the signal and refuses new calls)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(replica.url + "/readyz", timeout=2).status_code == 503:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{replica.url} did not begin stopping {timeout_s:g} s after SIGTERM:\n{replica.output()}")


def _run_for(load: Load, seconds: float) -> None:
    """Lets the load run ``seconds`` more (and at least until it has made one more call)."""
    before, deadline = load.count(), time.monotonic() + seconds
    while time.monotonic() < deadline or load.count() == before:
        time.sleep(0.1)


@pytest.mark.slow
def test_drain_restart_and_sigterm_behind_haproxy_lose_no_call(tmp_path):
    hf_home = tiny_cache(tmp_path / "hf")
    replicas = [Replica(tmp_path / f"replica{k}", hf_home) for k in range(3)]
    balancer = None
    load = None
    try:
        for replica in replicas:
            replica.start()
        for replica in replicas:
            replica.wait("/readyz")
        # the reference: each body alone on one replica, before any load
        headers = {"Authorization": f"Bearer {TOKEN}"}
        alone = [results_of(httpx.post(f"{replicas[0].url}/v1/score", json=b, headers=headers)) for b in BODIES]
        balancer = Balancer(tmp_path, replicas)
        for k in range(3):
            balancer.wait_status(f"replica{k}", "UP")
        load = Load(balancer.url)
        _run_for(load, 2)

        # replica 0: drained (out of rotation once haproxy sees /readyz fail, its calls finished), stopped, restarted
        # (still draining: the marker outlives the process), put back
        drained = replicas[0]
        assert prestop_drain.main(["--url", drained.url, "--token", TRUSTED, "--settle-s", "3", "--quiet-s", "1"]) == 0
        balancer.wait_status("replica0", "DOWN", timeout_s=5)  # it is already: no call came for a second
        assert drained.stop() == 0
        drained.start()
        drained.wait("/livez")
        restarted = drained.scored()
        undrain = httpx.delete(f"{drained.url}/v0/drain", headers={"Authorization": f"Bearer {TRUSTED}"})
        assert undrain.json() == {"draining": False}
        balancer.wait_status("replica0", "UP")
        _run_for(load, 3)
        assert drained.scored() > restarted, "the restarted replica got no call once back in rotation"

        # replica 1: SIGTERM with no drain, while the load goes on and a long call keeps it stopping for seconds,
        # answering 503 to new calls until haproxy takes it out
        stopped = replicas[1]
        long_call = _post_in_thread(stopped.url, LONG_BODY)
        burst = load.burst(BURST)
        time.sleep(1.0)  # admitted by then (checked below: it must be answered), and far from done
        refused = stopped.output().count("POST /v1/score 503")
        stopped.process.send_signal(signal.SIGTERM)
        # The steady clients alone seldom reach it now: leastconn sends each new call to the replica whose call just
        # ended, and replica 1's calls wait behind the long one. A burst makes the other two the busier ones. It
        # goes once replica 1 is stopping (its /readyz answers 503) and well before haproxy's checks can take it
        # out (two failed checks a second apart): a burst sent a fixed 0.2 s after the signal came too late on a
        # loaded 2-core machine, and no call reached the stopping replica.
        _wait_stopping(stopped)
        burst.set()
        balancer.wait_status("replica1", "DOWN")
        assert stopped.process.wait(timeout=60) == 0
        long_call.join(timeout=60)
        assert long_call.status == 200, f"the call in flight at SIGTERM was not answered: {long_call.status}"
        _run_for(load, 3)
        load.stop()
        stats = balancer.stats()

        # no replica left: the balancer's own 503, in the API's envelope and with a Retry-After
        for k in (0, 2):
            assert replicas[k].stop() == 0
            balancer.wait_status(f"replica{k}", "DOWN")
        none_left = httpx.post(f"{balancer.url}/v1/score", json=BODIES[0], headers=headers, timeout=30)
        assert (none_left.status_code, none_left.headers.get("Retry-After")) == (503, "10")
        assert none_left.json()["error"]["code"] == "model_unavailable"
    finally:
        if load is not None:
            load.stop()
        if balancer is not None:
            balancer.stop()
        for replica in replicas:
            replica.kill()

    failed = [(index, status, got) for index, status, got in load.answers if status != 200]
    assert failed == [], f"{len(failed)} of {len(load.answers)} calls failed, the first: {failed[:3]}"
    differ = [index for index, _, got in load.answers if got != alone[index]]
    assert differ == [], f"{len(differ)} answers differ from the same body scored alone"
    assert len(load.answers) >= 30, len(load.answers)
    served = [replica.scored() for replica in replicas]
    assert all(served), served
    # the 503s replica 1 answered while it stopped reached no client: haproxy sent those calls elsewhere
    refused = stopped.output().count("POST /v1/score 503") - refused
    assert refused > 0, "no call reached replica 1 while it was stopping: the SIGTERM leg tested nothing"
    retries = int(stats["BACKEND"]["wretr"]) + int(stats["BACKEND"]["wredis"])
    print(f"{len(load.answers)} calls, replicas served {served}, {refused} refused while stopping, {retries} retried")


def test_the_compose_file_gives_each_replica_a_gpu_and_the_balancer_every_replica():
    """compose.yaml and haproxy.cfg agree: one service per GPU, each a SPINF_REPLICA_<k> of the balancer, and
    haproxy accepts the file with the balancer's environment (``haproxy -c``)."""
    import yaml

    services = yaml.safe_load((CONFIG.parent / "compose.yaml").read_text())["services"]
    replicas = {name: spec for name, spec in services.items() if name.startswith("spinf-gpu")}
    devices = [spec["deploy"]["resources"]["reservations"]["devices"] for spec in replicas.values()]
    assert [device[0]["device_ids"] for device in devices] == [[str(k)] for k in range(len(replicas))]
    balancer = services["balancer"]["environment"]
    named = {value for key, value in balancer.items() if key.startswith("SPINF_REPLICA_")}
    assert named == {f"{name}:8000" for name in replicas}
    env = {**os.environ, **balancer, "SPINF_LB_STATS_SOCKET": "/nonexistent/haproxy.sock"}
    checked = subprocess.run([HAPROXY, "-c", "-f", str(CONFIG)], env=env, capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Configuration file is valid" in checked.stdout + checked.stderr
