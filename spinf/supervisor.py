"""The only wiring: opens the channels, starts the actors in dependency order and runs Hypercorn at the edge.

Nested nurseries encode the lifetimes: the executor thread outlives every actor that sends it work; the actors
outlive the HTTP server. Shutdown runs the other way: the drain controller lets the calls in flight finish, the
HTTP server closes, the actors are cancelled, and the executor's thread ends after its current job.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import hypercorn.trio
import trio
from hypercorn.config import Config

from spinf import http11
from spinf.actors.drain import DrainController
from spinf.actors.executor import Executor
from spinf.actors.loader import Loader
from spinf.actors.packer import Packer
from spinf.actors.warmup import Warmup
from spinf.admission import Admission
from spinf.metrics import Metrics
from spinf.serving import ServerState
from spinf.web import WebServices, create_app

log = logging.getLogger(__name__)


@attrs.frozen
class ServerOptions:
    """The server settings the wiring needs (api spec §9.2, section ``[server]``, plus the warm-up mode)."""

    host: str = "0.0.0.0"
    port: int = 8000
    token: str = ""
    trusted_token: str = ""
    queue: int = 4
    max_body_bytes: int = 2_097_152
    keepalive_s: float = 30.0
    body_timeout_s: float = 60.0
    backlog: int = 2048
    reject_rate: float = 200.0
    shutdown_s: float = 30.0
    debug: bool = False
    log_probes: bool = False
    warmup: str = "full"
    exit_on_leak: bool = True  # SPINF_EXIT_ON_LEAK (api spec §3.2): a degraded process exits with status 70

    @classmethod
    def from_settings(cls, settings) -> ServerOptions:
        """The ``[server]`` settings this class names, the warm-up mode and ``SPINF_EXIT_ON_LEAK``."""
        server = attrs.asdict(settings.server)
        given = {name: server[name] for name in attrs.fields_dict(cls) if name in server}
        leak = os.environ.get("SPINF_EXIT_ON_LEAK", "1").strip().lower() not in {"0", "false", "no", "off"}
        return cls(**given, warmup=settings.engine.warmup, exit_on_leak=leak)


def hypercorn_config(options: ServerOptions) -> Config:
    config = Config()
    config.bind = [f"{options.host}:{options.port}"]
    config.keep_alive_timeout = options.keepalive_s
    config.backlog = options.backlog
    config.graceful_timeout = options.shutdown_s  # narrowed to what the drain left of the one deadline
    config.accesslog = None  # spinf.access logs one line per request, without content
    config.errorlog = logging.getLogger("hypercorn.error")  # through our handlers (plain or JSON lines)
    return config


def _queued(packer: Packer) -> int:
    stats = packer.statistics()
    return stats.compiling + stats.waiting


@attrs.frozen
class Running:
    """What a running set of actors offers the edge: the web services and the shutdown controls."""

    services: WebServices
    drain: DrainController
    shutdown: trio.Event


@contextlib.asynccontextmanager
async def running_actors(
    options: ServerOptions,
    load: Callable[[], Any],
    models_entry: Callable[[ServerState], dict],
    *,
    openapi: Callable[[], dict] = dict,
    executor_class: type = Executor,
    packer_class: type = Packer,
) -> AsyncIterator[Running]:
    """Start the executor, then the drain controller, loader, warm-up and packer; stop them in reverse on exit.

    ``executor_class`` and ``packer_class`` are the seams for tests: a fake executor that "runs" a pass in a known
    time under a mock clock, and a packer that compiles inline (worker threads run on the real clock).
    """
    state = ServerState(boot={"import_s": round(time.process_time(), 3)})
    metrics = Metrics()
    exec_send, exec_recv = trio.open_memory_channel(0)
    loaded_send, loaded_recv = trio.open_memory_channel(1)  # the loaded engine, handed over once
    # a place per admission slot (queue + 1): a slot is freed only after the packer took its call (spinf.admission)
    packer_send, packer_recv = trio.open_memory_channel(options.queue + 1)
    shutdown = trio.Event()
    admission = Admission(options.queue + 1, options.reject_rate)
    drain = DrainController(
        state, shutdown, options.shutdown_s, exit_on_leak=options.exit_on_leak, on_stop=admission.release_all
    )
    packer = packer_class(packer_recv, exec_send, state, options.queue + 1, on_run=metrics.run)
    metrics.queued = functools.partial(_queued, packer)
    services = WebServices(
        state=state,
        packer=packer_send,
        admission=admission,
        token=options.token,
        trusted_token=options.trusted_token,
        max_body_bytes=options.max_body_bytes,
        body_timeout_s=options.body_timeout_s,
        debug=options.debug,
        log_probes=options.log_probes,
        models_entry=functools.partial(models_entry, state),
        metrics=metrics,
        openapi=openapi,
    )
    async with trio.open_nursery() as outer:
        await outer.start(executor_class(exec_recv).run)
        async with trio.open_nursery() as actors:
            await actors.start(drain.run)
            await actors.start(Loader(exec_send, loaded_send, state, load).run)
            await actors.start(Warmup(exec_send, loaded_recv, state, options.warmup).run)
            await actors.start(packer.run)
            yield Running(services, drain, shutdown)
            actors.cancel_scope.cancel()
        outer.cancel_scope.cancel()


async def serve(
    options: ServerOptions,
    load: Callable[[], Any],
    models_entry: Callable[[ServerState], dict],
    *,
    openapi: Callable[[], dict] = dict,
    task_status=trio.TASK_STATUS_IGNORED,
) -> int:
    """Run the server until a signal (or ``DrainController.stop``) shuts it down; ``task_status`` gets the binds.

    Returns the exit status: 0, or 70 when the engine was degraded (api spec §3.2).
    """
    http11.install()
    async with running_actors(options, load, models_entry, openapi=openapi) as running:
        app = create_app(running.services)
        config = hypercorn_config(options)

        async def shutdown_trigger() -> None:
            await running.shutdown.wait()
            # one deadline for the whole shutdown: Hypercorn closes the connections in what the drain left of it
            config.graceful_timeout = max(0.0, running.drain.deadline - trio.current_time())

        await hypercorn.trio.serve(app, config, shutdown_trigger=shutdown_trigger, task_status=task_status)
        log.info("the HTTP server has closed")
    return running.drain.exit_code


def models_entry_for(resolved, settings) -> Callable[[ServerState], dict]:
    """The one ``/v1/models`` entry (api spec §7): the model's own fields, its status, limits and features.

    Extraction, generation and media are not available in this build yet, so they are reported as off.
    """

    def entry(state: ServerState) -> dict:
        body = resolved.listing()
        body["id"] = settings.engine.served_model or body["id"]
        status = "error" if state.load_error else "available" if state.ready else "loading"
        body.update(status=status, capabilities=["score"], media=[])
        body["limits"] = settings.limits.as_dict()
        body["features"] = {"media": [], "extraction": False, "generation": False}
        # ours, beyond §7: a checkpoint outside the catalog carries no batch-invariance guarantee (§9.6, D2)
        body["batch_invariant"] = bool(state.engine.batch_invariant) if state.engine else resolved.batch_invariant
        return dict(sorted(body.items(), key=lambda item: _MODEL_KEYS.index(item[0])))

    return entry


_MODEL_KEYS = ["id", "name", "status", "base_model", "aliases", "family", "capabilities", "media", "limits"]
_MODEL_KEYS += ["features", "image", "batch_invariant"]


def run(settings) -> int:
    """``spinf-serve serve``: the server for the layered ``settings``, until SIGTERM or SIGINT."""
    from spinf import __version__
    from spinf.catalog import resolve_model
    from spinf.logs import configure
    from spinf.openapi import openapi_document

    configure(settings.server.log_format)
    resolved = resolve_model(settings.engine.model)
    options = ServerOptions.from_settings(settings)

    def load():
        from spinf.engine.engine import Engine  # torch is imported here, in the executor thread

        return Engine.from_settings(settings)

    document = openapi_document(__version__)
    return trio.run(
        functools.partial(serve, options, load, models_entry_for(resolved, settings), openapi=lambda: document)
    )
