"""The HTTP edge: a Quart-Trio app with the routes of api spec §1, JSON in and out, errors in the envelope.

It never imports torch: scoring calls go to the packer actor as `ScoreWork` over a channel, admitted through a
non-blocking semaphore of ``queue + 1`` slots held until the answer (api spec §2.6 step 4). Every response carries
``X-Request-Id``; every error, 404 and 405 included, is the envelope of §2.5.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import attrs
import trio
from quart import Response, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound, RequestEntityTooLarge

from spinf.errors import ApiError
from spinf.protocol.ids import new_request_id
from spinf.protocol.request import decode_json_body
from spinf.serving import ScoreWork, ServerState, set_draining

log = logging.getLogger(__name__)
access_log = logging.getLogger("spinf.access")

RETRY_WARMING, RETRY_UNAVAILABLE, RETRY_BUSY, RETRY_STOPPING = 10, 60, 2, 10
SERVED = {"GET", "POST", "DELETE"}


@attrs.define
class WebServices:
    """What the app needs from the supervisor."""

    state: ServerState
    packer: trio.MemorySendChannel[ScoreWork]
    admission: trio.Semaphore
    token: str = ""
    trusted_token: str = ""
    max_body_bytes: int = 2_097_152
    debug: bool = False
    models_entry: Callable[[], dict] = dict
    metrics: Any = None  # spinf.metrics.Metrics
    openapi: Callable[[], dict] = dict


def json_response(body: dict, status: int = 200, headers: dict | None = None) -> Response:
    """JSON that never holds NaN or infinities (a non-finite number is a server bug: 500 ``engine_error``)."""
    try:
        text = json.dumps(body, allow_nan=False, ensure_ascii=False)
    except ValueError:
        log.exception("a response held a non-finite number")
        return json_response(_envelope(ApiError(500, "engine_error", None, "the engine produced an invalid number")))
    return Response(text, status=status, headers=headers or {}, content_type="application/json")


def _envelope(exc: ApiError, trusted: bool = False) -> dict:
    return exc.envelope(getattr(g, "request_id", ""), trusted=trusted)


def error_response(exc: ApiError) -> Response:
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else {}
    return json_response(_envelope(exc, getattr(g, "trusted", False)), exc.status, headers)


def caller(services: WebServices, header: str | None) -> tuple[bool, bool]:
    """(authorised, trusted) for an ``Authorization`` header (api spec §2.3), compared in constant time."""
    token, trusted_token = services.token, services.trusted_token
    if not token and not trusted_token:
        return True, False
    scheme, _, rest = (header or "").partition(" ")
    given = rest.strip().encode() if scheme.lower() == "bearer" else b""
    is_trusted = bool(trusted_token) and bool(given) and hmac.compare_digest(given, trusted_token.encode())
    is_token = bool(token) and bool(given) and hmac.compare_digest(given, token.encode())
    if is_trusted:
        return True, True
    return is_token, is_token and not trusted_token


def create_app(services: WebServices) -> QuartTrio:
    app = QuartTrio(__name__, static_folder=None)  # no default /static route: unknown paths are 404s
    app.config["MAX_CONTENT_LENGTH"] = services.max_body_bytes
    app.url_map.strict_slashes = False

    @app.before_request
    async def _start() -> Response | None:
        g.request_id = new_request_id()
        g.started = time.perf_counter()
        g.trusted = False
        if request.method not in SERVED:
            return _method_not_allowed()
        if request.path != "/" and request.path.endswith("/") and not request.path.startswith("/v1/packs/"):
            return Response("", status=307, headers={"Location": request.path.rstrip("/")})
        return None

    @app.after_request
    async def _finish(response: Response) -> Response:
        response.headers["X-Request-Id"] = g.request_id
        if request.content_length and not getattr(g, "body_read", False):
            # answered before the body was read (413, 401, 404, 405): close the connection, or the unread body
            # would be taken for the next request on it
            response.headers["Connection"] = "close"
        route = _template(request.url_rule.rule) if request.url_rule is not None else "unmatched"
        if services.metrics is not None:
            services.metrics.request(route, response.status_code)
        access_log.info(
            "%s %s %s %d %.1fms%s",
            g.request_id,
            request.method,
            route,
            response.status_code,
            (time.perf_counter() - g.started) * 1000,
            getattr(g, "summary", ""),
        )
        return response

    @app.errorhandler(ApiError)
    async def _api_error(exc: ApiError) -> Response:
        return error_response(exc)

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException) -> Response:
        if isinstance(exc, NotFound):
            return error_response(ApiError(404, "not_found", None, f"no route {request.path}"))
        if isinstance(exc, MethodNotAllowed):
            return _method_not_allowed()
        if isinstance(exc, RequestEntityTooLarge):
            return error_response(_body_too_large(services.max_body_bytes))
        return error_response(ApiError(exc.code or 500, "engine_error", None, exc.description or "error"))

    @app.errorhandler(Exception)
    async def _crash(exc: Exception) -> Response:
        log.exception("unhandled error in %s", request.path)
        return error_response(ApiError(500, "engine_error", None, "the server failed to handle this request"))

    def _method_not_allowed() -> Response:
        allowed = sorted(m for m in _methods_for(app, request.path) if m in SERVED)
        exc = ApiError(405, "method_not_allowed", None, f"{request.method} is not served on {request.path}")
        if not allowed:
            exc = ApiError(404, "not_found", None, f"no route {request.path}")
            return error_response(exc)
        response = error_response(exc)
        response.headers["Allow"] = ", ".join(allowed)
        return response

    _register_probes(app, services)
    _register_scoring(app, services)
    return app


def _template(rule: str) -> str:
    """A route as the spec writes it: ``/v1/packs/<path:id>`` -> ``/v1/packs/{id}``."""
    return re.sub(r"<(?:[^<>:]+:)?([^<>]+)>", r"{\1}", rule)


def _methods_for(app: QuartTrio, path: str) -> set[str]:
    adapter = app.url_map.bind("")
    methods: set[str] = set()
    for method in ("GET", "POST", "DELETE"):
        try:
            adapter.match(path, method=method)
            methods.add(method)
        except HTTPException:
            continue
    return methods


def _body_too_large(limit: int) -> ApiError:
    return ApiError(413, "body_too_large", None, f"the body is larger than {limit / 2**20:.0f} MiB")


def _authorise(services: WebServices, *, trusted_only: bool = False) -> None:
    authorised, trusted = caller(services, request.headers.get("Authorization"))
    g.trusted = trusted
    if not authorised:
        raise ApiError(401, "invalid_token", None, "a valid bearer token is required")
    if trusted_only and not trusted:
        raise ApiError(401, "invalid_token", None, "this route is for trusted callers (the --trusted-token)")


def _check_ready(state: ServerState) -> None:
    if state.load_error is not None:
        raise ApiError(503, "model_unavailable", None, "the model failed to load", retry_after=RETRY_UNAVAILABLE)
    if not state.ready:
        raise ApiError(503, "warming_up", None, "the model is loading or warming up", retry_after=RETRY_WARMING)


def _register_probes(app: QuartTrio, services: WebServices) -> None:
    state = services.state

    @app.get("/healthz", provide_automatic_options=False)
    async def healthz() -> Response:
        return json_response({"ok": True})

    @app.get("/readyz", provide_automatic_options=False)
    async def readyz() -> Response:
        if state.load_error is not None:
            return json_response({"ready": False, "error": state.load_error}, 503)
        if not state.ready:
            return json_response({"ready": False}, 503)
        if state.draining:
            return json_response({"ready": False, "draining": True}, 503)
        return json_response({"ready": True, "boot": state.boot})

    @app.get("/livez", provide_automatic_options=False)
    async def livez() -> Response:
        return json_response({"live": state.ready}, 200 if state.ready else 503)

    @app.get("/metrics", provide_automatic_options=False)
    async def metrics() -> Response:
        text = services.metrics.render(state) if services.metrics is not None else ""
        return Response(text, content_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/openapi.json", provide_automatic_options=False)
    async def openapi() -> Response:
        return json_response(services.openapi())

    @app.route("/v0/drain", methods=["POST", "DELETE"], provide_automatic_options=False)
    async def drain() -> Response:
        _authorise(services, trusted_only=True)
        set_draining(request.method == "POST")
        return json_response({"draining": request.method == "POST"})

    @app.get("/v0/info", provide_automatic_options=False)
    async def info() -> Response:
        _authorise(services, trusted_only=True)
        _check_ready(state)
        return json_response({"engine": state.engine.info(), "boot": state.boot})

    @app.get("/v1/models", provide_automatic_options=False)
    async def models() -> Response:
        _authorise(services)
        return json_response({"models": [services.models_entry()]})

    @app.get("/v1/packs", provide_automatic_options=False)
    async def packs() -> Response:
        _authorise(services)
        return json_response({"packs": [], "sources": []})

    @app.get("/v1/packs/<path:id>", provide_automatic_options=False)
    @app.get("/v1/packs/", provide_automatic_options=False)
    async def pack(id: str = "") -> Response:  # noqa: A002 - the route's parameter is named as in the spec
        _authorise(services)
        raise ApiError(404, "unknown_pack", "id", f"no pack {id!r} is enabled; GET /v1/packs lists the packs")


def _register_scoring(app: QuartTrio, services: WebServices) -> None:
    @app.post("/v1/score", provide_automatic_options=False)
    async def score() -> Response:
        return await _score(services, chat=False)

    @app.post("/v1/chat/completions", provide_automatic_options=False)
    async def chat() -> Response:
        return await _score(services, chat=True)


async def _score(services: WebServices, *, chat: bool) -> Response:
    """The order of checks of api spec §2.6: body, authorisation, readiness, admission, then the engine."""
    state = services.state
    try:
        raw = await request.get_data(cache=False)
    except RequestEntityTooLarge as exc:
        raise _body_too_large(services.max_body_bytes) from exc
    g.body_read = True
    body = decode_json_body(raw)
    _authorise(services)
    _check_ready(state)
    if state.stopping:
        raise ApiError(503, "model_unavailable", None, "the server is shutting down", retry_after=RETRY_STOPPING)
    try:
        services.admission.acquire_nowait()
    except trio.WouldBlock:
        raise ApiError(429, "concurrency_limit", None, "too many calls in flight", retry_after=RETRY_BUSY) from None
    try:
        response = await _submit(services, body, chat)
    finally:
        services.admission.release()
    if chat:
        response["choices"] = []
    if services.metrics is not None:
        services.metrics.usage(response.get("usage", {}))
    g.summary = _summary(response)
    return json_response(response)


async def _submit(services: WebServices, body: object, chat: bool) -> dict:
    state = services.state
    reply_send, reply_recv = trio.open_memory_channel(1)  # one-shot reply
    internals = g.trusted or services.debug
    work = ScoreWork(body, g.request_id, chat, g.trusted, internals, reply_send, trio.current_time())
    state.in_flight += 1
    try:
        with reply_recv:
            services.packer.send_nowait(work)  # never full: admission bounds the calls in flight
            result = await reply_recv.receive()
    except BaseException:
        work.abandoned = True
        raise
    finally:
        state.in_flight -= 1
    return result.unwrap()


def _summary(response: dict) -> str:
    usage = response.get("usage", {})
    return (
        f" inputs={usage.get('inputs', 0)} questions={usage.get('scoring', {}).get('prompts', 0)}"
        f" tokens={usage.get('processed_tokens', 0)}"
    )
