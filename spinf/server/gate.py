"""The scoring routes' front door, in raw ASGI before Quart: the first four checks of api spec §2.6.

``POST /v1/score``, ``POST /v1/chat/completions`` and ``POST /v1/decisions`` are where floods land, so their refusals
must cost almost nothing: `Gate` reads the body (413 ``body_too_large`` as soon as it is over ``max_body_bytes``, 408
``body_timeout`` after ``body_timeout_s``), takes an admission slot or waits its paced turn (`admission`, which
shares the slots by the peer's address), then checks, in the spec's order, the JSON (400 ``invalid_json``), the token
(401), readiness (503) and the slot (429), and answers any refusal itself, without building a Quart request. A body
still arriving when the shutdown begins is not waited for: it is answered 503 at once, so it cannot hold the shutdown
up (a half-sent body would otherwise keep its connection open until the deadline). Only an admitted call goes on to the
Quart app, with its body, slot and caller in the ASGI scope (`Admitted`); the route takes the slot from there.

Before any of that, and on every route, `Sites` checks where a request comes from (docs/deployment.md "Security
defaults"): a ``Host`` the server does not answer to (403 ``forbidden_host``; on a loopback-bound server only
loopback names unless ``allowed_hosts`` says more, so a DNS-rebound page cannot read it; the probes are exempt, as
health checkers send the pod's address), an ``Origin`` not in ``allowed_origins`` (403 ``forbidden_origin``: browsers
send one on every cross-site POST; curl, spinf-client and the openai SDK send none), and a body sent with an
``Origin`` that is not declared JSON (415 ``unsupported_content_type``: a form or ``text/plain`` POST is what a page
can send without asking first). These refusals come before the body is read; the spec has no code for them (its
§2.5 names 403 codes only as the hosted API's, for other causes), so they are ours.

It also owns what every answer shares, here and in `app`: the caller's rights (§2.3), the readiness errors,
the access-log line (no content, probes only with ``log_probes``) and when a connection is closed after its answer.
An admitted call whose client goes away before its answer begins (quart-trio cancels its route, and the packer drops
its call) gets an access-log line too, with status 499 as nginx logs it, and counts in
``spinf_requests_abandoned_total``; nothing is sent.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import time
from typing import Any

import attrs
import trio

from spinf.errors import ApiError
from spinf.protocol.ids import new_request_id
from spinf.protocol.request import decode_json_body
from spinf.server.admission import Slot
from spinf.server.lifecycle import Lifecycle, Phase

access_log = logging.getLogger("spinf.access")
RETRY_WARMING, RETRY_UNAVAILABLE, RETRY_BUSY, RETRY_STOPPING = 10, 60, 2, 10
SCORING_ROUTES = ("/v1/score", "/v1/chat/completions", "/v1/decisions")
PROBES = frozenset({"/healthz", "/readyz", "/livez", "/metrics"})
ADMITTED = "spinf.admitted"  # the ASGI scope key of an admitted call
CLIENT_GONE = 499  # the access log's status of a call whose client went away before its answer (nginx's)
UNROUTED = "unrouted"  # the metrics route of a request refused before routing (a path label per path is unbounded)


@attrs.frozen
class Sites:
    """Which ``Host`` and ``Origin`` a request may carry. ``hosts``: the names (no port, lower case) a Host may name
    beside the loopback ones, None for any Host; ``origins``: the origins allowed (``scheme://host[:port]``, lower
    case), ``any_origin`` for ``*``. The default answers any Host and refuses every Origin."""

    hosts: frozenset[str] | None = None
    origins: frozenset[str] = frozenset()
    any_origin: bool = False

    @classmethod
    def build(cls, allowed_hosts, allowed_origins, *, loopback: bool) -> Sites:
        """The settings' lists (``*``: any); a server bound to loopback addresses only answers loopback Hosts
        unless ``allowed_hosts`` names more, one bound elsewhere any Host unless ``allowed_hosts`` is given."""
        hosts = {host_name(entry) for entry in allowed_hosts}
        origins = {origin_name(entry) for entry in allowed_origins}
        any_host = "*" in hosts or (not loopback and not hosts)
        return cls(None if any_host else frozenset(hosts), frozenset(origins - {"*"}), "*" in origins)

    def refusal(self, scope) -> ApiError | None:
        """403 for a Host or Origin not allowed, 415 for a body with an Origin that is not JSON; None: it may pass.
        Every Host and Origin header counts (a request may not slip one past the check in a second copy)."""
        headers = scope["headers"]
        if self.hosts is not None and scope["path"] not in PROBES:
            for host in (value.decode("latin-1") for name, value in headers if name == b"host"):
                name = host_name(host)
                if name not in self.hosts and not is_loopback_name(name):
                    return ApiError(
                        403,
                        "forbidden_host",
                        None,
                        f"this server does not answer to Host {host[:100]!r} (allowed_hosts)",
                    )
        origins = [value.decode("latin-1") for name, value in headers if name == b"origin"]
        for origin in origins:
            if not self.any_origin and origin_name(origin) not in self.origins:
                return ApiError(
                    403,
                    "forbidden_origin",
                    None,
                    f"requests from Origin {origin[:100]!r} are not allowed (allowed_origins)",
                )
        if origins and _has_body(headers) and not _declares_json(headers):
            return ApiError(
                415,
                "unsupported_content_type",
                None,
                "a request with an Origin header must send its body as JSON (Content-Type: application/json)",
            )
        return None


def origin_name(origin: str) -> str:
    """An ``Origin`` value or an ``allowed_origins`` entry as they are compared: lower case, no final slash."""
    return origin.strip().lower().rstrip("/")


def _has_body(headers) -> bool:
    """Whether the request's head announces a body (chunked, or a Content-Length above 0)."""
    return any(
        name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"", b"0"))
        for name, value in headers
    )


def host_name(host: str) -> str:
    """The name of a ``Host`` value, lower case, without its port, brackets or a final dot (``[::1]:8000`` ->
    ``::1``)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    name, colon, port = host.rpartition(":")
    if colon and ":" not in name and (port.isdigit() or not port):
        host = name
    return host.rstrip(".")


def is_loopback_name(name: str) -> bool:
    """``localhost``, or an address of 127.0.0.0/8 or ::1."""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _declares_json(headers) -> bool:
    content_type = next((value for name, value in headers if name == b"content-type"), b"").decode("latin-1")
    media = content_type.split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


@attrs.frozen
class Admitted:
    """A scoring call that passed the gate: the Quart route scores it and hands ``slot`` to the packer."""

    request_id: str
    started: float
    body: object
    trusted: bool
    slot: Slot


def caller(token: str, trusted_token: str, header: str | None) -> tuple[bool, bool]:
    """(authorised, trusted) for an ``Authorization`` header (api spec §2.3), compared in constant time."""
    if not token and not trusted_token:
        return True, False
    scheme, _, rest = (header or "").partition(" ")
    given = rest.strip().encode() if scheme.lower() == "bearer" else b""
    is_trusted = bool(trusted_token) and bool(given) and hmac.compare_digest(given, trusted_token.encode())
    is_token = bool(token) and bool(given) and hmac.compare_digest(given, token.encode())
    if is_trusted:
        return True, True
    return is_token, is_token and not trusted_token


def check_ready(lifecycle: Lifecycle) -> None:
    if lifecycle.error is not None:
        raise ApiError(503, "model_unavailable", None, "the model failed to load", retry_after=RETRY_UNAVAILABLE)
    if not lifecycle.is_warm:
        raise ApiError(503, "warming_up", None, "the model is loading or warming up", retry_after=RETRY_WARMING)


def shutting_down() -> ApiError:
    return ApiError(503, "model_unavailable", None, "the server is shutting down", retry_after=RETRY_STOPPING)


def check_admitted(lifecycle: Lifecycle, slot: Slot | None) -> None:
    """Step 3's last part and step 4: readiness, shutting down, a free slot."""
    check_ready(lifecycle)
    if lifecycle.is_stopping:
        raise shutting_down()
    if slot is None:
        raise ApiError(429, "concurrency_limit", None, "too many calls in flight", retry_after=RETRY_BUSY)


def body_too_large(limit: int) -> ApiError:
    size = f"{limit / 2**20:.0f} MiB" if limit >= 2**20 else f"{limit:,} bytes"
    return ApiError(413, "body_too_large", None, f"the body is larger than {size} (max_body_bytes)")


def body_timeout(limit: float) -> ApiError:
    return ApiError(408, "body_timeout", None, f"the body did not arrive within {limit:g} s (body_timeout_s)")


def must_close(lifecycle: Lifecycle, *, has_body: bool, body_read: bool) -> bool:
    """Close the connection after this answer? When the body was not read (the unread bytes would be taken for
    the next request on it), and always once the server is stopping (no connection may linger)."""
    return (has_body and not body_read) or lifecycle.is_stopping


def caller_address(scope) -> str | None:
    """Who a call is counted against for its admission share (`spinf.server.admission`): the peer's address, port left
    out. Not the bearer token: an open server ignores the header (api spec §2.3), so a flood could name a new
    caller per request, and a closed one has at most two tokens, which would make every client one caller."""
    client = scope.get("client")
    return client[0] if client else None


def log_access(request_id: str, method: str, route: str, status: int, started: float, summary: str = "") -> None:
    access_log.info(
        "%s %s %s %d %.1fms%s", request_id, method, route, status, (time.perf_counter() - started) * 1000, summary
    )


class _BodyGone(Exception):
    """The client went away while sending its body: there is nobody to answer."""


@attrs.define
class Gate:
    """ASGI middleware (``app.asgi_app = Gate(app.asgi_app, services)``): scoring POSTs pass here first."""

    app: Any
    services: Any  # spinf.server.app.WebServices (which imports this module)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and (refusal := self.services.sites.refusal(scope)) is not None:
            headers = dict(scope["headers"])
            has_body = b"content-length" in headers or b"transfer-encoding" in headers  # not read: close after
            await self._refuse(
                send, scope, refusal, new_request_id(), time.perf_counter(), trusted=False, close=has_body
            )
            return
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in SCORING_ROUTES:
            await self.app(scope, receive, send)
            return
        services, lifecycle = self.services, self.services.lifecycle
        request_id, started = new_request_id(), time.perf_counter()
        headers = dict(scope["headers"])  # ASGI header names are lower case
        has_body = b"content-length" in headers or b"transfer-encoding" in headers
        # who calls is known from the headers: a trusted caller gets ``rejected`` on the body's 413 and 400 too,
        # although the token is enforced only after them (api spec §2.4, §2.6)
        # the first one, as the routes read it; the connection layer refuses a request with two (spinf.server.http11)
        authorisation = next((v for n, v in scope["headers"] if n == b"authorization"), b"").decode("latin-1")
        authorised, trusted = caller(services.server.token, services.server.trusted_token, authorisation)
        body_read, slot = False, None
        try:
            with lifecycle.until_stopping() as stopping:
                raw = await self._read_body(receive, headers)
            if stopping.cancelled_caught:
                raise shutting_down()
            body_read = True
            ready = lifecycle.phase is Phase.READY
            slot = await services.admission.admit(len(raw), caller=caller_address(scope), can_admit=ready)
            body = decode_json_body(raw)
            if not authorised:
                raise ApiError(401, "invalid_token", None, "a valid bearer token is required")
            check_admitted(lifecycle, slot)
        except _BodyGone:
            return
        except ApiError as exc:
            if slot is not None:
                slot.release()
            close = must_close(lifecycle, has_body=has_body, body_read=body_read)
            await self._refuse(send, scope, exc, request_id, started, trusted=trusted, close=close)
            return
        scope = {**scope, ADMITTED: Admitted(request_id, started, body, trusted, slot)}
        exchange = _Exchange(receive, send)
        try:
            await self.app(scope, exchange.receive, exchange.send)
        finally:
            if not slot.handed:  # the call never reached the packer (its client left before the route ran)
                slot.release()
        if exchange.abandoned:  # quart-trio cancelled the route: its call is dropped (spinf.server.messages.ScoreWork)
            if self.services.metrics is not None:
                self.services.metrics.abandoned(scope["path"])
            log_access(request_id, scope["method"], scope["path"], CLIENT_GONE, started)

    async def _read_body(self, receive, headers: dict) -> bytes:
        limit, timeout_s = self.services.server.max_body_bytes, self.services.server.body_timeout_s
        declared = headers.get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > limit:
            raise body_too_large(limit)
        chunks, size = [], 0
        with trio.move_on_after(timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _BodyGone
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise body_too_large(limit)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
        raise body_timeout(timeout_s)

    async def _refuse(
        self, send, scope, exc: ApiError, request_id: str, started: float, *, trusted: bool, close: bool
    ) -> None:
        body = json.dumps(exc.envelope(request_id, trusted=trusted), ensure_ascii=False).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        headers.append((b"x-request-id", request_id.encode()))
        if exc.retry_after is not None:
            headers.append((b"retry-after", str(exc.retry_after).encode()))
        if close:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": exc.status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
        route = scope["path"] if scope["path"] in SCORING_ROUTES or scope["path"] in PROBES else UNROUTED
        if self.services.metrics is not None:
            self.services.metrics.request(route, exc.status)
        log_access(request_id, scope["method"], route, exc.status, started)


@attrs.define
class _Exchange:
    """An admitted call's ASGI ``receive`` and ``send`` as the app sees them: the body, read by the gate, replayed
    whole; and whether the client went away before its answer began (``abandoned``)."""

    _receive: Any
    _send: Any
    _delivered: bool = False
    _gone: bool = False
    _answered: bool = False

    async def receive(self) -> dict:
        if not self._delivered:
            self._delivered = True
            return {"type": "http.request", "body": b"", "more_body": False}
        message = await self._receive()
        self._gone = self._gone or message["type"] == "http.disconnect"
        return message

    async def send(self, message: dict) -> None:
        self._answered = self._answered or message["type"] == "http.response.start"
        await self._send(message)

    @property
    def abandoned(self) -> bool:
        return self._gone and not self._answered
