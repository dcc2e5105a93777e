"""``spinf-serve score``: one body (api spec §10), or a whole inputs file with ``--inputs`` and ``--output``.

``score REQUEST [MODEL]`` scores the body (a file, ``-`` for stdin, or the JSON itself when it starts with ``{``;
`spinf.bulk.inputs.read_request`) and prints the public response JSON to stdout. With ``--inputs
FILE.jsonl --output FILE.jsonl`` REQUEST.json holds only the shared part of the body (``scoring``, optionally
``model`` and ``endpoint``) and every line of the inputs file is one input; see `spinf.bulk.run`. The engine runs
in-process (one batch at a time) unless ``--url`` names servers, which get ``--concurrency`` batches at once
between them; the key for those servers comes from ``SPINF_API_KEY``, as for spinf-client (none is sent when it
is unset or empty).

Exit status: 0 done; 1 an API error (its envelope, without ``rejected``, on stderr; in bulk mode its ``param``
counts inputs over the whole inputs file), or a run that could not go on (retries spent); 2 a bad argument, request
file, inputs file or output file (one line on stderr naming the file, or for an inputs file one line per bad line);
130 Ctrl-C: one line on stderr saying what was done, where the results are and how to go on, and no traceback.
When Ctrl-C leaves a batch running in a worker thread, the process ends at once (``os._exit``) rather than wait at
exit for a call that can take minutes; its result would be dropped anyway, and the output file is already closed.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from collections.abc import Callable

from spinf.bulk.errors import BatchFailed, BulkError, BulkInputError, request_id_of
from spinf.bulk.inputs import check_shared, describe_request, read_request
from spinf.bulk.output import dumps
from spinf.bulk.progress import ProgressBar
from spinf.bulk.remote import http_scorers
from spinf.bulk.run import Interrupted, run_bulk
from spinf.errors import ApiError, SpinfError

_PREFIX = "spinf-serve score"
_INTERRUPTED = 128 + signal.SIGINT  # the shell's status for a command ended by Ctrl-C


def _default_engine(settings):
    """The engine of the layered settings (the MODEL argument is one of their layers)."""
    from spinf import Engine

    return Engine.from_settings(settings)


class _EngineScorer:
    """The in-process scorer. The engine loads on the first call: in bulk mode, after every input line was checked
    (a typo should not cost a model load), and never when a resumed run finds nothing left to score."""

    def __init__(self, build: Callable[[], object], *, debug: bool):
        self._build = build
        self._debug = debug
        self._engine = None

    def __call__(self, body: dict) -> dict:
        if self._engine is None:
            self._engine = self._build()
        # a body scored from the command line is prepared as a trusted caller (api spec §10)
        return self._engine.score(body, debug=self._debug, trusted=True)


def _scorers(args, settings, make_engine: Callable[[], object] | None) -> tuple[list, bool]:
    """The scorers and whether they are remote (and so may run concurrently)."""
    urls = getattr(args, "url", None)
    if urls:
        return http_scorers(urls, token=os.environ.get("SPINF_API_KEY") or None), True
    build = make_engine or functools.partial(_default_engine, settings)
    return [_EngineScorer(build, debug=bool(settings.server.debug))], False


def _check_mode(args) -> None:
    if args.inputs is None:
        extra = [flag for flag, given in (("--output", args.output), ("--resume", args.resume)) if given]
        if extra:
            raise BulkInputError(f"{' and '.join(extra)} {'needs' if len(extra) == 1 else 'need'} --inputs FILE.jsonl")
    elif args.output is None:
        raise BulkInputError("--inputs needs --output FILE.jsonl")


def _run_file(args, request: dict, scorers: list, remote: bool) -> None:
    check_shared(request, describe_request(args.request))
    show = not args.no_progress and sys.stderr.isatty()
    bar = ProgressBar(sys.stderr) if show else None
    try:
        stats = run_bulk(
            request,
            args.inputs,
            args.output,
            scorer=scorers,
            batch_size=args.batch_size,
            concurrency=args.concurrency if remote else 1,
            resume=args.resume,
            progress=bar,
        )
    finally:
        if bar is not None:
            bar.close()
    print(
        f"{_PREFIX}: wrote {stats.scored:,} results to {args.output} in {stats.elapsed_s:.1f} s"
        + (f" ({stats.skipped:,} were there already)" if stats.skipped else ""),
        file=sys.stderr,
    )


def _interrupted(args, exc: KeyboardInterrupt) -> int:
    """The one line of a Ctrl-C, and its exit status; see the module docstring for ``os._exit``."""
    if isinstance(exc, Interrupted):
        stats, again = exc.stats, "the same command" if args.resume else "the same command with --resume"
        line = (
            f"interrupted: {stats.skipped + stats.scored:,} of {stats.total:,} inputs have their results in "
            f"{args.output} ({stats.scored:,} written by this run); run {again} to score the rest"
        )
    elif args.inputs is not None:
        line = f"interrupted before scoring began: nothing was written to {args.output}"
    else:
        line = f"interrupted: {describe_request(args.request)} was not scored"
    print(f"{_PREFIX}: {line}", file=sys.stderr)
    if isinstance(exc, Interrupted) and exc.running:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_INTERRUPTED)
    return _INTERRUPTED


def main(args, settings, *, make_engine: Callable[[], object] | None = None) -> int:
    """Runs ``score`` for parsed ``args``; ``make_engine`` replaces building the engine from ``settings``."""
    try:
        _check_mode(args)
        request = read_request(args.request, sys.stdin.buffer)
        scorers, remote = _scorers(args, settings, make_engine)
        if args.inputs is None:
            print(dumps(scorers[0](request)))
        else:
            _run_file(args, request, scorers, remote)
        return 0
    except BatchFailed as exc:
        print(f"{_PREFIX}: {exc.where} was refused:", file=sys.stderr)
        print(json.dumps(exc.envelope()), file=sys.stderr)
        return 1
    except ApiError as exc:
        print(json.dumps(exc.envelope(request_id_of(exc))), file=sys.stderr)
        return 1
    except BulkInputError as exc:
        print(f"{_PREFIX}: {exc}", file=sys.stderr)
        return 2
    except BulkError as exc:
        print(f"{_PREFIX}: {exc}", file=sys.stderr)
        return 1
    except SpinfError as exc:  # a model that cannot load, a bad setting
        print(f"{_PREFIX}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        return _interrupted(args, exc)
