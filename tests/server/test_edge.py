"""The connection layer over raw sockets: what a hostile or sloppy client sends, byte for byte (spinf.server.http11).

A real server (Hypercorn, the app, the actors, a fake engine) on a random loopback port; each test writes bytes
and reads what comes back until the server closes the connection or a short wait passes.
"""

from __future__ import annotations

import json
import logging
import re

import pytest
import trio

from spinf.server.supervisor import serve
from tests.server.fakes import FakeEngine, models_entry, options

READY = b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
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


async def exchange(port: int, data: bytes, wait_s: float = 2.0, piece: int = 0) -> tuple[bytes, bool]:
    """Send ``data`` (``piece`` bytes per write when given); (everything read, whether the server closed the
    connection within ``wait_s``)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        try:
            for at in range(0, len(data), piece or len(data)):
                await stream.send_all(data[at : at + (piece or len(data))])
                await trio.sleep(0)
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
    raw, _ = await exchange(port, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
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
    raw, _ = await exchange(port, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n" + upgrade + b"\r\n", wait_s=0.5)
    [(status, _, body)] = answers(raw)
    assert status == 200 and body == {"ok": True}
    head = b"POST /v1/score HTTP/1.1\r\nHost: localhost\r\n"
    big = head + upgrade + b"Content-Length: 3000000\r\n\r\n" + b"x" * 3_000_000
    raw, closed = await exchange(port, big)  # the request that brought Hypercorn's h2 side down
    assert refused(raw, 413, "body_too_large")["connection"] == "close" and closed
    assert await healthy(port)


async def test_content_length_beside_chunked_is_refused_and_nothing_after_it_runs(port):
    smuggled = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
    raw, closed = await exchange(
        port,
        b"POST /v1/score HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled,
    )
    refused(raw, 400, "invalid_http")  # one answer only: the smuggled request never ran
    assert closed


async def test_connection_close_is_honoured(port):
    raw, closed = await exchange(port, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    assert [status for status, _, _ in answers(raw)] == [200] and closed


async def test_a_kept_alive_connection_serves_request_after_request(port):
    one = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
    raw, closed = await exchange(port, one + one, wait_s=0.5)
    assert [status for status, _, _ in answers(raw)] == [200, 200] and not closed


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"POST /v1/score HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
        (b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431),
    ],
)
async def test_protocol_refusals_come_in_the_envelope_and_close(port, request_bytes, status):
    raw, closed = await exchange(port, request_bytes)
    assert refused(raw, status, "invalid_http")["connection"] == "close" and closed


async def test_a_slow_body_gets_408_and_the_connection_closes(port):
    started = trio.current_time()
    raw, closed = await exchange(
        port, b"POST /v1/score HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{", 5.0
    )
    assert refused(raw, 408, "body_timeout")["connection"] == "close" and closed
    assert 0.5 <= trio.current_time() - started < 3.0


async def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(port):
    raw, closed = await exchange(
        port, b"POST /v1/score HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2000000\r\n\r\n"
    )
    assert refused(raw, 413, "body_too_large")["connection"] == "close" and closed


async def test_a_scored_call_still_works_on_the_same_server(port):
    head = f"POST /v1/score HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(OK_BODY)}\r\n\r\n".encode()
    raw, _ = await exchange(port, head + OK_BODY, wait_s=1.0)
    [(status, headers, body)] = answers(raw)
    assert status == 200 and body["id"] == headers["x-request-id"]


def with_header(size: int) -> bytes:
    """A GET /healthz whose head (request line, fields, blank line) is ``size`` bytes long."""
    head = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nX-Big: \r\n\r\n"
    return head.replace(b"X-Big: ", b"X-Big: " + b"a" * (size - len(head)))


@pytest.mark.parametrize(("size", "piece"), [(16_384, 1), (16_385, 1), (20_000, 1000), (65_000, 1000)])
async def test_one_header_limit_whatever_the_segmentation(port, size, piece):
    """Regression: a 65 KB head in one write passed while 20 KB in pieces was refused (h11 only measures a head
    that has not arrived whole). Now a head over 16 KiB is 431 both ways, and one of 16 KiB passes both ways."""
    request = with_header(size)
    assert len(request) == size
    statuses = []
    for raw, closed in [await exchange(port, request), await exchange(port, request, piece=piece)]:
        [(status, _, _)] = answers(raw)
        statuses.append(status)
        assert closed
    assert statuses == ([200, 200] if size <= 16_384 else [431, 431])


async def test_duplicate_authorization_headers_are_refused(port):
    """Regression: the gate read the last of two ``Authorization`` headers and the routes the first. A request
    with more than one is now 400 ``invalid_http`` and closed, on every route, before any of them reads it."""
    for target in (b"GET /v1/models", b"POST /v1/score"):
        auth = b"Authorization: Bearer a\r\nAuthorization: Bearer b\r\n"
        body = OK_BODY if target.startswith(b"POST") else b""
        head = target + b" HTTP/1.1\r\nHost: localhost\r\n" + auth + f"Content-Length: {len(body)}\r\n\r\n".encode()
        raw, closed = await exchange(port, head + body)
        headers = refused(raw, 400, "invalid_http")
        assert headers["connection"] == "close" and closed
    raw, _ = await exchange(
        port, b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer a\r\nConnection: close\r\n\r\n"
    )
    assert answers(raw)[0][0] == 200


async def keep_alive_until_closed(port: int, request: bytes) -> tuple[list[int], str]:
    """Send ``request`` on one connection again as soon as the head of each answer arrives (before its body, which
    is where a request sent after a closing answer landed), until the server closes; (statuses, last Connection)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    received = b""
    async with stream:
        with trio.fail_after(60):
            for k in range(1_001):
                try:
                    await stream.send_all(request)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
                while received.count(b"HTTP/1.1 ") <= k:
                    try:
                        chunk = await stream.receive_some(65536)
                    except trio.BrokenResourceError:
                        chunk = b""
                    if not chunk:
                        break
                    received += chunk
                else:
                    continue
                break
            while chunk := await stream.receive_some(65536):
                received += chunk
    found = answers(received)
    return [status for status, _, _ in found], found[-1][1].get("connection", "")


async def test_the_keep_alive_request_limit_closes_cleanly(port, caplog):
    """Regression: the 1,000th request on a keep-alive connection logged ``ERROR ... BusyResourceError`` when the
    client's next request arrived while that answer's body was being sent (the connection was closed from the
    reading task while the answering task was still writing). Now the 1,000th answer says ``Connection: close``,
    what arrives after it is not read, the connection closes after the answer, and nothing is logged at ERROR."""
    one = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
    results = []

    async def client():
        results.append(await keep_alive_until_closed(port, one))

    async with trio.open_nursery() as nursery:
        for _ in range(6):
            nursery.start_soon(client)
    assert results == [([200] * 1000, "close")] * 6
    assert await healthy(port)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
