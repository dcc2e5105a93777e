"""The pack syncer actor, driven by hand: the swap, a failing reload keeping the old catalog, packs off, coalescing of
reloads that wait, and the packer parsing each call with the snapshot of the moment it takes it."""

from __future__ import annotations

import threading

import attrs
import pytest
import trio
import trio.testing

from spinf.packs.catalog import Catalog
from spinf.server.actors.pack_syncer import CATALOG_ERRORS, NO_SOURCE, OFFICIAL_LOST, PackSyncer
from spinf.server.actors.packer import Packer
from spinf.server.messages import PackReload, Reloaded, ScoreWork


def catalog(*sources: str, errors: tuple[str, ...] = (), official_error: str | None = None) -> Catalog:
    return Catalog(sources=sources, errors=errors, official_error=official_error)


async def reload(inbox: trio.MemorySendChannel[PackReload], by: str = "test", refresh: bool = False) -> Reloaded:
    reply_send, reply_recv = trio.open_memory_channel(1)
    with reply_recv:
        await inbox.send(PackReload(by, reply_send, refresh))
        return await reply_recv.receive()


@attrs.define
class Rereads:
    """The catalogs a reload reads, in turn; ``record`` counts the reads."""

    catalogs: list[Catalog]
    record: list[bool] = attrs.field(factory=list)  # each read's refresh

    def __call__(self, refresh: bool) -> Catalog:
        self.record.append(refresh)
        return self.catalogs.pop(0)


async def start(nursery, reread, current, refresh=False) -> tuple[PackSyncer, trio.MemorySendChannel[PackReload]]:
    send, recv = trio.open_memory_channel(0)
    syncer = PackSyncer(recv, reread, current, refresh=refresh)
    await nursery.start(syncer.run)
    return syncer, send


async def test_a_reload_swaps_the_snapshot_and_answers_with_the_new_counts():
    old, new = catalog("local:a"), catalog("local:a", "local:b")
    async with trio.open_nursery() as nursery:
        syncer, inbox = await start(nursery, Rereads([new]), old)
        assert syncer.snapshot() is old
        reloaded = await reload(inbox)
        assert syncer.snapshot() is new
        assert reloaded == Reloaded(True, None, (), None, ("local:a", "local:b"), 0, 0, 0, 1)
        assert reloaded.as_dict()["sources"] == ["local:a", "local:b"]
        nursery.cancel_scope.cancel()
    assert syncer.statistics().applied == 1


async def test_a_reload_with_catalog_errors_keeps_the_old_catalog_and_says_why():
    old = catalog("local:a")
    async with trio.open_nursery() as nursery:
        syncer, inbox = await start(nursery, Rereads([catalog("local:a", errors=("local:a: broken.json: bad",))]), old)
        reloaded = await reload(inbox)
        assert syncer.snapshot() is old
        assert (reloaded.applied, reloaded.reason, reloaded.errors) == (
            False,
            CATALOG_ERRORS,
            ("local:a: broken.json: bad",),
        )
        assert reloaded.sources == ("local:a",)  # the catalog still in use
        nursery.cancel_scope.cancel()
    assert (syncer.statistics().reloads, syncer.statistics().refused) == (1, 1)


async def test_a_reload_does_not_drop_an_official_source_that_is_loaded_but_runs_on_when_it_was_missing():
    loaded, missing = catalog("spinfinc/spinf-prompts@0.1.0"), catalog(official_error="no network")
    async with trio.open_nursery() as nursery:
        syncer, inbox = await start(nursery, Rereads([missing, missing]), loaded)
        refused = await reload(inbox)
        assert (refused.applied, refused.reason, syncer.snapshot()) == (False, OFFICIAL_LOST, loaded)
        assert refused.errors == ("the official source would be dropped: no network",)
        syncer.current = catalog(official_error="down at start")
        applied = await reload(inbox)
        assert (applied.applied, applied.official_error, syncer.snapshot()) == (True, "no network", missing)
        nursery.cancel_scope.cancel()


async def test_with_packs_off_a_reload_answers_that_there_is_no_source():
    async with trio.open_nursery() as nursery:
        syncer, inbox = await start(nursery, None, None)
        reloaded = await reload(inbox)
        assert (reloaded.applied, reloaded.reason, syncer.snapshot()) == (False, NO_SOURCE, None)
        assert reloaded.errors == ("packs are off: no pack source is configured (--packs, or the official source)",)
        nursery.cancel_scope.cancel()
    assert syncer.statistics().reloads == 0


async def test_reloads_run_one_at_a_time_and_those_waiting_share_the_next_one():
    release, record, catalogs = threading.Event(), [], iter([catalog("first"), catalog("second")])

    def reread(refresh: bool) -> Catalog:
        record.append("start")
        release.wait(10)
        record.append("end")
        return next(catalogs)

    replies: list[Reloaded] = []

    async def ask(inbox, by):
        replies.append(await reload(inbox, by))

    async with trio.open_nursery() as nursery:
        syncer, inbox = await start(nursery, reread, catalog("old"))
        nursery.start_soon(ask, inbox, "a")
        with trio.fail_after(10):
            while not record:  # the first reload is in its thread
                await trio.sleep(0.001)
        for by in "bcd":
            nursery.start_soon(ask, inbox, by)
        await trio.testing.wait_all_tasks_blocked()  # three requests wait for it
        assert record == ["start"]
        release.set()
        with trio.fail_after(10):
            while len(replies) < 4:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert record == ["start", "end", "start", "end"]  # two reads: never two at once, the waiting three share one
    assert [(r.sources, r.requests) for r in replies] == [(("first",), 1)] + [(("second",), 3)] * 3
    assert syncer.snapshot().sources == ("second",)


@pytest.mark.parametrize(
    ("setting", "asked", "read"), [(False, False, False), (False, True, True), (True, False, True)]
)
async def test_a_reload_resolves_the_tags_again_when_packs_refresh_is_on_or_the_request_asks(setting, asked, read):
    rereads = Rereads([catalog("local:a")])
    async with trio.open_nursery() as nursery:
        _, inbox = await start(nursery, rereads, catalog("local:a"), refresh=setting)
        await reload(inbox, refresh=asked)
        nursery.cancel_scope.cancel()
    assert rereads.record == [read]


@attrs.define
class RecordingLoop:
    """Stands in for the engine loop: keeps the catalog each call was made with."""

    made: list = attrs.field(factory=list)

    def new_call(self, body, request_id, **kwargs):
        self.made.append((request_id, kwargs["packs"]))
        return request_id

    def add(self, call, parsed=None) -> None:
        pass


def work(request_id: str) -> ScoreWork:
    reply, _ = trio.open_memory_channel(1)
    return ScoreWork({}, request_id, False, False, False, reply, slot=None)


async def test_the_packer_parses_each_call_with_the_snapshot_of_the_moment_it_takes_it():
    snapshots = [catalog("v0"), catalog("v1")]
    current = {"catalog": snapshots[0]}
    packer = Packer(None, None, None, None, packs=lambda: current["catalog"])
    loop = RecordingLoop()
    # the packer's intake makes each call as the work arrives (before decoding its media, if any)
    before = work("before")
    packer._take(loop, before, packer._call(loop, before))
    current["catalog"] = snapshots[1]  # a reload swapped the snapshot
    after = work("after")
    packer._take(loop, after, packer._call(loop, after))
    assert loop.made == [("before", snapshots[0]), ("after", snapshots[1])]
