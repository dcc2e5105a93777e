"""The connection layer over raw sockets: what a hostile or sloppy client sends, byte for byte (spinf.http11).

A real server (Hypercorn, the app, the actors, a fake engine) on a random loopback port; each test writes bytes
and reads what comes back until the server closes the connection or a short wait passes.
"""

from __future__ import annotations

import json
import re

import pytest
import trio

from spinf.supervisor import serve
from tests.server.fakes import FakeEngine, models_entry, options

READY = b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
OK_BODY = json.dumps({"messages": [{"content": "hi"}], "scoring": {"queries": []}}).encode()


@pytest.fixture
async def port(tmp_path, monkeypatch):
    monkeypatch.setenv("SPINF_DRAIN_FILE", str(tmp_path / "drain"))
    opts = options(max_body_bytes=1_000_000, body_timeout_s=0.5)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(lambda task_status: serve(opts, FakeEngine, models_entry, task_status=task_status))
        port = int(binds[0].rsplit(":", 1)[1])
        with trio.fail_after(10):
            while answers((await exchange(port, READY))[0])[0][0] != 200:
                await trio.sleep(0.02)
        yield port
        nursery.cancel_scope.cancel()


async def exchange(port: int, data: bytes, wait_s: float = 2.0) -> tuple[bytes, bool]:
    """Send ``data``; (everything read, whether the server closed the connection within ``wait_s``)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        try:
            await stream.send_all(data)
        except trio.BrokenResourceError:
            pass  # the server refused and closed before taking it all
        received = b""
        with trio.move_on_after(wait_s):
            while True:
                try:
                    chunk = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    return received, True
                if not chunk:
                    return received, True
                received += chunk
        return received, False


def answers(raw: bytes) -> list[tuple[int, dict, dict]]:
    """Each (status, headers, JSON body) in ``raw``, in order."""
    found = []
    for match in re.finditer(rb"HTTP/1.1 (\d{3})[^\r]*\r\n(.*?)\r\n\r\n", raw, re.S):
        lines = match[2].decode().split("\r\n")
        headers = {name.lower(): value for name, value in (line.split(": ", 1) for line in lines)}
        length = int(headers.get("content-length", 0))
        body = raw[match.end() : match.end() + length]
        found.append((int(match[1]), headers, json.loads(body) if length else {}))
    return found


def refused(raw: bytes, status: int, code: str) -> dict:
    """The one answer in ``raw``: ``status`` with ``code`` in the error envelope and a matching request id."""
    [(got, headers, body)] = answers(raw)
    assert (got, body["error"]["code"]) == (status, code)
    assert headers["x-request-id"] == body["request_id"] and headers["content-type"] == "application/json"
    return headers


async def healthy(port: int) -> bool:
    raw, _ = await exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    return answers(raw)[0][0] == 200


async def test_http2_prior_knowledge_is_refused_and_the_server_lives_on(port):
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    raw, closed = await exchange(port, preface + b"\x00\x00\x12\x04\x00\x00\x00\x00\x00" + b"\x00" * 3_000_000)
    headers = refused(raw, 505, "invalid_http")
    assert closed and headers["connection"] == "close"
    assert raw.startswith(b"HTTP/1.1 505 HTTP Version Not Supported\r\n")  # with its reason phrase
    assert await healthy(port)


async def test_an_h2c_upgrade_is_served_as_http11(port):
    upgrade = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
    raw, _ = await exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + upgrade + b"\r\n", wait_s=0.5)
    [(status, _, body)] = answers(raw)
    assert status == 200 and body == {"ok": True}
    big = b"POST /v1/score HTTP/1.1\r\nHost: x\r\n" + upgrade + b"Content-Length: 3000000\r\n\r\n" + b"x" * 3_000_000
    raw, closed = await exchange(port, big)  # the request that brought Hypercorn's h2 side down
    assert refused(raw, 413, "body_too_large")["connection"] == "close" and closed
    assert await healthy(port)


async def test_content_length_beside_chunked_is_refused_and_nothing_after_it_runs(port):
    smuggled = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    raw, closed = await exchange(
        port,
        b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        + smuggled,
    )
    refused(raw, 400, "invalid_http")  # one answer only: the smuggled request never ran
    assert closed


async def test_connection_close_is_honoured(port):
    raw, closed = await exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert [status for status, _, _ in answers(raw)] == [200] and closed


async def test_a_kept_alive_connection_serves_request_after_request(port):
    one = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    raw, closed = await exchange(port, one + one, wait_s=0.5)
    assert [status for status, _, _ in answers(raw)] == [200, 200] and not closed


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"POST /v1/score HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431),
    ],
)
async def test_protocol_refusals_come_in_the_envelope_and_close(port, request_bytes, status):
    raw, closed = await exchange(port, request_bytes)
    assert refused(raw, status, "invalid_http")["connection"] == "close" and closed


async def test_a_slow_body_gets_408_and_the_connection_closes(port):
    started = trio.current_time()
    raw, closed = await exchange(port, b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{", 5.0)
    assert refused(raw, 408, "body_timeout")["connection"] == "close" and closed
    assert 0.5 <= trio.current_time() - started < 3.0


async def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(port):
    raw, closed = await exchange(port, b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n")
    assert refused(raw, 413, "body_too_large")["connection"] == "close" and closed


async def test_a_scored_call_still_works_on_the_same_server(port):
    head = f"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Length: {len(OK_BODY)}\r\n\r\n".encode()
    raw, _ = await exchange(port, head + OK_BODY, wait_s=1.0)
    [(status, headers, body)] = answers(raw)
    assert status == 200 and body["id"] == headers["x-request-id"]
