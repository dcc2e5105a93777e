"""Nothing lost at shutdown, abandoned calls dropped at once (issue 33 items 3 and 4).

First `spinf.server.http11.serve` on real loopback sockets with an app that answers every request: what happens to the
connections around the moment the listener closes. Then the real ``spinf-serve serve`` process
(`contrib.loadtest.shutdown`): calls whose clients left, and (in the ``slow`` run) a shutdown under many clients.
A call cut by the deadline is tests/test_system.py's.
"""

from __future__ import annotations

import functools
import socket

import pytest
import trio
from hypercorn.config import Config
from hypercorn.utils import wrap_app

from contrib.loadtest import shutdown
from spinf.server import http11

REQUEST = b"GET /ok HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


async def answer_every_request(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    headers = [(b"content-length", b"2"), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


def listening(keep_alive_s: float = 5.0) -> tuple[Config, object, int]:
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.keep_alive_timeout = keep_alive_s
    sockets = config.create_sockets()
    for sock in sockets.insecure_sockets:
        sock.listen(64)
    return config, sockets, sockets.insecure_sockets[0].getsockname()[1]


def read_all(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        chunks.append(b"<reset>")
    finally:
        sock.close()
    return b"".join(chunks)


async def serving(nursery: trio.Nursery, shutdown_trigger, keep_alive_s: float = 5.0) -> int:
    config, sockets, port = listening(keep_alive_s)
    app = wrap_app(answer_every_request, config.wsgi_max_body_size, None)
    serve = functools.partial(http11.serve, app, config, sockets, shutdown_trigger=shutdown_trigger)
    await nursery.start(serve)
    return port


async def accepted_then_stopped(nursery: trio.Nursery, stop: trio.Event) -> socket.socket:
    """A connection the server has accepted, then the shutdown."""
    port = await serving(nursery, stop.wait)
    client = socket.create_connection(("127.0.0.1", port))
    await trio.sleep(0.2)  # accepted
    stop.set()
    return client


async def test_connections_the_kernel_queued_when_the_shutdown_came_are_answered():
    stop, answers = trio.Event(), []
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            port = await serving(nursery, stop.wait)
            # no checkpoint from here to the stop: the server cannot accept, the kernel queues the connections
            clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
            for client in clients:
                client.sendall(REQUEST)
            stop.set()
            answers = await trio.to_thread.run_sync(lambda: [read_all(client) for client in clients])
        # Hypercorn's worker closed the listener with them in its queue: each was reset, its request sent
        assert [answer.split(b"\r\n")[0] for answer in answers] == [b"HTTP/1.1 200 "] * 5
        with pytest.raises(ConnectionRefusedError):  # and the listener is closed
            socket.create_connection(("127.0.0.1", port), timeout=5)


async def test_a_connection_accepted_before_the_listener_closed_may_still_send_its_request():
    stop = trio.Event()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            client = await accepted_then_stopped(nursery, stop)
            await trio.sleep(http11.FIRST_REQUEST_S / 2)  # Hypercorn's idle task closed it at once
            client.sendall(REQUEST)
            answer = await trio.to_thread.run_sync(read_all, client)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"ok")


async def test_a_connection_that_never_sends_is_closed_once_its_time_to_send_has_passed():
    stop = trio.Event()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            client = await accepted_then_stopped(nursery, stop)
            began = trio.current_time()
        closed_in = trio.current_time() - began  # serve returned: every connection has closed
    assert http11.FIRST_REQUEST_S <= closed_in < http11.FIRST_REQUEST_S + 1
    assert read_all(client) == b""  # closed, not reset


async def test_a_head_that_stops_arriving_is_closed_at_the_keep_alive_timeout():
    stop = trio.Event()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            port = await serving(nursery, stop.wait, keep_alive_s=0.5)
            client = socket.create_connection(("127.0.0.1", port))
            client.sendall(REQUEST[:20])  # and no more: a slow-loris
            began = trio.current_time()
            answer = await trio.to_thread.run_sync(read_all, client)
            closed_in = trio.current_time() - began
            stop.set()
    assert answer == b"" and closed_in < 3


def test_calls_whose_clients_left_free_their_slots_at_once_and_are_logged_499(tmp_path):
    # the 5 slots, each held by a call of many passes (short ones: a pass under way is not cut)
    figures = shutdown.abandoned(tmp_path, calls=5, token_budget=2048)
    # before: the slots were held until the pass under way ended (429s meanwhile), and nothing was logged
    assert figures["next"][0] == 200 and figures["refused_first"] == 0, figures
    assert figures["next"][1] < 3 * max(figures["alone_s"], 1.0), figures  # at most a pass under way before it
    assert figures["log_499"] == 5 and figures["counted"] == 5, figures


@pytest.mark.slow
@pytest.mark.parametrize("clients", [20, 500])
def test_a_shutdown_under_many_clients_loses_no_request_and_keeps_its_deadline(tmp_path, clients):
    figures = shutdown.shutdown(tmp_path, clients=clients, shutdown_s=30)
    report = shutdown.report([figures], None, None)
    # before: 5 (20 clients) and 490 (500 connections) resets
    assert shutdown.losses(figures) == 0, report
    assert set(figures["outcomes"]) <= {"200", "429", "503 enveloped", "refused"}, report
    assert figures["outcomes"].get("503 enveloped", 0) > 0 and figures["outcomes"]["refused"] == clients, report
    assert figures["exit_code"] == 0 and figures["exit_s"] <= 30 + 1, report
