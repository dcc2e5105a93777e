"""`run_bulk`: score an inputs file batch by batch and append the results to the output file, in input order.

Straight-line: check the shared request part and every input line, read back what a previous run wrote
(``resume``), then cut the remaining inputs into batches and hand them to a pool of ``concurrency`` worker threads,
batch k going to ``scorers[k % len(scorers)]``. The main thread writes finished batches in submission order, so a
finished batch waits for the ones before it; at most ``2 * concurrency`` batches are submitted but not yet
written, which bounds memory whatever the file's size. Because the output is always written in order, the inputs
not yet written after a crash are a suffix of the remaining ones, and ``resume`` skips exactly the written ids.

An in-process engine is not thread-safe: give it ``concurrency=1``.

**Cancellation:** an exception (a refused batch, spent retries) stops submitting, cancels the batches not yet
started and waits for those in a worker to end; their results are dropped. Ctrl-C (``KeyboardInterrupt``) while
scoring does the same without the wait, since a call in flight to a server can take minutes (timeouts, retries),
and raises `Interrupted`, which says what the output holds and whether a batch is still running in a worker. The
output then holds whole lines of a prefix, and ``resume`` picks up from there, scoring the dropped batches again.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import attrs

from spinf.bulk.errors import BatchFailed, BulkError, BulkInputError
from spinf.bulk.inputs import MAX_BATCH_BYTES, Item, batch_budget, batches, check_shared, read_items, scan_inputs
from spinf.bulk.output import OutputWriter, check_fresh, read_done, result_lines
from spinf.errors import ApiError

ScoreCall = Callable[[dict], dict]  # one /v1/score call: a body in, its response out (in-process or over HTTP)


@attrs.frozen
class BulkStats:
    """What a run did."""

    total: int  # inputs in the inputs file
    skipped: int  # already in the output when the run started (resume)
    scored: int  # scored and written by this run
    batches: int  # batches this run sent
    elapsed_s: float


class Interrupted(KeyboardInterrupt):
    """Ctrl-C while `run_bulk` was scoring. Still a ``KeyboardInterrupt``, but with ``stats``: what the output file
    holds now (whole lines, closed and fsynced), and ``running``: batches left running in worker threads, whose
    results are dropped (the interpreter waits for those threads at exit)."""

    def __init__(self, stats: BulkStats, running: int):
        super().__init__()
        self.stats = stats
        self.running = running


def _score_batch(scorer: ScoreCall, request: dict, batch: list[Item]) -> list[bytes]:
    body = {**request, "inputs": [item.body for item in batch]}
    try:
        response = scorer(body)
    except ApiError as exc:
        raise BatchFailed(exc, batch) from exc
    except BulkError as exc:
        raise BulkError(f"{exc} (the batch starting at input {batch[0].id!r}, line {batch[0].line})") from exc
    return result_lines(batch, response)


def _in_order(
    pool: ThreadPoolExecutor,
    scorers: list[ScoreCall],
    request: dict,
    todo: Iterable[list[Item]],
    max_pending: int,
    pending: deque[Future],
) -> Iterator[list[bytes]]:
    """The output lines of each batch in submission order, with at most ``max_pending`` submitted but not yet
    yielded. Those are in ``pending``, the one waited for included (the caller's, so that it can tell which still
    run when it stops)."""
    for k, batch in enumerate(todo):
        if len(pending) >= max_pending:
            yield pending[0].result()
            pending.popleft()
        pending.append(pool.submit(_score_batch, scorers[k % len(scorers)], request, batch))
    while pending:
        yield pending[0].result()
        pending.popleft()


def _check_arguments(scorer, batch_size: int, concurrency: int) -> list[ScoreCall]:
    scorers = [scorer] if callable(scorer) else list(scorer)
    if not scorers:
        raise BulkInputError("no scorer given")
    for name, value in (("batch size", batch_size), ("concurrency", concurrency)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BulkInputError(f"the {name} must be a whole number of at least 1, got {value!r}")
    return scorers


def run_bulk(
    request: dict,
    inputs_path: str | Path,
    output_path: str | Path,
    *,
    scorer: ScoreCall | Sequence[ScoreCall],
    batch_size: int = 64,
    concurrency: int = 1,
    resume: bool = False,
    progress: Callable[[int, int], None] | None = None,
    max_batch_bytes: int = MAX_BATCH_BYTES,
) -> BulkStats:
    """Scores every input of ``inputs_path`` not yet in ``output_path``; see the module docstring.

    ``request`` is the shared body part (``scoring``, ``model``, ``endpoint``…). ``scorer`` is one callable or a
    list of them, each taking a ``/v1/score`` body and returning its response or raising `ApiError`. ``progress``
    is called with ``(done, total)`` at the start and after each written batch.
    """
    scorers = _check_arguments(scorer, batch_size, concurrency)
    check_shared(request)
    budget = batch_budget(request, max_batch_bytes)
    index = scan_inputs(inputs_path)
    if resume:
        done = read_done(output_path, index)
    else:
        check_fresh(output_path)
        done = set()
    report = progress or (lambda done, total: None)
    report(len(done), index.total)
    todo = batches((item for item in read_items(inputs_path) if item.id not in done), batch_size, budget)
    started = time.monotonic()
    num_batches = 0
    pending: deque[Future] = deque()
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="spinf-bulk")
    wait = True
    try:
        with OutputWriter(output_path) as out:
            try:
                for lines in _in_order(pool, scorers, request, todo, 2 * concurrency, pending):
                    out.write(lines)
                    num_batches += 1
                    report(len(done) + out.num_lines, index.total)
            except KeyboardInterrupt as interrupt:
                wait = False
                pool.shutdown(wait=False, cancel_futures=True)
                stats = BulkStats(index.total, len(done), out.num_lines, num_batches, time.monotonic() - started)
                raise Interrupted(stats, sum(not future.done() for future in pending)) from interrupt
    finally:
        pool.shutdown(wait=wait, cancel_futures=True)
    return BulkStats(index.total, len(done), out.num_lines, num_batches, time.monotonic() - started)
