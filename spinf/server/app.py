"""The HTTP edge: a Quart-Trio app with the routes of api spec §1, JSON in and out, errors in the envelope.

It never imports torch. The scoring POSTs pass `spinf.server.gate.Gate` first (body, token, readiness and an
admission slot of `spinf.server.admission.Admission`, refusals answered there cheaply and paced); an admitted call
reaches its route
here and goes to the packer actor as `ScoreWork` over a channel. Every response carries ``X-Request-Id``; every
error, 404 and 405 included, is the envelope of §2.5. Once the server is stopping every answer carries
``Connection: close``, so no client sends another request on a connection about to close.

``POST /v1/decisions`` (the OpenAI Decisions API) is a score call underneath: `spinf.decisions` writes its body
as a score body for the packer and turns the score response into the SDK's ``Decision``.

``stream: true`` on ``/v1/chat/completions`` is answered as server-sent events the OpenAI SDK reads: one chunk (the
whole response) then ``data: [DONE]`` (docs/scoring-api.md). Probes are not access-logged unless ``log_probes``.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable

import attrs
import trio
from quart import Response, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound

from spinf.decisions import DEFAULT_STYLE, plan_decisions
from spinf.errors import ApiError
from spinf.packs.catalog import Catalog, Refused
from spinf.packs.entries import listing, pack_file
from spinf.protocol.ids import new_request_id
from spinf.server.admission import Admission, Slot
from spinf.server.drain_marker import is_draining, set_draining
from spinf.server.gate import ADMITTED, PROBES, Gate, Sites, caller, check_ready, log_access, must_close, shutting_down
from spinf.server.http11 import PROTOCOL_CODE, HTTPConnection
from spinf.server.lifecycle import InFlight, Lifecycle
from spinf.server.messages import PackReload, ScoreWork
from spinf.server.metrics import Metrics
from spinf.server.models_entry import ModelsEntry
from spinf.settings import ServerSettings

log = logging.getLogger(__name__)

SERVED = {"GET", "POST", "DELETE"}
# Routes whose last part is a name that may hold a /: a trailing slash there belongs to the name, not redirected; the
# name is looked up as sent (and refused with the route's own 404). The pack route also takes an empty name.
_NAMED_ROUTES = ("/v1/packs/", "/v1/models/")


@attrs.define
class WebServices:
    """What the app needs from the supervisor: it reads the lifecycle and the ``[server]`` settings, counts its calls
    in flight, and sends admitted calls to the packer (the supervisor closes that channel once the HTTP server has
    closed)."""

    lifecycle: Lifecycle
    packer: trio.MemorySendChannel[ScoreWork]
    admission: Admission
    models_entry: ModelsEntry  # the one /v1/models entry for the lifecycle now, and OpenAI's beside it
    in_flight: InFlight = attrs.field(factory=InFlight)
    server: ServerSettings = attrs.Factory(ServerSettings)  # the tokens, the body's limits, debug, log_probes
    metrics: Metrics | None = None
    openapi: Callable[[], dict] = dict
    packs: Callable[[], Catalog | None] = lambda: None  # the pack syncer's snapshot now (None: packs off)
    pack_reloads: trio.MemorySendChannel[PackReload] | None = None  # to the pack syncer
    prompt_style: str = DEFAULT_STYLE.name  # the served model's manifest's, for /v1/decisions (docs/decisions.md)
    sites: Sites = attrs.field(factory=Sites)  # the Host and Origin a request may carry (the gate, every route)


class SpinfApp(QuartTrio):
    """The Quart-Trio app, with responses that always finish (`spinf.server.http11.HTTPConnection`)."""

    asgi_http_class = HTTPConnection


def json_response(body: dict, status: int = 200, headers: dict | None = None) -> Response:
    """JSON that never holds NaN or infinities (a non-finite number is a server bug: 500 ``engine_error``)."""
    text = _json_text(body)
    if text is None:
        return _non_finite()
    return Response(text, status=status, headers=headers or {}, content_type="application/json")


def _json_text(body: dict) -> str | None:
    try:
        return json.dumps(body, allow_nan=False, ensure_ascii=False)
    except ValueError:
        log.exception("a response held a non-finite number")
        return None


def _non_finite() -> Response:
    return json_response(_envelope(ApiError(500, "engine_error", None, "the engine produced an invalid number")), 500)


def _envelope(exc: ApiError, trusted: bool = False) -> dict:
    return exc.envelope(getattr(g, "request_id", ""), trusted=trusted)


def error_response(exc: ApiError) -> Response:
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else {}
    return json_response(_envelope(exc, getattr(g, "trusted", False)), exc.status, headers)


def create_app(services: WebServices) -> QuartTrio:
    app = SpinfApp(__name__, static_folder=None)  # no default /static route: unknown paths are 404s
    # no route reads a body (the gate reads the scoring ones): this only bounds what Quart buffers of one unread
    app.config["MAX_CONTENT_LENGTH"] = services.server.max_body_bytes
    app.url_map.strict_slashes = False
    app.asgi_app = Gate(app.asgi_app, services)  # the scoring POSTs' first checks, in raw ASGI (spinf.server.gate)

    @app.before_request
    async def _start() -> Response | None:
        admitted = request.scope.get(ADMITTED)
        g.request_id = admitted.request_id if admitted else new_request_id()
        g.started = admitted.started if admitted else time.perf_counter()
        g.trusted = admitted.trusted if admitted else False
        g.body_read = admitted is not None
        if request.method not in SERVED:
            return _method_not_allowed()
        named = request.path.startswith(_NAMED_ROUTES) and request.path != "/v1/models/"  # that one is the list's
        if request.path != "/" and request.path.endswith("/") and not named:
            return Response("", status=307, headers={"Location": request.path.rstrip("/")})
        return None

    @app.after_request
    async def _finish(response: Response) -> Response:
        response.headers["X-Request-Id"] = g.request_id
        has_body = bool(request.content_length) or "Transfer-Encoding" in request.headers
        if must_close(services.lifecycle, has_body=has_body, body_read=g.body_read):
            response.headers["Connection"] = "close"
        route = _template(request.url_rule.rule) if request.url_rule is not None else "unmatched"
        if services.metrics is not None:
            services.metrics.request(route, response.status_code)
        if route not in PROBES or services.server.log_probes:
            log_access(g.request_id, request.method, route, response.status_code, g.started, g.get("summary", ""))
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
        status = exc.code or 500
        code = PROTOCOL_CODE if status < 500 else "engine_error"  # any other refusal of the HTTP layer itself
        return error_response(ApiError(status, code, None, exc.description or "the request was refused"))

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


def _authorise(services: WebServices, *, trusted_only: bool = False) -> None:
    server = services.server
    authorised, trusted = caller(server.token, server.trusted_token, request.headers.get("Authorization"))
    g.trusted = trusted
    if not authorised:
        raise ApiError(401, "invalid_token", None, "a valid bearer token is required")
    if trusted_only and not trusted:
        raise ApiError(401, "invalid_token", None, "this route is for trusted callers (the --trusted-token)")


def _register_probes(app: QuartTrio, services: WebServices) -> None:
    lifecycle = services.lifecycle

    @app.get("/healthz", provide_automatic_options=False)
    async def healthz() -> Response:
        return json_response({"ok": True})

    @app.get("/readyz", provide_automatic_options=False)
    async def readyz() -> Response:
        if lifecycle.error is not None:
            return json_response({"ready": False, "error": lifecycle.error}, 503)
        if not lifecycle.is_warm:
            return json_response({"ready": False}, 503)
        if lifecycle.degraded is not None:
            return json_response({"ready": False, "degraded": lifecycle.degraded}, 503)
        if is_draining():
            return json_response({"ready": False, "draining": True}, 503)
        if lifecycle.is_stopping:  # ours, beyond §3.2: out of the balancer's rotation at once
            return json_response({"ready": False, "stopping": True}, 503)
        return json_response({"ready": True, "boot": lifecycle.boot.as_dict()})

    @app.get("/livez", provide_automatic_options=False)
    async def livez() -> Response:
        if lifecycle.is_warm and lifecycle.degraded is not None:
            return json_response({"live": False, "degraded": lifecycle.degraded}, 503)
        return json_response({"live": lifecycle.is_warm}, 200 if lifecycle.is_warm else 503)

    @app.get("/metrics", provide_automatic_options=False)
    async def metrics() -> Response:
        text = services.metrics.render(lifecycle, services.in_flight) if services.metrics is not None else ""
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
        check_ready(lifecycle)
        return json_response({"engine": dict(lifecycle.engine.info), "boot": lifecycle.boot.as_dict()})

    @app.get("/v1/models", provide_automatic_options=False)
    async def models() -> Response:
        """§7's ``models`` for spinf-client, and OpenAI's list shape for the openai SDK, of the same model."""
        _authorise(services)
        entry = services.models_entry
        return json_response({"models": [entry(lifecycle)], "object": "list", "data": [entry.openai()]})

    @app.get("/v1/models/<path:id>", provide_automatic_options=False)  # ids hold a / (the SDK sends it as %2F)
    async def model(id: str) -> Response:  # noqa: A002 - the route's parameter is named as in the spec
        _authorise(services)
        entry = services.models_entry
        if not entry.answers_to(id):
            raise ApiError(404, "model_not_served", "id", f"model {id!r} is not served here; see GET /v1/models")
        return json_response(entry.openai())

    @app.get("/v1/packs", provide_automatic_options=False)
    async def packs() -> Response:
        _authorise(services)
        return json_response(listing(services.packs()))

    @app.get("/v1/packs/<path:id>", provide_automatic_options=False)
    @app.get("/v1/packs/", provide_automatic_options=False)
    async def pack(id: str = "") -> Response:  # noqa: A002 - the route's parameter is named as in the spec
        _authorise(services)
        found = pack_file(services.packs(), id, request.args.get("version"))
        if isinstance(found, Refused):
            raise ApiError(404, found.code, found.at, found.message)
        return json_response(found)

    @app.post("/v0/packs/reload", provide_automatic_options=False)
    async def reload_packs() -> Response:
        """Re-read the pack sources now (trusted; SIGHUP does the same). It waits for a reload at work, and the
        requests waiting together share the next one. 200 with `messages.Reloaded`: ``applied``, ``reason``
        (``no_source``, ``catalog_errors``, ``official_lost``, or null), ``errors``, ``official_error``, then the
        ``sources``, ``packs`` (ids), ``versions`` and ``skipped`` of the catalog in use afterwards, and
        ``requests`` (how many requests that reload answered). ``?refresh=true`` resolves the GitHub tags again
        (``--packs-refresh`` does at every reload); ``false`` or absent uses the cached commits. Once the server is
        stopping: 503 as a scoring call gets it (``model_unavailable``, ``Retry-After``)."""
        _authorise(services, trusted_only=True)
        refresh = {None: False, "false": False, "true": True}.get(request.args.get("refresh"))
        if refresh is None:
            raise ApiError(400, "invalid_field", "refresh", "refresh must be true or false")
        if services.pack_reloads is None:
            raise shutting_down()
        reply_send, reply_recv = trio.open_memory_channel(1)  # one-shot reply
        try:
            with reply_recv, services.lifecycle.until_answer_due() as due:
                await services.pack_reloads.send(PackReload("POST /v0/packs/reload", reply_send, refresh))
                reloaded = await reply_recv.receive()
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.EndOfChannel):
            raise shutting_down() from None  # the syncer has gone: the server is shutting down
        if due.cancelled_caught:
            raise shutting_down()
        return json_response(reloaded.as_dict())


def _register_scoring(app: QuartTrio, services: WebServices) -> None:
    @app.post("/v1/score", provide_automatic_options=False)
    async def score() -> Response:
        return await _score(services, chat=False)

    @app.post("/v1/chat/completions", provide_automatic_options=False)
    async def chat() -> Response:
        return await _score(services, chat=True)

    @app.post("/v1/decisions", provide_automatic_options=False)
    async def decisions() -> Response:
        return await _decide(services)


async def _score(services: WebServices, *, chat: bool) -> Response:
    """An admitted call (`spinf.server.gate.Gate` ran the checks of api spec §2.6 up to admission): score it."""
    admitted = request.scope[ADMITTED]
    response = await _hand_to_packer(services, admitted.body, chat, admitted.slot)
    if chat:
        response["choices"] = []
    if services.metrics is not None:
        services.metrics.usage(response.get("usage", {}))
    g.summary = _summary(response)
    if chat and isinstance(admitted.body, dict) and admitted.body.get("stream") is True:
        return _event_stream(response)
    return json_response(response)


async def _decide(services: WebServices) -> Response:
    """An admitted decisions call: its score body (`spinf.decisions`) through the packer like any score call, the
    score response turned into the SDK's Decision, and a refusal put back on the decisions body's params."""
    admitted = request.scope[ADMITTED]
    call = plan_decisions(admitted.body, services.prompt_style)
    try:
        response = await _hand_to_packer(services, call.score_body(), False, admitted.slot, internals=False)
    except ApiError as exc:
        raise call.translate(exc) from None
    if services.metrics is not None:
        services.metrics.usage(response.get("usage", {}))
    g.summary = _summary(response)
    return json_response(call.answer(response))


async def _hand_to_packer(
    services: WebServices, body: object, chat: bool, slot: Slot, *, internals: bool | None = None
) -> dict:
    reply_send, reply_recv = trio.open_memory_channel(1)  # one-shot reply
    internals = g.trusted or services.server.debug if internals is None else internals
    work = ScoreWork(body, g.request_id, chat, g.trusted, internals, reply_send, slot, trio.current_time())
    try:
        with services.in_flight.track(), reply_recv, services.lifecycle.until_answer_due() as due:
            # never full: the inbox has a place per slot, and a slot is freed only after the packer took its call
            services.packer.send_nowait(work)
            slot.handed = True
            result = await reply_recv.receive()
    except BaseException:
        work.abandon()  # the client went away
        raise
    if due.cancelled_caught:  # the shutdown's deadline is near: a 503 now rather than no answer at all
        work.abandon()
        raise shutting_down()
    return result.unwrap()


def _event_stream(response: dict) -> Response:
    """The response as the server-sent events of an OpenAI chat stream: one chunk, then ``[DONE]``."""
    chunk = _json_text(response)
    if chunk is None:
        return _non_finite()
    text = f"data: {chunk}\n\ndata: [DONE]\n\n"
    return Response(text, content_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _summary(response: dict) -> str:
    usage = response.get("usage", {})
    return (
        f" inputs={usage.get('inputs', 0)} questions={usage.get('scoring', {}).get('prompts', 0)}"
        f" tokens={usage.get('processed_tokens', 0)}"
    )
