"""contrib/kubernetes: the manifests against the Kubernetes schemas, offline, and the preStop drain script.

The schemas are kubernetes-validate's own copies (PyPI; the ``dev`` extra), so no cluster and no network is needed.
The manifests' rules are checked on the files themselves: the probes' routes, the startup window against the
image's HEALTHCHECK start period, the grace period against the preStop wait and the shutdown deadline, and that the
hook is the script the image carries. The drain script is run against a fake server (its waits, timed) and, in the
slow run, against a real one with a call in flight.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import kubernetes_validate
import pytest
import yaml

from contrib.kubernetes import prestop_drain
from contrib.loadtest.harness import ServerProcess, score_body
from tests.contrib.test_container import arguments, copies
from tests.loopback import JsonHandler, LoopbackServer

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "contrib" / "kubernetes").glob("*.yaml"))
SCRIPT = ROOT / "contrib" / "kubernetes" / "prestop_drain.py"
EXIT_MARGIN_S = 15  # the rule's margin for the process's own exit, as the manifest states it


def documents() -> dict[str, dict]:
    found = {}
    for path in MANIFESTS:
        for document in yaml.safe_load_all(path.read_text()):
            found[document["kind"]] = document
    return found


def container() -> dict:
    (main,) = documents()["Deployment"]["spec"]["template"]["spec"]["containers"]
    return main


def flag(command: list[str], name: str) -> float:
    return float(command[command.index(name) + 1])


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda path: path.name)
def test_the_manifest_is_valid_against_the_kubernetes_schemas(path):
    for document in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)


def test_the_validator_refuses_a_broken_deployment():
    broken = copy.deepcopy(documents()["Deployment"])
    broken["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "ninety"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)


def test_the_manifests_are_a_gpu_deployment_with_a_cache_a_service_and_a_budget():
    found = documents()
    assert set(found) == {"Deployment", "Service", "PodDisruptionBudget", "PersistentVolumeClaim"}
    template = found["Deployment"]["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert found["Service"]["spec"]["selector"] == labels
    assert found["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == labels
    main = container()
    assert main["resources"]["limits"]["nvidia.com/gpu"] == 1
    (mount,) = main["volumeMounts"]
    assert [mount["mountPath"]] == arguments("VOLUME")  # the image's cache volume
    (volume,) = template["spec"]["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == found["PersistentVolumeClaim"]["metadata"]["name"]
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/path"] == "/metrics"
    assert int(annotations["prometheus.io/port"]) == main["ports"][0]["containerPort"]


def test_the_probes_ask_readyz_and_livez_and_the_startup_window_covers_the_warmup():
    main = container()
    assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert main["livenessProbe"]["httpGet"]["path"] == "/livez"
    startup = main["startupProbe"]
    assert startup["httpGet"]["path"] == "/livez"
    (healthcheck,) = arguments("HEALTHCHECK")
    start_period_s = 60 * int(re.search(r"--start-period=(\d+)m", healthcheck)[1])
    assert startup["periodSeconds"] * startup["failureThreshold"] >= start_period_s


def test_the_grace_period_covers_the_prestop_wait_and_the_shutdown():
    spec = documents()["Deployment"]["spec"]["template"]["spec"]
    main = container()
    command = main["lifecycle"]["preStop"]["exec"]["command"]
    shutdown_s = float({env["name"]: env.get("value") for env in main["env"]}["SPINF_SHUTDOWN_S"])
    assert spec["terminationGracePeriodSeconds"] >= flag(command, "--timeout-s") + shutdown_s + EXIT_MARGIN_S
    readiness = main["readinessProbe"]
    assert flag(command, "--settle-s") >= readiness["periodSeconds"] * readiness["failureThreshold"]
    assert flag(command, "--timeout-s") > flag(command, "--settle-s") + flag(command, "--quiet-s")


def test_the_prestop_hook_is_the_script_the_image_carries():
    (destination,) = [to for sources, to in copies() if "contrib/kubernetes/prestop_drain.py" in sources]
    assert container()["lifecycle"]["preStop"]["exec"]["command"][0] == destination


class FakeServer(LoopbackServer):
    """``/v0/drain`` and ``/metrics``: ``busy_s`` seconds of one call in flight after the drain, and ``arriving``
    answered calls counted on every read of ``/metrics`` (traffic that does not stop)."""

    def __init__(self, *, token: str = "T", busy_s: float = 0.0, arriving: bool = False):
        super().__init__(FakeHandler)
        self.token, self.busy_s, self.arriving = token, busy_s, arriving
        self.drained_at: float | None = None
        self.answered = 7

    def metrics(self) -> bytes:
        busy = self.busy_s > 0 and (self.drained_at is None or time.monotonic() - self.drained_at < self.busy_s)
        self.answered += 1 if self.arriving else 0
        return (
            f"spinf_requests_in_flight {1.0 if busy else 0.0}\n"
            f'spinf_requests_total{{route="/v1/score",status="200"}} {self.answered}.0\n'
            f'spinf_requests_total{{route="/readyz",status="503"}} {time.monotonic()}\n'
        ).encode()


class FakeHandler(JsonHandler):
    def do_GET(self):
        self.answer(200, self.server.fake.metrics(), {})

    def do_POST(self):
        fake = self.server.fake
        if self.path != "/v0/drain" or self.headers.get("Authorization") != f"Bearer {fake.token}":
            self.answer(401, {"error": {"code": "invalid_token"}}, {})
            return
        fake.drained_at = time.monotonic()
        self.answer(200, {"draining": True}, {})


def drain(url: str, *flags: str) -> tuple[int, float]:
    start = time.monotonic()
    status = prestop_drain.main(["--url", url, "--settle-s", "0.2", "--quiet-s", "0.3", *flags])
    return status, time.monotonic() - start


def test_the_drain_waits_for_the_call_in_flight_then_for_quiet():
    with FakeServer(busy_s=0.6) as fake:
        status, took_s = drain(fake.url, "--token", "T", "--timeout-s", "10")
        assert fake.drained_at is not None
    assert status == 0
    assert 0.9 <= took_s < 2.0  # the call's 0.6 s, then 0.3 s with nothing in flight or answered


def test_the_drain_waits_at_least_the_settle_time():
    with FakeServer() as fake:
        status, took_s = drain(fake.url, "--token", "T", "--settle-s", "0.8", "--timeout-s", "10")
    assert status == 0 and 0.8 <= took_s < 2.0


def test_the_drain_gives_up_after_its_timeout_while_calls_keep_arriving():
    with FakeServer(arriving=True) as fake:
        status, took_s = drain(fake.url, "--token", "T", "--timeout-s", "0.8")
    assert status == 1 and 0.8 <= took_s < 1.8


def test_a_refused_drain_exits_2_at_once():
    with FakeServer() as fake:
        status, took_s = drain(fake.url, "--token", "wrong", "--timeout-s", "10")
        assert fake.drained_at is None
    assert status == 2 and took_s < 1.0


def test_without_a_token_the_drain_creates_the_marker_file(tmp_path, monkeypatch):
    marker = tmp_path / "drain"
    monkeypatch.setenv("SPINF_DRAIN_FILE", str(marker))
    with FakeServer() as fake:
        status, _ = drain(fake.url, "--token", "", "--timeout-s", "10")
        assert fake.drained_at is None  # nobody is trusted on an open server: no POST
    assert status == 0 and marker.exists()


@pytest.mark.slow
def test_the_drain_script_returns_after_the_call_in_flight_on_a_real_server(tmp_path):
    server = ServerProcess(tmp_path / "server", "--trusted-token", "T")
    answered: list[tuple[int, float]] = []

    def call() -> None:
        body, auth = score_body(sentences=80, questions=300), {"Authorization": "Bearer T"}
        answer = httpx.post(f"{server.url}/v1/score", json=body, headers=auth, timeout=120)
        answered.append((answer.status_code, time.monotonic()))

    caller = threading.Thread(target=call)
    try:
        command = [sys.executable, SCRIPT, "--url", server.url, "--settle-s", "0", "--quiet-s", "0.5"]
        refused = subprocess.run([*command, "--token", "wrong"], capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2, refused.stderr
        assert httpx.get(f"{server.url}/readyz").status_code == 200
        caller.start()
        deadline = time.monotonic() + 30
        while prestop_drain.read_load(server.url)[0] == 0 and not answered and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not answered, answered  # seen in flight
        started = time.monotonic()
        drained = subprocess.run([*command, "--token", "T"], capture_output=True, text=True, timeout=60)
        ended = time.monotonic()
        caller.join(timeout=120)
        assert drained.returncode == 0, drained.stderr
        assert answered and answered[0][0] == 200
        assert started < answered[0][1] <= ended  # in flight when the drain began, answered before it returned
        assert httpx.get(f"{server.url}/readyz").json() == {"ready": False, "draining": True}
        assert prestop_drain.read_load(server.url)[0] == 0
    finally:
        if caller.is_alive():
            caller.join(timeout=120)
        assert server.stop() == 0, server.output()
