"""The pack syncer: owns the pack catalog the server answers with, and re-reads the sources without a restart.

The catalog is a frozen snapshot (`spinf.packs.catalog.Catalog`, None when packs are off). `current` is the one
reference to it: the packer reads it when it takes a call and parses the call with that snapshot to the end, and
``GET /v1/packs`` reads it per request. A reload (SIGHUP, or ``POST /v0/packs/reload`` from a trusted caller) builds
a new catalog off the event loop, in a worker thread, since it reads files and maybe the network, and swaps it in
with one assignment; calls in flight keep the snapshot they started with. A reload that finds any catalog error keeps
the old catalog and says why, as does one whose official source failed when the catalog in use has it (a reload
never drops packs because the network is down). An official source missing since the start may come back on a
reload, and one missing then and still missing is no reason to refuse it.

Reloads run one at a time. A request that arrives while one runs waits, and every request waiting when it ends is
answered by one next reload (it reads the sources after all of them asked, so each sees its edit): they are
coalesced, and each reply counts the requests it answered. In the server a reload reads the pack settings again
first (`start_packs`): a config file edited since the start may add, remove or change sources, or
turn packs off or on; flags and the environment are fixed for the life of the process. A reload uses the cached
commits of GitHub tags unless ``--packs-refresh`` is on or a request of the group asks for ``refresh``; branches are
resolved again every time.

The catalog's start is here too (`start_packs`, packs spec §4.5): the supervisor's ``run`` builds it before the
model loads, so that a catalog error ends the start with exit status 1 without loading it, and hands it to the
syncer with the way to read the settings and the sources again (`PackCatalogs`).
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
from collections.abc import Callable, Mapping

import attrs
import trio

from spinf.errors import SpinfError
from spinf.packs.catalog import Catalog, log_lines
from spinf.packs.listing import read_catalog
from spinf.server.messages import PackReload, Reloaded
from spinf.settings import FeatureSettings

log = logging.getLogger(__name__)

NO_SOURCE = "no_source"
CATALOG_ERRORS = "catalog_errors"
OFFICIAL_LOST = "official_lost"


@attrs.frozen
class SyncerStats:
    reloads: int  # reloads run (each may answer several requests)
    applied: int
    refused: int


@attrs.frozen
class PackCatalogs:
    """The pack catalog built at start (packs spec §4.5), None when packs are off, and how the pack syncer reads the
    settings and sources again (None: never; in-process servers of the tests). ``hangups``: SIGHUP reloads too (only
    where a signal can be received)."""

    catalog: Catalog | None = None
    reread: Callable[[bool], Catalog | None] | None = None  # the argument: refresh; None back: packs now off
    hangups: bool = False
    refresh: bool = False


def pack_sources(features: FeatureSettings) -> str:
    """The start-up line's pack sources: ``off`` when there is none, ``official`` when it is on, then the specs."""
    return ", ".join((["official"] if features.official_packs else []) + list(features.packs)) or "off"


def start_packs(
    features: FeatureSettings,
    model: str,
    environ: Mapping[str, str],
    reload_features: Callable[[], FeatureSettings] | None = None,
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


def _reader(features: FeatureSettings, model: str, environ: Mapping[str, str]) -> Callable[..., Catalog]:
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


def _packs_on(features: FeatureSettings) -> bool:
    """Packs are on when a ``--packs`` source is given or the official source is on (packs spec §4.5)."""
    return bool(features.packs) or features.official_packs


def _reread_settings(
    reload_features: Callable[[], FeatureSettings], model: str, environ: Mapping[str, str], refresh: bool
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


def can_listen_for_hangups() -> bool:
    """SIGHUP exists here and this is the main thread (Trio takes signals only there)."""
    return hasattr(signal, "SIGHUP") and threading.current_thread() is threading.main_thread()


@attrs.define
class PackSyncer:
    """**Inbox**: `PackReload` requests on ``inbox`` (the web layer's, each with a one-shot reply channel) and, when
    ``hangups`` is set, SIGHUP (turned into a request without a reply by a task holding the ``hangups`` clone of the
    inbox's sender). **Outbox**: each request's `Reloaded`; the snapshot in `current`; the reload's log lines
    (§4.5's, then one line saying whether it was applied). **Ends**: when the inbox closes, which with SIGHUP taken
    (its task holds a sender) happens only when cancelled: the supervisor cancels it once the HTTP server has closed.
    **Cancellation**: a reload at work is abandoned in its thread (it only reads the sources and writes the pack
    cache atomically); the old catalog stays, and waiting requests get no reply (their callers are going too).
    """

    inbox: trio.MemoryReceiveChannel[PackReload]
    # a new catalog from the sources (arg: refresh), or None when the settings read again turn packs off; None
    # itself: packs are off for the life of the process
    reread: Callable[[bool], Catalog | None] | None
    current: Catalog | None = None
    hangups: trio.MemorySendChannel[PackReload] | None = None
    refresh: bool = False  # --packs-refresh: every reload resolves the tags again
    _reloads: int = 0
    _applied: int = 0

    def snapshot(self) -> Catalog | None:
        """The catalog in use now (what a call taken now is parsed with)."""
        return self.current

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            if self.hangups is not None:
                await nursery.start(self._listen, self.hangups)
            task_status.started()
            with self.inbox:
                async for first in self.inbox:
                    await self._serve([first, *self._waiting()])

    async def _listen(self, hangups: trio.MemorySendChannel[PackReload], *, task_status) -> None:
        with hangups, trio.open_signal_receiver(signal.SIGHUP) as signals:
            task_status.started()
            async for _ in signals:  # Trio delivers a signal that arrives again before it is read once
                log.info("received SIGHUP: reloading the pack sources")
                await hangups.send(PackReload("SIGHUP"))

    def _waiting(self) -> list[PackReload]:
        """The requests already waiting (blocked senders included): one reload answers them all."""
        waiting = []
        while True:
            try:
                waiting.append(self.inbox.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                return waiting

    async def _serve(self, requests: list[PackReload]) -> None:
        by = ", ".join(sorted({r.by for r in requests}))
        refresh = self.refresh or any(r.refresh for r in requests)
        reloaded = await self._reload(len(requests), refresh)
        line = "applied" if reloaded.applied else f"not applied ({reloaded.reason}), the catalog in use stays"
        log.log(logging.INFO if reloaded.applied else logging.ERROR, "pack reload (%s): %s", by, line)
        for request in requests:
            request.answer(reloaded)

    async def _reload(self, requests: int, refresh: bool) -> Reloaded:
        old = self.current
        problem = "packs are off: no pack source is configured (--packs, or the official source)"
        if self.reread is None:
            return _outcome(False, NO_SOURCE, (problem,), None, old, requests)
        # abandoned on cancel: a shutdown does not wait for a slow GitHub; the thread only reads and caches
        new = await trio.to_thread.run_sync(self.reread, refresh, abandon_on_cancel=True)
        if new is None and old is None:  # the settings read again still name no source: nothing was read
            return _outcome(False, NO_SOURCE, (problem,), None, old, requests)
        self._reloads += 1
        if new is None:  # the settings read again name no source: packs are off from now on
            self.current = None
            self._applied += 1
            log.info("pack reload: the settings now name no pack source; packs are off")
            return _outcome(True, None, (), None, None, requests)
        for level, message in log_lines(new):
            log.log(level, message)
        if new.errors:
            return _outcome(False, CATALOG_ERRORS, new.errors, new.official_error, old, requests)
        if new.official_error is not None and old is not None and old.official_error is None:
            problems = (f"the official source would be dropped: {new.official_error}",)
            return _outcome(False, OFFICIAL_LOST, problems, new.official_error, old, requests)
        self.current = new  # the swap: one assignment; calls taken before keep the snapshot they hold
        self._applied += 1
        return _outcome(True, None, (), new.official_error, new, requests)

    def statistics(self) -> SyncerStats:
        return SyncerStats(self._reloads, self._applied, self._reloads - self._applied)


def _outcome(
    applied: bool,
    reason: str | None,
    errors: tuple[str, ...],
    official_error: str | None,
    in_use: Catalog | None,
    requests: int,
) -> Reloaded:
    if in_use is None:
        return Reloaded(applied, reason, errors, official_error, (), 0, 0, 0, requests)
    counts = (len(in_use.packs), in_use.enabled_count, len(in_use.skipped))
    return Reloaded(applied, reason, errors, official_error, in_use.sources, *counts, requests)
