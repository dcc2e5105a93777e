"""The only wiring: opens the channels, starts the actors in dependency order and runs Hypercorn at the edge.

Nested nurseries encode the lifetimes: the executor thread outlives every actor that sends it work; the actors
outlive the HTTP server. Shutdown runs the other way, under **one deadline** on one cancel scope (the drain
controller's ``deadline``, which holds the actors and the HTTP server): the drain controller lets the calls in
flight finish, the HTTP server closes (`http11.serve`), the web layer's channel to the packer closes, the boot
actors are cancelled if still at work, and every actor ends by closing its own clone of the executor's inbox, which
ends the executor's thread after its current job. When the deadline passes first (the calls still waiting were
answered 503 a moment before it), the scope cancels all that is left at once; the executor's job in flight is
waited for until the same deadline and its thread then abandoned to it, so the process exits at the deadline
rather than after the pass (or the load) under way.

The pack catalog is built before any of this (`spinf.server.actors.pack_syncer.start_packs`, packs spec §4.5): a
catalog error ends the start with exit status 1 before the model loads. The pack syncer holds it from then on, beside
the packer, which reads its snapshot per call; it is cancelled once the HTTP server has closed, since no reload can be
asked for any more. What the wiring reads of the settings is `ServerOptions`, built in one place; the settings'
defaults are the settings table's (`spinf.settings`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable

import attrs
import trio
from hypercorn.config import Config, Sockets
from hypercorn.utils import wrap_app

from spinf.catalog import ResolvedModel
from spinf.decisions import DEFAULT_STYLE
from spinf.errors import ConfigError
from spinf.server import http11, start_signals
from spinf.server.actors.drain import DrainController
from spinf.server.actors.executor import Executor
from spinf.server.actors.loader import Loader
from spinf.server.actors.pack_syncer import PackCatalogs, PackSyncer, pack_sources, start_packs
from spinf.server.actors.packer import Packer
from spinf.server.actors.warmup import Warmup
from spinf.server.admission import Admission
from spinf.server.app import WebServices, create_app
from spinf.server.gate import Sites, is_loopback_name
from spinf.server.lifecycle import EngineStatus, InFlight, Lifecycle
from spinf.server.messages import PackReload
from spinf.server.metrics import Metrics
from spinf.server.models_entry import ModelsEntry, models_entry_for
from spinf.server.served import ServedEngine
from spinf.settings import ServerSettings, Settings

log = logging.getLogger(__name__)


@attrs.frozen
class ServerOptions:
    """What the wiring reads, built in one place (`from_settings`): the ``[server]`` settings, the warm-up mode, and
    three facts of the start that no setting holds."""

    server: ServerSettings
    warmup: str
    exit_on_leak: bool = True  # SPINF_EXIT_ON_LEAK (api spec §3.2): a degraded process exits with status 70
    prompt_style: str = DEFAULT_STYLE.name  # the served model's manifest's (POST /v1/decisions' wording)
    bound_to_loopback: bool = False  # every listening address is a loopback one (`serve` reads it off the sockets)

    @classmethod
    def from_settings(cls, settings: Settings, prompt_style: str = DEFAULT_STYLE.name) -> ServerOptions:
        """The options of the layered ``settings``, with ``SPINF_EXIT_ON_LEAK`` and the manifest's prompt style."""
        leak = os.environ.get("SPINF_EXIT_ON_LEAK", "1").strip().lower() not in {"0", "false", "no", "off"}
        return cls(settings.server, settings.engine.warmup, exit_on_leak=leak, prompt_style=prompt_style)


def hypercorn_config(server: ServerSettings) -> Config:
    config = Config()
    config.bind = [f"{server.host}:{server.port}"]
    config.keep_alive_timeout = server.keepalive_s
    config.backlog = server.backlog
    config.accesslog = None  # spinf.access logs one line per request, without content
    config.errorlog = logging.getLogger("hypercorn.error")  # through our handlers (plain or JSON lines)
    return config


def bind_sockets(server: ServerSettings) -> Sockets:
    """The listening address bound (not yet listening: a connection before the server runs is refused, not left
    waiting), so that an address in use is one line before the model loads rather than a trace after it.

    Raises ``ConfigError`` naming the address and the reason (in use, not on this machine, a privileged port)."""
    try:
        return hypercorn_config(server).create_sockets()
    except OSError as error:  # socket.gaierror too: a host name that does not resolve
        raise _cannot_listen(server, error) from error


def start_listening(server: ServerSettings, sockets: Sockets) -> None:
    """Listen on the bound ``sockets``; ``ConfigError`` as `bind_sockets` when another process listens there
    already (two sockets that allow address reuse may both bind one port; only one may listen)."""
    try:
        for sock in sockets.insecure_sockets:
            sock.listen(server.backlog)
    except OSError as error:
        raise _cannot_listen(server, error) from error


def _cannot_listen(server: ServerSettings, error: OSError) -> ConfigError:
    address = f"[{server.host}]:{server.port}" if ":" in server.host else f"{server.host}:{server.port}"
    reason = _BIND_REASONS.get(error.errno) or (error.strerror or str(error)).lower()
    return ConfigError(f"cannot listen on {address}: {reason}")


_BIND_REASONS = {
    errno.EADDRINUSE: "address already in use (another server runs there; choose another --port)",
    errno.EADDRNOTAVAIL: "the address is not one of this machine's (--host)",
    errno.EACCES: "permission denied (ports below 1024 need privileges)",
    socket.EAI_NONAME: "unknown host name (--host)",
}


def _queued(packer: Packer) -> int:
    return packer.statistics().waiting


def _warmed_up(warmup: Warmup) -> tuple[int, int]:
    stats = warmup.statistics()
    return stats.shapes_done, stats.passes


def _engine_thread(executor: Executor) -> tuple[int, float]:
    stats = executor.statistics()
    return stats.jobs, stats.busy_s


def _packs_in_use(syncer: PackSyncer) -> tuple[int, int, int, int]:
    catalog, stats = syncer.snapshot(), syncer.statistics()
    enabled = (catalog.enabled_count, len(catalog.packs)) if catalog is not None else (0, 0)
    return (*enabled, stats.applied, stats.refused)


@attrs.frozen
class Running:
    """What a running set of actors offers the edge: the web services and the shutdown controls."""

    services: WebServices
    drain: DrainController
    shutdown: trio.Event


@contextlib.asynccontextmanager
async def running_actors(
    options: ServerOptions,
    load: Callable[[], ServedEngine],
    models_entry: ModelsEntry,
    *,
    openapi: Callable[[], dict] = dict,
    executor_class: type = Executor,
    packer_class: type = Packer,
    packs: PackCatalogs | None = None,
) -> AsyncIterator[Running]:
    """Start the executor, then the drain controller, loader, warm-up and packer; the body of the ``async with``
    (the HTTP server) runs under the one shutdown deadline with them. Leaving it shuts the actors down in reverse.

    ``executor_class`` and ``packer_class`` are the seams for tests: a fake executor that "runs" a job in a known
    time under a mock clock, and a packer that, say, starts late. The packer is built as ``packer_class(inbox,
    executor, warmed, status, on_run=..., packs=...)``: its own executor clone, the warm engine once on
    ``warmed``, an `EngineStatus` whose one method is ``degrade``, and the pack syncer's snapshot reader.

    ``packs``: the catalog built at start and how to build it again (None: packs off). The pack syncer runs beside
    the packer and is cancelled once the HTTP server has closed.
    """
    packs, server = packs or PackCatalogs(), options.server
    lifecycle = Lifecycle(import_s=round(time.process_time(), 3))
    in_flight = InFlight()
    metrics = Metrics()
    exec_send, exec_recv = trio.open_memory_channel(0)
    loaded_send, loaded_recv = trio.open_memory_channel(1)  # the loaded engine, handed over once
    warmed_send, warmed_recv = trio.open_memory_channel(1)  # the warm engine, handed over once
    # a place per admission slot (queue + 1): a slot is freed only after the packer took its call (admission.py)
    packer_send, packer_recv = trio.open_memory_channel(server.queue + 1)
    shutdown, deadline = trio.Event(), trio.CancelScope()
    admission = Admission(server.queue + 1, server.reject_rate)
    drain = DrainController(
        lifecycle,
        in_flight,
        shutdown,
        deadline,
        server.shutdown_s,
        exit_on_leak=options.exit_on_leak,
        on_stop=admission.release_all,
    )
    reload_send, reload_recv = trio.open_memory_channel(0)  # a second reload waits for the one at work
    with reload_send:
        hangups = reload_send.clone() if packs.hangups else None
        syncer = PackSyncer(reload_recv, packs.reread, packs.catalog, hangups, packs.refresh)
        web_reloads = reload_send.clone()
        early_reloads = reload_send.clone()  # the SIGHUPs of the start, replayed as one reload
    with exec_send:  # every sender holds its own clone and closes it: the executor ends when the last one has
        loader = Loader(exec_send.clone(), loaded_send, lifecycle, load)
        warmup = Warmup(exec_send.clone(), loaded_recv, warmed_send, lifecycle, options.warmup)
        packer = packer_class(
            packer_recv,
            exec_send.clone(),
            warmed_recv,
            EngineStatus(lifecycle),
            on_run=metrics.run,
            packs=syncer.snapshot,
        )
    metrics.queued = functools.partial(_queued, packer)
    metrics.warmup = functools.partial(_warmed_up, warmup)
    metrics.packs = functools.partial(_packs_in_use, syncer)
    executor = executor_class(exec_recv)
    metrics.engine_thread = functools.partial(_engine_thread, executor)
    services = WebServices(
        lifecycle=lifecycle,
        packer=packer_send,
        admission=admission,
        models_entry=models_entry,
        in_flight=in_flight,
        server=server,
        metrics=metrics,
        openapi=openapi,
        packs=syncer.snapshot,
        pack_reloads=web_reloads,
        prompt_style=options.prompt_style,
        sites=Sites.build(server.allowed_hosts, server.allowed_origins, loopback=options.bound_to_loopback),
    )
    async with trio.open_nursery() as outer:
        await outer.start(executor.run)
        with deadline:
            async with trio.open_nursery() as actors:
                await actors.start(drain.run)
                _stop_if_asked_while_starting(drain)  # its receiver is open: no later signal is missed
                async with trio.open_nursery() as boot:
                    await boot.start(loader.run)
                    await boot.start(warmup.run)
                    await actors.start(packer.run)
                    async with trio.open_nursery() as syncing:
                        await syncing.start(syncer.run)
                        syncing.start_soon(_replay_hangups, early_reloads)  # the syncer's receiver is open now
                        with packer_send, web_reloads:  # the web layer's; no handler runs once the body has ended
                            yield Running(services, drain, shutdown)
                        syncing.cancel_scope.cancel()  # no request reaches the syncer any more
                    drain.stop()  # ending the body is a shutdown (begun already when the HTTP server closed)
                    boot.cancel_scope.cancel()  # a load or warm-up still at work is not wanted any more
        # the executor's job in flight (a pass, the load) is waited for until the same deadline, no longer: its
        # thread is then left to it, so the process exits at the deadline
        outer.cancel_scope.deadline = deadline.deadline
    if drain.cut:
        log.warning("the shutdown deadline (%g s) passed: what was still running was cancelled", server.shutdown_s)


def _bound_to_loopback(sockets: Sockets) -> bool:
    """Whether every address the server listens on is a loopback one (``127.0.0.1``, ``::1``, ``localhost``)."""
    addresses = [sock.getsockname()[0] for sock in sockets.insecure_sockets]
    return bool(addresses) and all(is_loopback_name(address.split("%")[0]) for address in addresses)


def _stop_if_asked_while_starting(drain: DrainController) -> None:
    """A SIGTERM or SIGINT that came after the event loop started and before the drain controller listened
    (`start_signals`) shuts down as one that comes later does."""
    signum = start_signals.take_stop()
    if signum is not None:
        log.info("received %s while starting: stopping", signal.Signals(signum).name)
        drain.stop()


async def _replay_hangups(early_reloads: trio.MemorySendChannel[PackReload]) -> None:
    """The SIGHUPs that came before the pack syncer listened (`start_signals`), as one reload: the start may
    have read the config file before the edit they announce."""
    with early_reloads:
        count = start_signals.take_hangups()
        if count:
            log.info(
                "received SIGHUP %d time%s while starting: reloading the pack sources once",
                count,
                "" if count == 1 else "s",
            )
            await early_reloads.send(PackReload("SIGHUP"))


async def serve(
    options: ServerOptions,
    load: Callable[[], ServedEngine],
    models_entry: ModelsEntry,
    *,
    openapi: Callable[[], dict] = dict,
    packs: PackCatalogs | None = None,
    sockets: Sockets | None = None,
    process: bool = False,
    task_status=trio.TASK_STATUS_IGNORED,
) -> int:
    """Run the server until a signal (or ``DrainController.stop``) shuts it down; ``task_status`` gets the binds.
    ``sockets``: the address bound already (`bind_sockets`); None binds it here. ``process``: the server is the
    process (``spinf-serve serve``), which a shutdown cut by its deadline ends at once (`_exit_now`).

    Returns the exit status: 0, also when the shutdown deadline cut calls short, or 70 when the engine was
    degraded (api spec §3.2).
    """
    config = hypercorn_config(options.server)
    sockets = sockets or bind_sockets(options.server)
    start_listening(options.server, sockets)  # before the actors: a refusal here is one line, not an exception group
    options = attrs.evolve(options, bound_to_loopback=_bound_to_loopback(sockets))
    async with running_actors(options, load, models_entry, openapi=openapi, packs=packs) as running:
        app = wrap_app(create_app(running.services), config.wsgi_max_body_size, None)
        await http11.serve(app, config, sockets, shutdown_trigger=running.shutdown.wait, task_status=task_status)
        log.info("the HTTP server has closed")
    if process and running.drain.cut:
        _exit_now(running.drain.exit_code)
    return running.drain.exit_code


def _exit_now(code: int) -> None:
    """End the process with ``code`` now, its engine thread still in the pass it was running: the interpreter's own
    exit would wait for torch's threads to finish that pass (seconds) or abort the process on them."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run(
    settings: Settings,
    resolved: ResolvedModel,
    reload_settings: Callable[[], Settings] | None = None,
    sockets: Sockets | None = None,
) -> int:
    """``spinf-serve serve``: the server for the layered ``settings``, until SIGTERM or SIGINT. ``resolved`` is the
    model they name, resolved once by the command (`spinf.catalog.resolve_model`): the ``/v1/models`` entry and the
    engine take it as it is. ``reload_settings``
    gives the layered settings again; a pack reload takes its pack settings from them. ``sockets``: the address
    bound already (`bind_sockets`, which the command calls before its checks); None binds it here, before the
    pack catalog and the model."""
    from spinf._version import __version__
    from spinf.server.logs import configure
    from spinf.server.openapi import openapi_document

    configure(settings.server.log_format)
    style = resolved.manifest.prompt_style if resolved.manifest is not None else DEFAULT_STYLE.name
    options = ServerOptions.from_settings(settings, prompt_style=style)
    sockets = sockets or bind_sockets(settings.server)
    log.info(
        "spinf-serve %s: %s on %s:%d; pack sources: %s",
        __version__,
        settings.engine.model,
        settings.server.host,
        settings.server.port,
        pack_sources(settings.features),
    )
    reload_features = (lambda: reload_settings().features) if reload_settings is not None else None
    packs = start_packs(settings.features, resolved.served_name, os.environ, reload_features)
    if packs is None:
        return 1

    def load():
        from spinf.engine.engine import Engine  # torch is imported here, in the executor thread

        return Engine.from_settings(settings, resolved=resolved)

    entry = models_entry_for(resolved, settings)
    document = openapi_document(__version__, settings.limits, entry.names)
    start_signals.hold_stops()  # from here a SIGTERM is the drain controller's, not an exception in the event loop
    return trio.run(
        functools.partial(
            serve,
            options,
            load,
            entry,
            openapi=lambda: document,
            packs=packs,
            sockets=sockets,
            process=True,
        )
    )
