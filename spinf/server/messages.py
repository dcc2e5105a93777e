"""The messages on the server's channels, and how an actor sends work to the executor thread.

Messages hand ownership to the receiver. A request carries a one-shot reply channel (buffer 1) and, for a scoring
call, its admission slot (`spinf.server.admission.Slot`), released by whoever ends the call. The executor takes
`ExecJob`s (`run_on_executor` sends one and waits for its outcome), the packer `ScoreWork`s, the pack syncer
`PackReload`s, each answered with a `Reloaded`.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import outcome
import trio

from spinf.server.admission import Slot


@attrs.frozen(eq=False)
class ExecJob:
    """Work for the GPU thread: ``fn`` runs there and returns CPU data; the outcome goes back on ``reply``."""

    fn: Callable[[], object]
    reply: trio.MemorySendChannel[outcome.Outcome]


@attrs.define(eq=False)
class ScoreWork:
    """One admitted scoring call on its way through the packer; ``abandoned`` is set when its caller went away.

    The packer owns it, and its ``slot``, once received (`take`): `finish` answers it and frees the slot, `drop`
    frees the slot of a call nobody waits for any more. A caller that goes away (`abandon`) frees the slot at once
    when the packer has taken the call: the packer's inbox holds only calls not yet taken, so it still never holds
    more calls than there are slots; a call still in the inbox frees its slot when the packer takes it.
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
    taken: bool = False

    def take(self) -> bool:
        """The packer takes the call from its inbox: False (its slot freed) when its caller went away already."""
        self.taken = True
        if self.abandoned:
            self.slot.release()
        return not self.abandoned

    def abandon(self) -> None:
        """The caller went away: the packer drops the call before its next step; its slot is free now if the
        packer has taken it (else when it does)."""
        self.abandoned = True
        if self.taken:
            self.slot.release()

    def finish(self, result: outcome.Outcome) -> None:
        try:
            self.reply.send_nowait(result)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the caller went away; nothing is waiting for this answer
        self.slot.release()

    def drop(self) -> None:
        self.slot.release()


@attrs.frozen(eq=False)
class PackReload:
    """A request to re-read the pack sources (``POST /v0/packs/reload`` or SIGHUP): ``by`` names who asked;
    ``reply`` (buffer 1, None for a signal) gets the `Reloaded` of the reload that served it; ``refresh``: resolve
    the GitHub tags again rather than use the cached commits (``?refresh=true``)."""

    by: str
    reply: trio.MemorySendChannel[Reloaded] | None = None
    refresh: bool = False

    def answer(self, reloaded: Reloaded) -> None:
        if self.reply is None:
            return
        with self.reply:
            try:
                self.reply.send_nowait(reloaded)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the caller went away


@attrs.frozen
class Reloaded:
    """What one reload did (the body of ``POST /v0/packs/reload``): whether the new catalog was swapped in, why
    not (``reason``: ``no_source``, ``catalog_errors`` or ``official_lost``; None when applied), the problems
    found (the catalog errors, or the official source's failure that would have dropped it), the official error
    of what was read, and the source labels and counts of the catalog in use after it (the old one when not
    applied). ``requests``: how many waiting requests this one reload answered."""

    applied: bool
    reason: str | None
    errors: tuple[str, ...]
    official_error: str | None
    sources: tuple[str, ...]
    packs: int
    versions: int
    skipped: int
    requests: int = 1

    def as_dict(self) -> dict:
        body = attrs.asdict(self, recurse=False)
        return {**body, "errors": list(self.errors), "sources": list(self.sources)}


async def run_on_executor(executor: trio.MemorySendChannel[ExecJob], fn: Callable[[], object]) -> object:
    """Run ``fn`` on the executor thread and return its value (or raise its exception).

    **Cancellation**: cancelling the caller abandons the reply; a job already handed over still runs.
    """
    reply_send, reply_recv = trio.open_memory_channel(1)  # one-shot reply
    with reply_recv:
        await executor.send(ExecJob(fn, reply_send))
        result = await reply_recv.receive()
    return result.unwrap()
