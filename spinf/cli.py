"""The ``spinf-serve`` command: argument parsing and dispatch; no logic of its own.

Subcommands so far: ``download MODEL`` (prints the local snapshot folder; for the built-in tiny model it generates
it) and ``serve`` (the HTTP server arrives with its own issue). ``--version`` prints the version.
"""

from __future__ import annotations

import argparse
import sys

from spinf._version import __version__
from spinf.errors import SpinfError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spinf-serve", description="Scoring server for decision models.")
    parser.add_argument("--version", action="version", version=f"spinf-serve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    download = sub.add_parser("download", help="fetch (or, for the tiny model, generate) a model's checkpoint")
    download.add_argument("model")
    download.add_argument("--dir", default=None, help="the hub cache folder to use")
    serve = sub.add_parser("serve", help="run the HTTP server (not available yet)")
    serve.add_argument("model", nargs="?", default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "download":
            from spinf.engine.engine import resolve_snapshot

            folder, _, _ = resolve_snapshot(args.model, args.dir)
            print(folder)
            return 0
        print(
            "spinf-serve serve: not yet: the HTTP server is still being built; use the engine in-process "
            "(`from spinf import Engine`, see README.md)",
            file=sys.stderr,
        )
        return 2
    except SpinfError as exc:
        print(f"spinf-serve: {exc}", file=sys.stderr)
        return 2
