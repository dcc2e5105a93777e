"""The ``spinf-serve`` command (also ``python -m spinf``): argument parsing and dispatch; no logic of its own.

Commands: ``serve [MODEL]`` (the HTTP server, ``spinf.server.supervisor``, after refusing an address it cannot
listen on, ``spinf.server.supervisor.bind_sockets``, what the manifest, the settings and the device decide,
``spinf.engine.opening.check_before_lookup``, and a model name that resolves to nothing,
``spinf.catalog.checkpoint.check_findable``), ``score REQUEST [MODEL]`` (``spinf.bulk``), ``config`` (the
effective settings with their origins, or ``--toml`` for a config file that reproduces them), ``download MODEL``
and ``models`` (``spinf.catalog``), ``calibrate`` and ``parity`` (``spinf.engine.calibrate``, ``spinf.engine.parity``),
``packs validate FOLDER`` (``spinf.packs.report``), ``packs list`` (``spinf.packs.listing``) and ``--version``.
``serve``, ``score`` and ``config`` take every setting's flag (``spinf.settings.flags``); ``calibrate`` and
``parity`` take the engine from the environment.
Every ``SpinfError``, and every usage error, is one line on stderr and exit status 2, never a traceback. The
catalog, the bulk scorer, the engine and the pack tools are imported only by the commands that use them, so
``config`` and ``--help`` stay quick.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from spinf._version import __version__
from spinf.errors import SpinfError
from spinf.server import start_signals

if TYPE_CHECKING:
    from spinf.settings import Settings

PROG = "spinf-serve"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (argparse prints the whole usage first), still with status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


def _parser() -> argparse.ArgumentParser:
    from spinf.settings.flags import add_flags

    parser = _Parser(prog=PROG, description="Scoring server for decision models.", allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, allow_abbrev=False)

    add_flags(command("serve", "run the HTTP server"))
    score = command("score", "score one request body, or a JSON Lines file of inputs, without a server")
    score.add_argument(
        "request",
        metavar="REQUEST",
        help="the request body (or its shared part with --inputs): a JSON file, - for stdin, or the JSON itself",
    )
    add_flags(score)
    bulk = score.add_argument_group("bulk scoring")
    bulk.add_argument("--inputs", metavar="FILE.jsonl", help="one input per line, scored with REQUEST's queries")
    bulk.add_argument("--output", metavar="FILE.jsonl", help="where the results go, one line per input")
    bulk.add_argument("--url", action="append", metavar="URL", help="score on this running server (repeatable)")
    bulk.add_argument("--batch-size", type=_positive, default=64, metavar="N", help="inputs per request (64)")
    bulk.add_argument("--concurrency", type=_positive, default=4, metavar="N", help="requests at once with --url (4)")
    bulk.add_argument("--resume", action="store_true", help="skip the inputs already in --output")
    bulk.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    config = command("config", "show the effective settings and where each came from")
    add_flags(config)
    config.add_argument("--toml", action="store_true", help="print a commented config file that reproduces them")
    download = command("download", "fetch (or, for the tiny model, generate) a model's checkpoint; print its folder")
    download.add_argument("model", metavar="MODEL")
    download.add_argument("--dir", default=None, help="the hub cache folder to use")
    command("models", "list the catalog's models and whether each is present locally")
    calibrate = command("calibrate", "build the fp8s activation-scale table of the model in SPINF_MODEL (etc.)")
    calibrate.add_argument("--corpus", required=True, metavar="FILE", help="scoring requests, gzip JSON (or JSON)")
    calibrate.add_argument("--fixture", default=None, metavar="F", help="parity fixture: SPINF_FIXTURE, else built-in")
    calibrate.add_argument("--images", default=None, metavar="DIR", help="JPEG and PNG, read at high and low detail")
    calibrate.add_argument("--audio", default=None, metavar="DIR", help="WAV clips")
    calibrate.add_argument("--n-images", type=_positive, default=24, metavar="N", help="images drawn from DIR (24)")
    calibrate.add_argument("--n-audio", type=_positive, default=8, metavar="N", help="clips drawn from --audio (8)")
    calibrate.add_argument("--headroom", type=float, default=2.0, help="scales cover this times the largest input")
    calibrate.add_argument("--out", default=None, metavar="FILE", help="write here instead of the table store")
    calibrate.add_argument("--device", default=None, help="the torch device (default: the device setting)")
    parity = command("parity", "score the parity fixture on the model in SPINF_MODEL (etc.), compare with a reference")
    parity.add_argument("--fixture", default=None, metavar="F", help="JSON or gzip (SPINF_FIXTURE, else built-in)")
    parity.add_argument("--reference", default=None, metavar="R", help="a recorded run; exit 1 unless it matches")
    parity.add_argument("--passes", type=_positive, default=2, metavar="N", help="runs of the whole fixture (2)")
    parity.add_argument("--record", default=None, metavar="OUT", help="write the fixture with this run's values")
    parity.add_argument("--device", default=None, help="the torch device (default: the device setting)")
    packs = command("packs", "prompt-pack tools for pack authors").add_subparsers(
        dest="packs_command", required=True, metavar="PACKS_COMMAND"
    )
    validate = packs.add_parser(
        "validate",
        help="check a folder's manifest and pack files",
        description="check a folder's manifest and pack files (schema, lock, referenced files); exit 1 on a problem",
        allow_abbrev=False,
    )
    validate.add_argument("folder", metavar="FOLDER")
    listing = packs.add_parser(
        "list",
        help="list the pack versions a server with these options would enable",
        description="build the pack catalog a server with these options would build (no model is loaded); exit 1 on"
        " a catalog error",
        allow_abbrev=False,
    )
    listing.add_argument("--packs", action="append", default=[], metavar="SOURCE", help="a pack source (repeatable)")
    listing.add_argument("--model", default=None, metavar="ID", help="keep only the versions for this model")
    # serve's names for the same settings are aliases: a user copies them over from a serve command line
    listing.add_argument(
        "--no-official", "--no-official-packs", action="store_true", help="leave out the official pack repository"
    )
    listing.add_argument(
        "--allow-namespace",
        "--packs-allow-namespace",
        action="append",
        default=[],
        metavar="NS",
        help="allow a reserved namespace (repeatable)",
    )
    listing.add_argument("--refresh", "--packs-refresh", action="store_true", help="resolve cached tags again")
    return parser


def serve_flags(argv: list[str]) -> dict[str, object]:
    """The settings flags of a ``serve`` command line (the words after ``serve``) as ``serve`` reads them, for
    ``load_settings``; the container's health probe reads the running server's port this way. Raises
    ``SystemExit`` on a command line ``serve`` would refuse."""
    from spinf.settings.flags import flags_from_args

    return flags_from_args(_parser().parse_args(["serve", *argv]))


def _manifest_defaults(model: str) -> Mapping[str, object]:
    from spinf.catalog import resolve_model

    return resolve_model(model).engine_defaults()


def _settings(args: argparse.Namespace) -> Settings:
    from spinf.settings import load_settings
    from spinf.settings.flags import flags_from_args

    return load_settings(flags_from_args(args), os.environ, manifest_defaults=_manifest_defaults)


def _serve(args: argparse.Namespace) -> int:
    """Refuses, before anything starts or is fetched, a start that cannot work: a listening address that cannot be
    bound (`bind_sockets`), what the manifest, the settings and the device decide (`check_before_lookup`), then a
    Hub repo id that is neither cached nor on the Hub (api spec §9.6, which asks the Hub). What the settings note (a
    key outside its section, a reference setting with no effect here) is logged first, once. The model is resolved
    here once, beside the settings' manifest layer, and handed down to the checks, the server and its engine."""
    settings = _settings(args)
    if settings.notes:
        from spinf.server.logs import configure
        from spinf.settings import log_notes

        configure(settings.server.log_format)
        log_notes(settings)
    from spinf.server.supervisor import bind_sockets, run

    sockets = bind_sockets(settings.server)  # an address in use: one line, before any load
    from spinf.catalog import resolve_model
    from spinf.catalog.checkpoint import check_findable
    from spinf.engine.opening import check_before_lookup  # torch, for the device's facts

    engine = settings.engine
    model = resolve_model(engine.model)
    resolved, _ = check_before_lookup(
        model,
        device=engine.device,
        quant=engine.quant,
        model_dir=engine.model_dir,
        revision=engine.revision,
        model_id=engine.model_id,
    )
    check_findable(
        resolved,
        model_dir=engine.model_dir,
        revision=engine.revision,
        cache_dirs=list(engine.cache_dirs) or None,
    )
    # a pack reload reads the layers again: the config file may have changed the pack settings since the start
    return run(settings, resolved=model, reload_settings=lambda: _settings(args), sockets=sockets)


def _score(args: argparse.Namespace) -> int:
    from spinf.settings import log_notes

    settings = _settings(args)
    log_notes(settings)  # warnings: on stderr even without a log set-up
    from spinf.bulk import main as bulk_main

    return bulk_main(args, settings)


def _config(args: argparse.Namespace) -> int:
    from spinf.settings.flags import describe, to_toml

    settings = _settings(args)
    print(to_toml(settings) if args.toml else describe(settings), end="" if args.toml else "\n")
    for note in settings.notes:  # what `serve` would log at start
        print(f"{PROG}: warning: {note}", file=sys.stderr)
    return 0


def _download(args: argparse.Namespace) -> int:
    from spinf.catalog import TinySnapshotMissing, download_model

    try:
        folder = download_model(args.model, args.dir)
    except TinySnapshotMissing as missing:
        from spinf.engine.gemma4.tiny import generate_snapshot  # torch, for the one model that is generated

        folder = generate_snapshot(missing).folder
    print(folder)
    return 0


def _models(args: argparse.Namespace) -> int:
    from spinf.catalog import describe_catalog

    rows = [("ID", "NAME", "FAMILY", "STATUS", "LOCAL", "ALIASES")]
    for row in describe_catalog():
        local = (row.get("path") or "yes") if row.get("present") else "-"
        rows.append((row["id"], row["name"], row["family"], row["status"], local, ", ".join(row["aliases"]) or "-"))
    widths = [max(len(str(cell)) for cell in column) for column in zip(*rows, strict=True)]
    for row in rows:
        print("  ".join(f"{cell!s:<{width}}" for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    """The engine comes from the environment (api spec §10); the table goes to the store unless ``--out``. The
    files and folders are checked before the (slow) load."""
    from spinf.settings import load_settings

    flags = {"device": args.device} if args.device else {}
    settings = load_settings(flags, os.environ, manifest_defaults=_manifest_defaults)
    from spinf.engine.calibrate import calibrate, calibration_engine, check_folders, media_requests, read_corpus
    from spinf.engine.parity import read_fixture
    from spinf.engine.scales import store_path, write_table

    corpus = read_corpus(args.corpus)
    fixture = read_fixture(args.fixture or os.environ.get("SPINF_FIXTURE") or None)
    check_folders(args.images, args.audio)
    engine = calibration_engine(settings)
    media = media_requests(engine, args.images, args.audio, n_images=args.n_images, n_audio=args.n_audio)
    table = calibrate(engine, corpus, headroom=args.headroom, media=media, fixture=fixture)
    path = args.out or store_path(engine.model_id, engine.revision)
    table_id = write_table(table, path)
    about = table["corpus"]
    inputs = ", ".join(f"{kind} {n}" for kind, n in about["inputs"].items())
    print(
        f"{path} (table {table_id}: {len(table['scales'])} linears, {about['requests']} requests scored, "
        f"{about['refused']} inputs refused; inputs: {inputs})"
    )
    return 0


def _parity(args: argparse.Namespace) -> int:
    """JSON on stdout (api spec §10, engine B.15). With ``--reference``, two lines on stderr: both platforms, then
    the verdict (`spinf.engine.verdict.judge`); exit 1 when it failed."""
    from spinf.settings import load_settings

    flags = {"device": args.device} if args.device else {}
    settings = load_settings(flags, os.environ, manifest_defaults=_manifest_defaults)
    from spinf.engine.engine import Engine
    from spinf.engine.parity import read_files, run_engine

    files = read_files(args.fixture or os.environ.get("SPINF_FIXTURE") or None, args.reference)
    started = time.perf_counter()
    engine = Engine.from_settings(settings)
    load_s = time.perf_counter() - started
    report, verdict = run_engine(engine, files, passes=args.passes, record=args.record, load_s=load_s)
    print(json.dumps(report, indent=1))
    if verdict is None:
        return 0
    for line in verdict.lines:
        print(f"{PROG}: parity: {line}", file=sys.stderr)
    return 0 if verdict.passed else 1


def _packs(args: argparse.Namespace) -> int:
    if args.packs_command == "list":
        from spinf.packs.listing import list_packs

        return list_packs(
            args.packs,
            model=args.model,
            official_on=not args.no_official,
            allowed=args.allow_namespace,
            refresh=args.refresh,
            out=sys.stdout,
            err=sys.stderr,
        )
    from spinf.packs.report import validate_folder

    return validate_folder(args.folder, sys.stdout, sys.stderr)


_COMMANDS = {
    "serve": _serve,
    "score": _score,
    "config": _config,
    "download": _download,
    "models": _models,
    "calibrate": _calibrate,
    "parity": _parity,
    "packs": _packs,
}


def main(argv: list[str] | None = None) -> int:
    # first, before the heavy imports: a SIGHUP or SIGTERM while `serve` starts must not end it without a word
    # (spinf.server.start_signals). Only `serve`: a hang-up still ends `score` as any terminal command.
    words = sys.argv[1:] if argv is None else argv
    serving = words[:1] == ["serve"]
    try:
        if serving:  # inside the try: a SIGTERM that comes as soon as its handler is in place is a stop too
            start_signals.install()
        return _command(_parser().parse_args(words))
    except start_signals.StartInterrupted as stop:  # a shutdown before the server ran: a shutdown's status, 0
        _say(f"received {stop}: stopping before the server runs")
        return 0
    finally:
        if serving:
            start_signals.restore()  # nothing to put back where nothing was installed


def _say(line: str) -> None:
    """A line in the log when it is set up, else on stderr."""
    import logging

    if logging.getLogger().handlers:
        logging.getLogger(__name__).info(line)
    else:
        print(f"{PROG}: {line}", file=sys.stderr)


def _command(args: argparse.Namespace) -> int:
    try:
        return _COMMANDS[args.command](args)
    except SpinfError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before a command's own handling (while loading, say): one line, no trace
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`spinf-serve config | head`): stop quietly, and stop Python's flush at exit from
        # failing again on the closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
