"""Fakes at the channel boundaries: an engine that does no work and an executor that takes a known time per job."""

from __future__ import annotations

import attrs
import outcome
import trio

from spinf.engine.loop import LoopStats
from spinf.engine.warm import Step
from spinf.errors import ApiError
from spinf.server.actors.executor import ExecutorStats
from spinf.server.actors.packer import Packer
from spinf.server.supervisor import ServerOptions
from spinf.settings import ServerSettings


@attrs.define(eq=False)
class FakeCall:
    body: object
    request_id: str
    abandoned: bool = False
    response: dict | None = None
    error: BaseException | None = None


@attrs.define
class FakeLoop:
    """The engine loop's surface (`spinf.engine.loop.EngineLoop`): each step runs every call added since the last
    one in one shared run (or, when not batch-invariant, the oldest call alone)."""

    engine: FakeEngine
    calls: list[FakeCall] = attrs.field(factory=list)
    pass_log: list = attrs.field(factory=list)

    @staticmethod
    def new_call(body, request_id, **flags) -> FakeCall:
        return FakeCall(body, request_id)

    def add(self, call: FakeCall, parsed=None) -> None:
        self.calls.append(call)

    @property
    def has_work(self) -> bool:
        return bool(self.calls)

    def step(self) -> list[FakeCall]:
        dropped = [c for c in self.calls if c.abandoned]
        calls = [c for c in self.calls if not c.abandoned]
        if not self.engine.batch_invariant:
            calls = calls[:1]
        self.calls = [c for c in self.calls if c not in dropped and c not in calls]
        valid = [c for c in calls if self._valid(c)]
        if valid:
            self.engine.runs.append(len(valid))
            self.pass_log.append((10, 0.0))
            for call in valid:
                self._run(call)
        return dropped + calls

    def statistics(self):
        return LoopStats(len(self.pass_log), 10 * len(self.pass_log), 0.0, 0, 0, 0)

    def _valid(self, call: FakeCall) -> bool:
        body = call.body
        if not isinstance(body, dict) or ("inputs" in body) == ("messages" in body):
            call.error = ApiError(400, "invalid_field", "messages", "send exactly one of messages and inputs")
            return False
        return True

    def _run(self, call: FakeCall) -> None:
        """A failing call fails alone (the real loop runs a failed shared pass's calls again one by one)."""
        engine, ids = self.engine, _ids(call)
        if engine.fail_on in ids:
            call.error = RuntimeError("the engine broke on this call")
        elif engine.oom_on in ids:
            call.error = ApiError(413, "request_too_large", None, "out of GPU memory while scoring this call")
        else:
            engine.responded.append(call.request_id)
            results = [{"input_id": i, "queries": []} for i in ids]
            call.response = {"id": call.request_id, "object": "score", "results": results, "warnings": [], "usage": {}}


def _ids(call: FakeCall) -> list[str]:
    return [i["id"] for i in call.body.get("inputs", [])] or ["0"]


@attrs.define
class FakeEngine:
    """Answers every call with its inputs' ids; records how many calls shared each run."""

    batch_invariant: bool = True
    weights: str = "config"
    runs: list[int] = attrs.field(factory=list)
    responded: list[str] = attrs.field(factory=list)  # the request ids whose responses were built
    fail_on: str | None = None  # an input id whose run raises (an engine bug in one call)
    oom_on: str | None = None  # an input id whose run runs out of device memory (the loop's 413, freed)
    degraded: str | None = None  # as Engine.degraded: memory not freed after an out-of-memory error
    features: None = None  # its media kinds and switches are not said (`EngineFacts` leaves them None)
    loop: FakeLoop = attrs.field(default=None)

    def __attrs_post_init__(self):
        self.loop = FakeLoop(self)

    def warmup_steps(self, mode):
        return [] if mode == "none" else [Step(lambda: self.score({"messages": [{"content": "warm"}]}))]

    def score(self, body):
        return {}

    def info(self):
        return {"engine": "fake"}

    def idle_gib(self):
        return 0.0

    def settle(self):
        pass


@attrs.define
class FakeExecutor:
    """Runs each job inline after ``cost`` seconds of (mock) time."""

    inbox: trio.MemoryReceiveChannel
    cost: float = 1.0

    jobs: int = 0

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
        task_status.started()
        async for job in self.inbox:
            await trio.sleep(self.cost)
            job.reply.send_nowait(outcome.capture(job.fn))
            self.jobs += 1

    def statistics(self) -> ExecutorStats:
        return ExecutorStats(self.jobs, self.jobs * self.cost)


InlinePacker = Packer  # the packer compiles nothing itself any more (the loop does, in the executor's step)


class FakeModelsEntry:
    """The served model's entries (`spinf.server.models_entry.ModelsEntry`) of a model named ``fake``."""

    def __call__(self, lifecycle):
        return {"id": "fake", "status": "available" if lifecycle.is_warm else "loading"}

    def openai(self) -> dict:
        return {"id": "fake", "object": "model", "created": 0, "owned_by": "spinf-serve"}

    def answers_to(self, name: str) -> bool:
        return name.casefold() == "fake"


models_entry = FakeModelsEntry()


def options(warmup: str = "short", **changes) -> ServerOptions:
    """The server's options on ``127.0.0.1``, port 0: the ``[server]`` settings named in ``changes`` and the other
    fields of `ServerOptions` (``exit_on_leak``, ``prompt_style``)."""
    server = {name: changes.pop(name) for name in list(changes) if name in attrs.fields_dict(ServerSettings)}
    return ServerOptions(ServerSettings(**{"host": "127.0.0.1", "port": 0, **server}), warmup, **changes)


def body(*ids: str) -> dict:
    return {"inputs": [{"id": i, "messages": [{"content": "x"}]} for i in ids], "scoring": {"queries": []}}
