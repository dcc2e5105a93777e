"""The loader: resolves and loads the model through the executor thread, then hands the engine to warm-up.

Loading runs in the background so that ``/healthz`` answers at once (api spec §3.1). A failure is stored in the
state (``/readyz`` and ``/livez`` then answer 503 with the reason, scoring 503 ``model_unavailable``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import attrs
import trio

from spinf.serving import ExecJob, ServerState, run_on_executor

log = logging.getLogger(__name__)


@attrs.frozen
class LoaderStats:
    loaded: bool
    load_s: float | None


@attrs.define
class Loader:
    """**Inbox**: none. **Outbox**: the loaded engine, once, on ``loaded`` (then closed).
    **Ends**: after one load, successful or not. **Cancellation**: a load in the executor thread runs to its end;
    the cancel only stops waiting for it, and nothing is sent.
    """

    executor: trio.MemorySendChannel[ExecJob]
    loaded: trio.MemorySendChannel[Any]
    state: ServerState
    load: Callable[[], Any]
    _load_s: float | None = None

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        with self.loaded:
            started = trio.current_time()
            log.info("loading the model")
            try:
                engine = await run_on_executor(self.executor, self.load)
            except Exception as exc:  # any load failure is reported, not raised: the server keeps answering
                log.error("the model failed to load: %s: %s", type(exc).__name__, exc)
                self.state.fail(exc)
                return
            self._load_s = trio.current_time() - started
            self.state.engine = engine
            self.state.loaded = True
            self.state.boot.update(load_s=round(self._load_s, 3), weights=getattr(engine, "weights", "config"))
            log.info("model loaded in %.1f s", self._load_s)
            await self.loaded.send(engine)

    def statistics(self) -> LoaderStats:
        return LoaderStats(self.state.loaded, self._load_s)
