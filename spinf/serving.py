"""What the server's actors and the web layer share: messages on channels and the boot/readiness state.

Messages hand ownership to the receiver. A request carries a one-shot reply channel (buffer 1) and its admission
slot (`spinf.admission.Slot`), released by whoever ends the call. `ServerState` is owned by the supervisor and
mutated only from the Trio thread (the loader and warm-up actors set the boot fields, the packer the degraded
state, the drain controller the stopping flag); the web layer reads it to answer probes. Nothing here imports
torch.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import outcome
import trio

from spinf.admission import Slot


@attrs.define(eq=False)
class ExecJob:
    """Work for the GPU thread: ``fn`` runs there and returns CPU data; the outcome goes back on ``reply``."""

    fn: Callable[[], Any]
    reply: trio.MemorySendChannel[outcome.Outcome]


@attrs.define(eq=False)
class ScoreWork:
    """One admitted scoring call on its way through the packer; ``abandoned`` is set when its caller went away.

    The packer owns it, and its ``slot``, once received: `finish` answers it and frees the slot, `drop` frees the
    slot of a call nobody waits for any more.
    """

    body: object
    request_id: str
    chat: bool
    trusted: bool
    internals: bool
    reply: trio.MemorySendChannel[outcome.Outcome]
    slot: Slot
    admitted_at: float = 0.0
    abandoned: bool = False

    def finish(self, result: outcome.Outcome) -> None:
        try:
            self.reply.send_nowait(result)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the caller went away; nothing is waiting for this answer
        self.slot.release()

    def drop(self) -> None:
        self.slot.release()


def drain_file() -> Path:
    """The drain marker (api spec §3.4): ``SPINF_DRAIN_FILE``, else ``spinf-drain`` in the temporary folder."""
    return Path(os.environ.get("SPINF_DRAIN_FILE") or Path(tempfile.gettempdir()) / "spinf-drain")


@attrs.define
class ServerState:
    """Boot and readiness, as the probes and /v1/models report them (api spec §3)."""

    loaded: bool = False
    warm: bool = False
    load_error: str | None = None
    stopping: bool = False
    boot: dict = attrs.field(factory=dict)
    engine: Any = None  # the loaded engine; only the executor thread runs its torch work
    in_flight: int = 0
    queued: int = 0
    degraded: str | None = None  # device memory not freed after an out-of-memory error (api spec §3.2)
    degraded_seen: trio.Event = attrs.field(factory=trio.Event)

    @property
    def ready(self) -> bool:
        return self.loaded and self.warm and self.load_error is None

    def degrade(self, reason: str) -> None:
        """Mark the engine degraded: probes answer 503 with the reason, scoring goes on, the process exits soon."""
        if self.degraded is None:
            self.degraded = reason
            self.degraded_seen.set()

    @property
    def draining(self) -> bool:
        return drain_file().exists()

    def fail(self, exc: BaseException) -> None:
        self.load_error = f"{type(exc).__name__}: {exc}"


async def run_on_executor(executor: trio.MemorySendChannel[ExecJob], fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on the executor thread and return its value (or raise its exception).

    **Cancellation**: cancelling the caller abandons the reply; a job already handed over still runs.
    """
    reply_send, reply_recv = trio.open_memory_channel(1)  # one-shot reply
    with reply_recv:
        await executor.send(ExecJob(fn, reply_send))
        result = await reply_recv.receive()
    return result.unwrap()


def set_draining(on: bool) -> None:
    """Create (empty) or remove the drain marker; the state outlives the request and the process."""
    path = drain_file()
    if on:
        path.write_bytes(b"")
    else:
        path.unlink(missing_ok=True)
