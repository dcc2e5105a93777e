"""The loader: loads the model through the executor thread, publishes its facts, then hands the engine to warm-up.

Loading runs in the background so that ``/healthz`` answers at once (api spec §3.1). The load job also takes the
engine's `EngineFacts` (``engine.info()`` reads torch, so it runs in the executor thread too); the facts go to the
lifecycle (loading -> warming), the engine itself only to the warm-up. A failure moves the lifecycle to failed
(``/readyz`` and ``/livez`` then answer 503 with the reason, scoring 503 ``model_unavailable``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import trio

from spinf.server.lifecycle import Lifecycle
from spinf.server.messages import ExecJob, run_on_executor
from spinf.server.served import EngineFacts, ServedEngine

log = logging.getLogger(__name__)


@attrs.define
class Loader:
    """**Inbox**: none. **Outbox**: one load job to the executor; the loaded engine, once, on ``loaded``; the
    engine's facts to the lifecycle. **Ends**: after one load, successful or not, closing its executor clone and
    ``loaded`` (so the warm-up learns there is no engine). **Cancellation**: a load in the executor thread runs to
    its end; the cancel only stops waiting for it, and nothing is sent or published.
    """

    executor: trio.MemorySendChannel[ExecJob]
    loaded: trio.MemorySendChannel[ServedEngine]
    lifecycle: Lifecycle
    load: Callable[[], ServedEngine]

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        with self.executor, self.loaded:
            started = trio.current_time()
            log.info("loading the model")
            try:
                engine, facts = await run_on_executor(self.executor, self._load_job)
            except Exception as exc:  # any load failure is reported, not raised: the server keeps answering
                log.error("the model failed to load: %s: %s", type(exc).__name__, exc)
                self.lifecycle.fail(exc)
                return
            load_s = trio.current_time() - started
            self.lifecycle.loaded(facts, load_s)
            log.info("model loaded in %.1f s", load_s)
            await self.loaded.send(engine)

    def _load_job(self) -> tuple[ServedEngine, EngineFacts]:
        """In the executor thread: the engine and its facts."""
        engine = self.load()
        return engine, EngineFacts.of(engine)
