"""Packs in a real server process (packs.md §4.5, api.md §8, issue 13 item 5), over a real socket.

One server serves a copy of fixtures/packs (``tiny/moderation`` 0.1.0) with ``--no-official-packs``: ``GET /v1/packs``
and ``GET /v1/packs/{id}`` answer from its catalog; then the copy is edited and reloaded, by the trusted ``POST
/v0/packs/reload`` and by SIGHUP, while other threads call ``GET /v1/packs`` and ``POST /v1/score`` and no call
fails. A broken edit keeps the old catalog and the POST says why. Two short starts besides: a ``--packs`` folder that
does not exist refuses the start before the model loads (exit status 1), and an official source that cannot be
reached (``SPINF_GITHUB_API`` on a closed loopback port) is logged and the server starts without it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from contrib.loadtest.harness import ROOT, ServerProcess, free_port, score_body, tiny_cache

FIXTURE = ROOT / "fixtures" / "packs"
PACK = json.loads((FIXTURE / "moderation" / "0.1.0.json").read_text())
TRUSTED = "trusted-secret"
AUTH = {"Authorization": f"Bearer {TRUSTED}"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tiny_cache(tmp_path_factory.mktemp("hf-home"))


@pytest.fixture(scope="module")
def served(tmp_path_factory, cache):
    """The server on a copy of fixtures/packs, and the copy's folder."""
    folder = tmp_path_factory.mktemp("packs") / "repo"
    shutil.copytree(FIXTURE, folder)
    server = ServerProcess(
        tmp_path_factory.mktemp("server"),
        "--packs",
        str(folder),
        "--no-official-packs",
        "--trusted-token",
        TRUSTED,
        hf_home=cache,
    )
    try:
        yield server, folder
    finally:
        assert server.stop() == 0


def get(server: ServerProcess, path: str, **params) -> httpx.Response:
    return httpx.get(f"{server.url}{path}", params=params, headers=AUTH, timeout=30)


def reload(server: ServerProcess) -> dict:
    answer = httpx.post(f"{server.url}/v0/packs/reload", headers=AUTH, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_v1_packs_lists_the_fixture_pack_with_the_fields_of_api_8_1(served):
    server, folder = served
    answer = get(server, "/v1/packs")
    assert answer.status_code == 200
    assert answer.json() == {
        "packs": [
            {
                "id": "tiny/moderation",
                "name": "Moderation (tiny, invented constants)",
                "status": "available",
                "version": "0.1.0",
                "versions": ["0.1.0"],
                "description": "A moderation-shaped pack for end-to-end tests on spinf/tiny-gemma4; nothing is "
                "calibrated.",
                "tags": ["test"],
                "model": "spinf/tiny-gemma4",
                "media": ["text"],
                "source": f"local:{folder}",
                "parameters": [],
                "contexts": [{"id": name, "template": text} for name, text in PACK["contexts"].items()],
                "categories": [
                    {"id": "general", "label": "General", "threshold": 0.5},
                    {"id": "violence", "label": "Violence", "threshold": 0.6},
                    {"id": "drugs", "label": "Drugs", "threshold": 0.6},
                    {"id": "harassment", "label": "Harassment", "threshold": 0.55},
                    {"id": "spam", "label": "Spam", "threshold": None},
                ],
                "decision": {
                    "mode": "micro_layer",
                    "modes": ["max", "per_category", "micro_layer"],
                    "fallback": "max",
                    "max_threshold": 0.5,
                    "critical": ["violence"],
                },
                "queries": 4,
                "prompts": 5,  # the attacks query has two combinations
            }
        ],
        "sources": [f"local:{folder}"],
    }
    assert list(answer.json()["packs"][0]) == [
        "id", "name", "status", "version", "versions", "description", "tags", "model", "media", "source",
        "parameters", "contexts", "categories", "decision", "queries", "prompts",
    ]  # fmt: skip


def test_v1_packs_id_gives_the_pack_file_unchanged_and_the_404s_of_api_8_2(served):
    server, _ = served
    assert get(server, "/v1/packs/tiny/moderation").json() == PACK
    assert get(server, "/v1/packs/tiny/moderation", version="0.1.0").json() == PACK
    for path, params, code, param in (
        ("/v1/packs/tiny/moderation", {"version": "9.9"}, "unknown_pack_version", "version"),
        ("/v1/packs/tiny/nothing", {}, "unknown_pack", "id"),
        ("/v1/packs/", {}, "unknown_pack", "id"),
    ):
        answer = get(server, path, **params)
        error = answer.json()["error"]
        assert (answer.status_code, error["type"], error["code"], error["param"]) == (404, "not_found", code, param)
    assert "0.1.0" in get(server, "/v1/packs/tiny/moderation", version="9.9").json()["error"]["message"]
    assert httpx.get(f"{server.url}/v1/packs", timeout=10).status_code == 401  # the access token is needed


def test_reload_is_for_trusted_callers_only(tmp_path, cache):
    server = ServerProcess(
        tmp_path, "--no-official-packs", "--token", "plain", "--trusted-token", TRUSTED, hf_home=cache
    )
    try:
        route = f"{server.url}/v0/packs/reload"
        assert httpx.post(route, timeout=10).status_code == 401
        assert httpx.post(route, headers={"Authorization": "Bearer plain"}, timeout=10).status_code == 401
        bad = httpx.post(route, params={"refresh": "yes"}, headers=AUTH, timeout=10)
        assert (bad.status_code, bad.json()["error"]["code"], bad.json()["error"]["param"]) == (
            400,
            "invalid_field",
            "refresh",
        )
        off = httpx.post(route, params={"refresh": "true"}, headers=AUTH, timeout=10)
        assert off.status_code == 200
        assert (off.json()["applied"], off.json()["reason"]) == (False, "no_source")  # packs off: nothing to read
        assert httpx.get(f"{server.url}/v1/packs", headers=AUTH, timeout=10).json() == {"packs": [], "sources": []}
    finally:
        assert server.stop() == 0


def add_version(folder: Path, version: str) -> None:
    pack = dict(PACK, version=version)
    (folder / "moderation" / f"{version}.json").write_text(json.dumps(pack))
    manifest = json.loads((folder / "prompt-packs.json").read_text())
    entry = {"version": version, "file": f"moderation/{version}.json", "model": "spinf/tiny-gemma4"}
    manifest["packs"][0]["versions"].insert(0, entry)
    (folder / "prompt-packs.json").write_text(json.dumps(manifest))


def versions(server: ServerProcess) -> list[str]:
    return get(server, "/v1/packs").json()["packs"][0]["versions"]


def pack_call(version: str | None = None) -> dict:
    reference = {"id": "tiny/moderation"} | ({"version": version} if version else {})
    content = [{"role": "user", "content": "You are wonderful."}]
    return {"inputs": [{"id": "a", "messages": content}], "scoring": {"queries": [], "packs": [reference]}}


class Traffic:
    """Threads calling ``GET /v1/packs``, ``POST /v1/score`` and ``POST /v1/score`` with the pack until stopped; every
    answer that is not 200 kept, and the pack versions the pack calls were answered with."""

    def __init__(self, server: ServerProcess, threads: int = 3):
        self.server, self.stopping, self.failures, self.calls = server, threading.Event(), [], 0
        self.pack_versions: set[str] = set()
        self.threads = [threading.Thread(target=self._run, args=(k,)) for k in range(threads)]

    def _run(self, k: int) -> None:
        with httpx.Client(base_url=self.server.url, headers=AUTH, timeout=60) as client:
            while not self.stopping.is_set():
                if k % 3 == 2:
                    answer = client.post("/v1/score", json=pack_call())
                elif k % 3 == 1:
                    answer = client.post("/v1/score", json=score_body(sentences=1, questions=2))
                else:
                    answer = client.get("/v1/packs")
                self.calls += 1
                if answer.status_code != 200:
                    self.failures.append((answer.status_code, answer.text))
                elif k % 3 == 2:
                    self.pack_versions.add(answer.json()["results"][0]["packs"][0]["version"])

    def __enter__(self) -> Traffic:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(60)


def test_a_pack_repository_changes_and_reloads_on_the_running_server_with_no_failed_call(served):
    server, folder = served
    score = f"{server.url}/v1/score"
    with Traffic(server) as traffic:
        add_version(folder, "0.2.0")
        unknown = httpx.post(score, json=pack_call("0.2.0"), headers=AUTH, timeout=60)
        assert (unknown.status_code, unknown.json()["error"]["code"]) == (400, "unknown_pack_version")
        applied = reload(server)
        assert applied == {
            "applied": True,
            "reason": None,
            "errors": [],
            "official_error": None,
            "sources": [f"local:{folder}"],
            "packs": 1,
            "versions": 2,
            "skipped": 0,
            "requests": 1,
        }
        assert versions(server) == ["0.2.0", "0.1.0"]
        assert get(server, "/v1/packs/tiny/moderation").json()["version"] == "0.2.0"  # the new default
        scored = httpx.post(score, json=pack_call(), headers=AUTH, timeout=60)
        assert scored.json()["results"][0]["packs"][0]["version"] == "0.2.0"  # calls take the new snapshot

        (folder / "moderation" / "0.2.0.json").write_text("{not json")  # a broken edit
        refused = reload(server)
        assert (refused["applied"], refused["reason"], refused["versions"]) == (False, "catalog_errors", 2)
        assert len(refused["errors"]) == 1 and "0.2.0.json" in refused["errors"][0]
        assert versions(server) == ["0.2.0", "0.1.0"]  # the old catalog stays
        assert get(server, "/v1/packs/tiny/moderation").json()["version"] == "0.2.0"

        add_version(folder, "0.3.0")
        (folder / "moderation" / "0.2.0.json").write_text(json.dumps(dict(PACK, version="0.2.0")))
        lines = server.log_lines()
        server.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while versions(server) != ["0.3.0", "0.2.0", "0.1.0"]:
            assert time.monotonic() < deadline, server.output()
            time.sleep(0.05)
        many = [threading.Thread(target=reload, args=(server,)) for _ in range(4)]  # concurrent reloads too
        for thread in many:
            thread.start()
        for thread in many:
            thread.join(60)
        deadline = time.monotonic() + 30
        while "0.3.0" not in traffic.pack_versions:  # pack calls go on, on the last catalog
            assert time.monotonic() < deadline and not traffic.failures, traffic.failures
            time.sleep(0.05)
    assert traffic.failures == [] and traffic.calls > 10
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    for line in ("spinf_pack_versions 3.0", "spinf_packs 1.0", 'spinf_pack_reloads{result="refused"} 1.0'):
        assert line in metrics.splitlines(), metrics
    assert traffic.pack_versions <= {"0.1.0", "0.2.0", "0.3.0"}
    log = server.output().splitlines()[lines:]
    assert any(line.endswith("received SIGHUP: reloading the pack sources") for line in log)
    assert any(line.endswith("pack reload (SIGHUP): applied") for line in log)
    refusal = [line for line in server.output().splitlines() if "pack reload (POST /v0/packs/reload): not" in line]
    assert len(refusal) == 1 and refusal[0].endswith("not applied (catalog_errors), the catalog in use stays")


def serve_command(*flags: str) -> list[str]:
    return [sys.executable, "-m", "spinf", "serve", "spinf/tiny-gemma4", "--device", "cpu", "--host", "127.0.0.1",
            "--port", str(free_port()), *flags]  # fmt: skip


def test_an_unreadable_packs_folder_refuses_the_start_before_the_model_loads(tmp_path):
    missing = tmp_path / "no-such-folder"
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf")}  # no model in it: the start must end before loading one
    done = subprocess.run(
        serve_command("--packs", str(missing), "--no-official-packs"),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 2, done.stderr  # the catalog error, then the one refusal listing the errors
    assert "pack catalog error:" in errors[0] and str(missing) in errors[0]
    assert "not starting: the pack catalog has 1 error: " in errors[1] and str(missing) in errors[1]
    assert "loading the model" not in done.stderr


def test_an_unreachable_official_source_is_logged_and_the_server_starts_without_it(tmp_path, cache):
    closed = free_port()  # nothing listens there
    env = {"SPINF_GITHUB_API": f"http://127.0.0.1:{closed}", "SPINF_PACKS_CACHE": str(tmp_path / "packs-cache")}
    server = ServerProcess(tmp_path, "--packs", str(FIXTURE), "--trusted-token", TRUSTED, env=env, hf_home=cache)
    try:
        listed = get(server, "/v1/packs").json()
        assert listed["sources"] == [f"local:{FIXTURE}"]
        assert [p["id"] for p in listed["packs"]] == ["tiny/moderation"]
        output = server.output()
    finally:
        assert server.stop() == 0
    assert f"; pack sources: official, {FIXTURE}" in output
    unavailable = [line for line in output.splitlines() if "the official pack repository is unavailable" in line]
    assert len(unavailable) == 1 and " WARNING " in unavailable[0] and f"127.0.0.1:{closed}" in unavailable[0]


def extra_repository(folder: Path) -> Path:
    """A second repository without a manifest: one pack file, ``extra/moderation``, found by discovery."""
    folder.mkdir(parents=True)
    (folder / "moderation.json").write_text(json.dumps(dict(PACK, pack="extra/moderation")))
    return folder


def write_config(path: Path, sources: list[Path], official: bool = False) -> None:
    listed = ", ".join(json.dumps(str(source)) for source in sources)
    path.write_text(f"[features]\nofficial_packs = {str(official).lower()}\npacks = [{listed}]\n")


def test_a_repository_added_to_the_config_file_is_served_after_a_reload(tmp_path, cache):
    """A reload reads the pack settings again: a source added to (or removed from) the config file is served (or
    gone) without a restart; a config file that no longer parses keeps the catalog in use and says why."""
    first = tmp_path / "first"
    shutil.copytree(FIXTURE, first)
    second = extra_repository(tmp_path / "second")
    config = tmp_path / "spinf.toml"
    write_config(config, [first])
    server = ServerProcess(tmp_path / "server", "--config", str(config), "--trusted-token", TRUSTED, hf_home=cache)
    try:
        ids = lambda: [p["id"] for p in get(server, "/v1/packs").json()["packs"]]  # noqa: E731
        assert ids() == ["tiny/moderation"]
        write_config(config, [first, second])
        added = reload(server)
        assert (added["applied"], added["sources"], added["packs"]) == (
            True,
            [f"local:{first}", f"local:{second}"],
            2,
        )
        assert ids() == ["tiny/moderation", "extra/moderation"]
        body = pack_call() | {"scoring": {"queries": [], "packs": [{"id": "extra/moderation"}]}}
        answer = httpx.post(f"{server.url}/v1/score", json=body, headers=AUTH, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["results"][0]["packs"][0]["id"] == "extra/moderation"
        config.write_text("[features\npacks = 3\n")  # no longer TOML
        broken = reload(server)
        assert (broken["applied"], broken["reason"], broken["packs"]) == (False, "catalog_errors", 2)
        assert "the settings could not be read again" in broken["errors"][0]
        assert ids() == ["tiny/moderation", "extra/moderation"]
        write_config(config, [second])
        os.kill(server.process.pid, signal.SIGHUP)  # the same by SIGHUP: the first source is gone
        deadline = time.monotonic() + 60
        while ids() != ["extra/moderation"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ids() == ["extra/moderation"]
        config.write_text("[features]\nofficial_packs = false\npacks = []\n")
        off = reload(server)  # the file now names no source: packs are off
        assert (off["applied"], off["sources"], off["packs"]) == (True, [], 0)
        assert get(server, "/v1/packs").json() == {"packs": [], "sources": []}
    finally:
        assert server.stop() == 0
