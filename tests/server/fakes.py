"""Fakes at the channel boundaries: an engine that does no work and an executor that takes a known time per job."""

from __future__ import annotations

import attrs
import outcome
import trio

from spinf.actors.packer import Packer
from spinf.errors import ApiError
from spinf.supervisor import ServerOptions


@attrs.frozen
class FakeStats:
    passes: int = 1
    packed_tokens: int = 10
    busy_s: float = 0.0
    wall_s: float = 0.0


@attrs.define
class FakePrepared:
    request_id: str
    body: dict
    compiled: object
    compile_s: float = 0.0
    queue_s: float = 0.0


@attrs.define
class FakeEngine:
    """Answers every call with its inputs' ids; records how many calls shared each run."""

    batch_invariant: bool = True
    weights: str = "config"
    runs: list[int] = attrs.field(factory=list)
    responded: list[str] = attrs.field(factory=list)  # the request ids whose responses were built
    fail_on: str | None = None  # an input id whose run raises (an engine bug in one call)
    oom_on: str | None = None  # an input id whose run runs out of device memory (Engine.run's 413, freed)
    degraded: str | None = None  # as Engine.degraded: memory not freed after an out-of-memory error

    def prepare(self, body, *, chat=False, trusted=False, request_id=None):
        if not isinstance(body, dict) or ("inputs" in body) == ("messages" in body):
            raise ApiError(400, "invalid_field", "messages", "send exactly one of messages and inputs")
        ids = [i["id"] for i in body.get("inputs", [])] or ["0"]
        return FakePrepared(request_id, body, attrs.make_class("Compiled", {"jobs": attrs.field()})(ids))

    def run(self, job_lists):
        self.runs.append(len(job_lists))
        if self.fail_on is not None and any(self.fail_on in jobs for jobs in job_lists):
            raise RuntimeError("the engine broke on this call")
        if self.oom_on is not None and any(self.oom_on in jobs for jobs in job_lists):
            raise ApiError(413, "request_too_large", None, "out of GPU memory while scoring this call")
        return [{"ids": jobs} for jobs in job_lists], FakeStats()

    def respond(self, prepared, values, stats, *, internals=False):
        self.responded.append(prepared.request_id)
        results = [{"input_id": i, "queries": []} for i in values["ids"]]
        return {"id": prepared.request_id, "object": "score", "results": results, "warnings": [], "usage": {}}

    def warmup_bodies(self, mode):
        return [] if mode == "none" else [{"messages": [{"content": "warm"}]}]

    def score(self, body):
        return {}

    def info(self):
        return {"engine": "fake"}

    def idle_gib(self):
        return 0.0


@attrs.define
class FakeExecutor:
    """Runs each job inline after ``cost`` seconds of (mock) time."""

    inbox: trio.MemoryReceiveChannel
    cost: float = 1.0

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
        task_status.started()
        async for job in self.inbox:
            await trio.sleep(self.cost)
            job.reply.send_nowait(outcome.capture(job.fn))


async def _inline(fn):
    return fn()


class InlinePacker(Packer):
    """Compiles on the event loop: with no worker threads, the mock clock orders everything exactly."""

    offload = staticmethod(_inline)


def models_entry(state):
    return {"id": "fake", "status": "available" if state.ready else "loading"}


def options(**changes) -> ServerOptions:
    return ServerOptions(**{"host": "127.0.0.1", "port": 0, "warmup": "short", **changes})


def body(*ids: str) -> dict:
    return {"inputs": [{"id": i, "messages": [{"content": "x"}]} for i in ids], "scoring": {"queries": []}}
