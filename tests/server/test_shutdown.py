"""Shutdown under one deadline, and every actor's end, under a mock clock (`spinf.server.supervisor`,
`spinf.server.actors.drain`).

The executor here behaves like the real one at its edges: a job takes ``cost`` seconds, a reply nobody waits for any
more is dropped, its loop ends when the last sender has closed its inbox, and a cancel abandons it at once (the
supervisor cancels it only when the deadline has passed: the real thread is left to finish its job unheard). It
records how it ended. tests/test_system.py and tests/server/test_closing.py check the same against the real process
over real sockets.
"""

from __future__ import annotations

import functools
import json

import attrs
import outcome
import pytest
import trio
import trio.testing

from spinf.server.actors.executor import ExecutorStats
from spinf.server.app import create_app
from spinf.server.lifecycle import Phase
from spinf.server.supervisor import running_actors
from tests.server.fakes import FakeEngine, body, models_entry, options


@pytest.fixture
def drain_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SPINF_DRAIN_FILE", str(tmp_path / "drain"))


@attrs.define
class RecordingExecutor:
    inbox: trio.MemoryReceiveChannel
    cost: float = 1.0
    record: list = attrs.field(factory=list)  # (how the loop ended, when)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
        task_status.started()
        try:
            async for job in self.inbox:
                await trio.sleep(self.cost)  # a cancel abandons the job in flight, as the supervisor does the thread
                try:
                    job.reply.send_nowait(outcome.capture(job.fn))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # its caller went away
        except trio.Cancelled:
            self.record.append(("cancelled", trio.current_time()))
            raise
        self.record.append(("end of channel", trio.current_time()))

    def statistics(self) -> ExecutorStats:
        return ExecutorStats(0, 0.0)


def start(record: list, cost: float = 1.0, **changes):
    executor = functools.partial(RecordingExecutor, cost=cost, record=record)
    return running_actors(options(**changes), FakeEngine, models_entry, executor_class=executor)


async def test_every_actor_ends_by_itself_once_the_server_has_closed(autojump_clock, drain_file):
    record = []
    with trio.fail_after(60):  # an actor that kept its executor clone open would hold the executor for ever
        async with start(record) as running:
            client = create_app(running.services).test_client()
            await trio.sleep(10)
            assert (await client.post("/v1/score", json=body("x"))).status_code == 200
            stopped_at = trio.current_time()
            running.drain.stop()
            await running.shutdown.wait()
    assert record == [("end of channel", stopped_at)]


async def test_a_call_that_outlasts_the_deadline_is_answered_503_before_it_and_the_executor_is_left(
    autojump_clock, drain_file
):
    record, answers = [], []
    async with start(record, cost=100, shutdown_s=30) as running:
        client = create_app(running.services).test_client()
        await trio.sleep(301)  # the load, one warm-up shape and the idle reading: 100 s each

        async def call():
            answer = await client.post("/v1/score", json=body("long"))
            code = (await answer.get_json())["error"]["code"]
            answers.append((answer.status_code, code, answer.headers["Retry-After"], trio.current_time()))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await trio.sleep(9)  # inside the call's step (301 to 401)
            stopped_at = trio.current_time()
            running.drain.stop()
            await trio.sleep_forever()  # the deadline ends this
    # answered half a second before the deadline, which then cuts the rest: the executor's job is not waited for
    assert answers == [(503, "model_unavailable", "10", stopped_at + 29.5)]
    assert record == [("cancelled", stopped_at + 30)] and trio.current_time() == stopped_at + 30


async def test_a_shutdown_during_the_load_waits_for_the_load_job_until_the_deadline(autojump_clock, drain_file):
    record = []
    async with start(record, cost=100) as running:
        await trio.sleep(10)
        running.drain.stop()
        lifecycle = running.services.lifecycle
    assert record == [("cancelled", 40.0)] and trio.current_time() == 40.0
    assert lifecycle.phase is Phase.STOPPING and lifecycle.engine is None and not lifecycle.is_warm


async def test_a_body_still_arriving_when_the_shutdown_begins_is_answered_503_at_once(autojump_clock, drain_file):
    async with start([]) as running:
        client = create_app(running.services).test_client()
        await trio.sleep(10)
        headers = {"Content-Type": "application/json", "Content-Length": "100"}
        async with client.request("/v1/score", method="POST", headers=headers) as connection:
            await connection.send(b'{"inputs": ')
            await trio.testing.wait_all_tasks_blocked()
            stopped_at = trio.current_time()
            running.drain.stop()
            answer = json.loads(await connection.receive())
            answered_at = trio.current_time()
    assert (connection.status_code, answer["error"]["code"]) == (503, "model_unavailable")
    assert connection.headers["Connection"] == "close" and connection.headers["Retry-After"] == "10"
    assert answered_at == stopped_at  # not after body_timeout_s (60 s) nor the deadline (30 s)
