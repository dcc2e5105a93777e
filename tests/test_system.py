"""The real server process, spoken to by the real clients: spinf-client 0.3.1, the OpenAI SDK and curl.

`spinf-serve serve spinf/tiny-gemma4` runs as a subprocess on a free loopback port; the test drains it, sends
SIGTERM, and checks that every call admitted before the signal was answered and that the process exits 0.
"""

from __future__ import annotations

import http.client
import json
import re
import shlex
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from spinf_client import SpinfClient, SpinfError, answers, query, text

from contrib.loadtest.harness import ServerProcess, tiny_cache

ROOT = Path(__file__).resolve().parent.parent
QUERY = {"id": "refund", "template": "\n\nDoes the customer ask for a refund? Answer:{?}", "options": [" yes", " no"]}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tiny_cache(tmp_path_factory.mktemp("hf-home"))


@pytest.fixture(scope="module")
def open_server(tmp_path_factory, cache):
    server = ServerProcess(tmp_path_factory.mktemp("open"), hf_home=cache)
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


@pytest.mark.slow  # over 15 s: the default run keeps to 10 minutes on 2 cores
def test_a_token_server_with_a_tiny_queue(tmp_path, cache):
    server = ServerProcess(tmp_path, "--token", "secret", "--trusted-token", "boss", "--queue", "0", hf_home=cache)
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
    server = ServerProcess(tmp_path, "--queue", "8", hf_home=cache)
    body = {"messages": [{"content": "Refund me. " * 300}], "scoring": {"queries": [QUERY]}}
    statuses = []

    def call():
        statuses.append(httpx.post(f"{server.url}/v1/score", json=body, timeout=60).status_code)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    _wait_admitted(server.url, 6)  # every call reached the server: the guarantee is about admitted calls
    code = server.stop()
    for t in threads:
        t.join(60)
    assert code == 0
    assert len(statuses) == 6 and set(statuses) <= {200, 503}
    assert "stopping" in server.output()


def _wait_admitted(url: str, calls: int, timeout_s: float = 30.0) -> None:
    """Until ``calls`` scoring calls were admitted (in flight, or answered), read from /metrics: a fixed sleep let a
    busy machine send SIGTERM before every client had connected, and a refused connection is no admitted call."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = httpx.get(f"{url}/metrics", timeout=5).text
        in_flight = float(re.search(r"^spinf_requests_in_flight (\S+)$", text, re.M)[1])
        answered = re.findall(r'^spinf_requests_total\{route="/v1/score",status="\d+"\} (\S+)$', text, re.M)
        if in_flight + sum(float(n) for n in answered) >= calls:
            return
        time.sleep(0.02)
    raise AssertionError(f"{calls} calls were not admitted within {timeout_s} s")


def test_openai_sdk_stream_reads_one_chunk_with_the_results(open_server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{open_server.url}/v1", api_key="unused")
    stream = client.chat.completions.create(
        model="spinf/tiny-gemma4",
        messages=[{"role": "user", "content": "I was charged twice. Please refund one payment."}],
        stream=True,
        extra_body={"scoring": {"queries": [QUERY]}},
    )
    chunks = list(stream)
    assert len(chunks) == 1 and chunks[0].choices == []
    assert chunks[0].model_extra["results"][0]["queries"][0]["id"] == "refund"


def _hammer(url: str, body: bytes, stop_at: float, record: list) -> None:
    """One client on kept-alive connections: send, read, again, until refused or ``stop_at``. Each request is
    recorded as (reused connection?, status or the error when no status line came back)."""
    host, port = url.removeprefix("http://").split(":")
    connection, reused = None, False
    while time.monotonic() < stop_at:
        if connection is None:
            connection, reused = http.client.HTTPConnection(host, int(port), timeout=30), False
        try:
            connection.request("POST", "/v1/score", body, {"Content-Type": "application/json"})
        except ConnectionRefusedError:
            return  # the server has closed its listener: nothing was sent
        except OSError:
            connection = None
            continue
        try:
            answer = connection.getresponse()
            answer.read()
            record.append((reused, answer.status))
        except (http.client.RemoteDisconnected, ConnectionResetError) as exc:
            record.append((reused, type(exc).__name__))
            connection = None
            continue
        if answer.getheader("Connection", "").lower() == "close":
            connection.close()
            connection = None
        else:
            reused = True


def test_sigterm_under_keepalive_load_answers_every_request_it_read(tmp_path, cache):
    server = ServerProcess(tmp_path, "--queue", "4", hf_home=cache)
    body = json.dumps({"messages": [{"content": "Refund me. " * 40}], "scoring": {"queries": [QUERY] * 1}}).encode()
    record: list = []
    stop_at = time.monotonic() + 60
    threads = [threading.Thread(target=_hammer, args=(server.url, body, stop_at, record)) for _ in range(16)]
    for thread in threads:
        thread.start()
    time.sleep(3)
    answered_before = len(record)
    started = time.monotonic()
    code = server.stop()
    stopped_in = time.monotonic() - started
    for thread in threads:
        thread.join(60)
    lost = [entry for entry in record if entry[0] and not isinstance(entry[1], int)]
    assert code == 0 and stopped_in < 10
    assert answered_before > 20 and {status for _, status in record if isinstance(status, int)} <= {200, 429, 503}
    assert lost == [], f"{len(lost)} requests on kept-alive connections got no status line"


def _in_flight(url: str) -> int:
    metrics = httpx.get(f"{url}/metrics", timeout=5).text
    return int(float(re.search(r"^spinf_requests_in_flight (\S+)$", metrics, re.M).group(1)))


def _wait_in_flight(url: str, count: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _in_flight(url) < count:
        assert time.monotonic() < deadline, f"fewer than {count} calls in flight after {timeout_s:g} s"
        time.sleep(0.02)


def _kept_alive(url: str) -> http.client.HTTPConnection:
    """A connection that had one answer and stays open (keep-alive), idle."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("GET", "/healthz")
    answer = connection.getresponse()
    assert answer.read() == b'{"ok": true}' and answer.getheader("Connection") is None
    return connection


def _closed_by_the_server(connection: http.client.HTTPConnection) -> bool:
    connection.sock.settimeout(5)
    try:
        return connection.sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _scoring_body(inputs: int, words: int, questions: int) -> dict:
    template = "\n\nQuestion {k}: does the customer ask for a refund? Answer:{{?}}"
    queries = [{"id": f"q{k}", "template": template.format(k=k), "options": [" yes", " no"]} for k in range(questions)]
    contents = [
        {"id": f"i{j}", "messages": [{"content": f"Order {j}. " + "Refund me. " * words}]} for j in range(inputs)
    ]
    return {"inputs": contents, "scoring": {"queries": queries}}


def test_sigterm_with_idle_kept_alive_connections_exits_at_once(tmp_path, cache):
    server = ServerProcess(tmp_path, hf_home=cache)
    idle = _kept_alive(server.url)
    idle_httpx = httpx.Client(base_url=server.url, timeout=10)
    assert idle_httpx.get("/healthz").status_code == 200  # httpx keeps its connection in its pool
    started = time.monotonic()
    code = server.stop()
    assert code == 0 and time.monotonic() - started <= 3.0
    assert _closed_by_the_server(idle)
    idle.close()
    idle_httpx.close()


def test_sigterm_with_calls_in_flight_finishes_them_then_exits_0(tmp_path, cache):
    server = ServerProcess(tmp_path, "--queue", "8", hf_home=cache)
    idle = _kept_alive(server.url)
    body, answers = _scoring_body(1, 300, 10), []

    def call():
        with httpx.Client(base_url=server.url, timeout=120) as client:  # kept alive, like a pooled client
            answers.append(client.post("/v1/score", json=body))

    threads = [threading.Thread(target=call) for _ in range(3)]
    for thread in threads:
        thread.start()
    _wait_in_flight(server.url, 3)
    code = server.stop()
    for thread in threads:
        thread.join(60)
    assert code == 0
    assert [answer.status_code for answer in answers] == [200, 200, 200]
    assert all(len(answer.json()["results"][0]["queries"]) == 10 for answer in answers)
    assert _closed_by_the_server(idle)
    idle.close()


def test_sigterm_answers_503_to_the_calls_that_outlast_the_deadline_and_exits_0_at_it(tmp_path, cache):
    # one pass holds the whole call (no time bound, a budget above its tokens): seconds of work for the tiny model
    # on a CPU, under way when the signal comes, so it cannot end within the deadline on any machine (with the CPU
    # default of 0.5 s passes, a pass could end before the deadline and the shutdown was not cut)
    flags = ("--max-pass-s", "0", "--token-budget", "65536")
    server = ServerProcess(tmp_path, *flags, env={"SPINF_SHUTDOWN_S": "1"}, hf_home=cache)
    answers = []

    def call():
        answers.append(httpx.post(f"{server.url}/v1/score", json=_scoring_body(32, 300, 20), timeout=120))

    thread = threading.Thread(target=call)
    thread.start()
    _wait_in_flight(server.url, 1)
    started = time.monotonic()
    code = server.stop()
    stopped_in = time.monotonic() - started
    thread.join(60)
    # the deadline is the deadline: the pass under way is not waited for (issue 33 item 3: 7.9 s after it); the
    # slack is the process's own exit on a busy 2-core machine (2.1 s in all once, with the other worker's tests)
    assert code == 0 and stopped_in <= 1 + 3
    [answer] = answers  # an answer, not a connection closed without one
    assert (answer.status_code, answer.json()["error"]["code"], answer.headers["Retry-After"]) == (
        503,
        "model_unavailable",
        "10",
    )
    assert "the shutdown deadline (1 s) passed: what was still running was cancelled" in server.output()


def test_sigterm_with_a_body_still_arriving_answers_503_and_exits_at_once(tmp_path, cache):
    server = ServerProcess(tmp_path, hf_home=cache)
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        head = b"POST /v1/score HTTP/1.1\r\nHost: localhost\r\n"
        head += b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        sock.sendall(head + b'{"messages": ')  # the rest never comes; body_timeout_s is 60 s
        time.sleep(0.3)
        started = time.monotonic()
        code = server.stop()
        assert code == 0 and time.monotonic() - started <= 3.0
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 503 ") and b"connection: close" in answer.lower()
    assert b'"code": "model_unavailable"' in answer


def test_concurrent_calls_share_passes_and_floors_and_each_gets_its_solo_bits(tmp_path, cache, monkeypatch):
    """32 calls at once with the same questions, through the real server: each answer is, bit for bit, the one
    the engine gives that call alone in-process, and the floors were read once for all of them."""
    from spinf import Engine

    questions = [
        QUERY,
        *({**QUERY, "id": f"q{k}", "template": f"\n\nIs it about item {k}? Answer:{{?}}"} for k in range(8)),
    ]
    bodies = [
        {
            "inputs": [{"id": f"m{k}", "messages": [{"content": f"Order {k} came {k} days late."}]}],
            "scoring": {"queries": questions},
        }
        for k in range(32)
    ]
    server = ServerProcess(tmp_path, "--queue", "32", hf_home=cache)
    httpx.post(f"{server.url}/v1/score", json={**bodies[0], "scoring": {"queries": [QUERY]}}, timeout=60)
    before = httpx.get(f"{server.url}/metrics", timeout=5).text  # counts the warm-up's floors and that call's
    with httpx.Client(base_url=server.url, timeout=120) as http, ThreadPoolExecutor(32) as pool:
        served = list(pool.map(lambda b: http.post("/v1/score", json=b), bodies))
    after = httpx.get(f"{server.url}/metrics", timeout=5).text
    assert server.stop() == 0
    assert [r.status_code for r in served] == [200] * 32
    monkeypatch.setenv("HF_HOME", str(cache))
    engine = Engine("spinf/tiny-gemma4", device="cpu")
    for body, answer in zip(bodies, served, strict=True):
        assert answer.json()["results"] == engine.score(body)["results"]

    def count(name: str, text: str) -> float:
        found = re.search(rf"^{name} (\S+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    misses = count("spinf_floor_cache_misses_total", after) - count("spinf_floor_cache_misses_total", before)
    hits = count("spinf_floor_cache_hits_total", after) - count("spinf_floor_cache_hits_total", before)
    assert misses == len(questions) - 1 and hits >= 31 * len(questions) + 1  # refund's floor: cached before
