"""The only wiring: opens the channels, starts the actors in dependency order and runs Hypercorn at the edge.

Nested nurseries encode the lifetimes: the executor thread outlives every actor that sends it work; the actors
outlive the HTTP server. Shutdown runs the other way, under **one deadline** on one cancel scope (the drain
controller's ``deadline``, which holds the actors and the HTTP server): the drain controller lets the calls in
flight finish, the HTTP server closes (`spinf.http11.serve`), the web layer's channel to the packer closes, the boot
actors are cancelled if still at work, and every actor ends by closing its own clone of the executor's inbox, which
ends the executor's thread after its current job. When the deadline passes first (the calls still waiting were
answered 503 a moment before it), the scope cancels all that is left at once; the executor's job in flight is
waited for until the same deadline and its thread then abandoned to it, so the process exits at the deadline
rather than after the pass (or the load) under way.

The pack catalog is built before any of this (`start_packs`, packs spec §4.5): a catalog error ends the start with
exit status 1 before the model loads. The pack syncer holds it from then on, beside the packer, which reads its
snapshot per call; it is cancelled once the HTTP server has closed, since no reload can be asked for any more.
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
from collections.abc import AsyncIterator, Callable, Mapping

import attrs
import trio
from hypercorn.config import Config, Sockets
from hypercorn.utils import wrap_app

from spinf import http11, start_signals
from spinf.actors.drain import DrainController
from spinf.actors.executor import Executor
from spinf.actors.loader import Loader
from spinf.actors.pack_syncer import PackSyncer, can_listen_for_hangups
from spinf.actors.packer import Packer
from spinf.actors.warmup import Warmup
from spinf.admission import Admission
from spinf.errors import ConfigError, SpinfError
from spinf.gate import Sites, is_loopback_name
from spinf.metrics import Metrics
from spinf.packs.catalog import Catalog, log_lines
from spinf.packs.listing import read_catalog
from spinf.serving import EngineStatus, InFlight, Lifecycle, ModelsEntry, PackReload, ServedEngine
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
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    bound_to_loopback: bool = False  # every listening address is a loopback one (`serve` reads it off the sockets)
    warmup: str = "full"
    exit_on_leak: bool = True  # SPINF_EXIT_ON_LEAK (api spec §3.2): a degraded process exits with status 70
    prompt_style: str = "default"  # the served model's manifest's prompt_style (POST /v1/decisions' wording)

    @classmethod
    def from_settings(cls, settings) -> ServerOptions:
        """The ``[server]`` settings this class names, the warm-up mode and ``SPINF_EXIT_ON_LEAK``."""
        server = attrs.asdict(settings.server)
        given = {name: server[name] for name in attrs.fields_dict(cls) if name in server}
        leak = os.environ.get("SPINF_EXIT_ON_LEAK", "1").strip().lower() not in {"0", "false", "no", "off"}
        return cls(**given, warmup=settings.engine.warmup, exit_on_leak=leak)


@attrs.frozen
class PackCatalogs:
    """The pack catalog built at start (packs spec §4.5), None when packs are off, and how the pack syncer reads the
    settings and sources again (None: never; in-process servers of the tests). ``hangups``: SIGHUP reloads too (only
    where a signal can be received)."""

    catalog: Catalog | None = None
    reread: Callable[[bool], Catalog | None] | None = None  # the argument: refresh; None back: packs now off
    hangups: bool = False
    refresh: bool = False


def pack_sources(features) -> str:
    """The start-up line's pack sources: ``off`` when there is none, ``official`` when it is on, then the specs."""
    return ", ".join((["official"] if features.official_packs else []) + list(features.packs)) or "off"


def start_packs(
    features,
    model: str,
    environ: Mapping[str, str],
    reload_features: Callable[[], object] | None = None,
) -> PackCatalogs | None:
    """The catalog at start, before the model loads, with §4.5's log lines; None when a catalog error refuses the
    start. A reload reads the sources again; ``packs_refresh`` resolves the tags again at start and at every reload
    (a reload may also ask for it). ``reload_features``, when given, gives the ``[features]`` settings again (the
    layers re-read: a config file edited since the start changes the pack settings a reload uses, so a source can
    be added or removed without a restart; flags and the environment are fixed for the life of the process)."""
    # without reload_features a reload reads the same settings: the sources again, or no source (still answered)
    reread = functools.partial(_reread_settings, reload_features or (lambda: features), model, environ)
    if not _packs_on(features):
        return PackCatalogs(None, reread, hangups=can_listen_for_hangups())
    catalog = _reader(features, model, environ)(refresh=features.packs_refresh)
    for level, message in log_lines(catalog):
        log.log(level, message)
    if catalog.errors:
        count = len(catalog.errors)
        log.error(
            "not starting: the pack catalog has %d error%s: %s",
            count,
            "" if count == 1 else "s",
            "; ".join(catalog.errors),
        )
        return None
    return PackCatalogs(catalog, reread, hangups=can_listen_for_hangups(), refresh=features.packs_refresh)


def _reader(features, model: str, environ: Mapping[str, str]) -> Callable[..., Catalog]:
    """The catalog of the pack settings in ``features`` (call it with ``refresh``)."""
    return functools.partial(
        read_catalog,
        features.packs,
        model=model,
        official_on=features.official_packs,
        official=features.packs_official,
        allowed=features.packs_allow_namespace,
        environ=environ,
    )


def _packs_on(features) -> bool:
    """Packs are on when a ``--packs`` source is given or the official source is on (packs spec §4.5)."""
    return bool(features.packs) or features.official_packs


def _reread_settings(
    reload_features: Callable[[], object], model: str, environ: Mapping[str, str], refresh: bool
) -> Catalog | None:
    """A reload's catalog from the settings as they are now: the pack settings read again (a settings error is a
    catalog error, so the catalog in use stays); None when they now turn packs off."""
    try:
        features = reload_features()
    except (SpinfError, OSError) as error:  # a ConfigError, or the model no longer resolving
        return Catalog(errors=(f"the settings could not be read again: {error}",))
    if not _packs_on(features):
        return None
    log.info("pack reload: pack sources %s", pack_sources(features))
    return _reader(features, model, environ)(refresh=refresh or features.packs_refresh)


def hypercorn_config(options: ServerOptions) -> Config:
    config = Config()
    config.bind = [f"{options.host}:{options.port}"]
    config.keep_alive_timeout = options.keepalive_s
    config.backlog = options.backlog
    config.accesslog = None  # spinf.access logs one line per request, without content
    config.errorlog = logging.getLogger("hypercorn.error")  # through our handlers (plain or JSON lines)
    return config


def bind_sockets(options: ServerOptions) -> Sockets:
    """The listening address bound (not yet listening: a connection before the server runs is refused, not left
    waiting), so that an address in use is one line before the model loads rather than a trace after it.

    Raises ``ConfigError`` naming the address and the reason (in use, not on this machine, a privileged port)."""
    try:
        return hypercorn_config(options).create_sockets()
    except OSError as error:  # socket.gaierror too: a host name that does not resolve
        raise _cannot_listen(options, error) from error


def start_listening(options: ServerOptions, sockets: Sockets) -> None:
    """Listen on the bound ``sockets``; ``ConfigError`` as `bind_sockets` when another process listens there
    already (two sockets that allow address reuse may both bind one port; only one may listen)."""
    try:
        for sock in sockets.insecure_sockets:
            sock.listen(options.backlog)
    except OSError as error:
        raise _cannot_listen(options, error) from error


def _cannot_listen(options: ServerOptions, error: OSError) -> ConfigError:
    address = f"[{options.host}]:{options.port}" if ":" in options.host else f"{options.host}:{options.port}"
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
    packs = packs or PackCatalogs()
    lifecycle = Lifecycle(import_s=round(time.process_time(), 3))
    in_flight = InFlight()
    metrics = Metrics()
    exec_send, exec_recv = trio.open_memory_channel(0)
    loaded_send, loaded_recv = trio.open_memory_channel(1)  # the loaded engine, handed over once
    warmed_send, warmed_recv = trio.open_memory_channel(1)  # the warm engine, handed over once
    # a place per admission slot (queue + 1): a slot is freed only after the packer took its call (spinf.admission)
    packer_send, packer_recv = trio.open_memory_channel(options.queue + 1)
    shutdown, deadline = trio.Event(), trio.CancelScope()
    admission = Admission(options.queue + 1, options.reject_rate)
    drain = DrainController(
        lifecycle,
        in_flight,
        shutdown,
        deadline,
        options.shutdown_s,
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
    services = WebServices(
        lifecycle=lifecycle,
        packer=packer_send,
        admission=admission,
        models_entry=models_entry,
        in_flight=in_flight,
        token=options.token,
        trusted_token=options.trusted_token,
        max_body_bytes=options.max_body_bytes,
        body_timeout_s=options.body_timeout_s,
        debug=options.debug,
        log_probes=options.log_probes,
        metrics=metrics,
        openapi=openapi,
        packs=syncer.snapshot,
        pack_reloads=web_reloads,
        prompt_style=options.prompt_style,
        sites=Sites.build(options.allowed_hosts, options.allowed_origins, loopback=options.bound_to_loopback),
    )
    async with trio.open_nursery() as outer:
        await outer.start(executor_class(exec_recv).run)
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
        log.warning("the shutdown deadline (%g s) passed: what was still running was cancelled", options.shutdown_s)


def _bound_to_loopback(sockets: Sockets) -> bool:
    """Whether every address the server listens on is a loopback one (``127.0.0.1``, ``::1``, ``localhost``)."""
    addresses = [sock.getsockname()[0] for sock in sockets.insecure_sockets]
    return bool(addresses) and all(is_loopback_name(address.split("%")[0]) for address in addresses)


def _stop_if_asked_while_starting(drain: DrainController) -> None:
    """A SIGTERM or SIGINT that came after the event loop started and before the drain controller listened
    (`spinf.start_signals`) shuts down as one that comes later does."""
    signum = start_signals.take_stop()
    if signum is not None:
        log.info("received %s while starting: stopping", signal.Signals(signum).name)
        drain.stop()


async def _replay_hangups(early_reloads: trio.MemorySendChannel[PackReload]) -> None:
    """The SIGHUPs that came before the pack syncer listened (`spinf.start_signals`), as one reload: the start may
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
    config = hypercorn_config(options)
    sockets = sockets or bind_sockets(options)
    start_listening(options, sockets)  # before the actors: a refusal here is one line, not an exception group
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


@attrs.frozen
class ModelEntry:
    """The one ``/v1/models`` entry (api spec §7): the model's own fields, its status, limits and features.

    ``extraction`` and ``generation`` are the server's switches. A feature is on when its switch is and the model's
    capabilities name it; generation needs extraction too (``--no-extraction`` reports both off), and
    ``capabilities`` lists the model's minus what the switches turn off. ``media`` (in the entry and its features)
    is the kinds the model reads that ``--media`` keeps, in the manifest's order: before the engine is loaded the
    manifest's kinds, then those the engine reads (its checkpoint may lack an embedder the manifest names).

    Beside it, OpenAI's entry (`openai`) for the openai SDK's ``models.list()`` and ``models.retrieve()``. Its
    ``created`` is when this entry was made, at the server's start: no file we hold says when the model was made
    (manifests carry no date; a checkpoint's file times are when it was downloaded or generated), and a time fixed
    for the process keeps the list and every retrieve in agreement. ``owned_by`` is the namespace of the name the
    model is published under, the catalog's (``spinf``) or the Hub repo's organisation; ``spinf-serve`` for a local
    folder, whose owner nothing records.
    """

    resolved: object  # spinf.catalog.ResolvedModel
    served_model: str
    limits: dict
    extraction: bool = True
    generation: bool = True
    media: frozenset[str] = frozenset()  # the server's --media
    created: int = attrs.field(factory=lambda: int(time.time()))  # Unix seconds: the server's start

    def __call__(self, lifecycle: Lifecycle) -> dict:
        body = self.resolved.listing()
        body["id"] = self.id
        status = "error" if lifecycle.error else "available" if lifecycle.is_warm else "loading"
        engine = lifecycle.engine
        capabilities = self.capabilities(engine)
        reads = engine.media if engine and engine.media is not None else self.media
        media = [kind for kind in self.resolved.media if kind in reads]
        limits = dict(self.limits)
        manifest = self.resolved.manifest
        if manifest is not None and manifest.head == "readout":  # api spec §9.4: the decider forces 0
            limits["max_extractions_per_input"] = 0
        body.update(status=status, capabilities=capabilities, media=media, limits=limits)
        body["features"] = {
            "media": list(media),
            "extraction": "extract" in capabilities,
            "generation": "generate" in capabilities,
        }
        # ours, beyond §7: a checkpoint outside the catalog carries no batch-invariance guarantee (§9.6, D2)
        body["batch_invariant"] = engine.batch_invariant if engine else self.resolved.batch_invariant
        return dict(sorted(body.items(), key=lambda item: _MODEL_KEYS.index(item[0])))

    @property
    def id(self) -> str:
        return self.served_model or self.resolved.served_name

    @property
    def names(self) -> tuple[str, ...]:
        """The names a request's ``model`` may give (api spec §9.6): the served name, the manifest id, its aliases."""
        manifest = self.resolved.manifest
        return (self.id, *((manifest.id,) if manifest is not None else ()), *self.resolved.aliases)

    def answers_to(self, name: str) -> bool:
        """Whether ``name`` is one of the model's `names`, compared case-insensitively, as a request's ``model`` is."""
        return name.casefold() in {known.casefold() for known in self.names}

    def openai(self) -> dict:
        """OpenAI's model object for the served model (api spec §7, "OpenAI's shape beside it")."""
        published = self.resolved.manifest.id if self.resolved.manifest is not None else self.resolved.repo_id
        owner = published.split("/")[0] if published and "/" in published else "spinf-serve"
        return {"id": self.id, "object": "model", "created": self.created, "owned_by": owner}

    def capabilities(self, engine=None) -> list[str]:
        """The model's capabilities (all three without a manifest) minus what the switches turn off, and once the
        engine is loaded (its `EngineFacts`) minus what its stack does not run (the Qwen stack's extraction)."""
        extract = self.extraction and "extract" in self.resolved.capabilities
        if engine is not None and engine.extraction is not None:
            extract = extract and engine.extraction
        off = set() if extract else {"extract", "generate"}
        if not self.generation or (engine is not None and engine.generation is False):
            off.add("generate")
        return [name for name in self.resolved.capabilities if name not in off]


def models_entry_for(resolved, settings) -> ModelEntry:
    """The ``/v1/models`` entry of ``resolved`` as the layered ``settings`` serve it."""
    features = settings.features
    return ModelEntry(
        resolved,
        settings.engine.served_model,
        settings.limits.as_dict(),
        extraction=features.extraction,
        generation=features.generation,
        media=frozenset(features.media),
    )


_MODEL_KEYS = ["id", "name", "status", "base_model", "aliases", "family", "capabilities", "media", "limits"]
_MODEL_KEYS += ["features", "image", "batch_invariant"]


def run(settings, reload_settings: Callable[[], object] | None = None, sockets: Sockets | None = None) -> int:
    """``spinf-serve serve``: the server for the layered ``settings``, until SIGTERM or SIGINT. ``reload_settings``
    gives the layered settings again; a pack reload takes its pack settings from them. ``sockets``: the address
    bound already (`bind_sockets`, which the command calls before its checks); None binds it here, before the
    pack catalog and the model."""
    from spinf import __version__
    from spinf.catalog import resolve_model
    from spinf.logs import configure
    from spinf.openapi import openapi_document

    configure(settings.server.log_format)
    resolved = resolve_model(settings.engine.model)
    options = ServerOptions.from_settings(settings)
    sockets = sockets or bind_sockets(options)
    if resolved.manifest is not None:
        options = attrs.evolve(options, prompt_style=resolved.manifest.prompt_style)
    log.info(
        "spinf-serve %s: %s on %s:%d; pack sources: %s",
        __version__,
        settings.engine.model,
        options.host,
        options.port,
        pack_sources(settings.features),
    )
    reload_features = (lambda: reload_settings().features) if reload_settings is not None else None
    packs = start_packs(settings.features, resolved.served_name, os.environ, reload_features)
    if packs is None:
        return 1

    def load():
        from spinf.engine.engine import Engine  # torch is imported here, in the executor thread

        return Engine.from_settings(settings)

    document = openapi_document(__version__, settings.limits, models_entry_for(resolved, settings).names)
    start_signals.hold_stops()  # from here a SIGTERM is the drain controller's, not an exception in the event loop
    return trio.run(
        functools.partial(
            serve,
            options,
            load,
            models_entry_for(resolved, settings),
            openapi=lambda: document,
            packs=packs,
            sockets=sockets,
            process=True,
        )
    )
