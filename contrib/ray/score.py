"""Bulk scoring on Ray Data: ``spinf-serve score --inputs``, with the batches spread over a Ray cluster's GPUs.

``python -m contrib.ray.score REQUEST.json [MODEL] --inputs FILE.{jsonl,parquet} --output FILE.jsonl`` writes the
same output file as ``spinf-serve score`` with the same request and inputs, line for line (docs/bulk-scoring.md),
because every step but the scoring is `spinf.bulk`'s own: checking the request part and every input line
(`scan_inputs`), resuming (`read_done`), cutting batches by count and bytes (`batches`), scoring a batch and
turning its response into output lines (`spinf.bulk.run._score_batch`, `result_lines`), writing whole lines in
input order (`OutputWriter`), and the progress bar.

What Ray adds: the batches become a Ray Dataset of one row per batch, and ``map_batches`` hands the rows to

- **an actor pool** (the default): ``--actors N`` actors (default: one per GPU of the cluster), each reserving
  ``--gpus-per-actor`` GPUs (default 1; Ray sets each actor's ``CUDA_VISIBLE_DEVICES``, so ``--device cuda:0`` is
  that actor's own GPU) and holding one `spinf.Engine` built from the settings given here, as ``spinf-serve score``
  builds it in-process. An actor scores one batch at a time; the pool hands the next row to whichever actor is free;
- or **running servers** (``--url``, repeatable): ``--actors N`` Ray tasks at once POST the batches to the servers
  with `spinf.bulk.remote`'s retries (429, 5xx, timeouts), batch k to ``urls[k % len(urls)]``, as
  ``spinf-serve score --url`` does.

The driver reads the results back in order (Ray Data's ``preserve_order``) and appends them, so a run that stops
leaves a prefix of whole lines and ``--resume`` scores the rest. **Retries:** Ray Data restarts an actor that dies
(a lost node, a killed process) and sends its batch again, without limit; a scorer's refusal (a 4xx: a bad input)
is the same on every try, so it stops the run, as in ``spinf-serve score``. **Parquet:** the driver converts the
file to JSON Lines in a temporary folder first (null fields, Parquet's way of leaving a column out of a row, are
dropped), so the checks and error messages are `spinf.bulk`'s: ``line n`` is the file's row n, counting from 1.
**Memory:** the driver holds the inputs still to score once, while it builds the dataset; Ray's object store keeps
them from then on (spilling to disk when it must).

Exit status as for ``spinf-serve score``: 0 done; 1 a refused batch or a run that could not go on; 2 a bad argument,
file or setting; 130 Ctrl-C (the output keeps the whole lines written so far).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import numpy as np

from spinf.bulk.command import _EngineScorer
from spinf.bulk.errors import BatchFailed, BulkError, BulkInputError
from spinf.bulk.inputs import (
    MAX_BATCH_BYTES,
    Item,
    batch_budget,
    batches,
    check_shared,
    read_items,
    read_json_object,
    scan_inputs,
)
from spinf.bulk.output import OutputWriter, check_fresh, dumps, read_done
from spinf.bulk.progress import ProgressBar
from spinf.bulk.remote import http_scorers
from spinf.bulk.run import BulkStats, _score_batch
from spinf.errors import SpinfError

_PREFIX = "contrib.ray.score"
_INTERRUPTED = 130


# --- the inputs: JSON Lines as they are, Parquet converted to JSON Lines ---


def _without_nulls(value: object) -> object:
    if isinstance(value, dict):
        return {key: _without_nulls(v) for key, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def parquet_to_jsonl(parquet: str | Path, jsonl: str | Path) -> Path:
    """Writes one JSON line per Parquet row, in row order, without the row's null fields; returns ``jsonl``."""
    import pyarrow.parquet as pq

    try:
        source = pq.ParquetFile(parquet)
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise BulkInputError(f"cannot read the inputs file {str(parquet)!r} as Parquet: {exc}") from exc
    with Path(jsonl).open("w", encoding="utf-8") as out:
        for table in source.iter_batches(batch_size=4096):
            out.writelines(dumps(_without_nulls(row)) + "\n" for row in table.to_pylist())
    return Path(jsonl)


# --- the scorers that run in Ray: one batch per dataset row, its output lines or its failure back ---

_ROW_FIELDS = ("index", "line", "id", "body", "size")


def _encode(batch: list[Item]) -> str:
    return json.dumps([[getattr(item, name) for name in _ROW_FIELDS] for item in batch])


def _decode(text: str) -> list[Item]:
    return [Item(*fields) for fields in json.loads(text)]


def _score_rows(scorers: Sequence[Callable[[dict], dict]], request: dict, rows: dict) -> dict:
    """Scores each row's batch with ``scorers[k % len(scorers)]``; a refusal or failure goes back as the row's
    ``error`` (a Ray task error would lose what the driver prints), and the driver stops at the first."""
    lines, errors = [], []
    for k, text in zip(rows["k"], rows["batch"], strict=True):
        try:
            done = _score_batch(scorers[int(k) % len(scorers)], request, _decode(text))
        except BatchFailed as exc:
            lines.append("")
            errors.append(f"{exc.where} was refused:\n{json.dumps(exc.envelope())}")
        except BulkError as exc:
            lines.append("")
            errors.append(str(exc))
        else:
            lines.append(b"".join(done).decode("utf-8"))
            errors.append("")
    return {"k": np.asarray(rows["k"]), "lines": np.asarray(lines, dtype=object), "error": np.asarray(errors, object)}


class EngineActor:
    """One actor of the pool: an engine built once from the settings, scoring one batch at a time."""

    def __init__(self, settings, request: dict):
        from spinf import Engine

        engine = Engine.from_settings(settings)  # here, so that the pool counts the actor ready once it is loaded
        self._scorers = [_EngineScorer(lambda: engine, debug=bool(settings.server.debug))]
        self._request = request

    def __call__(self, rows: dict) -> dict:
        return _score_rows(self._scorers, self._request, rows)


def _score_over_http(rows: dict, *, urls: list[str], token: str | None, request: dict) -> dict:
    return _score_rows(http_scorers(urls, token=token), request, rows)


# --- the driver ---


@attrs.frozen
class Pool:
    """Where the batches are scored: ``urls`` (running servers) or, when empty, an actor pool built from
    ``settings`` (the layered settings of `spinf.settings`, as ``spinf-serve score`` reads them)."""

    actors: int
    settings: object = None
    urls: tuple[str, ...] = ()
    token: str | None = None
    gpus_per_actor: float = 1.0
    cpus_per_actor: float = 1.0


def _scored(rows: list[dict], request: dict, pool: Pool):
    """The dataset of output rows, one per input row, in input order."""
    import ray.cloudpickle
    import ray.data

    # The actors and tasks get this module's code by value: the workers need the spinf package, not this checkout.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True
    context.enable_progress_bars = False  # ours counts inputs and draws on one line
    dataset = ray.data.from_items(rows, override_num_blocks=len(rows))
    if pool.urls:
        return dataset.map_batches(
            _score_over_http,
            batch_size=1,
            compute=ray.data.TaskPoolStrategy(size=pool.actors),
            num_cpus=pool.cpus_per_actor,
            fn_kwargs={"urls": list(pool.urls), "token": pool.token, "request": request},
        )
    # Settings hold their origins in a read-only mapping, which does not pickle; a dict does.
    settings = attrs.evolve(pool.settings, origins=dict(pool.settings.origins))
    return dataset.map_batches(
        EngineActor,
        batch_size=1,
        compute=ray.data.ActorPoolStrategy(size=pool.actors),
        num_gpus=pool.gpus_per_actor,
        num_cpus=pool.cpus_per_actor,
        fn_constructor_kwargs={"settings": settings, "request": request},
    )


def _rows(inputs: Path, done: set[str], batch_size: int, budget: int) -> list[dict]:
    """The dataset's rows: batch k of the inputs not yet done, cut as `spinf.bulk.run.run_bulk` cuts them."""
    todo = (item for item in read_items(inputs) if item.id not in done)
    return [{"k": k, "batch": _encode(batch)} for k, batch in enumerate(batches(todo, batch_size, budget))]


def run_ray(
    request: dict,
    inputs_path: str | Path,
    output_path: str | Path,
    *,
    pool: Pool,
    batch_size: int = 64,
    resume: bool = False,
    progress: Callable[[int, int], None] | None = None,
    max_batch_bytes: int = MAX_BATCH_BYTES,
) -> BulkStats:
    """Scores every input of ``inputs_path`` (JSON Lines, or Parquet by its ``.parquet`` suffix) not yet in
    ``output_path`` on the running Ray (``ray.init`` first); see the module docstring."""
    check_shared(request)
    budget = batch_budget(request, max_batch_bytes)
    with tempfile.TemporaryDirectory(prefix="spinf-ray-") as folder:
        inputs = Path(inputs_path)
        if inputs.suffix.lower() in (".parquet", ".pq"):
            inputs = parquet_to_jsonl(inputs, Path(folder) / "inputs.jsonl")
        index = scan_inputs(inputs)
        done = read_done(output_path, index) if resume else check_fresh(output_path) or set()
        rows = _rows(inputs, done, batch_size, budget)
    report = progress or (lambda done, total: None)
    report(len(done), index.total)
    started = time.monotonic()
    with OutputWriter(output_path) as out:
        if rows:
            for row in _scored(rows, request, pool).iter_rows():
                if row["error"]:
                    raise BulkError(row["error"])
                out.write(row["lines"].encode("utf-8").splitlines(keepends=True))
                report(len(done) + out.num_lines, index.total)
    return BulkStats(index.total, len(done), out.num_lines, len(rows), time.monotonic() - started)


# --- the command line ---


def _parser() -> argparse.ArgumentParser:
    from spinf.settings.flags import add_flags

    parser = argparse.ArgumentParser(
        prog=f"python -m {_PREFIX}", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    parser.add_argument("request", metavar="REQUEST", help="the shared part of every body (JSON)")
    add_flags(parser)
    job = parser.add_argument_group("the Ray job")
    job.add_argument("--inputs", required=True, metavar="FILE", help="one input per line (.jsonl) or row (.parquet)")
    job.add_argument("--output", required=True, metavar="FILE.jsonl", help="where the results go, one line per input")
    job.add_argument("--url", action="append", metavar="URL", help="score on this running server (repeatable)")
    job.add_argument("--actors", type=int, metavar="N", help="engine actors, or HTTP tasks at once (one per GPU)")
    job.add_argument("--gpus-per-actor", type=float, default=1.0, metavar="N", help="GPUs each engine actor holds (1)")
    job.add_argument("--cpus-per-actor", type=float, default=1.0, metavar="N", help="CPUs each actor or task holds")
    job.add_argument("--batch-size", type=int, default=64, metavar="N", help="inputs per batch (64)")
    job.add_argument("--resume", action="store_true", help="skip the inputs already in --output")
    job.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    job.add_argument("--address", metavar="ADDRESS", help="the Ray cluster to join (default: a local one)")
    return parser


def _pool(args: argparse.Namespace) -> Pool:
    import ray

    if args.url:
        actors = args.actors or 4
        return Pool(actors, urls=tuple(args.url), token=os.environ.get("SPINF_API_KEY") or None)
    from spinf.catalog import resolve_model
    from spinf.settings import load_settings
    from spinf.settings.flags import flags_from_args

    def manifest_defaults(model: str):
        return resolve_model(model).engine_defaults()

    settings = load_settings(flags_from_args(args), os.environ, manifest_defaults=manifest_defaults)
    gpus = args.gpus_per_actor
    actors = args.actors or (int(ray.cluster_resources().get("GPU", 0) // gpus) if gpus else 0)
    if actors < 1:
        raise BulkInputError("the Ray cluster has no GPU for an engine actor: give --actors (and --gpus-per-actor 0)")
    return Pool(actors, settings=settings, gpus_per_actor=gpus, cpus_per_actor=args.cpus_per_actor)


def main(argv: list[str] | None = None) -> int:
    import ray

    parser = _parser()
    args = parser.parse_args(argv)
    for flag, value in (("--batch-size", args.batch_size), ("--actors", args.actors)):
        if value is not None and value < 1:
            parser.error(f"{flag} must be at least 1, got {value}")
    ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    bar = ProgressBar(sys.stderr) if not args.no_progress and sys.stderr.isatty() else None
    try:
        request = read_json_object(args.request, "request file")
        stats = run_ray(
            request,
            args.inputs,
            args.output,
            pool=_pool(args),
            batch_size=args.batch_size,
            resume=args.resume,
            progress=bar,
        )
    except SpinfError as exc:
        print(f"{_PREFIX}: {exc}", file=sys.stderr)
        # 1: a refused batch or a run that could not go on; 2: a bad file or setting, a model that cannot load
        return 1 if isinstance(exc, BulkError) and not isinstance(exc, BulkInputError) else 2
    except ray.exceptions.RayError as exc:  # an actor that cannot start (its engine did not load), a lost cluster
        print(f"{_PREFIX}: the Ray job failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{_PREFIX}: interrupted; run the same command with --resume to score the rest", file=sys.stderr)
        return _INTERRUPTED
    finally:
        if bar is not None:
            bar.close()
        ray.shutdown()
    print(
        f"{_PREFIX}: wrote {stats.scored:,} results to {args.output} in {stats.elapsed_s:.1f} s"
        + (f" ({stats.skipped:,} were there already)" if stats.skipped else ""),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
