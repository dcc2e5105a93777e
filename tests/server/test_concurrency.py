"""Deterministic concurrency: admission, warm-up gating, drain and shutdown, under a mock clock.

The actors run for real; the executor is a fake that takes one (mock) second per job and the engine does no work,
so every ordering below is exact.
"""

from __future__ import annotations

import functools
import json
import re

import pytest
import trio
import trio.testing

from spinf.server.app import create_app
from spinf.server.supervisor import running_actors
from tests.server.fakes import FakeEngine, FakeExecutor, InlinePacker, body, models_entry, options


@pytest.fixture
def drain_file(tmp_path, monkeypatch):
    path = tmp_path / "drain"
    monkeypatch.setenv("SPINF_DRAIN_FILE", str(path))
    return path


def start(opts, engine=None):
    engine = engine or FakeEngine()
    return running_actors(opts, lambda: engine, models_entry, executor_class=FakeExecutor, packer_class=InlinePacker)


async def post_all(client, bodies, record):
    async def one(k, b):
        response = await client.post("/v1/score", json=b)
        record.append((k, response.status_code, response.headers.get("Retry-After"), await response.get_json()))

    async with trio.open_nursery() as nursery:
        for k, b in enumerate(bodies):
            nursery.start_soon(one, k, b)


async def test_queue_admits_exactly_queue_plus_one_and_refuses_the_rest(autojump_clock, drain_file):
    async with start(options(queue=2)) as running:
        client = create_app(running.services).test_client()
        await trio.sleep(10)  # loaded and warm
        record = []
        await post_all(client, [body(f"c{k}") for k in range(7)], record)
        running.drain.stop()
    statuses = sorted(status for _, status, _, _ in record)
    assert statuses == [200, 200, 200, 429, 429, 429, 429]
    refused = [(retry, answer["error"]["code"]) for _, status, retry, answer in record if status == 429]
    assert refused == [("2", "concurrency_limit")] * 4


async def test_slots_are_shared_by_peer_address_so_another_caller_waits_where_one_over_its_share_is_refused(
    autojump_clock, drain_file
):
    """Issue 33 item 2: one address holding every slot gets its extra calls refused at once, while a call from
    another address, under its share, waits for the next freed slot (the fake executor frees one after a second)
    instead of a 429."""
    async with start(options(queue=2)) as running:
        client = create_app(running.services).test_client()
        await trio.sleep(10)
        record = []

        async def one(name, address):
            scope = {"client": (address, 40000)}
            response = await client.post("/v1/score", json=body(name), scope_base=scope)
            record.append((name, response.status_code, trio.current_time()))

        async with trio.open_nursery() as nursery:
            for k in range(4):
                nursery.start_soon(one, f"flood{k}", "192.0.2.9")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(one, "polite", "192.0.2.2")
        running.drain.stop()
    flood = sorted((status, t) for name, status, t in record if name != "polite")
    assert [status for status, _ in flood] == [200, 200, 200, 429]
    [(status, answered_at)] = [(status, t) for name, status, t in record if name == "polite"]
    assert status == 200 and flood[-1][1] == 10 and answered_at > 10  # the flood's 429 at once, polite after a wait


async def test_concurrent_calls_share_runs_and_get_their_own_answers(autojump_clock, drain_file):
    engine = FakeEngine()
    async with start(options(queue=4), engine) as running:
        client = create_app(running.services).test_client()
        await trio.sleep(10)
        record = []
        await post_all(client, [body(f"a{k}", f"b{k}") for k in range(5)], record)
        running.drain.stop()
    for k, status, _, answer in record:
        assert status == 200
        assert [r["input_id"] for r in answer["results"]] == [f"a{k}", f"b{k}"]
    assert max(engine.runs) > 1  # the warm-up ran alone; scoring calls shared a run


async def test_one_calls_engine_error_does_not_fail_the_others(autojump_clock, drain_file):
    engine = FakeEngine(fail_on="bad")
    async with start(options(queue=4), engine) as running:
        client = create_app(running.services).test_client()
        await trio.sleep(10)
        record = []
        await post_all(client, [body("ok1"), body("bad"), body("ok2")], record)
        running.drain.stop()
    by_id = {answer.get("results", [{}])[0].get("input_id", "error"): status for _, status, _, answer in record}
    assert sorted(status for _, status, _, _ in record) == [200, 200, 500]
    assert by_id["ok1"] == by_id["ok2"] == 200


async def test_scoring_answers_503_warming_up_until_warm(autojump_clock, drain_file):
    async with start(options()) as running:
        client = create_app(running.services).test_client()
        early = await client.post("/v1/score", json=body("x"))
        assert early.status_code == 503
        assert early.headers["Retry-After"] == "10"
        assert (await early.get_json())["error"]["code"] == "warming_up"
        assert (await client.get("/readyz")).status_code == 503
        assert (await (await client.get("/v1/models")).get_json())["models"][0]["status"] == "loading"
        await trio.sleep(10)
        assert (await client.get("/readyz")).status_code == 200
        assert (await client.post("/v1/score", json=body("x"))).status_code == 200
        running.drain.stop()


async def test_drain_takes_the_server_out_of_rotation_but_keeps_serving(autojump_clock, drain_file):
    async with start(options(token="secret")) as running:
        client = create_app(running.services).test_client()
        auth = {"Authorization": "Bearer secret"}
        await trio.sleep(10)
        drained = await client.post("/v0/drain", headers=auth)
        assert (await drained.get_json()) == {"draining": True} and drain_file.exists()
        ready = await client.get("/readyz")
        assert ready.status_code == 503 and (await ready.get_json()) == {"ready": False, "draining": True}
        assert (await client.get("/livez")).status_code == 200
        assert (await client.post("/v1/score", json=body("x"), headers=auth)).status_code == 200
        restored = await client.delete("/v0/drain", headers=auth)
        assert (await restored.get_json()) == {"draining": False} and not drain_file.exists()
        assert (await client.get("/readyz")).status_code == 200
        running.drain.stop()


async def test_shutdown_answers_every_admitted_call_and_refuses_later_ones(autojump_clock, drain_file):
    async with start(options(queue=4)) as running:
        client = create_app(running.services).test_client()
        await trio.sleep(10)
        record = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post_all, client, [body(f"c{k}") for k in range(3)], record)
            await trio.testing.wait_all_tasks_blocked()
            stopped_at = trio.current_time()
            running.drain.stop()
            late = await client.post("/v1/score", json=body("late"))
        await running.shutdown.wait()
        assert trio.current_time() - stopped_at < 30
    assert late.status_code == 503 and (await late.get_json())["error"]["code"] == "model_unavailable"
    assert sorted(status for _, status, _, _ in record) == [200, 200, 200]


class StalledPacker(InlinePacker):
    """A packer whose task has not yet come round to its inbox (as under a burst of thousands of connections)."""

    go: trio.Event = trio.Event()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
        task_status.started()
        await self.go.wait()
        await super().run()


async def test_callers_that_leave_keep_their_slots_until_the_packer_drops_their_calls(autojump_clock, drain_file):
    StalledPacker.go = trio.Event()
    engine = FakeEngine()
    opts = options(queue=2)
    async with running_actors(
        opts, lambda: engine, models_entry, executor_class=FakeExecutor, packer_class=StalledPacker
    ) as running:
        client = create_app(running.services).test_client()
        await trio.sleep(10)
        async with trio.open_nursery() as leaving:
            for k in range(3):
                leaving.start_soon(functools.partial(client.post, "/v1/score", json=body(f"gone{k}")))
            await trio.testing.wait_all_tasks_blocked()
            leaving.cancel_scope.cancel()  # three clients disconnect at once; their calls sit in the inbox
        assert running.services.admission.in_use == 3
        record = []
        await post_all(client, [body(f"new{k}") for k in range(3)], record)
        assert sorted(status for _, status, _, _ in record) == [429, 429, 429]  # not 500 engine_error
        StalledPacker.go.set()
        await trio.sleep(5)
        assert running.services.admission.in_use == 0 and engine.runs == []  # the left calls never ran
        assert (await client.post("/v1/score", json=body("after"))).status_code == 200 and engine.runs == [1]
        running.drain.stop()


async def test_a_call_whose_caller_left_mid_run_frees_its_slot_at_once(autojump_clock, drain_file):
    engine = FakeEngine()
    async with start(options(queue=0), engine) as running:  # one slot
        client = create_app(running.services).test_client()
        await trio.sleep(10)
        async with trio.open_nursery() as leaving:
            leaving.start_soon(functools.partial(client.post, "/v1/score", json=body("gone")))
            await trio.sleep(0.5)  # inside its step (a step takes one second)
            leaving.cancel_scope.cancel()
        assert running.services.admission.in_use == 0  # the packer took the call: its slot is free at once
        answer = await client.post("/v1/score", json=body("next"))  # the one slot: admitted, not 429
        # after the step under way (it finishes, and drops the call that was left), then its own
        assert answer.status_code == 200 and trio.current_time() == 12.0
        running.drain.stop()


async def call_and_leave(app, payload: bytes, after: float) -> list[dict]:
    """A scoring call whose client goes away ``after`` seconds after sending it; what the app sent back to it."""
    scope = app.test_client().request("/v1/score", method="POST", headers={"Content-Type": "application/json"}).scope
    arriving, sent = [{"type": "http.request", "body": payload, "more_body": False}], []

    async def receive():
        if arriving:
            return arriving.pop()
        await trio.sleep(after)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    return sent


async def test_a_caller_that_leaves_mid_call_is_access_logged_499_and_counted(autojump_clock, drain_file, caplog):
    caplog.set_level("INFO", logger="spinf.access")
    async with start(options(), FakeEngine()) as running:
        app = create_app(running.services)
        await trio.sleep(10)
        sent = await call_and_leave(app, json.dumps(body("gone")).encode(), after=0.5)  # inside its step
        lines = [record.getMessage() for record in caplog.records if record.name == "spinf.access"]
        metrics = await (await app.test_client().get("/metrics")).get_data(as_text=True)
        running.drain.stop()
    assert sent == []  # nothing was sent to a client that had gone
    assert len(lines) == 1 and re.fullmatch(r"^scr_\w+ POST /v1/score 499 [\d.]+ms$", lines[0]), lines
    assert 'spinf_requests_abandoned_total{route="/v1/score"} 1.0' in metrics.splitlines()
    assert 'spinf_requests_total{route="/v1/score",status="200"}' not in metrics


async def test_a_degraded_engine_serves_on_then_the_process_exits_70(autojump_clock, drain_file):
    engine = FakeEngine()
    async with start(options(), engine) as running:
        client = create_app(running.services).test_client()
        await trio.sleep(10)
        engine.degraded = "3.00 GiB still held after an out-of-memory error"
        assert (await client.post("/v1/score", json=body("x"))).status_code == 200
        seen = trio.current_time()  # the packer read the degraded state after that call's run
        ready, live = await client.get("/readyz"), await client.get("/livez")
        assert ready.status_code == 503 and (await ready.get_json()) == {"ready": False, "degraded": engine.degraded}
        assert live.status_code == 503 and (await live.get_json()) == {"live": False, "degraded": engine.degraded}
        assert (await client.post("/v1/score", json=body("y"))).status_code == 200  # still serving
        await running.shutdown.wait()
        assert 2.0 <= trio.current_time() - seen < 3.0 and running.drain.exit_code == 70


async def test_with_exit_on_leak_off_a_degraded_engine_keeps_running(autojump_clock, drain_file):
    engine = FakeEngine()
    async with start(options(exit_on_leak=False), engine) as running:
        client = create_app(running.services).test_client()
        await trio.sleep(10)
        engine.degraded = "leaked"
        assert (await client.post("/v1/score", json=body("x"))).status_code == 200
        await trio.sleep(60)
        assert not running.shutdown.is_set() and (await client.get("/readyz")).status_code == 503
        running.drain.stop()
    assert running.drain.exit_code == 0


async def test_once_stopping_every_answer_closes_its_connection(autojump_clock, drain_file):
    async with start(options()) as running:
        client = create_app(running.services).test_client()
        await trio.sleep(10)
        assert "Connection" not in (await client.get("/healthz")).headers
        running.drain.stop()
        late, ready = await client.post("/v1/score", json=body("late")), await client.get("/readyz")
        assert late.status_code == 503 and late.headers["Connection"] == "close"
        assert ready.status_code == 503 and (await ready.get_json()) == {"ready": False, "stopping": True}
        assert ready.headers["Connection"] == "close"


async def test_out_of_memory_is_413_for_that_call_only_and_the_server_serves_on(autojump_clock, drain_file):
    engine = FakeEngine(oom_on="huge")
    async with start(options(queue=4), engine) as running:
        client = create_app(running.services).test_client()
        await trio.sleep(10)
        record = []
        await post_all(client, [body("small1"), body("huge"), body("small2")], record)
        after = await client.post("/v1/score", json=body("after"))
        running.drain.stop()
    by_status = sorted((status, answer.get("error", {}).get("code")) for _, status, _, answer in record)
    assert by_status == [(200, None), (200, None), (413, "request_too_large")]
    assert [answer["error"]["param"] for _, status, _, answer in record if status == 413] == [None]
    assert after.status_code == 200 and running.services.lifecycle.degraded is None


@pytest.mark.parametrize("log_probes", [False, True])
async def test_probes_are_access_logged_only_when_asked(autojump_clock, drain_file, caplog, log_probes):
    caplog.set_level("INFO", logger="spinf.access")
    async with start(options(log_probes=log_probes)) as running:
        client = create_app(running.services).test_client()
        await trio.sleep(10)
        for path in ("/healthz", "/readyz", "/livez", "/metrics"):
            assert (await client.get(path)).status_code == 200
        assert (await client.post("/v1/score", json=body("x"))).status_code == 200
        running.drain.stop()
    routes = [record.getMessage().split()[2] for record in caplog.records if record.name == "spinf.access"]
    probes = ["/healthz", "/readyz", "/livez", "/metrics"] if log_probes else []
    assert routes == [*probes, "/v1/score"]
