"""The real server process, spoken to by the real clients: spinf-client 0.3.1, the OpenAI SDK and curl.

`spinf-serve serve spinf/tiny-gemma4` runs as a subprocess on a free loopback port; the test drains it, sends
SIGTERM, and checks that every call admitted before the signal was answered and that the process exits 0.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from spinf_client import SpinfClient, SpinfError, answers, query, text

ROOT = Path(__file__).resolve().parent.parent
QUERY = {"id": "refund", "template": "\n\nDoes the customer ask for a refund? Answer:{?}", "options": [" yes", " no"]}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    def __init__(self, tmp_path: Path, cache: Path, *extra: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, HF_HOME=str(cache), SPINF_DRAIN_FILE=str(tmp_path / "drain"), PYTHONUNBUFFERED="1")
        command = [sys.executable, "-m", "spinf", "serve", "spinf/tiny-gemma4", "--device", "cpu", "--host"]
        command += ["127.0.0.1", "--port", str(self.port), "--warmup", "short", *extra]
        self.log = open(tmp_path / f"server-{self.port}.log", "w+")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(command, env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.output()
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError("the server did not become ready:\n" + self.output())

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return Path(self.log.name).read_text()

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        finally:
            self.log.close()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    from spinf.engine.tiny import ensure_tiny_snapshot

    home = tmp_path_factory.mktemp("hf-home")
    ensure_tiny_snapshot(home / "hub")
    return home


@pytest.fixture(scope="module")
def open_server(tmp_path_factory, cache):
    server = Server(tmp_path_factory.mktemp("open"), cache)
    yield server
    assert server.stop() == 0


def test_spinf_client_scores_and_reads_answers(open_server):
    client = SpinfClient(base_url=open_server.url, model="spinf/tiny-gemma4")
    out = client.score(
        content=[text("I was charged twice. Please refund one payment.")],
        queries=[
            query(QUERY["id"], QUERY["template"], QUERY["options"]),
            query(
                "about",
                "\n\nThe message is about {topic}:{?}",
                [" yes", " no"],
                combinations="all",
                values={"topic": ["money", "a parcel", "an account"]},
            ),
        ],
    )
    assert [q["id"] for q in out["results"][0]["queries"]] == ["refund", "about"]
    refund = answers(out, "refund")
    assert [o["text"] for o in refund["options"]] == [" yes", " no"]
    assert abs(sum(o["p"] for o in refund["options"]) - 1) < 1e-5
    assert [answers(out, "about", combination=k)["values"]["topic"] for k in range(3)] == [
        "money",
        "a parcel",
        "an account",
    ]
    models = client.models()["models"]
    assert models[0]["id"] == "spinf/tiny-gemma4" and models[0]["status"] == "available"


def test_spinf_client_many_inputs_with_query_ids_and_own_queries(open_server):
    client = SpinfClient(base_url=open_server.url, model="tiny")
    inputs = [
        {"id": "a", "content": [text("Where is my parcel?")], "query_ids": ["refund"]},
        {
            "id": "b",
            "content": [text("Cancel my account.")],
            "queries": [{"id": "cancel", "template": "\n\nCancel? Answer:{?}", "options": [" yes", " no"]}],
        },
    ]
    out = client.score(inputs=inputs, queries=[QUERY])
    assert [r["input_id"] for r in out["results"]] == ["a", "b"]
    assert [q["id"] for q in out["results"][1]["queries"]] == ["refund", "cancel"]
    with pytest.raises(SpinfError) as refused:
        client.score(inputs=[{"id": "x", "content": [{"type": "text", "text": "hi"}], "query_ids": ["nope"]}])
    assert (refused.value.status, refused.value.code) == (400, "unknown_query_id")


def test_openai_sdk_chat_completions_returns_results(open_server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{open_server.url}/v1", api_key="unused")
    completion = client.chat.completions.create(
        model="spinf/tiny-gemma4",
        messages=[{"role": "user", "content": "I was charged twice. Please refund one payment."}],
        extra_body={"scoring": {"queries": [QUERY]}},
    )
    extra = completion.model_extra
    assert extra["results"][0]["queries"][0]["id"] == "refund"
    assert completion.choices == []


def test_the_readme_curl_example(open_server):
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"```bash\n(curl .*?)```", readme, re.S).group(1)
    command = command.replace("http://localhost:8000", open_server.url).replace("\\\n", " ")
    done = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert '"results"' in done.stdout and '"refund"' in done.stdout


def test_a_token_server_with_a_tiny_queue(tmp_path, cache):
    server = Server(tmp_path, cache, "--token", "secret", "--trusted-token", "boss", "--queue", "0")
    try:
        with pytest.raises(SpinfError) as refused:
            SpinfClient(base_url=server.url, model="tiny").models()
        assert (refused.value.status, refused.value.code) == (401, "invalid_token")
        client = SpinfClient(api_key="secret", base_url=server.url, model="tiny")
        body = {"messages": [{"content": "Refund me. " * 300}], "scoring": {"queries": [QUERY] * 1}}
        results, errors = [], []

        def call():
            try:
                results.append(client.request(body))
            except Exception as exc:  # collected and asserted below
                errors.append(exc)

        threads = [threading.Thread(target=call) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors and len(results) == 4  # every 429 was retried after its Retry-After until it got through
        assert re.search(r"POST /v1/score 429 ", server.output()), "no call was refused: the retry path was not taken"
        assert len({str(r["results"]) for r in results}) == 1
        boss = httpx.Client(base_url=server.url, headers={"Authorization": "Bearer boss"})
        assert boss.post("/v0/drain").json() == {"draining": True}
        assert httpx.get(f"{server.url}/readyz").json() == {"ready": False, "draining": True}
        assert client.request(body)["results"] == results[0]["results"]  # draining still serves
    finally:
        assert server.stop() == 0


def test_sigterm_answers_every_admitted_call_then_exits_0(tmp_path, cache):
    server = Server(tmp_path, cache, "--queue", "8")
    body = {"messages": [{"content": "Refund me. " * 300}], "scoring": {"queries": [QUERY]}}
    statuses = []

    def call():
        statuses.append(httpx.post(f"{server.url}/v1/score", json=body, timeout=60).status_code)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    code = server.stop()
    for t in threads:
        t.join(60)
    assert code == 0
    assert len(statuses) == 6 and set(statuses) <= {200, 503}
    assert "stopping" in server.output()
