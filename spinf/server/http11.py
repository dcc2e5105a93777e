"""The connection layer under the app: HTTP/1.1 only, framed strictly, every refusal in the error envelope.

Hypercorn speaks HTTP/1.1 and HTTP/2 on the same cleartext port, and its HTTP/2 side has a known crash (a request
answered before its body was read raises ``KeyError`` out of ``hypercorn/protocol/h2.py`` and ends the process).
This server offers **HTTP/1.1 only**: ``Upgrade: h2c`` is ignored (RFC 9110 §7.8 lets a server serve the request as
it came), and the HTTP/2 preface (prior knowledge) is refused with 505. A TLS or HTTP/2 front end belongs in the
load balancer (docs/deployment.md).

What this module owns, beside that:

- **Framing.** A request with both ``Content-Length`` and ``Transfer-Encoding`` is refused with 400 and the
  connection closed (RFC 9112 §6.3), so no bytes after a chunked terminator run as a second request.
- **One reading of the headers.** More than one ``Authorization`` header is 400 (the gate and the routes would read
  different ones). A head over ``h11_max_incomplete_size`` (16 KiB) is 431 however its bytes arrive: h11 measures
  only a head still arriving, so one that came in a single write is measured here (`head_size`).
- **Protocol refusals in the envelope.** h11's own 400, 431 and 501 (malformed request line, headers over
  ``h11_max_incomplete_size``, a transfer coding other than chunked) are the error envelope of api spec §2.5 with
  code ``invalid_http`` and an ``X-Request-Id``, never a bare plain-text answer.
- **Closing answers close cleanly.** After an answer that says ``Connection: close`` (the 1,000th request of a
  keep-alive connection, a refusal whose body was not read) nothing more is read from the connection.
- **Responses always finish.** quart-trio cancels a request's task group as soon as the client's side reports
  ``http.disconnect``; landing inside Hypercorn's send-and-close path, that cancel left the socket open after a
  ``Connection: close`` answer. `HTTPConnection` sends the response shielded (bounded by Quart's response
  timeout), so the close always runs.

- **A client that leaves is heard.** The end of input while a request is answered is passed on at once, even when
  bytes of a next request are buffered (h11 would hold it until the answer is sent), so the app gets
  ``http.disconnect`` and the call is cancelled (spinf.server.gate's 499).
- **A shutdown loses no request** (`serve`, in place of Hypercorn's ``worker_serve``). Hypercorn stops accepting by
  cancelling its accept loop and leaves the socket listening until the process exits, so the connections the
  kernel accepted meanwhile were reset with their requests sent, and its idle task closed every connection without a
  request under way, one whose request was arriving among them. Here, once the shutdown trigger returns, the
  connections waiting in the kernel's queue are taken and the socket is closed in the same step, before their tasks
  start (a later client is refused before it sends anything). The kernel completes handshakes on its own, so one
  that completes between the last accept and the close is still reset: that window is the two calls apart, where
  starting the queued connections' tasks first had widened it to their count. A connection that has not sent its
  first request yet, or has part of its next one, is given `FIRST_REQUEST_S` to send it and gets its answer (a 503
  once the server is stopping); one idle between requests is closed at once, as Hypercorn closes it.

`install` puts the protocol in place of Hypercorn's (``hypercorn.trio.tcp_server.ProtocolWrapper``, the one name
Hypercorn looks up per connection); `serve` calls it.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus

import h11
import hypercorn.trio.tcp_server
import trio
from hypercorn.config import Config, Sockets
from hypercorn.events import Closed, RawData
from hypercorn.protocol import ProtocolWrapper
from hypercorn.protocol.events import Response
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import repr_socket_addr
from quart_trio.asgi import TrioASGIHTTPConnection

from spinf.errors import ApiError
from spinf.protocol.ids import new_request_id

log = logging.getLogger(__name__)
PROTOCOL_CODE = "invalid_http"
# after the listener closed, how long a connection that has not sent its (first or next) request may take to send it:
# a client sends its request at once after connecting, so this only bounds one that never does
FIRST_REQUEST_S = 1.0
LINGER_S = 0.5  # how long a closing connection waits for its client's end before closing (`_Connection`)
_REASONS = {
    400: "the request is not valid HTTP/1.1",
    431: "the request's header fields are too large",
    501: "only the chunked transfer coding is supported",
    505: "this server speaks HTTP/1.1 only (no HTTP/2: put an HTTP/2 front end before it)",
}


class Refusal(Exception):
    """A request refused at the protocol layer, before any route sees it; the connection is then closed."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def envelope_bytes(status: int, message: str) -> tuple[bytes, bytes]:
    """(request id, JSON body) of a protocol refusal: the envelope of api spec §2.5 with code ``invalid_http``."""
    request_id = new_request_id()
    body = ApiError(status, PROTOCOL_CODE, None, message).envelope(request_id)
    return request_id.encode(), json.dumps(body).encode()


class Http11Protocol(H11Protocol):
    """Hypercorn's HTTP/1.1 protocol with the upgrades to HTTP/2 taken out, ambiguous framing and headers refused,
    and nothing read after an answer that closes the connection."""

    closing = False  # the answer being sent says Connection: close

    async def handle(self, event) -> None:
        if isinstance(event, RawData) and self.closing:
            # RFC 9112 §9.6: after a closing answer the server reads no further request. Handed to h11, these bytes
            # (a request sent on the strength of the answer's head) made it close the socket from the reading task
            # while the answering task was still writing the body: BusyResourceError, logged as an ERROR.
            return
        if isinstance(event, RawData) and not event.data and self.is_answering:
            # the client closed while its request is answered. With bytes of a next request buffered (a pipelining
            # client), h11 holds the end of input (PAUSED) until the answer is sent, so the app would not hear of
            # it and the call would run on; the reader's Closed comes next and tells the app (http.disconnect),
            # which cancels the call (spinf.server.gate logs it 499, as nginx does)
            return
        await super().handle(event)

    @property
    def is_answering(self) -> bool:
        """A request was read whole and its answer is not finished."""
        return self.stream is not None and self.connection.their_state is h11.DONE

    @property
    def expects_request(self) -> bool:
        """No request came on this connection yet, or part of the next one has arrived: closing it now could lose
        a request its client has sent."""
        return self.keep_alive_requests == 0 or bool(self.connection.trailing_data[0])

    @property
    def has_request(self) -> bool:
        """A request's head has been read and its exchange is not over."""
        return self.stream is not None or self.connection.their_state is not h11.IDLE

    async def stream_send(self, event) -> None:
        if isinstance(event, Response) and event.status_code >= 200:
            self.closing = self.keep_alive_requests >= self.config.keep_alive_max_requests or _says_close(event)
        await super().stream_send(event)

    async def _check_protocol(self, event: h11.Request) -> None:
        if event.method == b"PRI" and event.http_version == b"2.0":
            raise Refusal(505, _REASONS[505])
        names = [name for name, _ in event.headers]  # h11 lower-cases header names
        if b"content-length" in names and b"transfer-encoding" in names:
            raise Refusal(400, "a request may not carry both Content-Length and Transfer-Encoding (RFC 9112 §6.3)")
        if names.count(b"authorization") > 1:
            # RFC 9110 §5.3: a singleton field; read first by one layer and last by another, it was two callers
            raise Refusal(400, "a request may carry one Authorization header, not several")
        if head_size(event) > self.config.h11_max_incomplete_size:
            raise Refusal(431, _REASONS[431])

    async def _send_error_response(self, status_code: int) -> None:
        # h11's own refusals; Hypercorn closes the connection after this
        await self._send_envelope(status_code, _REASONS.get(status_code, _REASONS[400]))

    async def refuse(self, refusal: Refusal) -> None:
        """Answer ``refusal`` in the envelope, then close the connection."""
        await self._send_envelope(refusal.status, refusal.message)
        await self.send(Closed())

    async def _send_envelope(self, status: int, message: str) -> None:
        request_id, body = envelope_bytes(status, message)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-request-id", request_id),
            (b"connection", b"close"),
            *self.config.response_headers("h11"),
        ]
        if self.connection.our_state in {h11.IDLE, h11.SEND_RESPONSE}:
            reason = HTTPStatus(status).phrase.encode()  # h11 would write an empty reason phrase
            await self._send_h11_event(h11.Response(status_code=status, headers=headers, reason=reason))
            await self._send_h11_event(h11.Data(data=body))
            await self._send_h11_event(h11.EndOfMessage())


def head_size(event: h11.Request) -> int:
    """The bytes of a request's head as h11 parsed it: request line, ``name: value`` lines, the blank line.

    h11 measures only a head that has not arrived whole (``max_incomplete_event_size``), so without this check
    a head that came in one write passed at any size while the same head in pieces was refused at 16 KiB. h11
    strips the spaces around a value, so a head padded with them can be a few bytes longer on the wire."""
    line = len(event.method) + len(event.target) + len(event.http_version) + len(b"  HTTP/\r\n")
    return line + sum(len(name) + len(value) + 4 for name, value in event.headers) + 2


def _says_close(event: Response) -> bool:
    return any(name.lower() == b"connection" and b"close" in value.lower() for name, value in event.headers)


class Http11Only(ProtocolWrapper):
    """Every connection is `Http11Protocol`, whatever ALPN said: there is no switch to HTTP/2."""

    def __init__(self, app, config, context, task_group, state, ssl, client, server, send, alpn_protocol=None):
        self.protocol = Http11Protocol(app, config, context, task_group, state, ssl, client, server, send)

    async def handle(self, event) -> None:
        try:
            await self.protocol.handle(event)
        except Refusal as refusal:
            await self.protocol.refuse(refusal)

    @property
    def expects_request(self) -> bool:
        return self.protocol.expects_request

    @property
    def has_request(self) -> bool:
        return self.protocol.has_request


class _Connection(TCPServer):
    """Hypercorn's connection, whose idle task, once the server is shutting down, gives a connection that expects a
    request `FIRST_REQUEST_S` to send it before closing it (a request that comes stops the idle task, as ever), and
    which lingers after a closing answer: it sends its end (FIN) and discards what the client still sends until the
    client closes too or `LINGER_S` has passed. Closed at once, a socket with unread bytes (the body of a request
    refused unread: a 413, a 503 of a server stopping) is reset, and the reset can destroy the answer before the
    client has read it."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self._read_all = trio.Event()

    async def _read_data(self) -> None:
        try:
            await super()._read_data()
        finally:
            self._read_all.set()

    async def _close(self) -> None:
        try:
            await self.stream.send_eof()
        except (trio.BrokenResourceError, trio.BusyResourceError, trio.ClosedResourceError):
            pass  # gone already, or the reader is closing it
        else:
            with trio.move_on_after(LINGER_S):  # Http11Protocol discards what comes after a closing answer
                await self._read_all.wait()
        await self.stream.aclose()

    async def _idle_timeout(self) -> None:
        with trio.move_on_after(self.config.keep_alive_timeout):
            await self.context.terminated.wait()
        if self.context.terminated.is_set() and self.protocol.expects_request:
            await trio.sleep(FIRST_REQUEST_S)
        if self.protocol.has_request:  # a request came as this task woke: it stops this task, once it gets there
            return
        with trio.CancelScope(shield=True):
            await self._initiate_server_close()


async def serve(
    app,
    config: Config,
    sockets: Sockets,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on the listening ``sockets`` until ``shutdown_trigger`` returns, then close as the module
    docstring says and return once every connection has closed; ``task_status`` gets the binds.

    **Cancellation**: the connections are closed where they are (the supervisor's deadline bounds this).
    """
    install()
    lifespan = Lifespan(app, config, {})
    context = WorkerContext(None)
    connection = functools.partial(_Connection, app, config, context, ConnectionState({}))

    async def run(stream: trio.SocketStream) -> None:
        await connection(stream)

    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as connections:  # outlives the listeners
            listening = sockets.insecure_sockets
            listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(sock)) for sock in listening]
            binds = [f"http://{repr_socket_addr(sock.family, sock.getsockname())}" for sock in listening]
            for bind in binds:
                await config.log.info(f"Running on {bind} (CTRL + C to quit)")
            async with trio.open_nursery() as accepting:
                for listener in listeners:
                    accepting.start_soon(_accept, listener, run, connections)
                task_status.started(binds)
                await shutdown_trigger()
                accepting.cancel_scope.cancel()
            for sock, listener in zip(listening, listeners, strict=True):  # no checkpoint until terminated is set
                queued = _queued(sock)
                listener.socket.close()  # at once: one that completes its handshake before this is reset
                for stream in queued:
                    connections.start_soon(run, stream)
            await context.terminated.set()
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


async def _accept(listener: trio.SocketListener, run, connections: trio.Nursery) -> None:
    """Accept connections on ``listener`` and run each in ``connections``, until cancelled. Unlike
    ``trio.serve_listeners`` it leaves the listener open when cancelled: `serve` takes the kernel's queue first.

    **Cancellation**: nothing is left behind (a connection accepted is handed over before the next checkpoint)."""
    while True:
        try:
            stream = await listener.accept()
        except OSError as error:
            if error.errno not in _OUT_OF_RESOURCES:
                raise
            log.error("accepting a connection failed (%s): trying again in %g s", error, _RESOURCES_BACK_S)
            await trio.sleep(_RESOURCES_BACK_S)
            continue
        connections.start_soon(run, stream)


_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
_RESOURCES_BACK_S = 0.1


def _queued(sock) -> list[trio.SocketStream]:
    """The connections the kernel has accepted on the listening ``sock`` that nobody has taken yet, without waiting
    (trio made the socket non-blocking)."""
    streams = []
    while True:
        try:
            accepted, _ = sock.accept()
        except OSError:  # none left (EAGAIN), or one reset in the queue or no descriptor free: the kernel keeps it
            return streams
        streams.append(trio.SocketStream(trio.socket.from_stdlib_socket(accepted)))


class HTTPConnection(TrioASGIHTTPConnection):
    """quart-trio's request task, with the response sent under a shield so a disconnect cannot cut the close."""

    async def handle_request(self, nursery: trio.Nursery, request, send) -> None:
        response = await self.app.handle_request(request)
        timeout = self.app.config["RESPONSE_TIMEOUT"]
        if getattr(response, "timeout", Ellipsis) is not Ellipsis:
            timeout = response.timeout
        with trio.CancelScope(shield=True), trio.move_on_after(timeout if timeout is not None else float("inf")):
            await self._send_response(send, response)
        nursery.cancel_scope.cancel()


def install() -> None:
    """Make Hypercorn's trio server build `Http11Only` for every new connection."""
    hypercorn.trio.tcp_server.ProtocolWrapper = Http11Only
