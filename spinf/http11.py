"""The connection layer under the app: HTTP/1.1 only, framed strictly, every refusal in the error envelope.

Hypercorn speaks HTTP/1.1 and HTTP/2 on the same cleartext port, and its HTTP/2 side has a known crash (a request
answered before its body was read raises ``KeyError`` out of ``hypercorn/protocol/h2.py`` and ends the process).
This server offers **HTTP/1.1 only**: ``Upgrade: h2c`` is ignored (RFC 9110 §7.8 lets a server serve the request as
it came), and the HTTP/2 preface (prior knowledge) is refused with 505. A TLS or HTTP/2 front end belongs in the
load balancer (docs/deployment.md).

What this module owns, beside that:

- **Framing.** A request with both ``Content-Length`` and ``Transfer-Encoding`` is refused with 400 and the
  connection closed (RFC 9112 §6.3), so no bytes after a chunked terminator run as a second request.
- **Protocol refusals in the envelope.** h11's own 400, 431 and 501 (malformed request line, headers over
  ``h11_max_incomplete_size``, a transfer coding other than chunked) are the error envelope of api spec §2.5 with
  code ``invalid_http`` and an ``X-Request-Id``, never a bare plain-text answer.
- **Responses always finish.** quart-trio cancels a request's task group as soon as the client's side reports
  ``http.disconnect``; landing inside Hypercorn's send-and-close path, that cancel left the socket open after a
  ``Connection: close`` answer. `HTTPConnection` sends the response shielded (bounded by Quart's response
  timeout), so the close always runs.

`install` puts the protocol in place of Hypercorn's (``hypercorn.trio.tcp_server.ProtocolWrapper``, the one name
Hypercorn looks up per connection); the supervisor calls it before serving.
"""

from __future__ import annotations

import json
from http import HTTPStatus

import h11
import hypercorn.trio.tcp_server
import trio
from hypercorn.events import Closed
from hypercorn.protocol import ProtocolWrapper
from hypercorn.protocol.h11 import H11Protocol
from quart_trio.asgi import TrioASGIHTTPConnection

from spinf.errors import ApiError
from spinf.protocol.ids import new_request_id

PROTOCOL_CODE = "invalid_http"
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
    """Hypercorn's HTTP/1.1 protocol with the upgrades to HTTP/2 taken out and ambiguous framing refused."""

    async def _check_protocol(self, event: h11.Request) -> None:
        if event.method == b"PRI" and event.http_version == b"2.0":
            raise Refusal(505, _REASONS[505])
        names = {name for name, _ in event.headers}  # h11 lower-cases header names
        if b"content-length" in names and b"transfer-encoding" in names:
            raise Refusal(400, "a request may not carry both Content-Length and Transfer-Encoding (RFC 9112 §6.3)")

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


class Http11Only(ProtocolWrapper):
    """Every connection is `Http11Protocol`, whatever ALPN said: there is no switch to HTTP/2."""

    def __init__(self, app, config, context, task_group, state, ssl, client, server, send, alpn_protocol=None):
        self.protocol = Http11Protocol(app, config, context, task_group, state, ssl, client, server, send)

    async def handle(self, event) -> None:
        try:
            await self.protocol.handle(event)
        except Refusal as refusal:
            await self.protocol.refuse(refusal)


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
