"""Host and Origin checks and JSON bodies (issue 33 item 5; `spinf.server.gate.Sites`, docs/deployment.md "Security
defaults"), against real server processes on loopback spoken to over raw sockets, and with the real clients.

A loopback server refuses a foreign Host (DNS rebinding) except on the probes, and any Origin it was not told to
allow (a cross-site browser POST); an allowed Origin must send JSON. Requests without an Origin, as curl,
spinf-client and the openai SDK send them, are read as JSON whatever their content type.
"""

from __future__ import annotations

import http.client
import json
import socket

import pytest
from spinf_client import SpinfClient, answers, query, text

from contrib.loadtest.harness import ServerProcess, tiny_cache
from spinf.server.gate import Sites, host_name, is_loopback_name
from spinf.server.supervisor import _bound_to_loopback, bind_sockets
from spinf.settings import ServerSettings

QUERY = {"id": "refund", "template": "\n\nDoes the customer ask for a refund? Answer:{?}", "options": [" yes", " no"]}
BODY = json.dumps({"messages": [{"role": "user", "content": "Please refund me."}], "scoring": {"queries": [QUERY]}})


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tiny_cache(tmp_path_factory.mktemp("hf-home"))


@pytest.fixture(scope="module")
def loopback(tmp_path_factory, cache):
    server = ServerProcess(tmp_path_factory.mktemp("loopback"), "--no-official-packs", hf_home=cache)
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def allowing(tmp_path_factory, cache):
    flags = ("--no-official-packs", "--allowed-hosts", "api.example.com", "--allowed-origins", "https://app.example")
    server = ServerProcess(tmp_path_factory.mktemp("allowing"), *flags, hf_home=cache)
    yield server
    assert server.stop() == 0


def call(server, method: str, path: str, body: str | None = None, **headers: str) -> tuple[int, dict, dict]:
    """One request over a fresh connection with exactly these headers (``Host`` included): status, headers, JSON."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name.replace("_", "-"), value)
        data = body.encode() if body is not None else None
        if data is not None:
            connection.putheader("Content-Length", str(len(data)))
        connection.endheaders(data)
        answer = connection.getresponse()
        raw = answer.read()
        is_json = answer.getheader("Content-Type", "").startswith("application/json")
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, json.loads(raw) if is_json else raw
    finally:
        connection.close()


def refused(answer, status: int, code: str) -> None:
    got, headers, body = answer
    assert (got, body["error"]["code"]) == (status, code), body
    assert body["error"]["type"] == "invalid_request" and body["error"]["param"] is None
    assert body["request_id"] == headers["x-request-id"]


def test_a_loopback_server_answers_loopback_hosts_only(loopback):
    local = f"127.0.0.1:{loopback.port}"
    for host in (
        local,
        f"localhost:{loopback.port}",
        "localhost",
        "127.8.9.1",
        f"[::1]:{loopback.port}",
        "LOCALHOST.",
    ):
        assert call(loopback, "GET", "/v1/models", Host=host)[0] == 200, host
    for host in ("evil.example", f"evil.example:{loopback.port}", "127.0.0.1.evil.example", "10.0.0.7:8000"):
        refused(call(loopback, "GET", "/v1/models", Host=host), 403, "forbidden_host")
        refused(call(loopback, "POST", "/v1/score", BODY, Host=host), 403, "forbidden_host")
    for probe in ("/healthz", "/readyz", "/livez", "/metrics"):  # health checkers send the pod's address
        assert call(loopback, "GET", probe, Host="10.0.0.7:8000")[0] == 200, probe


def test_a_refusal_comes_before_the_body(loopback):
    """A cross-site POST is refused on its head alone: the body it announces is never waited for."""
    with socket.create_connection(("127.0.0.1", loopback.port), timeout=10) as sock:
        head = f"POST /v1/score HTTP/1.1\r\nHost: 127.0.0.1:{loopback.port}\r\nOrigin: https://evil.example\r\n"
        sock.sendall((head + "Content-Type: text/plain\r\nContent-Length: 100000\r\n\r\n").encode())
        chunks = []
        while chunk := sock.recv(65536):  # the answer, then the close: the body was not waited for
            chunks.append(chunk)
        answer = b"".join(chunks).decode()
    assert answer.startswith("HTTP/1.1 403 ") and '"forbidden_origin"' in answer
    assert "connection: close" in answer.lower()


def test_a_foreign_origin_is_refused_and_curl_bodies_are_still_json(loopback):
    host = f"127.0.0.1:{loopback.port}"
    for origin in ("https://evil.example", "null", f"http://{host}"):
        answer = call(loopback, "POST", "/v1/score", BODY, Host=host, Origin=origin, Content_Type="text/plain")
        refused(answer, 403, "forbidden_origin")
        refused(call(loopback, "GET", "/v1/models", Host=host, Origin=origin), 403, "forbidden_origin")
    # curl -d: form-urlencoded, no Origin; text/plain and none at all: all read as JSON
    for content_type in ("application/x-www-form-urlencoded", "text/plain", None):
        headers = {"Content_Type": content_type} if content_type else {}
        status, _, body = call(loopback, "POST", "/v1/score", BODY, Host=host, **headers)
        assert status == 200 and body["results"][0]["queries"][0]["id"] == "refund", body


def test_allowed_hosts_and_origins_and_an_allowed_origin_sends_json(allowing):
    host = f"127.0.0.1:{allowing.port}"
    assert call(allowing, "GET", "/v1/models", Host="API.example.com:443")[0] == 200
    assert call(allowing, "GET", "/v1/models", Host=host)[0] == 200
    refused(call(allowing, "GET", "/v1/models", Host="other.example.com"), 403, "forbidden_host")
    origin = "https://app.example"
    for content_type in ("application/json", "application/json; charset=utf-8", "application/merge-patch+json"):
        status, _, body = call(
            allowing, "POST", "/v1/score", BODY, Host=host, Origin=origin, Content_Type=content_type
        )
        assert status == 200, body
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        answer = call(allowing, "POST", "/v1/score", BODY, Host=host, Origin=origin, Content_Type=content_type)
        refused(answer, 415, "unsupported_content_type")
    refused(call(allowing, "POST", "/v1/score", BODY, Host=host, Origin=origin), 415, "unsupported_content_type")
    assert call(allowing, "GET", "/v1/models", Host=host, Origin=origin)[0] == 200  # no body: no content type
    answer = call(allowing, "POST", "/v1/score", BODY, Host=host, Origin="https://app.example.evil")
    refused(answer, 403, "forbidden_origin")


def test_spinf_client_and_the_openai_sdk_work_unchanged_on_loopback(loopback):
    from openai import OpenAI

    client = SpinfClient(base_url=loopback.url, model="spinf/tiny-gemma4")
    out = client.score(
        content=[text("Please refund me.")], queries=[query(QUERY["id"], QUERY["template"], [" yes", " no"])]
    )
    assert [o["text"] for o in answers(out, "refund")["options"]] == [" yes", " no"]
    for base_url in (f"{loopback.url}/v1", f"http://localhost:{loopback.port}/v1"):
        sdk = OpenAI(base_url=base_url, api_key="unused")
        assert [model.id for model in sdk.models.list()] == ["spinf/tiny-gemma4"]
        completion = sdk.chat.completions.create(
            model="spinf/tiny-gemma4",
            messages=[{"role": "user", "content": "Please refund me."}],
            extra_body={"scoring": {"queries": [QUERY]}},
        )
        assert completion.model_extra["results"][0]["queries"][0]["id"] == "refund"


def test_a_server_bound_elsewhere_answers_any_host_but_no_foreign_origin():
    sites = Sites.build((), (), loopback=False)
    scope = {"path": "/v1/score", "headers": [(b"host", b"10.1.2.3:8000"), (b"content-length", b"2")]}
    assert sites.refusal(scope) is None
    scope["headers"].append((b"origin", b"https://evil.example"))
    assert sites.refusal(scope).code == "forbidden_origin"
    named = Sites.build(("api.example.com",), ("*",), loopback=False)
    assert named.refusal({"path": "/v1/models", "headers": [(b"host", b"10.1.2.3:8000")]}).code == "forbidden_host"
    assert named.refusal({"path": "/readyz", "headers": [(b"host", b"10.1.2.3:8000")]}) is None
    assert named.refusal({"path": "/v1/models", "headers": [(b"host", b"[::1]:8000")]}) is None
    assert Sites.build(("*",), (), loopback=True).refusal({"path": "/", "headers": [(b"host", b"a.example")]}) is None
    # a second Host or Origin header cannot carry a refused one past the check
    twice = {"path": "/v1/models", "headers": [(b"host", b"localhost"), (b"host", b"evil.example")]}
    assert Sites.build((), (), loopback=True).refusal(twice).code == "forbidden_host"


def test_host_names_and_the_loopback_binding():
    assert [host_name(h) for h in ("LocalHost:80", "[::1]:8000", "[::1]", "a.example.", "a.example:")] == [
        "localhost",
        "::1",
        "::1",
        "a.example",
        "a.example",
    ]
    assert [is_loopback_name(n) for n in ("localhost", "127.0.0.1", "127.255.0.9", "::1", "10.0.0.1", "0.0.0.0")] == [
        True,
        True,
        True,
        True,
        False,
        False,
    ]
    sockets = bind_sockets(ServerSettings(host="127.0.0.1", port=0))
    try:
        assert _bound_to_loopback(sockets)
    finally:
        for sock in sockets.insecure_sockets:
            sock.close()
